"""`tbench run`: export, check, serve and measure one model on this node."""

from __future__ import annotations

import typer

from tbench.cli.common import (
    EXIT_BAD_OPTIONS,
    _given,
    _quiet_prefect,
    _run_with_progress,
    _shape_range,
    _split,
    cli_errors,
    model_fields,
    model_file_fields,
    parse_float_list,
    parse_int_list,
    parse_named,
    parse_options,
)
from tbench.cli.option_groups import with_option_groups
from tbench.cli.options import (
    BatchSizes,
    Concurrency,
    Formats,
    Framework,
    InputData,
    ModelFile,
    ModelOrFile,
    Output,
    PrecisionOpt,
    Repository,
    RepositoryModel,
    Reuse,
    Scenarios,
    ServedModel,
    ServerOptions,
    Shape,
    Size,
    ValueRange,
    Verbose,
    WindowOptions,
    field_help,
)
from tbench.planning.preflight import preflight
from tbench.team.prefect_api import start_early


@with_option_groups
def run(
    model: ModelOrFile = None,
    model_file: ModelFile = None,
    shape: Shape = None,
    dtype: list[str] = typer.Option(
        None, "--dtype", help="--model-file: an input's numpy dtype, NAME:int64 (TorchScript, a bare .pt2)."
    ),
    value_range: ValueRange = None,
    input_data: InputData = None,
    trt_shape: list[str] = typer.Option(
        None,
        "--trt-shape",
        help="trt, tf-trt: an input's dynamic dims in TensorRT's "
        "profile, NAME:MIN,OPT,MAX non-batch shapes, dims joined by 'x' (repeat per "
        "input), e.g. input_ids:16,128,512; the sample's size otherwise.",
    ),
    calibration_samples: int = typer.Option(None, "--calibration-samples", help=field_help("calibration_samples")),
    framework: Framework = None,
    size: Size = None,
    option: list[str] = typer.Option(
        None, "--option", help="A model-specific option, NAME=VALUE (repeat), e.g. memory_threshold_gb=16."
    ),
    checkpoint: str = typer.Option(None, help=field_help("checkpoint")),
    dataset: str = typer.Option(None, help=field_help("dataset")),
    formats: Formats = None,
    serve: str = typer.Option(None, help=field_help("serve_formats", "On the command line: onnx,ts-script or all.")),
    precision: PrecisionOpt = "fp32",
    batch_sizes: BatchSizes = None,
    concurrency: Concurrency = None,
    scenarios: Scenarios = None,
    online_batch_size: int = typer.Option(None, help=field_help("online_batch_size")),
    request_rates: str = typer.Option(
        None, "--request-rates", help=field_help("request_rates", "On the command line: 10,20,40.")
    ),
    distribution: str = typer.Option(
        "poisson", help=field_help("request_distribution", "poisson, constant or gamma (bursty).")
    ),
    burstiness: float = typer.Option(2.0, help=field_help("burstiness")),
    trace: str = typer.Option(None, "--trace", help=field_help("trace")),
    trace_speed: str = typer.Option(
        None, "--trace-speed", help=field_help("trace_speeds", "On the command line: 1,2,4.")
    ),
    max_batch_size: int = typer.Option(None, help="Triton max_batch_size."),
    instances: int = typer.Option(None, help="Model instances (instance_group count)."),
    preferred_batch_sizes: str = typer.Option(None, help="Dynamic batching preferred batch sizes, e.g. 4,8."),
    queue_delay_us: int = typer.Option(None, help="Dynamic batching max queue delay in microseconds."),
    profile: str = typer.Option(None, help=field_help("profile")),
    output: Output = None,
    baseline: str = typer.Option(None, help=field_help("baseline")),
    reuse: Reuse = False,
    served_model: ServedModel = None,
    repository: Repository = None,
    repository_model: RepositoryModel = None,
    serving: ServerOptions = ServerOptions(),
    windows: WindowOptions = WindowOptions(),
    trials: int = typer.Option(1, "--trials", metavar="N", help=field_help("trials")),
    against: str = typer.Option(
        None,
        "--against",
        metavar="MODEL_FILE",
        help="Measure this model file too, as the baseline of --model-file: --trials N rounds, each the two files' "
        "runs back to back (the order alternating), then the comparison paired by round (what moved the machine in "
        "a round moved both); exit as `tbench compare` does. The session's folder: <output>/sessions/<id>.",
    ),
    pin_cpus: bool = typer.Option(True, "--pin-cpus/--no-pin-cpus", help=field_help("pin_cpus")),
    direct: bool = typer.Option(False, "--direct", help=field_help("direct")),
    verbose: Verbose = False,
) -> None:
    """Export, check, serve and measure MODEL; prints the run folder."""
    _quiet_prefect(verbose)
    from tbench.request.benchmark import BenchmarkRequest

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        request = BenchmarkRequest(
            **model_fields(model, model_file, served_model, repository, repository_model),
            size=size,
            model_options=parse_options(option),
            checkpoint=checkpoint,
            dataset=dataset,
            formats=_split(formats),
            serve_formats=_split(serve),
            framework=framework,
            **model_file_fields(model_file, shape, value_range, input_data),
            input_dtypes=parse_named(dtype, "dtype", str),
            trt_shapes=parse_named(trt_shape, "--trt-shape (NAME:MIN,OPT,MAX)", _shape_range),
            calibration_samples=calibration_samples,
            precision=precision,
            batch_sizes=parse_int_list(batch_sizes, "batch sizes"),
            concurrency=parse_int_list(concurrency, "concurrency"),
            scenarios=_split(scenarios),
            online_batch_size=online_batch_size,
            request_rates=parse_float_list(request_rates, "request rates"),
            request_distribution=distribution,
            burstiness=burstiness,
            trace=trace,
            trace_speeds=parse_float_list(trace_speed, "trace speeds"),
            max_batch_size=max_batch_size,
            model_instances=instances,
            preferred_batch_sizes=parse_int_list(preferred_batch_sizes, "preferred batch sizes"),
            max_queue_delay_us=queue_delay_us,
            profile=profile,
            **_given(output=output),
            baseline=baseline,
            reuse_measurements=reuse,
            measurement=windows.overrides(),
            trials=trials,
            direct=direct,
            pin_cpus=pin_cpus,
            **serving.fields(),
        )
        if served_model:
            preflight(served_model_answers(request))
        elif repository:
            preflight(repository_checked(request))
        else:
            from tbench.node import hardware

            resolved = request.resolve(hardware.detect().has_gpu)  # fail fast, before Prefect starts
            preflight(resolved)  # ports, paths, output root, artifact store, this node's tools: before anything starts
        if against:
            check_against(request, against)

    if not verbose:
        _quiet_onnxruntime()
    start_early()  # the run's Prefect API starts while the flows are imported
    if against:
        _ab_session(request, against, verbose)
    from flows.benchmark import benchmark_flow

    _run_with_progress(lambda: benchmark_flow(request), "report.md", verbose)


def check_against(request, against: str) -> None:
    """--against: a model file beside --model-file, measured in rounds (--trials 2 or more); its own request resolves
    as the candidate's does (the file is read, its inputs checked) before anything starts."""
    from tbench.core.errors import ConfigError
    from tbench.node import hardware
    from tbench.stages.ab_session import side_requests

    if not request.model_file or request.served_model or request.repository:
        raise ConfigError("--against MODEL_FILE measures a model file against --model-file: give --model-file too")
    if request.trials < 2:
        raise ConfigError("--against measures the two files round by round: give --trials N, the rounds (2 or more)")
    side_requests(request, against)["baseline"].resolve(hardware.detect().has_gpu)


def _ab_session(request, against: str, verbose: bool) -> None:
    """`--against`: the two model files round by round, then the paired comparison's line and exit code."""
    from flows.session import ab_session_flow
    from tbench.stages.ab_session import read_session

    url = _run_with_progress(lambda: ab_session_flow(request, against), "comparison.md", verbose, points_exit=False)
    session = read_session(url)
    typer.echo(session["summary"])
    raise typer.Exit(session["exit_code"])


def served_model_answers(request):
    """A served model's request as its run reads it, once its server says the model is ready: before Prefect starts."""
    from tbench.request.served import check_served
    from tbench.triton.served import parse_served_model, read_served_model, split_server_url

    checked = check_served(request)
    read_served_model(split_server_url(checked.server_url)[0], *parse_served_model(checked.served_model))
    return checked


def repository_checked(request):
    """A repository run's request, its repository checked against the server it will start (its capabilities read
    without starting it): one line naming the file and field Triton or that server would refuse, before Prefect
    starts."""
    from pathlib import Path

    from tbench.planning.plan import server_options
    from tbench.request.repository import check_repository
    from tbench.triton.server_modes import make_server
    from tbench.triton.user_repository import plan_repository

    checked = check_repository(request)
    server = make_server(checked.server, Path("."), Path("/dev/null"), **server_options(checked))
    plan_repository(checked.repository, checked.repository_model, server.capabilities())
    return checked


def _quiet_onnxruntime() -> None:
    """ONNX Runtime logs a failed run to stderr before it raises; the error it raises is what the CLI reports."""
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)  # fatal only
    except ImportError:
        pass
