"""The configuration search flow: wiring only. Export and check the model (the benchmark's tasks), start one Triton
server in explicit model-control mode, then search the configuration grid on it; the run folder keeps the checkpoint
(search.jsonl, one line per measured candidate), search.md, search.json and plots/search.png."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.lifecycle import finish_run, run_lifecycle
from flows.repository import RepositorySource
from flows.served import read_served
from tasks.correctness import correctness_task
from tasks.export import export_task
from tasks.search_eval import search_task
from tasks.server import server_task
from tbench.capacity.evaluate import RateEvaluator, RepositoryRateEvaluator, rate_fields
from tbench.capacity.report import pool_answer, write_capacity_files
from tbench.capacity.request import CapacityRequest
from tbench.capacity.statistics import PercentileRule, percentile_measurement
from tbench.core.errors import ConfigError
from tbench.node import hardware as hw
from tbench.planning.run_plan import RunPlan
from tbench.request.adapter import adapter_for
from tbench.request.benchmark import DEFAULT_TOLERANCES, BenchmarkRequest, request_from_argv
from tbench.request.repository import check_repository
from tbench.request.served import resolve_served
from tbench.search.config_edit import candidate_of, edited_config, to_text
from tbench.search.evaluate import (
    RepositoryEvaluator,
    RepositoryVariant,
    ServedVariant,
    TritonEvaluator,
    artifact_key,
)
from tbench.search.plan import (
    CHECKPOINT,
    CONTEXT,
    check_resumable,
    checkpoint_names,
    fit_search,
    pipeline_steps,
    repository_search_context,
    repository_space,
    resume_checkpoint,
    resumed_checkpoints,
    search_context,
    search_server_options,
    searchable_model,
    step_space,
    variant_plan,
)
from tbench.search.report import partial_result, write_repository_search_files, write_search_files
from tbench.search.request import SearchRequest
from tbench.search.strategies import Candidate, Checkpoint, Observation, SearchResult
from tbench.stages.converters.registry import ConversionOptions
from tbench.stages.correctness import require_passed
from tbench.stages.store import run_url
from tbench.stages.sweep import measured_inputs
from tbench.stages.tracker import RunTracker
from tbench.team.pools import check_worker_hardware, pool_of
from tbench.triton.repository import serves_natively
from tbench.triton.server_modes import make_server
from tbench.triton.user_repository import CONFIG_FILE, parse_model_ref, read_config


@flow(name="triton-search")
def search_flow(request: BenchmarkRequest = BenchmarkRequest(), search: SearchRequest = SearchRequest()) -> str:
    """Search the configuration grid of one model on one server; returns the URL of the run folder."""
    return run_search(request, search)


def run_search(request: BenchmarkRequest, search: SearchRequest, capacity: CapacityRequest | None = None) -> str:
    """The search on this machine: at a fixed concurrency, or (a capacity plan) each candidate by its sustainable
    rate under the SLO, with the capacity answer written beside the search's files."""
    if getattr(request, "repository", None):  # a model of the user's own repository: its config.pbtxt is the base
        return repository_search(request, search, capacity)
    hardware = hw.detect()
    check_worker_hardware(hardware)
    req = request.resolve(hardware.has_gpu)
    adapter = adapter_for(req)
    search, _ = fit_search(search, req)  # the CLI has said why where the grid shrank
    run_plan = RunPlan(req, hardware)
    plan = variant_plan(search.space, req, hardware.has_gpu)
    context = search_context(req, search, plan, hardware)
    resume = resume_checkpoint(search.resume_from, context)
    request_json = {"request": req.model_dump(mode="json"), "search": search.model_dump(mode="json")}
    if capacity is not None:
        request_json["capacity"] = capacity.model_dump(mode="json")
    kind = "capacity" if capacity is not None else "search"
    with run_lifecycle(req, hardware, f"{req.model}-{kind}", request_json) as tracker:
        layout = tracker.layout
        layout.repository_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = Checkpoint(layout.run_dir / CHECKPOINT)
        if resume is not None:  # the new run starts from a copy: the interrupted run's folder stays as it was
            shutil.copyfile(resume, checkpoint.path)
            shutil.copyfile(resume.with_name(CONTEXT), layout.run_dir / CONTEXT)
        server, result, device = None, None, None
        concurrency = search.concurrency or max(req.concurrency)
        try:
            with tracker.stage("export"):
                module = adapter.build()
                artifacts = {}
                for precision in dict.fromkeys(p for _, p in plan.values()):
                    formats = list(dict.fromkeys(f for f, p in plan.values() if p is precision))
                    out = (
                        layout.models_dir
                        if len({p for _, p in plan.values()}) == 1
                        else layout.models_dir / precision.value
                    )
                    options = ConversionOptions.for_run(req, precision, max(search.space.max_batch_sizes))
                    for artifact in export_task(adapter, module, formats, out, options):
                        artifacts[(artifact.format, precision)] = artifact
                tracker.save_json(layout.iospec_json, adapter.io_spec().model_dump())
            with tracker.stage("correctness"):
                for (_fmt, precision), artifact in artifacts.items():
                    atol, rtol = (
                        DEFAULT_TOLERANCES[precision]
                        if precision is not req.precision
                        else (req.tolerance_atol, req.tolerance_rtol)
                    )
                    tracker.correctness += correctness_task(adapter, module, [artifact], atol, rtol)
                tracker.save_json(layout.correctness_json, [c.model_dump(mode="json") for c in tracker.correctness])
                require_passed(tracker.correctness)
                perf_inputs, tracker.measured_shapes = measured_inputs(
                    adapter, module, layout.run_dir / "perf_input.json"
                )
            with tracker.stage("server"):
                server = make_server(
                    req.server,
                    layout.repository_dir,
                    layout.server_log,
                    http_port=req.http_port,
                    grpc_port=req.grpc_port,
                    url=req.server_url,
                    **search_server_options(req, hardware),
                )
                backends = server.backends()
                variants = {
                    entry: ServedVariant(artifacts[key], serves_natively(key[0], backends))
                    for entry, key in plan.items()
                }
                # one instance kind for every candidate: the GPU only where every variant runs there
                served = {e: (v.artifact.format, v.native) for e, v in variants.items()}
                device = run_plan.one_device(served)
            with tracker.stage("server-start"):
                server_task(server)
                context["server"] = server.identity()
                if resume is not None:  # the same server as well: its address, binary or image, and version
                    check_resumable(resume, context)
                (layout.run_dir / CONTEXT).write_text(json.dumps(context, indent=2))  # before the first measurement
            evaluator_args = dict(
                server=server,
                repository=layout.repository_dir,
                variants=variants,
                name=req.model + req.triton_suffix,  # a remote run's own name
                concurrency=concurrency,
                measurement=req.measurement,
                work_dir=layout.run_dir / "search",
                inputs=perf_inputs,
                online_batch_size=req.online_batch_size,
                kind=device.kind,
                cpu_cores=hardware.cpu_cores,
                gpu_env=run_plan.gpu_env,
            )
            if capacity is None:
                if search.objective.p99_budget_ms is not None:  # a p99 a candidate is judged by needs the requests
                    evaluator_args["measurement"] = percentile_measurement(req.measurement, PercentileRule())
                evaluator = TritonEvaluator(**evaluator_args, load_budget_ms=search.load_budget_ms)
            else:
                evaluator = RateEvaluator(
                    **evaluator_args,
                    **rate_fields(capacity, layout.run_dir / "arrivals", adapter.given_samples, req.measurement.seed),
                    gpu_uuids=tuple(device.gpu_uuids),
                )
            start = Candidate(
                instances=req.model_instances,
                max_batch_size=req.max_batch_size,
                preferred_batch_sizes=tuple(req.preferred_batch_sizes),
                queue_delay_us=req.max_queue_delay_us,
                format=search.space.formats[0],
            )
            with tracker.stage("search"):
                result = search_task(
                    search.strategy,
                    search.space,
                    search.objective,
                    evaluator,
                    checkpoint,
                    budget_fraction=search.budget_fraction,
                    start=start,
                    label=layout.run_id,
                    # a capacity candidate's figure is a rate search, with no windows' noise to confirm
                    confirm_rounds=search.confirm_rounds if capacity is None else 0,
                )
        except BaseException as err:
            _finish(tracker, req, search, hardware, server, result, concurrency, device, capacity, error=err)
            raise
        return _finish(tracker, req, search, hardware, server, result, concurrency, device, capacity)


def repository_search(request: BenchmarkRequest, search: SearchRequest, capacity: CapacityRequest | None = None) -> str:
    """Search the config of a model of the user's repository (`--repository DIR --model NAME[:VERSION]`) in a copy
    served by a server of ours: each candidate the user's config.pbtxt with the searched fields edited, the user's
    own config measured the same way, the recommended config.pbtxt written into the run folder. An ensemble's steps
    are searched one after another, each with the steps before it at their best, the pipeline measured whole.
    `capacity`: a capacity plan, each candidate judged by its sustainable rate under the SLO (`tbench capacity
    --repository`), the answer written beside. Returns the run folder's URL."""
    hardware = hw.detect()
    check_worker_hardware(hardware)
    req = check_repository(request)
    name, version = parse_model_ref(req.repository_model)
    target = searchable_model(req.repository, req.repository_model)
    steps = pipeline_steps(target)
    context = repository_search_context(req, search, hardware)
    checkpoints = checkpoint_names(target)
    resumed = resumed_checkpoints(search.resume_from, context, checkpoints)
    request_json = {"request": req.model_dump(mode="json"), "search": search.model_dump(mode="json")}
    if capacity is not None:
        request_json["capacity"] = capacity.model_dump(mode="json")
    kind = "capacity" if capacity is not None else "search"
    with run_lifecycle(req, hardware, f"{name}-{kind}", request_json) as tracker:
        layout = tracker.layout
        source = RepositorySource(req, hardware, layout)
        found = RepositoryFindings(source=source, pipeline=name if target.is_ensemble else "", model=name)
        concurrency = search.concurrency or 1
        for checkpoint, path in resumed.items():  # the new run starts from copies: the interrupted run stays as it was
            shutil.copyfile(path, layout.run_dir / checkpoint)
        try:
            source.prepare(tracker)  # the plan, and the copy in layout.repository_dir
            served, _, shape_sets = read_served(req, name, version, tracker, source.server)  # starts and loads
            context["server"] = source.server.identity()
            if resumed:  # the same server as well: its address, binary or image, and version
                check_resumable(next(iter(resumed.values())), context)
            (layout.run_dir / CONTEXT).write_text(json.dumps(context, indent=2))  # before the first measurement
            if len(shape_sets) > 1:
                raise ConfigError("a --shape sweep is measured by `tbench run`; search takes one shape")
            sweep = resolve_served(req, served.config.max_batch_size, hardware.has_gpu)
            concurrency = search.concurrency or max(sweep.concurrency)
            measurement = sweep.measurement
            if search.objective.p99_budget_ms is not None and capacity is None:  # a p99 judged needs the requests
                measurement = percentile_measurement(measurement, PercentileRule())
            found.batch_size = sweep.online_batch_size
            evaluator_args = dict(
                server=source.server,
                repository=layout.repository_dir,
                variants={"": RepositoryVariant(served.io_spec)},
                name=name,
                concurrency=concurrency,
                measurement=measurement,
                work_dir=layout.run_dir / "search",
                inputs=shape_sets[0].inputs,
                online_batch_size=sweep.online_batch_size,
                cpu_cores=hardware.cpu_cores,
                base=read_config(layout.repository_dir / name / CONFIG_FILE),
            )
            if capacity is None:
                evaluator = RepositoryEvaluator(**evaluator_args, load_budget_ms=search.load_budget_ms)
            else:
                evaluator = RepositoryRateEvaluator(
                    **evaluator_args, **rate_fields(capacity, layout.run_dir / "arrivals", None, req.measurement.seed)
                )
            with tracker.stage("your-config"):  # first, as written: the search's first candidate loads from its load
                found.yours = measure_users_config(
                    [evaluator_for(evaluator, step, found.pipeline) for step in steps], layout.run_dir / "yours"
                )
            evaluator.read_back(found.yours)
            for step, checkpoint in zip(steps, checkpoints):
                step_evaluator = evaluator_for(evaluator, step, found.pipeline)
                if capacity is None and step == steps[0]:  # every other step still as written: the same pipeline
                    step_evaluator.as_written = found.yours
                found.evaluators[step] = step_evaluator
                with tracker.stage(f"search-{step}" if found.pipeline else "search"):
                    found.results[step] = search_task(
                        search.strategy,
                        searched_space(search, step_evaluator, target).space,
                        search.objective,
                        step_evaluator,
                        Checkpoint(layout.run_dir / checkpoint),
                        budget_fraction=search.budget_fraction,
                        start=candidate_of(step_evaluator.base),
                        label=f"{layout.run_id}-{step}" if found.pipeline else layout.run_id,
                        # a capacity candidate's figure is a rate search, with no windows' noise to confirm
                        confirm_rounds=search.confirm_rounds if capacity is None else 0,
                    )
                if found.pipeline:  # the next step is searched with this one at its best, from its best load
                    adopt_best(step_evaluator, found.results[step])
                    evaluator.start_load = step_evaluator.start_load
            found.recommended = write_recommended(found, source.plan.source, layout.run_dir)
        except BaseException as err:
            _finish(
                tracker, req, search, hardware, source.server, found.result, concurrency, None, capacity, err, found
            )
            raise
        return _finish(
            tracker, req, search, hardware, source.server, found.result, concurrency, None, capacity, None, found
        )


@dataclass
class RepositoryFindings:
    """What a repository search found, for its report: each searched model's result (an ensemble's steps, else the
    model's), the user's own config measured the same way, and the recommended config.pbtxt files."""

    source: RepositorySource | None = None
    pipeline: str = ""  # the ensemble whose steps were searched
    model: str = ""  # the model searched (the pipeline, for an ensemble), as the reports name it
    batch_size: int = 1  # the samples per request it was measured with
    results: dict[str, SearchResult] = field(default_factory=dict)
    evaluators: dict[str, RepositoryEvaluator] = field(default_factory=dict)
    yours: Observation | None = None
    recommended: dict[str, Path] = field(default_factory=dict)

    @property
    def result(self) -> SearchResult | None:
        """The last search's: a pipeline's last step was measured with every step at its best."""
        return list(self.results.values())[-1] if self.results else None

    @property
    def users_configs(self) -> dict[str, Path]:
        """Each searched model's own config.pbtxt, as written in the user's folder."""
        plan = self.source.plan if self.source else None
        return {step: plan.source / step / CONFIG_FILE for step in self.evaluators} if plan else {}

    def manifest(self) -> dict:
        return {
            **(self.source.manifest() if self.source else {}),
            "your_config": self.yours.model_dump(mode="json") if self.yours else None,
            "recommended_config": {step: str(path) for step, path in self.recommended.items()},
        }


def evaluator_for(evaluator: RepositoryEvaluator, model: str, pipeline: str) -> RepositoryEvaluator:
    """The evaluator that edits `model`'s config: the searched model's own, or a step's of `pipeline` (its files
    under search/<step>/, the pipeline measured)."""
    if not pipeline:
        return evaluator
    return replace(
        evaluator,
        name=model,
        pipeline=pipeline,
        base=read_config(evaluator.repository / model / CONFIG_FILE),
        work_dir=evaluator.work_dir / model,
    )


def searched_space(search: SearchRequest, evaluator: RepositoryEvaluator, target) -> SearchRequest:
    """The grid of the model an evaluator edits: fitted to its config (and to the pipeline's max batch)."""
    if evaluator.pipeline:
        return step_space(search, evaluator.base.max_batch_size, target.config.max_batch_size)
    return repository_space(search, evaluator.base.max_batch_size)[0]


def adopt_best(evaluator: RepositoryEvaluator, result: SearchResult) -> None:
    """A pipeline's step served at its best from now on (as the user wrote it where nothing was feasible)."""
    best = result.best
    chosen = evaluator if best is not None else replace(evaluator, verbatim=True)
    chosen.load(chosen.write(best.candidate if best is not None else candidate_of(evaluator.base)))


def planned_steps(found: RepositoryFindings) -> dict[str, dict]:
    """Each searched step's configuration in the pipeline's plan: its best, or where no candidate of it met the SLO
    the user's config, served as written (adopt_best), marked `yours` so the plan says so."""
    steps = {}
    for step, result in found.results.items():
        if result.best is not None:
            steps[step] = result.best.candidate.model_dump(mode="json")
        else:
            steps[step] = candidate_of(found.evaluators[step].base).model_dump(mode="json") | {"yours": True}
    return steps


def measure_users_config(evaluators: list[RepositoryEvaluator], work_dir: Path) -> Observation:
    """The user's config.pbtxt as written (no field edited; every step's, for a pipeline), measured as every
    candidate is, before the search (Model Analyzer measures the default config as one of its configs): its load,
    where it holds the budget, is where the first candidate's load search starts, and a candidate whose config is the
    same text is not measured again (RepositoryEvaluator.as_written)."""
    *others, last = evaluators
    for evaluator in others:  # a pipeline's other steps as the user wrote them
        own = replace(evaluator, verbatim=True)
        own.load(own.write(candidate_of(own.base)))
    own = replace(last, work_dir=work_dir, verbatim=True)
    return own.evaluate(candidate_of(last.base))


def yours_is_best(found: RepositoryFindings) -> bool:
    """Every searched model's best is its config as the user wrote it (the same text): the search found nothing
    better than the user's config, which was measured as its candidate."""
    return bool(found.results) and all(
        r.best is not None and found.evaluators[m].is_as_written(r.best.candidate) for m, r in found.results.items()
    )


def write_recommended(found: RepositoryFindings, user_root: Path, run_dir: Path) -> dict[str, Path]:
    """recommended/<model>/config.pbtxt per searched model with a best: the user's own config.pbtxt (not the copy's,
    which a backend the server lacks rewrites) with the best candidate's fields, ready to copy back."""
    written = {}
    for model, result in found.results.items():
        if (best := result.best) is None:
            continue
        evaluator = found.evaluators[model]
        config = edited_config(
            read_config(user_root / model / CONFIG_FILE), best.candidate, evaluator.threads(best.candidate)
        )
        path = run_dir / "recommended" / model / CONFIG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_text(config))
        written[model] = path
    return written


def _finish(
    tracker: RunTracker,
    req,
    search: SearchRequest,
    hardware,
    server,
    result,
    concurrency: int,
    device=None,
    capacity: CapacityRequest | None = None,
    error: BaseException | None = None,
    found: RepositoryFindings | None = None,
) -> str:
    """Stop the server, write what the search found (whatever it got to) and store the run folder
    (flows/lifecycle.py: finish_run)."""
    layout = tracker.layout
    model = found.model if found else req.model
    manifest = {
        "request": req.model_dump(mode="json"),
        "search": search.model_dump(mode="json"),
        **({"capacity": capacity.model_dump(mode="json")} if capacity is not None else {}),
        "hardware": hardware.model_dump(),
        **(found.manifest() if found else {}),
        "artifact_url": run_url(req.output, layout.run_id),
        "local_dir": str(layout.run_dir),
    }

    answers = []

    def report() -> None:
        nonlocal result
        with tracker.stage("report"):
            if result is None and tracker.layout.run_dir.joinpath(CHECKPOINT).exists():
                result = partial_result(layout, search)
            if result is not None:
                what = f"{req.repository_model} from {req.repository}" if found else f"{req.model} ({req.size})"
                title = (
                    f"Configuration search: {what}, concurrency {concurrency}, "
                    f"{device.label if device else hardware.gpu_label}"
                )
                if found is None:
                    text = write_search_files(layout, result, title)
                else:
                    text = write_repository_search_files(
                        layout,
                        found.results or {req.model: result},  # an interrupted search: what its checkpoint holds
                        title,
                        found.yours,
                        found.recommended,
                        found.users_configs,
                        found.pipeline,
                        yours_is_best(found),
                    )
                create_markdown_artifact(
                    text,
                    key=artifact_key(f"search-report-{model}"),
                    description="Configuration search result (the plot is in the run folder)",
                )
        if capacity is not None and result is not None:
            with tracker.stage("capacity-report"):
                work = layout.run_dir / "search"
                if found and found.pipeline and found.results:  # the last step's rate searches: the pipeline's
                    work = work / list(found.results)[-1]
                answer = pool_answer(
                    result,
                    work,
                    capacity,
                    model=model,
                    pool=capacity.pool or pool_of(hardware),
                    hardware=device.label if device else hardware.gpu_label,
                    batch_size=found.batch_size if found else req.online_batch_size,
                    run_url=run_url(req.output, layout.run_id),
                )
                if found and found.pipeline:  # the pipeline's plan: every step at its chosen configuration
                    answer = answer.model_copy(update={"steps": planned_steps(found)})
                answers.append(answer)
                text = write_capacity_files(layout.run_dir, [answer], capacity, model)
                create_markdown_artifact(
                    text,
                    key=artifact_key(f"capacity-report-{model}"),
                    description="Capacity plan (the plot is in the run folder)",
                )

    def summary() -> dict:
        best = result.best if result is not None else None
        return {
            "measured": result.measured if result else 0,
            "grid_size": result.grid_size if result else None,
            "best": best.candidate.key if best else None,
            **(
                {"capacity": answers[0].model_dump(mode="json", include={"status", "reason", "plan", "pool"})}
                if answers
                else {}
            ),
        }

    return finish_run(tracker, error, manifest, server=server, output=req.output, report=report, summary=summary)


if __name__ == "__main__":
    # `python -m flows.search resnet50 size=small search='{"strategy": "exhaustive"}'`
    args = [a for a in sys.argv[1:] if not a.startswith("search=")]
    given = [a.partition("=")[2] for a in sys.argv[1:] if a.startswith("search=")]
    print(
        search_flow(request_from_argv(args), SearchRequest.model_validate_json(given[0]) if given else SearchRequest())
    )
