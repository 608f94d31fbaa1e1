"""The matrix flow: wiring only. Fans a benchmark out over models x formats x precisions x GPU pools through the
pools' deployments (one child flow run each, in parallel), gathers every run's stored results and writes one cross-GPU
comparison report (report.md and report.html) next to the runs in the artifact store.

Children that do not finish do not stop the matrix. Each child is watched within two limits (`start_timeout_s` while
its pool has no online worker, `child_timeout_s` in all) and cancelled past them (tasks/matrix_runs.py); a failed,
crashed, cancelled or timed-out child becomes a row with its state and a one-line reason. The report compares the
children that completed (points that failed inside a completed run show as such) and lists the others in its section
"Runs that did not finish"; a failed child's partial results stay in its own run folder, out of the comparison.

The flow's final state: Completed (returning the report folder's URL) when every child completed. Otherwise, once the
report and manifest are stored, it fails with a one-line `MatrixIncomplete` naming how many children did not finish
and where the report is, so the UI, `tbench submit` and a caller see a matrix that is not whole.
"""

from __future__ import annotations

import itertools
import os

import pandas as pd
from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, Field

from tasks.matrix_runs import matrix_run
from tasks.store import store_task
from tbench.core.errors import BenchError, one_line
from tbench.core.layout import RunLayout, new_run_id
from tbench.core.storage import url_to_fs
from tbench.results.html_report import write_html_report
from tbench.results.matrix_report import matrix_markdown
from tbench.stages.store import discard_staged, run_url, staging_root
from tbench.stages.tracker import RunTracker
from tbench.team.matrix_runs import ChildRun, children_cancelled_on_interrupt
from tbench.team.pools import POOLS


class MatrixIncomplete(BenchError):
    """Some children did not finish; the report of the others is stored."""


class MatrixRequest(BaseModel):
    """What to run where; every other benchmark setting is shared by all runs (`request`)."""

    models: list[str] = Field(["resnet50"], description="Model adapters to run.")
    formats: list[str] | None = Field(
        None, description="Formats to serve, one run each; the model's first format by default."
    )
    precisions: list[str] = Field(
        ["fp32"],
        description="Precisions to serve, one run each (what each format can carry: "
        "tbench/core/precision.py; int8 needs trt or tf-trt on GPU pools).",
    )
    pools: list[str] = Field(["cpu"], description="Work pools (GPU kinds) to run on: " + ", ".join(POOLS) + ".")
    request: dict = Field(
        default_factory=dict,
        description="Other BenchmarkRequest fields for every run, e.g. {'size': 'small', 'batch_sizes': [1, 8]}.",
    )
    output: str | None = Field(
        None,
        description="Artifact root of the runs and the matrix report; the workers' TBENCH_ARTIFACT_ROOT by default.",
    )
    child_timeout_s: float = Field(
        4 * 3600,
        gt=0,
        description="Longest a child run may take from its submission to "
        "its end (waiting for a worker and for its GPU included); it is then cancelled and "
        "reported as not finished.",
    )
    start_timeout_s: float = Field(
        600,
        gt=0,
        description="Longest a child may stay scheduled on a pool that has no "
        "online worker; it is then cancelled, so a worker that comes later does not run it. "
        "A child queued on a pool whose worker is alive waits on, up to child_timeout_s.",
    )


def child_parameters(matrix: MatrixRequest, model: str, fmt: str | None, precision: str) -> dict:
    request = {**matrix.request, "model": model, "precision": precision}
    if fmt:
        request["formats"] = [fmt]
    if matrix.output:
        request["output"] = matrix.output
    return {"request": request}


def store_parent_run(tracker: RunTracker, layout: RunLayout, root: str, **record) -> str:
    """A run that gathered its children's runs (a matrix, a capacity plan across pools) stored with its manifest
    (`record`: its own fields), then its staged folder discarded: its report is in the store, and a worker's disk
    keeps nothing of it. Returns the stored run's URL."""
    with tracker.stage("store"):
        manifest = tracker.manifest(**record, artifact_url=run_url(root, layout.run_id), local_dir=str(layout.run_dir))
        url = store_task(layout.run_dir, root, layout.run_id, manifest)
    discard_staged(layout.run_dir, root)
    return url


def settled(future, pool: str, model: str, fmt: str | None, precision: str) -> dict:
    """The child's row; a matrix-run task that itself broke (it catches everything it expects) is a row too."""
    outcome = future.result(raise_on_failure=False)
    if isinstance(outcome, dict):
        return outcome
    return ChildRun(
        pool=pool,
        model=model,
        format=fmt or "(default)",
        precision=precision,
        state="UNKNOWN",
        reason=one_line(f"the matrix-run task broke: {outcome}"),
    ).model_dump()


def load_results(runs: list[dict]) -> pd.DataFrame:
    """The stored results of the children that completed (a failed child's partial results stay out)."""
    frames = []
    for r in runs:
        if r["state"] != "COMPLETED" or not r["run_url"]:
            continue
        fs, path = url_to_fs(r["run_url"] + "/results.parquet")
        if fs.exists(path):
            with fs.open(path, "rb") as f:
                frames.append(pd.read_parquet(f).assign(pool=r["pool"], run_url=r["run_url"]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@flow(name="triton-matrix")
def matrix_flow(matrix: MatrixRequest = MatrixRequest()) -> str:
    """Run the matrix through the deployments and write the cross-GPU report; returns the report folder's URL."""
    root = matrix.output or os.environ.get("TBENCH_ARTIFACT_ROOT", "runs")
    layout = RunLayout(staging_root(root), new_run_id("matrix")).create()
    tracker = RunTracker(layout)
    combos = list(itertools.product(matrix.models, matrix.formats or [None], matrix.precisions, matrix.pools))
    with tracker.stage("runs"), children_cancelled_on_interrupt():
        futures = [
            matrix_run.submit(
                pool,
                model,
                fmt,
                precision,
                child_parameters(matrix, model, fmt, precision),
                matrix.start_timeout_s,
                matrix.child_timeout_s,
            )
            for model, fmt, precision, pool in combos
        ]
        runs = [settled(f, pool, model, fmt, precision) for f, (model, fmt, precision, pool) in zip(futures, combos)]
    unfinished = [r for r in runs if r["state"] != "COMPLETED"]
    with tracker.stage("report"):
        results = load_results(runs)
        if not results.empty:
            results.to_parquet(
                layout.run_dir / "matrix_results.parquet", index=False
            )  # not results.parquet: the runs are in the dataset already
        text = matrix_markdown(results, pd.DataFrame(runs), layout.run_dir)
        layout.report_md.write_text(text)
        write_html_report(layout.report_md)
        create_markdown_artifact(text, key="matrix-report", description="Cross-GPU comparison of the matrix's runs")
    url = store_parent_run(
        tracker, layout, root, matrix=matrix.model_dump(mode="json"), runs=runs, not_finished=len(unfinished)
    )
    if unfinished:  # after the store: the report of the children that finished is there
        raise MatrixIncomplete(incomplete_message(unfinished, len(runs), url))
    return url


def incomplete_message(unfinished: list[dict], total: int, url: str) -> str:
    named = ", ".join(f"{r['pool']}/{r['model']}/{r['format']}/{r['precision']} {r['state']}" for r in unfinished[:3])
    more = f" and {len(unfinished) - 3} more" if len(unfinished) > 3 else ""
    return (
        f"{len(unfinished)} of {total} child runs did not finish ({named}{more}); "
        f"the report of the others, with the reasons, is at {url}"
    )
