"""The benchmark flow: wiring only. Each stage is a Prefect task; a failed run still leaves its measured
results, its logs, a report and a manifest that says it failed and where."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefect import flow, get_run_logger

import model_adapters
from tasks.accuracy import accuracy_task
from tasks.correctness import correctness_task, require_passed
from tasks.export import export_task
from tasks.metrics import metrics_task
from tasks.perf import perf_task, plan_points
from tasks.report import report_task
from tasks.repository import ServingConfig, backend_label, repository_task, serves_natively
from tasks.server import make_server, server_task
from tasks.store import run_url, staging_root, store_task
from tbench import hardware as hw
from tbench import progress
from tbench.layout import RunLayout, new_run_id
from tbench.request import BenchmarkRequest
from tbench.run import RunTracker


@flow(name="triton-benchmark")
def benchmark_flow(request: BenchmarkRequest = BenchmarkRequest()) -> str:
    """Export, check, serve and measure one model; returns the URL of the run folder."""
    hardware = hw.detect()
    req = request.resolve(hardware.has_gpu)
    adapter = model_adapters.get(req.model, req.size, req.checkpoint)
    layout = RunLayout(staging_root(req.output), new_run_id(req.model)).create()
    tracker = RunTracker(layout)
    tracker.capture_logs()
    tracker.save_json(layout.request_json, req.model_dump(mode="json"))
    progress.emit("run_start", run_id=layout.run_id, run_dir=str(layout.run_dir))
    server = None
    try:
        with tracker.stage("export"):
            module = adapter.build()
            artifacts = export_task(adapter, module, req.formats, layout.models_dir)
            tracker.save_json(layout.iospec_json, adapter.io_spec().model_dump())
        with tracker.stage("correctness"):
            tracker.correctness = correctness_task(adapter, module, artifacts, req.tolerance_atol, req.tolerance_rtol)
            tracker.save_json(layout.correctness_json, [c.model_dump(mode="json") for c in tracker.correctness])
            require_passed(tracker.correctness)
        served = next(a for a in artifacts if a.format is req.serve_format)
        cfg = ServingConfig(name=req.model, max_batch_size=req.max_batch_size, preferred_batch_sizes=req.preferred_batch_sizes,
                            max_queue_delay_us=req.max_queue_delay_us, instances=req.model_instances,
                            kind="KIND_GPU" if hardware.has_gpu else "KIND_CPU",
                            intra_op_threads=max(1, hardware.cpu_cores // req.model_instances))
        with tracker.stage("server"):  # what the server can run decides how the repository serves the model
            server = make_server(req.server, layout.repository_dir, layout.server_log, http_port=req.http_port,
                                 grpc_port=req.grpc_port, url=req.server_url, **server_options(req))
            native = serves_natively(served.format, server.backends())
        tracker.served_by = backend_label(served.format, native)
        with tracker.stage("repository"):
            repository_task(layout.repository_dir, cfg, served, native)
        with tracker.stage("server-start"):
            server_task(server)
        with tracker.stage("accuracy"):
            tracker.accuracy = accuracy_task(adapter, module, server.endpoints.grpc_url, cfg.name,
                                             req.accuracy_samples, min(8, req.max_batch_size))
            tracker.save_json(layout.accuracy_json, tracker.accuracy.model_dump())
        static = {"model": req.model, "model_size": req.size, "gpu": hardware.gpu_label,
                  "backend": tracker.served_by, "model_format": served.format.label,
                  "backend_accelerator": "", "precision": req.precision.value.upper(),
                  "max_batch_size": req.max_batch_size, "model_instances": req.model_instances}
        for scenario in req.scenarios:
            with tracker.stage(f"perf-{scenario.value}"):
                perf_task(scenario, plan_points([scenario], req.batch_sizes, req.concurrency),
                          model=cfg.name, grpc_url=server.endpoints.grpc_url, spec=served.io_spec, m=req.measurement,
                          layout=layout, static=static, on_row=lambda t, s=scenario.value: tracker.save_points(s, t),
                          server_alive=server.alive)
    except BaseException:
        _finish(tracker, req, hardware, server, raise_errors=False)
        raise
    return _finish(tracker, req, hardware, server, raise_errors=True)


def server_options(req) -> dict:
    """The mode-specific options a request carries, for make_server."""
    options = {"local": {"binary": req.tritonserver, "backend_dir": Path(req.backend_dir) if req.backend_dir else None},
               "docker": {"image": req.docker_image, "gpus": req.gpus}}.get(req.server, {})
    return {k: v for k, v in options.items() if v is not None}


def _finish(tracker: RunTracker, req, hardware, server, raise_errors: bool) -> str:
    """Stop the server, then report and store whatever the run has; with a stage error already in flight, a
    failure here is logged instead of hiding the first error."""
    layout = tracker.layout
    url = str(layout.run_dir)
    try:
        if server is not None:
            with tracker.stage("server-stop"):
                server.stop()
        with tracker.stage("metrics"):
            summary = metrics_task(tracker.results)
        with tracker.stage("report"):
            report_task(layout.report_md, tracker.results, run_id=layout.run_id, request=req, hardware=hardware,
                        correctness=tracker.correctness, accuracy=tracker.accuracy, summary=summary,
                        served_by=tracker.served_by,
                        stage_seconds=dict(tracker.stage_seconds), plots_dir=layout.plots_dir,
                        status=tracker.status, error=tracker.error)
        tracker.release_logs()
        with tracker.stage("store"):
            url = store_task(layout.run_dir, req.output, layout.run_id,
                             tracker.manifest(request=req.model_dump(mode="json"), hardware=hardware.model_dump(),
                                              summary=summary, artifact_url=run_url(req.output, layout.run_id),
                                              local_dir=str(layout.run_dir)))
    except Exception as err:
        if raise_errors:
            raise
        get_run_logger().error(f"while finishing a failed run: {err}; the run folder is {layout.run_dir}")
    finally:
        tracker.release_logs()
        progress.emit("run_end", run_id=layout.run_id, url=url, status=tracker.status)
    return url


def request_from_argv(argv: list[str]) -> BenchmarkRequest:
    """`[MODEL] [field=value ...]`, values as JSON where they parse: size=small batch_sizes=[1,4]"""
    fields = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            key, value = "model", arg
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            fields[key] = value
    return BenchmarkRequest(**fields)


if __name__ == "__main__":
    # A plain Prefect flow run: `python -m flows.benchmark resnet50 size=small batch_sizes=[1,4]`
    print(benchmark_flow(request_from_argv(sys.argv[1:])))
