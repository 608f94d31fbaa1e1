"""The reference pages, generated from the code at every `mkdocs build` (mkdocs-gen-files runs this file): the CLI from
typer, the request fields from the pydantic models, the results columns from tbench.core.metrics, the deployments from
deployments/prefect.yaml. Nothing here is written twice: a new option, field, column or deployment appears by itself."""

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
    from tbench.capacity.request import CapacityRequest
    from tbench.request import BenchmarkRequest
    from tbench.search.request import SearchRequest

    lines = [
        "# Request reference",
        "",
        "The fields of the requests the flows take: what the CLI builds from its options, what `tbench submit` sends, "
        "and the form the Prefect UI shows for each deployment (the same models, with the same descriptions).",
        "",
    ]
    seen: set = set()
    for model in (BenchmarkRequest, SearchRequest, CapacityRequest, MatrixRequest):
        lines += model_section(model, seen)
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


for path, build in (
    ("reference/cli.md", cli_page),
    ("reference/request.md", request_page),
    ("reference/results.md", results_page),
    ("reference/deployments.md", deployments_page),
):
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(build())
