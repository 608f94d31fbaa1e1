"""The documentation site builds with --strict (a broken link, a missing page or picture fails), its generated
reference holds every CLI option, request field, results column and deployment, and the README stays short with
links that resolve."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = str(Path(sys.executable).with_name("mkdocs"))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"},  # their banners only
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def page_text(site: Path, page: str) -> str:
    return html.unescape((site / page / "index.html").read_text())


def all_commands(command: click.Command, path: str = "tbench"):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from all_commands(sub, f"{path} {name}")


def test_the_cli_reference_has_every_command_and_option(site):
    from tbench.cli import app

    text = page_text(site, "reference/cli")
    missing = [
        f"{path} {opt}"
        for path, command in all_commands(typer.main.get_command(app))
        for param in command.params
        for opt in param.opts
        if opt.startswith("--") and opt not in text
    ]
    missing += [path for path, _ in all_commands(typer.main.get_command(app)) if path not in text]
    assert not missing, missing


def test_the_request_results_and_deployment_references_are_complete(site):
    from flows.matrix import MatrixRequest
    from tbench.capacity.fleet import Fleet, FleetModel, FleetPool
    from tbench.capacity.request import CapacityRequest, FleetRequest
    from tbench.core.metrics import COLUMN_DESCRIPTIONS, RESULT_COLUMNS
    from tbench.request.benchmark import BenchmarkRequest
    from tbench.request.colocated import ColocatedRequest, ModelLoad
    from tbench.search.request import SearchRequest

    requests = page_text(site, "reference/request")
    flows = (BenchmarkRequest, SearchRequest, CapacityRequest, MatrixRequest, ColocatedRequest, FleetRequest)
    for model in (*flows, ModelLoad, Fleet, FleetModel, FleetPool):
        assert model.__name__ in requests
        assert not [f for f in model.model_fields if f not in requests], model
    assert set(RESULT_COLUMNS) == set(COLUMN_DESCRIPTIONS)
    results = page_text(site, "reference/results")
    assert not [c for c in RESULT_COLUMNS if c not in results]
    deployments = page_text(site, "reference/deployments")
    names = re.findall(
        r"^\s+name: ((?:benchmark|search|capacity|matrix)-\w+)$",
        (ROOT / "deployments" / "prefect.yaml").read_text(),
        re.M,
    )
    assert len(names) >= 20 and not [n for n in names if n not in deployments]


def test_the_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 8 * 1024
    assert "./scripts/run.sh" in readme and "./scripts/test.sh" in readme
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert len(links) >= 20
    assert not [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
