"""`tbench`: start the benchmark flow from a terminal, with rich progress and one-line errors."""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

from tbench.core.settings import configure_prefect_env

configure_prefect_env()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner stays out of the CLI's output

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import (  # noqa: E402
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from tbench.capacity.request import CapacityRequest  # noqa: E402
from tbench.capacity.statistics import PercentileRule  # noqa: E402
from tbench.cli_options import (  # noqa: E402
    BatchSizes,
    Concurrency,
    DockerImage,
    DockerNetwork,
    DockerUlimit,
    Formats,
    Framework,
    Gpus,
    GrpcPort,
    HttpPort,
    MaxTrials,
    ModelName,
    Output,
    PrecisionOpt,
    Reuse,
    Scenarios,
    Server,
    ServerUrl,
    Size,
    Stability,
    Verbose,
    WindowS,
    field_help,
    measurement_overrides,
    server_fields,
)
from tbench.core import progress  # noqa: E402
from tbench.core.errors import BenchError, ConfigError, error_line  # noqa: E402
from tbench.preflight import preflight  # noqa: E402

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Benchmark models on NVIDIA Triton Inference Server."
)
console = Console(stderr=True, soft_wrap=True)

# exit codes of `run`, `search` and `submit` (130: interrupted, tbench.interrupts.EXIT_INTERRUPTED)
EXIT_FAILED, EXIT_BAD_OPTIONS, EXIT_FAILED_POINTS = 1, 2, 3


@contextmanager
def cli_errors(
    exit_code: int, prefix: str = "", options: bool = False, also: tuple[type[BaseException], ...] = (), describe=str
):
    """The CLI's one error handler: an error a user can fix is one line, `error: PREFIX...`, and `exit_code`, never
    a traceback. Every BenchError shows its message; with `options` (the block builds the request from the options),
    a ValueError is pydantic's validation: 'invalid option: FIELD: MESSAGE'; `also` adds error types that `describe`
    turns into the line. Anything else is a bug and goes through with its traceback."""
    try:
        yield
    except Exception as err:
        if isinstance(err, BenchError):
            line = str(err)
        elif options and isinstance(err, ValueError):
            line = f"invalid option: {validation_line(err)}"
        elif isinstance(err, also):
            line = describe(err)
        else:
            raise
        console.print(f"[red]error:[/] {prefix}{line}")
        raise typer.Exit(exit_code) from None


def parse_int_list(text: str | None, what: str) -> list[int] | None:
    """'1,2,4' or a perf_analyzer-style inclusive range 'start:end[:step]', or both mixed: '1,2,4:16:4'."""
    if not text:
        return None
    values: list[int] = []
    try:
        for part in text.split(","):
            if ":" in part:
                start, end, *step = (int(x) for x in part.split(":"))
                values += list(range(start, end + 1, step[0] if step else 1))
            elif part.strip():
                values.append(int(part))
    except ValueError:
        raise ConfigError(f"cannot read {what} {text!r}: use '1,2,4' or 'start:end:step'") from None
    return values


def parse_float_list(text: str | None, what: str) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"cannot read {what} {text!r}: use '10,20,40'") from None


def parse_named(values: list[str] | None, what: str, convert) -> dict | None:
    """Repeated NAME:VALUE options (the name may itself hold colons, as TF tensor names can): {name: convert(value)}."""
    if not values:
        return None
    parsed = {}
    for item in values:
        name, sep, value = item.rpartition(":")
        if not sep or not name or not value:
            raise ConfigError(f"cannot read {what} {item!r}: use NAME:VALUE")
        try:
            parsed[name] = convert(value)
        except ValueError:
            raise ConfigError(f"cannot read {what} {item!r}") from None
    return parsed


def parse_job_variables(text: str | None) -> dict | None:
    """A JSON object of the pool's job variables (image, volumes, env...) for one run."""
    if not text:
        return None
    import json

    try:
        parsed = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"cannot read the job variables: {err}") from None
    if not isinstance(parsed, dict):
        raise ConfigError('the job variables must be a JSON object, e.g. \'{"image": "NAME:TAG"}\'')
    return parsed


def parse_options(values: list[str] | None) -> dict | None:
    """Repeated NAME=VALUE model options; numbers become numbers."""
    if not values:
        return None
    parsed = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(f"cannot read option {item!r}: use NAME=VALUE")
        try:
            parsed[name.strip()] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            parsed[name.strip()] = value.strip()
    return parsed


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",")]


def _bounds(text: str) -> list[float]:
    low, high = text.split(",")  # anything but two numbers is a ValueError: parse_named says which option
    return [float(low), float(high)]


def _shape_range(text: str) -> list[list[int]]:
    """'16,128,512' or '80x16,80x128,80x512': an input's non-batch MIN,OPT,MAX shapes, dims joined by 'x'."""
    shapes = [[int(d) for d in part.split("x")] for part in text.split(",")]
    if len(shapes) != 3:
        raise ValueError(text)  # parse_named says which option
    return shapes


def _given(**values) -> dict:
    """Only the options the user gave, so the request's own defaults apply to the rest."""
    return {k: v for k, v in values.items() if v is not None}


def _split(text: str | None) -> list[str] | None:
    return [p.strip() for p in text.split(",") if p.strip()] if text else None


def validation_line(err: ValueError) -> str:
    """A pydantic error as one line: the field and pydantic's message, not its 'N validation errors for X' header."""
    from pydantic import ValidationError

    if isinstance(err, ValidationError) and err.errors():
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first['msg']}" if where else first["msg"]
    return str(err).splitlines()[0]


class RichProgress:
    """Listens to progress events: a line per stage, a bar over the perf_analyzer points."""

    def __init__(self, bar: Progress):
        self.bar = bar
        self.stage = self.sweep = None
        self.stage_name: str | None = None  # the stage running now: where an interrupt landed
        self.run_url: str | None = None
        self.status, self.detail = None, ""

    def __call__(self, event: str, **data) -> None:
        if event == "run_end":
            self.run_url, self.status, self.detail = data["url"], data["status"], data.get("detail", "")
            self.stage_name = data.get("stage") or self.stage_name
        elif event == "lock_wait":
            self.bar.console.print(
                f"  [yellow]waiting[/] {data['waited_s']:.0f} s for the device lock: held by {data['holder']}"
            )
        elif event == "lock_reclaimed":
            self.bar.console.print(f"  [yellow]reclaimed[/] the device lock from {data['holder']} (its lease is stale)")
        elif event == "run_start":
            self.bar.console.print(f"run [bold]{data['run_id']}[/] in {data['run_dir']}")
        elif event == "stage_start":
            self.stage_name = data["stage"]
            self.stage = self.bar.add_task(f"{data['stage']}", total=None)
        elif event == "stage_end":
            self.bar.remove_task(self.stage)
            mark = "[green]done[/]" if data["status"] == "completed" else f"[red]{data['status']}[/]"
            self.bar.console.print(f"  {data['stage']:<24} {mark} in {data['seconds']:.1f} s")
        elif event == "sweep_start":
            self.sweep = self.bar.add_task("perf_analyzer points", total=data["total"])
        elif event == "point_done":
            row = data["row"]
            self.bar.advance(self.sweep)
            tput = row.get("throughput_infer_per_s")
            what = (
                f"{tput:.1f} infer/s, p99 {row['p99_ms']:.2f} ms"
                if row["status"] == "ok"
                else f"[yellow]{row['status']}[/]: {row['error']}"
            )
            load = (
                f"rate {row['request_rate']:g}/s {row['request_distribution']}"
                if row.get("request_distribution")
                else f"concurrency {row['concurrency']}"
            )
            self.bar.console.print(f"    {row['scenario']} batch {row['batch_size']} {load}: {what}")
            if data["index"] == data["total"]:
                self.bar.remove_task(self.sweep)
        elif event == "search_point":
            if self.sweep is None:
                self.sweep = self.bar.add_task("configurations", total=data["limit"])
            self.bar.update(self.sweep, completed=data["measured"])
            what = (
                f"{data['throughput']:.1f} infer/s, p99 {data['p99_ms']:.2f} ms"
                if data["status"] == "ok"
                else f"[yellow]{data['status']}[/]: {data['error']}"
            )
            self.bar.console.print(f"    {data['key']}: {what}")
        elif event == "rate_point":
            latency = f", latency {data['latency_ms']:.3g} ms" if data.get("latency_ms") is not None else ""
            why = f" ({data['reason']})" if data.get("reason") else ""
            self.bar.console.print(f"      rate {data['rate']:g}/s: {data['status']}{latency}{why}")


@app.command()
def run(
    model: str = typer.Argument(None, help="Model adapter name (see `tbench models`); not needed with --model-file."),
    model_file: str = typer.Option(None, "--model-file", help=field_help("model_file")),
    shape: list[str] = typer.Option(
        None, "--shape", help="--model-file: an input's non-batch shape, NAME:D1,D2 (repeat per input)."
    ),
    dtype: list[str] = typer.Option(
        None, "--dtype", help="--model-file: an input's numpy dtype, NAME:int64 (TorchScript)."
    ),
    value_range: list[str] = typer.Option(
        None,
        "--value-range",
        help="--model-file: an input's synthetic values in "
        "LO..HI, NAME:LO,HI (repeat per input); integers inclusive, floats uniform.",
    ),
    input_data: str = typer.Option(None, "--input-data", help=field_help("input_data")),
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
    distribution: str = typer.Option("poisson", help=field_help("request_distribution", "poisson or constant.")),
    max_batch_size: int = typer.Option(None, help="Triton max_batch_size."),
    instances: int = typer.Option(None, help="Model instances (instance_group count)."),
    preferred_batch_sizes: str = typer.Option(None, help="Dynamic batching preferred batch sizes, e.g. 4,8."),
    queue_delay_us: int = typer.Option(None, help="Dynamic batching max queue delay in microseconds."),
    profile: str = typer.Option(None, help=field_help("profile")),
    output: Output = None,
    baseline: str = typer.Option(None, help=field_help("baseline")),
    reuse: Reuse = False,
    server: Server = "embedded",
    server_url: ServerUrl = None,
    docker_image: DockerImage = None,
    gpus: Gpus = None,
    docker_network: DockerNetwork = "host",
    docker_ulimit: DockerUlimit = None,
    http_port: HttpPort = None,
    grpc_port: GrpcPort = None,
    window_s: WindowS = None,
    stability: Stability = None,
    max_trials: MaxTrials = None,
    verbose: Verbose = False,
) -> None:
    """Export, check, serve and measure MODEL; prints the run folder."""
    _quiet_prefect(verbose)
    from tbench.request import BenchmarkRequest

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        if not model and not model_file:
            raise ConfigError("name a model (see `tbench models`) or give --model-file PATH")
        request = BenchmarkRequest(
            model=model or "resnet50",
            size=size,
            model_options=parse_options(option),
            checkpoint=checkpoint,
            dataset=dataset,
            formats=_split(formats),
            serve_formats=_split(serve),
            framework=framework,
            model_file=model_file,
            shapes=parse_named(shape, "shape", _dims),
            input_dtypes=parse_named(dtype, "dtype", str),
            input_data=input_data,
            value_ranges=parse_named(value_range, "--value-range (NAME:LO,HI)", _bounds),
            trt_shapes=parse_named(trt_shape, "--trt-shape (NAME:MIN,OPT,MAX)", _shape_range),
            calibration_samples=calibration_samples,
            precision=precision,
            batch_sizes=parse_int_list(batch_sizes, "batch sizes"),
            concurrency=parse_int_list(concurrency, "concurrency"),
            scenarios=_split(scenarios),
            online_batch_size=online_batch_size,
            request_rates=parse_float_list(request_rates, "request rates"),
            request_distribution=distribution,
            max_batch_size=max_batch_size,
            model_instances=instances,
            preferred_batch_sizes=parse_int_list(preferred_batch_sizes, "preferred batch sizes"),
            max_queue_delay_us=queue_delay_us,
            profile=profile,
            **_given(output=output),
            baseline=baseline,
            reuse_measurements=reuse,
            measurement=measurement_overrides(window_s, stability, max_trials),
            **server_fields(
                server, server_url, docker_image, gpus, docker_network, docker_ulimit, http_port, grpc_port
            ),
        )
        from tbench.node import hardware

        resolved = request.resolve(hardware.detect().has_gpu)  # fail fast, before Prefect starts
        preflight(resolved)  # ports, paths, output root, artifact store, this node's tools: before anything starts

    if not verbose:
        _quiet_onnxruntime()
    from flows.benchmark import benchmark_flow

    _run_with_progress(lambda: benchmark_flow(request), "report.md", verbose)


def _quiet_prefect(verbose: bool) -> None:
    """Without -v, Prefect's console logs stay off the terminal (tracebacks too: they still go to the run's
    logs/prefect.log). Set before anything imports Prefect (the preflight's node check does): its console handler
    reads this once."""
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


def _quiet_onnxruntime() -> None:
    """ONNX Runtime logs a failed run to stderr before it raises; the error it raises is what the CLI reports."""
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)  # fatal only
    except ImportError:
        pass


def _run_with_progress(start_flow, done: str, verbose: bool = False) -> None:
    """Run a flow with a rich progress bar in the CLI's own Prefect API; print `done` (a file of the run folder) and the
    run folder. Every way a run can end is one line and an exit code: completed 0, completed with failed points 3,
    failed 1 (a BenchError's message, or the type and first line of anything else; the traceback is in the run's
    logs, and on the terminal with -v), interrupted 130 (Ctrl-C or SIGTERM)."""
    from tbench.node.interrupts import EXIT_INTERRUPTED, cli_signal_handlers, is_interrupt, signal_name
    from tbench.prefect_api import prefect_api

    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    listener = None
    logging.raiseExceptions = False  # a log file on a full disk: the run's own error says so, not a logging traceback
    try:
        with cli_signal_handlers(), Progress(*columns, console=console, transient=True) as bar:
            listener = RichProgress(bar)
            progress.subscribe(listener)
            with prefect_api():
                url = start_flow()
    except BaseException as err:
        where = listener.run_url if listener else None
        stage = f" during {listener.stage_name}" if listener and listener.stage_name else ""
        if is_interrupt(err):
            console.print(
                f"[red]interrupted[/] by {signal_name(err)}{stage}; the server is stopped and every point "
                "measured so far is kept"
            )
            code = EXIT_INTERRUPTED
        elif isinstance(err, BenchError):
            console.print(f"[red]error:[/] {err}")
            code = EXIT_FAILED
        else:  # a bug or an environment problem: one line here, the traceback in the run's logs (and here with -v)
            if verbose:
                console.print_exception()
            console.print(
                f"[red]error:[/] {type(err).__name__}{stage}: {error_line(err)}"
                + (f" (traceback: {where}/logs/prefect.log)" if where else "")
            )
            code = EXIT_FAILED
        if where:
            console.print(f"partial results, logs and manifest: {where}")
        raise typer.Exit(code) from None
    finally:
        if listener:
            progress.unsubscribe(listener)
    console.print(f"[green]{done}:[/] {url}/{done}")
    if listener.status == "completed_with_failures":
        console.print(f"[yellow]completed with failed points:[/] {listener.detail}")
        typer.echo(url)
        raise typer.Exit(EXIT_FAILED_POINTS)
    typer.echo(url)


@app.command()
def search(
    model: ModelName,
    size: Size = None,
    framework: Framework = None,
    variants: str = typer.Option(
        None,
        help="Served variants to search across: formats or FORMAT:PRECISION, e.g. "
        "onnx,ts-trace (the model's first format by default).",
    ),
    instances: str = typer.Option("1,2", help="Instance counts to try."),
    max_batch_sizes: str = typer.Option("1,2,4,8,16", "--max-batch-sizes", help="Max batch sizes to try."),
    preferred: str = typer.Option("none,max", help="Preferred batch size rules to try: none, max, half, quarter."),
    queue_delays_us: str = typer.Option("0,500,2000", "--queue-delays-us", help="Max queue delays to try, in us."),
    p99_budget_ms: float = typer.Option(None, "--p99-budget-ms", help="Best throughput with p99 under this budget."),
    throughput_floor: float = typer.Option(
        None, "--throughput-floor", help="Instead: lowest p99 with at least this throughput."
    ),
    strategy: str = typer.Option("smart", help="smart (measures a budget share of the grid) or exhaustive."),
    budget_fraction: float = typer.Option(0.10, help="smart: the largest share of the grid measured."),
    concurrency: int = typer.Option(
        None, help="Closed-loop clients per measurement (the model's largest online concurrency by default)."
    ),
    resume: str = typer.Option(
        None, help="An interrupted search's run folder (or search.jsonl): measured candidates are not measured again."
    ),
    output: Output = None,
    server: Server = "embedded",
    server_url: ServerUrl = None,
    docker_image: DockerImage = None,
    gpus: Gpus = None,
    docker_network: DockerNetwork = "host",
    docker_ulimit: DockerUlimit = None,
    http_port: HttpPort = None,
    grpc_port: GrpcPort = None,
    window_s: WindowS = None,
    stability: Stability = None,
    max_trials: MaxTrials = None,
    verbose: Verbose = False,
) -> None:
    """Search MODEL's Triton configuration grid for the best throughput under a p99 budget (or the lowest p99 above a
    throughput floor); prints the run folder, whose search.md names the best configuration."""
    _quiet_prefect(verbose)
    from tbench.request import BenchmarkRequest
    from tbench.search.strategies import Objective, SearchSpace

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        if throughput_floor is not None and p99_budget_ms is not None:
            raise ConfigError("give a p99 budget or a throughput floor, not both")
        measurement = measurement_overrides(window_s, stability, max_trials)
        space = SearchSpace(
            instances=parse_int_list(instances, "instances"),
            max_batch_sizes=parse_int_list(max_batch_sizes, "max batch sizes"),
            preferred=_split(preferred),
            queue_delays_us=parse_int_list(queue_delays_us, "queue delays"),
            formats=_split(variants) or [""],
        )
        objective = (
            Objective(goal="min_latency", throughput_floor=throughput_floor)
            if throughput_floor is not None
            else Objective(p99_budget_ms=p99_budget_ms)
        )
        request = BenchmarkRequest(
            model=model,
            size=size,
            framework=framework,
            **_given(output=output),
            measurement=measurement,
            formats=list(dict.fromkeys(v.partition(":")[0] for v in space.formats if v)) or None,
            **server_fields(
                server, server_url, docker_image, gpus, docker_network, docker_ulimit, http_port, grpc_port
            ),
        )
        from tbench.node import hardware
        from tbench.search.plan import resume_checkpoint, search_context, variant_plan
        from tbench.search.request import SearchRequest

        search_request = SearchRequest(
            space=space,
            objective=objective,
            strategy=strategy,
            budget_fraction=budget_fraction,
            concurrency=concurrency,
            resume_from=resume,
        )
        machine = hardware.detect()
        resolved = request.resolve(machine.has_gpu)
        plan = variant_plan(space, resolved, machine.has_gpu)  # fail fast, before Prefect starts
        preflight(resolved)  # ports, paths, output root, artifact store, this node's tools: before anything starts
        resume_checkpoint(resume, search_context(resolved, search_request, plan, machine))
    from flows.search import search_flow

    _run_with_progress(lambda: search_flow(request, search_request), "search.md", verbose)


@app.command()
def capacity(
    model: ModelName,
    slo_p99_ms: float = typer.Option(..., "--slo-p99-ms", help=field_help("slo_ms", model=CapacityRequest)),
    traffic: float = typer.Option(..., "--traffic", help=field_help("traffic_rps", model=CapacityRequest)),
    headroom: float = typer.Option(0.2, help=field_help("headroom", model=CapacityRequest)),
    percentile: int = typer.Option(99, help="The percentile the SLO bounds: 50, 90, 95 or 99."),
    confidence: float = typer.Option(0.95, help=field_help("confidence", model=PercentileRule)),
    margin_fraction: float = typer.Option(0.5, help=field_help("margin_fraction", model=PercentileRule)),
    pools: str = typer.Option(
        None,
        help="Pools to plan for, e.g. a100,t4,cpu, each through its capacity deployment (needs "
        "PREFECT_API_URL); this machine by default.",
    ),
    prices: str = typer.Option(None, help=field_help("prices", model=CapacityRequest)),
    instances: str = typer.Option("1,2", help="Instance counts to try."),
    max_batch_sizes: str = typer.Option("1,8", "--max-batch-sizes", help="Max batch sizes to try."),
    preferred: str = typer.Option("none", help="Preferred batch size rules to try: none, max, half, quarter."),
    queue_delays_us: str = typer.Option("500", "--queue-delays-us", help="Max queue delays to try, in us."),
    tolerance: float = typer.Option(0.1, help=field_help("tolerance", model=CapacityRequest)),
    max_points: int = typer.Option(8, help=field_help("max_points", model=CapacityRequest)),
    start_rps: float = typer.Option(None, help=field_help("start_rps", model=CapacityRequest)),
    size: Size = None,
    framework: Framework = None,
    output: Output = None,
    server: Server = "embedded",
    server_url: ServerUrl = None,
    docker_image: DockerImage = None,
    gpus: Gpus = None,
    docker_network: DockerNetwork = "host",
    docker_ulimit: DockerUlimit = None,
    http_port: HttpPort = None,
    grpc_port: GrpcPort = None,
    stability: Stability = None,
    verbose: Verbose = False,
) -> None:
    """The cheapest configuration that serves TRAFFIC requests/s of MODEL with the percentile latency under the SLO:
    each configuration's sustainable Poisson rate, the instances the traffic needs and their cost; prints the run
    folder, whose capacity.md has the answer."""
    _quiet_prefect(verbose)
    from tbench.request import BenchmarkRequest
    from tbench.search.strategies import SearchSpace

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        cap = CapacityRequest(
            slo_ms=slo_p99_ms,
            traffic_rps=traffic,
            headroom=headroom,
            rule=PercentileRule(percentile=percentile, confidence=confidence, margin_fraction=margin_fraction),
            space=SearchSpace(
                instances=parse_int_list(instances, "instances"),
                max_batch_sizes=parse_int_list(max_batch_sizes, "max batch sizes"),
                preferred=_split(preferred),
                queue_delays_us=parse_int_list(queue_delays_us, "queue delays"),
            ),
            tolerance=tolerance,
            max_points=max_points,
            start_rps=start_rps,
            pools=_split(pools) or [],
            prices=prices,
        )
        request = BenchmarkRequest(
            model=model,
            size=size,
            framework=framework,
            **_given(output=output),
            measurement=measurement_overrides(None, stability, None),
            **server_fields(
                server, server_url, docker_image, gpus, docker_network, docker_ulimit, http_port, grpc_port
            ),
        )
        from tbench.capacity.costs import load_prices

        load_prices(cap.prices)  # a price table that cannot be read fails here, not after the measurements
        if cap.pools:
            if not os.environ.get("PREFECT_API_URL"):
                raise ConfigError(
                    "--pools runs through the pools' deployments: set PREFECT_API_URL (e.g. `tbench stack env`)"
                )
        else:
            from tbench.node import hardware

            preflight(request.resolve(hardware.detect().has_gpu))
    from flows.capacity import capacity_flow

    # with pools, the children run on the pools' workers: this flow run submits, gathers and reports
    _run_with_progress(lambda: capacity_flow(request, cap), "capacity.md", verbose)


@app.command()
def compare(
    baseline: str = typer.Argument(..., help="The baseline run folder (a path or an fsspec URL)."),
    candidate: str = typer.Argument(..., help="The run to judge against it."),
    min_effect: float = typer.Option(0.05, help="Smallest relative change that can count, e.g. 0.05 for 5%."),
    k: float = typer.Option(3.0, "-k", help="How many times the combined window noise a change must exceed."),
    output: str = typer.Option(".", "--output", "-o", help="Folder for comparison.md and comparison.png."),
) -> None:
    """Per-point deltas and a noise-aware verdict; exit 0 (no change or faster), 1 (regression), 2 (not comparable)."""
    from tbench.results.compare import compare_runs, comparison_markdown, plot_comparison, verdict_exit_code

    with cli_errors(2, also=(OSError, ValueError)):  # 2: not comparable (a run that is missing or unreadable)
        result = compare_runs(baseline, candidate, min_effect, k)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(comparison_markdown(result))
    plot_comparison(result, out / "comparison.png")
    typer.echo(result.summary)
    raise typer.Exit(verdict_exit_code(result))


@app.command()
def submit(
    model: ModelName,
    pool: str = typer.Option("cpu", help="The work pool whose workers run it: a100, v100, t4, a30, a40, h100 or cpu."),
    # no defaults of its own: only the options given are sent, the worker's request fills the rest
    size: Size = None,
    framework: Framework = None,
    formats: Formats = None,
    precision: PrecisionOpt = None,
    batch_sizes: BatchSizes = None,
    concurrency: Concurrency = None,
    scenarios: Scenarios = None,
    window_s: WindowS = None,
    stability: Stability = None,
    max_trials: MaxTrials = None,
    output: Output = None,
    reuse: Reuse = False,
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Follow the run to its end (states and logs)."),
    timeout: float = typer.Option(3600, help="Stop following after this many seconds (the run goes on)."),
    job_variables: str = typer.Option(
        None,
        "--job-variables",
        help="JSON object of the pool's job variables for this "
        'run (its `env` adds to the pool\'s), e.g. \'{"image": "NAME:TAG"}\'.',
    ),
) -> None:
    """Send a benchmark run to a pool of the Prefect server at PREFECT_API_URL and follow it; `tbench run` runs here."""
    from tbench import submit as remote
    from tbench.pools import POOLS
    from tbench.request import BenchmarkRequest

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        if pool not in POOLS:
            raise ConfigError(f"unknown pool {pool!r}; known: {', '.join(POOLS)}")
        if not os.environ.get("PREFECT_API_URL"):
            raise ConfigError(
                "PREFECT_API_URL is not set: point it at the team's Prefect server (or `tbench stack env`)"
            )
        request = BenchmarkRequest(
            model=model,
            **_given(
                size=size,
                framework=framework,
                formats=_split(formats),
                precision=precision,
                batch_sizes=parse_int_list(batch_sizes, "batch sizes"),
                concurrency=parse_int_list(concurrency, "concurrency"),
                scenarios=_split(scenarios),
                output=output,
                reuse_measurements=reuse or None,
                measurement=measurement_overrides(window_s, stability, max_trials),
            ),
        )
        import model_adapters

        model_adapters.get(request.model, request.size)  # an unknown model fails here, not on the worker
        parameters = {"request": request.model_dump(mode="json", exclude_unset=True)}
        variables = parse_job_variables(job_variables)
        started = time.monotonic()
        run_id = remote.submit(
            remote.deployment_name("benchmark", pool), parameters, tags=["submitted"], job_variables=variables
        )
    console.print(f"submitted flow run {run_id} to pool {pool}")
    if not follow:
        typer.echo(str(run_id))
        return
    result = remote.follow(
        run_id, lambda line: console.print(line, markup=False, highlight=False), timeout_s=timeout, submitted_at=started
    )
    if result.report_url:
        console.print(f"[green]report:[/] {result.report_url}")
    if result.state != "COMPLETED":
        console.print(f"[red]error:[/] the run ended {result.state_name}: {result.message}")
        raise typer.Exit(EXIT_FAILED)
    typer.echo(str(run_id))
    if result.state_name == "CompletedWithFailures":  # flows/benchmark.py's state for a run with failed points
        console.print(f"[yellow]completed with failed points:[/] {result.message}")
        raise typer.Exit(EXIT_FAILED_POINTS)


@app.command()
def upload(
    run_folder: str = typer.Argument(..., help="A run folder kept locally after its upload failed."),
    to: str = typer.Option(
        None, "--to", help="The artifact root (default: where the run's manifest says it was going)."
    ),
) -> None:
    """Finish the upload of a kept run folder: files already in the store are skipped, the manifest goes last."""
    from tbench.store import retry_upload

    with cli_errors(EXIT_FAILED):
        url = retry_upload(Path(run_folder), to)
    typer.echo(url)


@app.command()
def results(
    root: str = typer.Option(
        None,
        "--root",
        help="The artifact root holding the results dataset (default: $TBENCH_ARTIFACT_ROOT, else ./runs).",
    ),
    model: str = typer.Option(None, help="Only this model."),
    gpu: str = typer.Option(
        None, help="Only this GPU (as the results name it, e.g. 'CPU' or 'NVIDIA A100-SXM4-80GB')."
    ),
    since: str = typer.Option(None, help="Only runs from this date on (YYYY-MM-DD)."),
    all_points: bool = typer.Option(False, "--all", help="Every point, not the best per run, format and scenario."),
    csv: str = typer.Option(None, "--csv", help="Also write the rows to this CSV file."),
    include_incomplete: bool = typer.Option(
        False,
        "--include-incomplete",
        help="Also runs that failed or were interrupted (by default: completed runs, with or without failed points).",
    ),
) -> None:
    """Query the results of every stored run (the partitioned Parquet dataset under the artifact root)."""
    from rich.table import Table

    from tbench.core.storage import error_cause, store_errors
    from tbench.results.dataset import best_per_run, query_results

    root = root or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs")
    # store_errors: an S3 endpoint that is down raises botocore's own errors, not OSErrors
    with cli_errors(
        EXIT_FAILED, f"cannot read the results dataset under {root}: ", also=store_errors(), describe=error_cause
    ):
        table = query_results(root, model=model, gpu=gpu, since=since, include_incomplete=include_incomplete)
    if table.empty:
        console.print(
            f"no stored results under {root}/results match"
            + ("" if include_incomplete else " (failed and interrupted runs are left out: --include-incomplete)")
        )
        raise typer.Exit(0)
    rows = table if all_points else best_per_run(table)
    if csv:
        rows.to_csv(csv, index=False)
    headers = {
        "date": "date",
        "run_id": "run",
        "model": "model",
        "gpu": "gpu",
        "format": "format",
        "precision": "precision",
        "scenario": "scenario",
        "batch_size": "batch",
        "concurrency": "conc.",
        "throughput_infer_per_s": "infer/s",
        "p99_ms": "p99 ms",
        "run_status": "run status",
    }
    shown = [c for c in headers if c in rows.columns]
    out = Table(*(headers[c] for c in shown), title=f"{len(rows)} rows from {table['run_id'].nunique()} runs")
    for _, r in rows[shown].iterrows():
        out.add_row(*("" if pd_missing(v) else (f"{v:.2f}" if isinstance(v, float) else str(v)) for v in r))
    Console(width=None if console.is_terminal else 200).print(out)


def pd_missing(value) -> bool:
    import pandas as pd

    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


stack_app = typer.Typer(
    help="The local stack: Prefect server, S3 endpoint (moto), pools, deployments and a cpu worker."
)
app.add_typer(stack_app, name="stack")
StackFolder = Annotated[str | None, typer.Option(help="The stack's folder (~/.cache/tbench/stack by default).")]


def _stack_dir(folder: str | None) -> Path:
    from tbench import stack

    return Path(folder) if folder else stack.DEFAULT_DIR


@stack_app.command("up")
def stack_up(
    folder: str = typer.Option(
        None, help="Where the stack keeps its database, logs and state (~/.cache/tbench/stack)."
    ),
    database_url: str = typer.Option(
        None,
        envvar="TBENCH_STACK_DATABASE_URL",
        help="PostgreSQL instead of SQLite: "
        "postgresql+asyncpg://user:pass@host/db. Better set TBENCH_STACK_DATABASE_URL (a "
        "command line is seen by ps and kept in shell history); only the Prefect server "
        "gets the password: stack.json and what is printed show the URL with ***.",
    ),
    port: int = typer.Option(4200, help="The Prefect server's port (its UI too)."),
) -> None:
    """Start the stack and deploy; prints the environment a shell needs (also: tbench stack env)."""
    from tbench import stack

    s = stack.Stack(root=_stack_dir(folder), database_url=database_url, api_port=port)
    with cli_errors(EXIT_FAILED):
        try:
            s.up()
        except BenchError:
            s.down()  # what did start stops again before the error is shown
            raise
    console.print(
        f"Prefect UI: {s.api_url[:-4]}   S3 endpoint: {s.s3.url}   artifacts: {s.artifact_root}"
        + (f"   database: {stack.masked_url(database_url)}" if database_url else "")
    )
    for key, value in s.client_env().items():
        typer.echo(f"export {key}={value}")


@stack_app.command("env")
def stack_env(folder: StackFolder = None) -> None:
    """Shell exports for the running stack: eval "$(tbench stack env)"."""
    from tbench import stack

    with cli_errors(EXIT_FAILED):
        state = stack.load_state(_stack_dir(folder))
    for key, value in state["env"].items():
        if key not in stack.SECRET_ENV:  # a stack.json from before the URL was kept out of it
            typer.echo(f"export {key}={value}")


@stack_app.command("down")
def stack_down(folder: StackFolder = None) -> None:
    """Stop the worker, the Prefect server and the S3 endpoint."""
    from tbench import stack

    with cli_errors(EXIT_FAILED):
        stopped = stack.down_from_state(_stack_dir(folder))
    console.print("stopped: " + ", ".join(stopped))


@app.command()
def doctor(
    json_output: bool = typer.Option(False, "--json", help="The report as JSON, for scripts."),
    image: bool = typer.Option(
        False,
        "--image",
        help="Also check what the GPU worker image must hold (CUDA builds, "
        "TensorRT at the image's version, the local server's backends); exit 1 if it "
        "lacks any.",
    ),
) -> None:
    """What this node can export (each converter's tools), serve (each server mode) and measure (perf_analyzer, GPUs,
    GPU metrics, CUDA in each framework); `tbench run` refuses what it lacks."""
    from rich.table import Table

    from tbench.doctor import full_report, image_problems

    with cli_errors(EXIT_FAILED):
        report = full_report()
    if json_output:
        typer.echo(report.model_dump_json(indent=2))
    else:
        marks = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}
        table = Table("", "check", "ok", "detail", "where to get it", title=f"tbench doctor: {report.host}")
        for check in report.checks:
            table.add_row(check.area, check.name, marks[check.ok], check.detail, check.hint)
        Console(width=None if console.is_terminal else 200).print(table)
    if image and (problems := image_problems(report)):
        console.print(f"[red]error:[/] this image lacks what GPU runs need: {' | '.join(problems)}")
        raise typer.Exit(EXIT_FAILED)


@app.command()
def models() -> None:
    """List the registered model adapters and their frameworks."""
    import model_adapters

    for name in model_adapters.names():
        typer.echo(f"{name}\t{', '.join(model_adapters.frameworks(name))}")


if __name__ == "__main__":
    app()
