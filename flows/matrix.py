"""The matrix flow: wiring only. Fans a benchmark out over models x formats x precisions x GPU pools through the
pools' deployments (one child flow run each, in parallel), gathers every run's stored results and writes one cross-GPU
comparison report (report.md and report.html) next to the runs in the artifact store."""

from __future__ import annotations

import itertools
import os

import pandas as pd
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from tasks.html_report import write_html_report
from tasks.matrix_report import matrix_markdown
from tasks.store import run_url, staging_root, store_task
from tbench.layout import RunLayout, new_run_id
from tbench.pools import POOLS
from tbench.run import RunTracker
from tbench.storage import url_to_fs
from tbench.submit import deployment_name, report_link


class MatrixRequest(BaseModel):
    """What to run where; every other benchmark setting is shared by all runs (`request`)."""

    models: list[str] = Field(["resnet50"], description="Model adapters to run.")
    formats: list[str] | None = Field(None, description="Formats to serve, one run each; the model's first format by default.")
    precisions: list[str] = Field(["fp32"], description="Precisions to serve, one run each (what each format can carry: "
                                  "tbench/precision.py; int8 needs trt or tf-trt on GPU pools).")
    pools: list[str] = Field(["cpu"], description="Work pools (GPU kinds) to run on: " + ", ".join(POOLS) + ".")
    request: dict = Field(default_factory=dict, description="Other BenchmarkRequest fields for every run, e.g. "
                          "{'size': 'small', 'batch_sizes': [1, 8]}.")
    output: str | None = Field(None, description="Artifact root of the runs and the matrix report; the workers' "
                               "TBENCH_ARTIFACT_ROOT by default.")


def child_parameters(matrix: MatrixRequest, model: str, fmt: str | None, precision: str) -> dict:
    request = {**matrix.request, "model": model, "precision": precision}
    if fmt:
        request["formats"] = [fmt]
    if matrix.output:
        request["output"] = matrix.output
    return {"request": request}


@task(name="matrix-run", task_run_name="{pool}-{model}-{fmt}-{precision}", cache_policy=NO_CACHE)
def matrix_run(pool: str, model: str, fmt: str | None, precision: str, parameters: dict) -> dict:
    """One benchmark run through the pool's deployment, waited for; where its results are stored."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    run = run_deployment(deployment_name("benchmark", pool), parameters=parameters, timeout=None, tags=["matrix"])
    with get_client(sync_client=True) as client:
        link = report_link(client, run.id)
    return {"pool": pool, "model": model, "format": fmt or "(default)", "precision": precision,
            "state": run.state.type.value if run.state else "UNKNOWN", "flow_run": str(run.id),
            "run_url": link.rsplit("/", 1)[0] if link else None}


def load_results(runs: list[dict]) -> pd.DataFrame:
    frames = []
    for r in runs:
        if not r["run_url"]:
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
    with tracker.stage("runs"):
        futures = [matrix_run.submit(pool, model, fmt, precision, child_parameters(matrix, model, fmt, precision))
                   for model, fmt, precision, pool in combos]
        runs = [f.result() for f in futures]
    with tracker.stage("report"):
        results = load_results(runs)
        if not results.empty:
            results.to_parquet(layout.run_dir / "matrix_results.parquet", index=False)  # not results.parquet: the runs are in the dataset already
        text = matrix_markdown(results, pd.DataFrame(runs), layout.run_dir)
        layout.report_md.write_text(text)
        write_html_report(layout.report_md)
        create_markdown_artifact(text, key="matrix-report", description="Cross-GPU comparison of the matrix's runs")
    with tracker.stage("store"):
        url = store_task(layout.run_dir, root, layout.run_id,
                         tracker.manifest(matrix=matrix.model_dump(mode="json"), runs=runs,
                                          artifact_url=run_url(root, layout.run_id), local_dir=str(layout.run_dir)))
    return url
