"""The reference pages, generated from the code at every `mkdocs build` (mkdocs-gen-files runs this file): the CLI from
typer, the request fields from the pydantic models, the results columns from tbench.core.metrics, the deployments from
deployments/prefect.yaml, how far to trust each verdict from benchmarks/results/calibration.json. Nothing here is
written twice: a new option, field, column, deployment or calibration figure appears by itself."""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from pathlib import Path

import click
import mkdocs_gen_files
import typer.cli
import typer.main
import yaml
from pydantic import BaseModel

from tbench.capacity.rate_search import CONFIRMATIONS, REPEATS
from tbench.search.confirm import CONFIRM_ROUNDS, CONFIRM_WIDTH, SMART_CONFIRM_ROUNDS
from tbench.search.objective import TIE_MARGIN
from tbench.triton.monitor import METRICS_INTERVAL_MS

ROOT = Path(__file__).resolve().parents[1]


def cli_page() -> str:
    from tbench.cli import app

    command = typer.main.get_command(app)
    docs = typer.cli.get_docs_for_click(
        obj=command, ctx=click.Context(command, info_name="tbench"), name="tbench", title="CLI reference"
    )
    return docs + "\n"


def _type_name(annotation) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return text.replace("typing.", "").replace("NoneType", "None").replace("|", "&#124;")


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models a field's type holds (X, X | None, list[X], dict[str, X])."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _default(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return "(built)"
    value = field.default
    if isinstance(value, BaseModel):
        return "(defaults below)"
    return f"`{value!r}`" if value is not None else ""


def model_section(model: type[BaseModel], seen: set) -> list[str]:
    """One table per model, then one per nested model, each once."""
    if model in seen:
        return []
    seen.add(model)
    doc = inspect.cleandoc(model.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    lines = [f"## {model.__name__}", "", doc, "", "| field | type | default | what it is |", "|---|---|---|---|"]
    nested = []
    for name, field in model.model_fields.items():
        description = (field.description or "").replace("|", "&#124;").replace("\n", " ")
        lines.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
        nested += _models_in(field.annotation)
    lines.append("")
    for m in nested:
        lines += model_section(m, seen)
    return lines


def request_page() -> str:
    from flows.matrix import MatrixRequest
    from tbench.capacity.fleet import Fleet
    from tbench.capacity.request import CapacityRequest, FleetRequest
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.request.colocated import ColocatedRequest
    from tbench.search.request import SearchRequest

    lines = [
        "# Request reference",
        "",
        "The fields of the requests the flows take: what the CLI builds from its options, what `tbench submit` sends, "
        "and the form the Prefect UI shows for each deployment (the same models, with the same descriptions).",
        "",
    ]
    seen: set = set()
    for model in (BenchmarkRequest, SearchRequest, CapacityRequest, MatrixRequest, ColocatedRequest, FleetRequest):
        lines += model_section(model, seen)
    lines += ["# The fleet file", "", "What `tbench fleet FLEET` reads (YAML or JSON).", ""]
    lines += model_section(Fleet, seen)
    return "\n".join(lines) + "\n"


def results_page() -> str:
    from tbench.core.metrics import COLUMN_DESCRIPTIONS, MEASUREMENT_COLUMNS, PUBLISHED_COLUMNS, SERVER_COLUMNS

    lines = [
        "# Results columns",
        "",
        "One row per measured point, in `results.csv` and `results.parquet` of every run folder and in the results "
        "dataset across runs (`<root>/results/model=.../gpu=.../date=.../<run id>.parquet`, which adds the run's "
        "id and status). Latencies are in milliseconds.",
        "",
    ]
    for title, columns in (
        ("The published tables' columns", PUBLISHED_COLUMNS),
        ("How the point was measured", MEASUREMENT_COLUMNS),
        ("What the server did", SERVER_COLUMNS),
    ):
        lines += [f"## {title}", "", "| column | what it is |", "|---|---|"]
        lines += [f"| `{c}` | {COLUMN_DESCRIPTIONS[c]} |" for c in columns]
        lines.append("")
    return "\n".join(lines) + "\n"


def deployments_page() -> str:
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    lines = [
        "# Deployments",
        "",
        "Every deployment in `deployments/prefect.yaml`, as `tbench stack up` (or `prefect deploy --all`) creates "
        "them. Their parameters are the [requests](request.md); schedules are created switched off.",
        "",
        "| deployment | entrypoint | work pool | schedules | what it does |",
        "|---|---|---|---|---|",
    ]
    for d in spec["deployments"]:
        path, function = d["entrypoint"].split(":", 1)
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), function).name
        pool = (d.get("work_pool") or {}).get("name", "")
        schedules = ", ".join(
            f"`{s.get('cron') or s.get('interval')}` {s.get('timezone', '')}{'' if s.get('active', True) else ' (off)'}"
            for s in d.get("schedules") or []
        )
        description = " ".join((d.get("description") or "").split())
        lines.append(f"| `{flow}/{d['name']}` | `{d['entrypoint']}` | `{pool}` | {schedules} | {description} |")
    return "\n".join(lines) + "\n"


# What each verdict decides, in words; its figures, parameters and conditions come from the record
VERDICTS = {
    "compare": "`tbench compare`'s verdict and exit code: each matched point's throughput, p99 and mean latency "
    "(the means of its trials) against the run-to-run spread (measured by the runs' trials, or stated) by Welch's "
    "test, and against their windows' noise (k standard errors, at least the minimum effect); no spread, or one "
    "too wide for the minimum effect, gives undetermined; a point the candidate lost is never left out. Simulated at "
    "run-to-run spreads of 2, 5, 10 and 20% and a bimodal one.",
    "kept_up": "Whether a rate point carried the load it was offered (ok, behind, client-bound, undetermined): served "
    "against offered within the arrivals' randomness and the latency's trend, from every request's timestamps "
    "(exported or the server's trace), else from the windows, ok there only when the server's compute time per "
    "request on its instances shows the offered load below capacity.",
    "capacity": "A capacity plan's sustainable rate: the highest Poisson rate whose percentile holds and that kept up, "
    "from a bracketing search in which each rate is measured until its runs, pooled (with its neighbours' where its "
    f"own cannot decide), decide (at most {REPEATS} runs), and whose answer rests on at least {1 + CONFIRMATIONS}. "
    "Per case, `at_0.9_of_truth` says how many runs, pooled, a rate at 0.9 of the true one needs to pass in 90% of "
    "searches (from the spread of each run's count over the SLO), and how long they take.",
    "history": "The history's regression alert and `tbench history`'s exit code: a change alerts once, on the run that "
    "confirms it, put down to what differed in the manifests of the neighbouring runs.",
    "search": "The search's best configuration: candidates ranked on the mean's standard error, ties within "
    f"{100 * TIE_MARGIN:g}%, feasibility on p99 plus its error within the budget; where the leaders cannot be "
    f"separated, they are measured again (up to {CONFIRM_ROUNDS} rounds of {CONFIRM_WIDTH}, {SMART_CONFIRM_ROUNDS} in "
    "a smart search) and judged on all their windows; undetermined where that still cannot decide.",
    "energy": f"Energy per inference: the serving GPUs' energy counter, polled every {METRICS_INTERVAL_MS} ms, over "
    "the span requests were served, with its uncertainty.",
}


def _cell(value, limit: int = 400) -> str:
    """A figure in a table cell: numbers to 4 significant figures, nested ones inline, long lists left to the record."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        text = "; ".join(f"{k}: ({_cell(v)})" if isinstance(v, dict) else f"{k}: {_cell(v)}" for k, v in value.items())
    elif isinstance(value, list):
        text = ", ".join(_cell(v) for v in value)
    else:
        text = str(value)
    if len(text) > limit:
        text = f"{len(value)} entries: see the record" if isinstance(value, list | dict) else text[:limit] + "…"
    return text.replace("|", "&#124;")


def verdicts_page() -> str:
    """benchmarks/results/calibration.json as a page: per rule, its goals and measured shares, every other figure the
    harness reported, its parameters and the conditions tried."""
    import json

    record = json.loads((ROOT / "benchmarks" / "results" / "calibration.json").read_text())
    prov = record["provenance"]
    lines = [
        "# How far to trust a verdict",
        "",
        "Every verdict tbench gives (ok, behind, regression, best) was measured against a known truth: a simulated "
        "server, series or power trace whose answer is known, driving the project's own decision code unchanged. "
        "This page is generated from `benchmarks/results/calibration.json` (`benchmarks/calibration.py`), commit "
        f"`{str(prov['commit'])[:10]}`{' (dirty)' if prov['dirty'] else ''}, {prov['started'][:10]}, "
        f"seed {record['seed']}, scale {record['scale']:g}, {prov['wall_s']:.0f} s.",
        "",
    ]
    for rule, words in VERDICTS.items():
        goals = record.get("goals", {}).get(rule, {})
        figures = record.get("rules", {}).get(rule, {})
        lines += [f"## {rule}", "", words, "", "| goal | measured | met |", "|---|---|---|"]
        for key, goal in goals.items():
            met = {True: "yes", False: "**no**", None: "not run"}[goal["met"]]
            lines.append(f"| {goal['words']} (`{key}` {goal['goal']}) | {_cell(goal['value'])} | {met} |")
        others = {k: v for k, v in figures.items() if k not in goals}
        if others:
            lines += ["", "Every figure the harness reported:", "", "| figure | value |", "|---|---|"]
            lines += [f"| `{k}` | {_cell(v)} |" for k, v in others.items()]
        for part, title in (("parameters", "Parameters (read from the code)"), ("conditions", "Conditions tried")):
            items = record.get(part, {}).get(rule, {})
            if items:
                lines += ["", f"{title}:", "", "| name | value |", "|---|---|"]
                lines += [f"| `{k}` | {_cell(v)} |" for k, v in items.items()]
        lines.append("")
    return "\n".join(lines) + "\n"


for path, build in (
    ("reference/cli.md", cli_page),
    ("reference/request.md", request_page),
    ("reference/results.md", results_page),
    ("reference/deployments.md", deployments_page),
    ("concepts/verdicts.md", verdicts_page),
):
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(build())
