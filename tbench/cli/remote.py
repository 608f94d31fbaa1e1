"""The team's servers: `tbench submit` (a run on a pool's workers) and `tbench upload` (a kept run folder to the
artifact store)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from tbench.cli.common import (
    EXIT_BAD_OPTIONS,
    EXIT_FAILED,
    EXIT_FAILED_POINTS,
    _given,
    _split,
    cli_errors,
    console,
    model_fields,
    model_file_fields,
    parse_float_list,
    parse_int_list,
    parse_job_variables,
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
    ServerUrl,
    Shape,
    Size,
    ValueRange,
    WindowOptions,
    field_help,
)
from tbench.core.errors import ConfigError


@with_option_groups
def submit(
    model: ModelOrFile = None,
    model_file: ModelFile = None,
    shape: Shape = None,
    value_range: ValueRange = None,
    input_data: InputData = None,
    served_model: ServedModel = None,
    repository: Repository = None,
    repository_model: RepositoryModel = None,
    server_url: ServerUrl = None,
    pool: str = typer.Option("cpu", help="The work pool whose workers run it: a100, v100, t4, a30, a40, h100 or cpu."),
    # no defaults of its own: only the options given are sent, the worker's request fills the rest
    size: Size = None,
    framework: Framework = None,
    formats: Formats = None,
    precision: PrecisionOpt = None,
    batch_sizes: BatchSizes = None,
    concurrency: Concurrency = None,
    scenarios: Scenarios = None,
    trace: str = typer.Option(None, "--trace", help=field_help("trace") + " Uploaded with the run, as a model file."),
    trace_speed: str = typer.Option(None, "--trace-speed", help=field_help("trace_speeds", "e.g. 1,2,4.")),
    windows: WindowOptions = WindowOptions(),
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
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.team import submit as remote
    from tbench.team.pools import POOLS

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        if pool not in POOLS:
            raise ConfigError(f"unknown pool {pool!r}; known: {', '.join(POOLS)}")
        if not os.environ.get("PREFECT_API_URL"):
            raise ConfigError(
                "PREFECT_API_URL is not set: point it at the team's Prefect server (or `tbench stack env`)"
            )
        files = {k: v for k, v in model_file_fields(model_file, shape, value_range, input_data).items() if v}
        request = BenchmarkRequest(
            **model_fields(model, model_file, served_model, repository, repository_model),
            **files,
            **_given(
                server_url=server_url,
                size=size,
                framework=framework,
                formats=_split(formats),
                precision=precision,
                batch_sizes=parse_int_list(batch_sizes, "batch sizes"),
                concurrency=parse_int_list(concurrency, "concurrency"),
                scenarios=_split(scenarios),
                trace=trace,
                trace_speeds=parse_float_list(trace_speed, "trace speeds"),
                output=output,
                reuse_measurements=reuse or None,
                measurement=windows.overrides(),
            ),
        )
        if request.trace:  # read here as the worker will: a bad trace fails here
            from tbench.core.request_trace import load_schedule

            load_schedule(request.trace)
        if request.served_model:  # the worker measures it where it is served: only the options are checked here
            from tbench.request.served import check_served

            check_served(request)
            request = hand_over(request, output or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"))
        elif request.repository:  # checked here as the worker will (a repository Triton would refuse fails here)
            from tbench.cli.run import repository_checked

            repository_checked(request)
            request = hand_over(request, output or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"))
        elif request.model_file:  # read here as the worker will (a bad file fails here), then handed over
            from tbench.request.adapter import adapter_for

            adapter_for(request)
            request = hand_over(request, output or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"))
        else:
            import model_adapters

            model_adapters.get(request.model, request.size)  # an unknown model fails here, not on the worker
            request = hand_over(request, output or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"))
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


def hand_over(request, root: str):
    """The request with its model file (or repository) and input data where the pool's workers can read them: uploaded
    to the shared artifact root under their content digest (tbench.core.handover), or, with a local root (a worker on
    this machine), as absolute paths."""
    from tbench.core import handover

    fields = {}
    for field in ("model_file", "repository", "input_data", "trace"):
        value = getattr(request, field, None)  # a capacity request has a trace only
        if value and not (field == "trace" and value.startswith("ramp:")):  # a rate schedule travels as it is
            fields[field] = handover.hand_over_path(value, root)
            console.print(f"{field.replace('_', ' ')}: {fields[field]}", markup=False, highlight=False)
    return request.model_copy(update=fields)


def upload(
    run_folder: str = typer.Argument(..., help="A run folder kept locally after its upload failed."),
    to: str = typer.Option(
        None, "--to", help="The artifact root (default: where the run's manifest says it was going)."
    ),
) -> None:
    """Finish the upload of a kept run folder: files already in the store are skipped, the manifest goes last."""
    from tbench.stages.store import retry_upload

    with cli_errors(EXIT_FAILED):
        url = retry_upload(Path(run_folder), to)
    typer.echo(url)
