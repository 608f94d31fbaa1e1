"""Several models on one server, each under its own load, measured alone and together (`tbench colocate`): wiring
only. The server is a running one (by URL) or this machine's, on the given model repositories merged into one; each
model's inputs are read from the server as a served model's are; the measurement is tbench.stages.colocated's, and
each rate point with an SLO is judged as a capacity plan judges one (tbench.capacity.rate_search.judge)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd
from prefect import flow

from flows.lifecycle import finish_run, run_lifecycle
from model_adapters.served_model import ServedModelAdapter
from tbench.capacity.evaluate import exported_requests, rate_measurement
from tbench.capacity.rate_search import alone_verdict, judge
from tbench.capacity.statistics import PercentileRule
from tbench.core.errors import PerfAnalyzerError
from tbench.core.handover import local_path
from tbench.core.layout import RunLayout
from tbench.node import hardware as hw
from tbench.node import tools
from tbench.request.colocated import ColocatedRequest
from tbench.results.colocated_report import plot_colocated, render_colocated
from tbench.results.html_report import write_html_report
from tbench.stages.colocated import Colocation, Placed, measure_alone, measure_together, merged_repository
from tbench.stages.sweep import measured_shape_sets, warm_up
from tbench.stages.tracker import FAILED, RunTracker
from tbench.triton.served import ServedServer, read_served_model, served_infer
from tbench.triton.server_modes import make_server

COLOCATED_MD = "colocated.md"


@flow(name="triton-colocated")
def colocated_flow(request: ColocatedRequest) -> str:
    """Measure each model alone, then all together; returns the URL of the run folder."""
    hardware = hw.detect()
    name = "colocated-" + "-".join(load.name for load in request.loads)[:80]
    with run_lifecycle(request, hardware, name, request.model_dump(mode="json")) as tracker:
        return _measure(request, hardware, tracker)


def _measure(req: ColocatedRequest, hardware, tracker: RunTracker) -> str:
    rows: list[dict] = []

    def keep(row: dict) -> None:  # saved as it is measured
        rows.append(row)
        tracker.save_points("colocated", pd.DataFrame(rows))

    try:
        measure_colocated(req, hardware, tracker, tracker.layout, keep)
    except BaseException as err:
        _finish(tracker, req, hardware, error=err)
        raise
    url = _finish(tracker, req, hardware)
    if tracker.status == FAILED:
        raise PerfAnalyzerError(f"{tracker.status_line}; the run folder is {url}")
    return url


def measure_colocated(
    req: ColocatedRequest, hardware, tracker: RunTracker, layout: RunLayout, keep: Callable[[dict], None], prefix=""
) -> None:
    """The stages of a co-located measurement, in `layout` (the run folder, or a folder in it), each row judged and
    passed to `keep` as it is measured; the server is stopped at the end, whatever happened. `prefix` names the
    stages (several measurements in one run)."""
    server = None
    folder = layout.run_dir.relative_to(tracker.layout.run_dir)

    def judged(row: dict) -> None:
        percentile = row.get("slo_percentile") or req.percentile  # the load's own, else the request's
        row = row | slo_verdict(row, PercentileRule(percentile=int(percentile)), layout)
        if folder.parts and isinstance(row.get("source_file"), str):  # relative to the run folder
            row["source_file"] = f"{folder.as_posix()}/{row['source_file']}"
        keep(row)

    layout.logs_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tracker.stage(f"{prefix}server"):
            if req.server_url:
                server = ServedServer(req.server_url, layout.server_log)
            else:
                names = {load.name for load in req.loads} if req.only_loaded else None
                folders = [Path(local_path(repo)) for repo in req.repositories]  # an upload's URL: fetched
                merged = merged_repository(folders, layout.repository_dir, names)
                tracker.environment.setdefault("models_served", {})[str(folder)] = merged
                ports = {"http_port": req.http_port, "grpc_port": req.grpc_port}
                server = make_server(req.server, layout.repository_dir, layout.server_log, **ports)
            server.start()
            tracker.environment.setdefault("server", server.identity())
        with tracker.stage(f"{prefix}inputs"):
            placed = [place(load, server, layout) for load in req.loads]
        colo = Colocation(
            server,
            tools.perf_analyzer_binary(),
            tools.perf_analyzer_env(),
            rate_measurement(req.resolved_measurement(), PercentileRule(percentile=req.strictest_percentile())),
            layout,
            gpu_uuids=() if req.server_url else tuple(hardware.gpu_uuids),
        )
        if req.alone:
            with tracker.stage(f"{prefix}alone"):
                measure_alone(placed, colo, judged)
        with tracker.stage(f"{prefix}together"):
            measure_together(placed, colo, judged)
    finally:
        if server is not None:
            server.stop()


def place(load, server, layout) -> Placed:
    """A model's io spec and batching as the server serves it, perf_analyzer's inputs for it (in the run folder's
    inputs/<model>/), and its latency at its batch size once warmed up."""
    grpc_url = server.endpoints.grpc_url
    served = read_served_model(grpc_url, load.name, load.version)
    adapter = ServedModelAdapter(load.name, grpc_url, served.io_spec, served.batching)
    folder = layout.run_dir / "inputs" / load.name
    folder.mkdir(parents=True, exist_ok=True)
    answer = lambda chunk: served_infer(grpc_url, served, chunk)  # noqa: E731
    shapes = measured_shape_sets(adapter, None, folder, "none", answer=answer)
    inputs = replace(shapes[0].inputs, model_version=served.version if load.version else "")
    batch = load.batch if served.batching else 1
    latency = warm_up(
        grpc_url,
        load.name,
        served.io_spec,
        [batch],
        requests=5,
        shapes=inputs.shapes,
        batching=served.batching,
        model_version=inputs.model_version,
    )
    return Placed(load, served.io_spec, inputs, latency.get(batch))


def slo_verdict(row: dict, rule: PercentileRule, layout) -> dict:
    """A rate point with an SLO: pass, undetermined, or why not, as a capacity plan judges a rate (the `slo`,
    `slo_reason` and `slo_latency_ms` columns, the last an upper confidence bound of the percentile where the requests
    were exported); empty without an SLO or at a concurrency (a closed loop's latency is not a load's)."""
    slo, rate = row.get("slo_ms"), row.get("request_rate")
    if slo is None or pd.isna(slo) or rate is None or pd.isna(rate):
        return {"slo": "", "slo_reason": "", "slo_latency_ms": None}
    point = judge(float(rate), int(row["batch_size"]), row, float(slo), rule, exported_requests(layout, row))
    point = alone_verdict(point, rule)
    return {"slo": point.status, "slo_reason": point.reason, "slo_latency_ms": point.latency_ms}


def _finish(tracker: RunTracker, req: ColocatedRequest, hardware, error: BaseException | None = None) -> str:
    layout = tracker.layout
    manifest = {
        "request": req.model_dump(mode="json"),
        "hardware": hardware.model_dump(),
        "environment": tracker.environment,
        "local_dir": str(layout.run_dir),
    }

    def report() -> None:
        with tracker.stage("report"):
            plot = plot_colocated(tracker.results, req, layout.plots_dir)
            text = render_colocated(tracker.results, req, status=tracker.status, error=tracker.status_line, plot=plot)
            (layout.run_dir / COLOCATED_MD).write_text(text)
            write_html_report(layout.run_dir / COLOCATED_MD, layout.run_dir / "colocated.html")
            manifest["summary"] = {"colocated": COLOCATED_MD}

    return finish_run(tracker, error, manifest, server=None, output=req.output, report=report)
