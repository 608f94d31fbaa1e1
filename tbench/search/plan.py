"""What a configuration search serves and where it resumes from, decided before anything runs: the variants of its grid
(`variant_plan`), its server's options (`search_server_options`), what its measurements are taken for
(`search_context`, `repository_search_context`) and the checkpoints a resume reads (`resume_checkpoint`,
`resumed_checkpoints`; refused when they were measured for anything else). Pure logic: the CLI checks a search with
it before Prefect starts, and the search flow calls it."""

from __future__ import annotations

import json
from pathlib import Path

from tbench.core.enums import Format, Precision
from tbench.core.errors import ConfigError
from tbench.core.precision import refusal
from tbench.planning.plan import server_options
from tbench.search.request import SearchRequest
from tbench.search.strategies import SearchSpace
from tbench.triton.user_repository import CONFIG_FILE, RepositoryModel, parse_model_ref, read_model

CHECKPOINT = "search.jsonl"
CONTEXT = "search_context.json"  # beside the checkpoint: what its measurements were taken for (search_context)
INPUT_FIELDS = ("input_data", "dataset", "shapes", "input_dtypes", "value_ranges")  # the request's, that shape inputs


def resume_checkpoint(resume_from: str | None, context: dict | None = None) -> Path | None:
    """The checkpoint file a `resume_from` names (a file, or a run folder holding search.jsonl); with a `context`,
    one measured for anything else is refused (check_resumable)."""
    if not resume_from:
        return None
    path = Path(resume_from).expanduser()
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise ConfigError(
            f"resume_from {resume_from!r}: no search checkpoint there "
            f"(expected a {CHECKPOINT} file or a run folder holding one)"
        )
    if context is not None:
        check_resumable(path, context)
    return path


def fit_search(search: SearchRequest, req) -> tuple[SearchRequest, str | None]:
    """The search a model can take (SearchSpace.fitted_to) and, where its grid shrank, the line that says why."""
    if req.shapes and any(len(dims) > 1 for dims in req.shapes.values()):
        from tbench.request.benchmark import adapter_for

        if len(adapter_for(req).shape_sets) > 1:  # a search compares configurations at one shape
            raise ConfigError("a --shape sweep is measured by `tbench run`; search and capacity take one shape")
    space = search.space.fitted_to(req.max_batch_size)
    if space == search.space:
        return search, None
    note = (
        f"model {req.model!r} has no batch axis (served with max_batch_size 0): the search varies instances and "
        "formats only; max batch sizes, preferred batch sizes and queue delays do not apply"
    )
    return search.model_copy(update={"space": space}), note


def search_context(req, search: SearchRequest, plan: dict, hardware) -> dict:
    """What a search's measurements were taken for, besides the server (added once it runs: TritonServer.identity),
    as JSON reads it back. A resume must match it: another model, grid or setting would mix numbers."""
    context = {
        "model": req.model,
        "size": req.size,
        "framework": req.framework,
        "model_file": req.model_file,
        "checkpoint": req.checkpoint,
        "model_options": req.model_options,
        "variants": {entry: f"{fmt.value}:{precision.value}" for entry, (fmt, precision) in plan.items()},
        "concurrency": search.concurrency or max(req.concurrency),
        "online_batch_size": req.online_batch_size,
        "measurement": req.measurement.model_dump(mode="json"),
        **_grid_context(req, search, hardware),
    }
    return json.loads(json.dumps(context))


def _grid_context(req, search: SearchRequest, hardware) -> dict:
    """What every search's context holds: its inputs, grid, objective, load budget and machine."""
    return {
        "inputs": {k: getattr(req, k) for k in INPUT_FIELDS},
        "space": search.space.model_dump(mode="json"),
        "objective": search.objective.model_dump(mode="json"),
        "load_budget_ms": search.load_budget_ms,  # each candidate's load searched against it, or one load
        "machine": {k: getattr(hardware, k) for k in ("cpu_model", "cpu_cores", "gpus", "gpu_uuids", "driver", "cuda")},
    }


def repository_search_context(req, search: SearchRequest, hardware) -> dict:
    """What a search of a model of the user's repository measures for, besides the server: the repository's files
    for that model and every model it calls (each config as written, each other file by its size and time: a model
    file changed since would mix numbers), the inputs, the grid and the load, as JSON reads it back."""
    from tbench.triton.user_repository import needed_models

    root = Path(req.repository).expanduser().resolve()
    files = {}
    for model in needed_models(root, parse_model_ref(req.repository_model)[0]):
        for path in sorted(p for p in model.path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            key = str(path.relative_to(root))
            stat = path.stat()
            files[key] = (
                path.read_text(errors="replace") if path.name == CONFIG_FILE else [stat.st_size, stat.st_mtime_ns]
            )
    context = {
        "repository": str(root),
        "repository_model": req.repository_model,
        "repository_files": files,
        "concurrency": search.concurrency,  # None: the model's own default, which its config (above) decides
        "measurement": req.measurement and req.measurement.model_dump(mode="json"),  # None: the windows' defaults
        **_grid_context(req, search, hardware),
    }
    return json.loads(json.dumps(context))


def resumed_checkpoints(resume_from: str | None, context: dict, names: list[str]) -> dict[str, Path]:
    """The checkpoints of an interrupted repository search that `resume_from` names (its run folder, or a checkpoint
    file in it), by file name (`names`: one per searched model, checkpoint_name); refused in one line where there is
    none or it was measured for anything else (check_resumable)."""
    if not resume_from:
        return {}
    path = Path(resume_from).expanduser()
    folder = path if path.is_dir() else path.parent
    found = {name: folder / name for name in names if (folder / name).is_file()}
    if not found:
        raise ConfigError(
            f"resume_from {resume_from!r}: no search checkpoint there (expected {' or '.join(names)} in a run folder)"
        )
    check_resumable(next(iter(found.values())), context)
    return found


def context_differences(recorded: dict, current: dict) -> list[str]:
    """The fields of `current` that `recorded` differs in (a field it lacks differs), a dict's by its keys."""
    differing = []
    for key, value in current.items():
        there = recorded.get(key)
        if there == value:
            continue
        if isinstance(value, dict) and isinstance(there, dict):
            differing += [f"{key}.{k}" for k in sorted(set(value) | set(there)) if value.get(k) != there.get(k)]
        else:
            differing.append(key)
    return differing


def check_resumable(checkpoint: Path, context: dict) -> None:
    """Refuse, in one line, a checkpoint whose recorded context differs from the new search's in any field `context`
    has (before the server runs it has no `server`), or one that recorded none (from before tbench recorded it)."""
    recorded = checkpoint.with_name(CONTEXT)
    if not recorded.is_file():
        raise ConfigError(
            f"cannot resume from {checkpoint}: it has no {CONTEXT} beside it to say which model, grid and "
            "server it measured (a checkpoint from an older tbench); start a new search"
        )
    if differing := context_differences(json.loads(recorded.read_text()), context):
        raise ConfigError(
            f"cannot resume from {checkpoint}: it was measured with another {', '.join(differing)} "
            f"(see {recorded}); start a new search or resume with the same settings"
        )


def variant_plan(space: SearchSpace, req, has_gpu: bool) -> dict[str, tuple[Format, Precision]]:
    """Each SearchSpace.formats entry as (format, precision); '' is the request's first served format. Refuses what
    cannot be served: an ensemble, a precision the format cannot carry here (tbench/core/precision.py; the search's
    configs apply no GPU accelerator, so no fp16 tf-savedmodel)."""
    plan = {}
    for entry in space.formats:
        fmt, _, precision = entry.partition(":")
        plan[entry] = (
            Format.parse(fmt) if fmt else req.serve_formats[0],
            Precision.parse(precision) if precision else req.precision,
        )
    for fmt, _ in plan.values():
        if fmt is Format.ENSEMBLE:
            raise ConfigError("the configuration search serves one model; ensembles are not searched")
    for entry, (fmt, precision) in plan.items():
        if reason := refusal(fmt, precision, has_gpu=has_gpu, server=req.server, accelerator=None):
            raise ConfigError(f"variant {entry!r}: {reason}")
    return plan


def search_server_options(req, hardware=None) -> dict:
    """The benchmark's server options, in explicit model-control mode (a remote server is explicit already)."""
    options = server_options(req, hardware)
    return options if req.server == "remote" else {**options, "model_control": "explicit"}


def searchable_model(repository: str | Path, model: str) -> RepositoryModel:
    """The model of the user's repository a search edits (NAME[:VERSION]): one model, or an ensemble whose steps
    are searched one after another; an ensemble that has an ensemble as a step refused in one line."""
    name, _ = parse_model_ref(model)
    root = Path(repository).expanduser().resolve()
    found = read_model(root, name)
    for i, step in enumerate(found.steps):
        if read_model(root, step).is_ensemble:
            raise ConfigError(
                f"{found.config_path}: ensemble_scheduling.step[{i}].model_name {step!r} is an ensemble: searching a "
                "pipeline of pipelines is not built yet; name the inner one with --model"
            )
    return found


def pipeline_steps(model: RepositoryModel) -> list[str]:
    """The models a search edits: an ensemble's steps, each once in the order they run; else the model itself."""
    return list(dict.fromkeys(model.steps)) if model.is_ensemble else [model.name]


def step_space(search: SearchRequest, step_max_batch: int, pipeline_max_batch: int) -> SearchRequest:
    """A pipeline step's grid: fitted to its own config, and no max batch below the pipeline's (Triton refuses an
    ensemble that takes larger batches than a step of it)."""
    fitted, _ = repository_space(search, step_max_batch)
    if step_max_batch == 0 or pipeline_max_batch == 0:
        return fitted
    sizes = [b for b in fitted.space.max_batch_sizes if b >= pipeline_max_batch] or [pipeline_max_batch]
    return fitted.model_copy(update={"space": fitted.space.model_copy(update={"max_batch_sizes": sizes})})


def checkpoint_name(step: str, pipeline: bool) -> str:
    """A search's checkpoint file: one per step of a pipeline."""
    return f"search-{step}.jsonl" if pipeline else CHECKPOINT


def checkpoint_names(target: RepositoryModel) -> list[str]:
    """A repository search's checkpoint files, one per searched model (pipeline_steps), in search order."""
    return [checkpoint_name(step, target.is_ensemble) for step in pipeline_steps(target)]


def repository_space(search: SearchRequest, max_batch_size: int) -> tuple[SearchRequest, str | None]:
    """The search a model of the user's repository can take, by its config's max_batch_size (0: no batch axis), and
    the line that says why where the grid shrank."""
    space = search.space.fitted_to(max_batch_size)
    if space == search.space:
        return search, None
    note = (
        "the model's config has max_batch_size 0 (no batch axis): the search varies instances and threads only; max "
        "batch sizes, preferred batch sizes and queue delays do not apply"
    )
    return search.model_copy(update={"space": space}), note
