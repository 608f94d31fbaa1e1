"""`tbench search` (the best Triton configuration under a latency budget) and `tbench capacity` (the cheapest
configuration that serves a traffic under an SLO)."""

from __future__ import annotations

import os

import typer

from tbench.capacity.rate_search import MAX_POINTS, REPEATS, TOLERANCE
from tbench.capacity.request import CapacityRequest
from tbench.capacity.statistics import PercentileRule
from tbench.cli.common import (
    EXIT_BAD_OPTIONS,
    EXIT_UNDETERMINED,
    _given,
    _quiet_prefect,
    _run_with_progress,
    _split,
    cli_errors,
    model_file_fields,
    search_space,
)
from tbench.cli.option_groups import with_option_groups
from tbench.cli.options import (
    Framework,
    InputData,
    Instances,
    MaxBatchSizes,
    ModelFile,
    ModelOrFile,
    Output,
    Preferred,
    QueueDelaysUs,
    Repository,
    RepositoryModel,
    ServedModel,
    ServerOptions,
    Shape,
    Size,
    Stability,
    ValueRange,
    Verbose,
    WindowOptions,
    WindowS,
    field_help,
    measurement_overrides,
)
from tbench.core.errors import ConfigError
from tbench.planning.preflight import preflight
from tbench.team.prefect_api import start_early


@with_option_groups
def search(
    model: ModelOrFile = None,
    model_file: ModelFile = None,
    shape: Shape = None,
    value_range: ValueRange = None,
    input_data: InputData = None,
    served_model: ServedModel = None,
    repository: Repository = None,
    repository_model: RepositoryModel = None,
    size: Size = None,
    framework: Framework = None,
    variants: str = typer.Option(
        None,
        help="Served variants to search across: formats or FORMAT:PRECISION, e.g. "
        "onnx,ts-trace (the model's first format by default).",
    ),
    instances: Instances = "1,2",
    max_batch_sizes: MaxBatchSizes = "1,2,4,8,16",
    preferred: Preferred = "none,max",
    queue_delays_us: QueueDelaysUs = "0,500,2000",
    p99_budget_ms: float = typer.Option(None, "--p99-budget-ms", help="Best throughput with p99 under this budget."),
    throughput_floor: float = typer.Option(
        None, "--throughput-floor", help="Instead: lowest p99 with at least this throughput."
    ),
    strategy: str = typer.Option("smart", help="smart (measures a budget share of the grid) or exhaustive."),
    budget_fraction: float = typer.Option(0.10, help="smart: the largest share of the grid measured."),
    confirm_rounds: int = typer.Option(
        None,
        "--confirm-rounds",
        min=0,
        help="Rounds that re-measure the leader and the configurations the windows cannot separate from it "
        "(0: none; default 6 exhaustive, 2 smart).",
    ),
    concurrency: int = typer.Option(
        None, help="Closed-loop clients per measurement (the model's largest online concurrency by default)."
    ),
    search_load: bool = typer.Option(
        True,
        "--search-load/--fixed-load",
        help="With --p99-budget-ms, each candidate's best load up to --concurrency (powers of two) whose p99 holds "
        "the budget: a configuration at a load. --fixed-load: every candidate at --concurrency.",
    ),
    resume: str = typer.Option(
        None, help="An interrupted search's run folder (or search.jsonl): measured candidates are not measured again."
    ),
    output: Output = None,
    serving: ServerOptions = ServerOptions(),
    windows: WindowOptions = WindowOptions(),
    verbose: Verbose = False,
) -> None:
    """Search MODEL's Triton configuration grid for the best throughput under a p99 budget (or the lowest p99 above a
    throughput floor); prints the run folder, whose search.md names the best configuration."""
    _quiet_prefect(verbose)
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.search.strategies import Objective

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        if throughput_floor is not None and p99_budget_ms is not None:
            raise ConfigError("give a p99 budget or a throughput floor, not both")
        measurement = windows.overrides()
        space = search_space(instances, max_batch_sizes, preferred, queue_delays_us, variants)
        objective = (
            Objective(goal="min_latency", throughput_floor=throughput_floor)
            if throughput_floor is not None
            else Objective(p99_budget_ms=p99_budget_ms)
        )
        if served_model:  # the server's configuration is not ours to vary: only the load is
            raise ConfigError(
                f"a served model's configuration is the server's, so only its load varies: `tbench run --served-model "
                f"{served_model} --scenarios online --concurrency 1:64` (the load grid, its best point in the report) "
                f"or `tbench capacity --served-model {served_model}` (the highest rate under an SLO)"
            )
        from tbench.search.request import SearchRequest

        search_request = SearchRequest(
            space=space,
            objective=objective,
            strategy=strategy,
            budget_fraction=budget_fraction,
            concurrency=concurrency,
            search_load=search_load,
            confirm_rounds=confirm_rounds,
            resume_from=resume,
        )
        if repository or repository_model:
            given = model_file_fields(model_file, shape, value_range, input_data) | _given(output=output)
            given |= {"size": size, "framework": framework}  # refused in one line where given (check_repository)
            request, search_request = repository_search_request(
                model, repository, repository_model, given, measurement, serving, search_request, variants
            )
        else:
            if not model and not model_file:
                raise ConfigError("name a model (see `tbench models`) or give --model-file PATH")
            request = BenchmarkRequest(
                model=model or "resnet50",
                **model_file_fields(model_file, shape, value_range, input_data),
                size=size,
                framework=framework,
                **_given(output=output),
                measurement=measurement,
                formats=list(dict.fromkeys(v.partition(":")[0] for v in space.formats if v)) or None,
                **serving.fields(),
            )
            from tbench.node import hardware
            from tbench.search.plan import fit_search, resume_checkpoint, search_context, variant_plan

            machine = hardware.detect()
            resolved = request.resolve(machine.has_gpu)
            search_request, note = fit_search(search_request, resolved)
            if note:
                typer.echo(note, err=True)
            plan = variant_plan(search_request.space, resolved, machine.has_gpu)  # fail fast, before Prefect starts
            preflight(resolved)  # ports, paths, output root, artifact store, this node's tools: before anything starts
            resume_checkpoint(resume, search_context(resolved, search_request, plan, machine))
    start_early()  # the run's Prefect API starts while the flows are imported
    from flows.search import search_flow

    _run_with_progress(lambda: search_flow(request, search_request), "search.md", verbose)


def repository_capacity_request(model, repository, repository_model, given: dict, measurement, serving, cap):
    """`tbench capacity --repository DIR --model NAME`: the model's config searched at open-loop rates on this
    machine, checked as `search --repository` checks it (an ensemble: its steps searched one after another, each
    candidate judged by the pipeline's sustainable rate)."""
    if cap.pools:
        raise ConfigError("--repository plans on this machine, from the folder given: leave --pools out")
    return repository_search_request(
        model, repository, repository_model, given, measurement, serving, cap.search(), None
    )[0]


def repository_search_request(
    model, repository, repository_model, given: dict, measurement, serving: ServerOptions, search_request, variants
):
    """A search of a model of the user's repository (`--repository DIR --model NAME[:VERSION]`), checked as `run
    --repository` checks it (the repository against the server it will start), its model searchable (no ensemble)
    and its grid fitted to its config's max_batch_size: (request, search request), before Prefect starts."""
    from tbench.cli.run import repository_checked
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.search.plan import (
        checkpoint_names,
        repository_search_context,
        repository_space,
        resumed_checkpoints,
        searchable_model,
    )

    if repository_model and not repository:
        raise ConfigError("--model NAME[:VERSION] names a model of --repository DIR; give --repository too")
    if model and repository_model and model != repository_model:
        raise ConfigError(f"--repository: the model is {model!r} or {repository_model!r}? Name it once")
    if variants:
        raise ConfigError("--variants does not apply to --repository: the model is served as its config.pbtxt says")
    request = BenchmarkRequest(
        repository=repository,
        repository_model=repository_model or model,
        **given,
        measurement=measurement,
        **serving.fields(),
    )
    checked = repository_checked(request)
    target = searchable_model(checked.repository, checked.repository_model)
    if search_request is not None and search_request.resume_from:  # refused here, before anything starts
        from tbench.node import hardware

        context = repository_search_context(checked, search_request, hardware.detect())
        resumed_checkpoints(search_request.resume_from, context, checkpoint_names(target))
    if target.is_ensemble:  # each step's grid is fitted to its own config as its search starts
        note = f"{target.name} is an ensemble: its steps ({', '.join(target.steps)}) are searched one after another"
    else:
        search_request, note = repository_space(search_request, target.config.max_batch_size)
    if note:
        typer.echo(note, err=True)
    preflight(checked)
    return request, search_request


@with_option_groups
def capacity(
    model: ModelOrFile = None,
    model_file: ModelFile = None,
    shape: Shape = None,
    value_range: ValueRange = None,
    input_data: InputData = None,
    served_model: ServedModel = None,
    repository: Repository = None,
    repository_model: RepositoryModel = None,
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
    instances: Instances = "1,2",
    max_batch_sizes: MaxBatchSizes = "1,8",
    preferred: Preferred = "none",
    queue_delays_us: QueueDelaysUs = "500",
    tolerance: float = typer.Option(TOLERANCE, help=field_help("tolerance", model=CapacityRequest)),
    max_points: int = typer.Option(MAX_POINTS, help=field_help("max_points", model=CapacityRequest)),
    repeats: int = typer.Option(REPEATS, help=field_help("repeats", model=CapacityRequest)),
    max_minutes: float = typer.Option(None, help=field_help("max_minutes", model=CapacityRequest)),
    start_rps: float = typer.Option(None, help=field_help("start_rps", model=CapacityRequest)),
    trace: str = typer.Option(None, "--trace", help=field_help("trace", model=CapacityRequest)),
    burstiness: float = typer.Option(None, help=field_help("burstiness", model=CapacityRequest)),
    size: Size = None,
    framework: Framework = None,
    output: Output = None,
    serving: ServerOptions = ServerOptions(),
    window_s: WindowS = None,
    stability: Stability = None,
    verbose: Verbose = False,
) -> None:
    """The cheapest configuration that serves TRAFFIC requests/s of MODEL with the percentile latency under the SLO:
    each configuration's sustainable Poisson rate, the instances the traffic needs and their cost; prints the run
    folder, whose capacity.md has the answer."""
    _quiet_prefect(verbose)
    from tbench.request.benchmark import BenchmarkRequest

    with cli_errors(EXIT_BAD_OPTIONS, options=True):
        cap = CapacityRequest(
            slo_ms=slo_p99_ms,
            traffic_rps=traffic,
            headroom=headroom,
            rule=PercentileRule(percentile=percentile, confidence=confidence, margin_fraction=margin_fraction),
            space=search_space(instances, max_batch_sizes, preferred, queue_delays_us),
            tolerance=tolerance,
            max_points=max_points,
            repeats=repeats,
            max_minutes=max_minutes,
            start_rps=start_rps,
            trace=trace,
            burstiness=burstiness,
            pools=_split(pools) or [],
            prices=prices,
        )
        if repository or repository_model:
            request = repository_capacity_request(
                model,
                repository,
                repository_model,
                model_file_fields(model_file, shape, value_range, input_data)
                | _given(output=output)
                | {"size": size, "framework": framework},
                measurement_overrides(window_s, stability, None),
                serving,
                cap,
            )
            start_early()
            from flows.capacity import capacity_flow

            _answered(_run_with_progress(lambda: capacity_flow(request, cap), "capacity.md", verbose))
            return
        if not model and not model_file and not served_model:
            raise ConfigError(
                "name a model (see `tbench models`), give --model-file PATH or --served-model NAME with --server-url, "
                "or --repository DIR --model NAME"
            )
        request = BenchmarkRequest(
            **({"model": model or "resnet50"} if not served_model else _given(model=model)),
            served_model=served_model,
            **model_file_fields(model_file, shape, value_range, input_data),
            size=size,
            framework=framework,
            **_given(output=output),
            measurement=measurement_overrides(window_s, stability, None),
            **serving.fields(),
        )
        from tbench.capacity.costs import load_prices

        load_prices(cap.prices)  # a price table that cannot be read fails here, not after the measurements
        if served_model:  # its configuration is the server's: --instances and the like do not apply
            if cap.pools:
                raise ConfigError("--served-model measures the server it names from here: leave --pools out")
            from tbench.cli.run import served_model_answers

            preflight(served_model_answers(request))
        elif cap.pools:
            if not os.environ.get("PREFECT_API_URL"):
                raise ConfigError(
                    "--pools runs through the pools' deployments: set PREFECT_API_URL (e.g. `tbench stack env`)"
                )
            from tbench.cli.remote import hand_over

            # the pools' workers read the model file, inputs and trace from the artifact store, as a submitted run's
            request, cap = hand_over(request, request.output), hand_over(cap, request.output)
        else:
            from tbench.node import hardware

            resolved = request.resolve(hardware.detect().has_gpu)
            preflight(resolved)
            from tbench.search.plan import fit_search

            _, note = fit_search(cap.search(), resolved)
            if note:
                typer.echo(note, err=True)
    start_early()
    from flows.capacity import capacity_flow

    # with pools, the children run on the pools' workers: this flow run submits, gathers and reports
    _answered(_run_with_progress(lambda: capacity_flow(request, cap), "capacity.md", verbose))


def _answered(url: str) -> None:
    """Each pool's answer that is not a plan, one line on stderr; exit 2 where one is undetermined (a budget stopped its
    searches before they decided), as `tbench compare` exits 2 on what it cannot decide: a script reads the exit code.
    A plan (ok) and every rate failing the SLO (no_rate) are answers: exit 0."""
    from tbench.capacity.report import AnswerStatus, read_answers

    answers = read_answers(url)
    for a in answers:
        if a.status is not AnswerStatus.OK:
            typer.echo(f"{a.status}: {a.pool or 'here'}: {a.reason}", err=True)
    if any(a.status is AnswerStatus.UNDETERMINED for a in answers):
        raise typer.Exit(EXIT_UNDETERMINED)
