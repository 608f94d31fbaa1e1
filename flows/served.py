"""A model someone else serves, measured where it is (`--served-model` with `--server-url`): wiring only. Its stages
read the model from the server, make its inputs, sweep it with perf_analyzer and report; nothing is exported,
uploaded, loaded or changed on the server, and accuracy is not measured (there is no source model to compare with)."""

from __future__ import annotations

from dataclasses import replace

from flows.lifecycle import finish_run, run_lifecycle
from model_adapters.served_model import ServedModelAdapter
from tasks.metrics import metrics_task
from tasks.perf import perf_task
from tasks.report import served_report_task
from tbench.core.errors import PerfAnalyzerError
from tbench.core.handover import local_path
from tbench.core.measured import input_data_label
from tbench.loadgen.arrivals import with_intervals
from tbench.request.benchmark import BenchmarkRequest
from tbench.request.served import ServedSweep, check_served, resolve_served
from tbench.results.pipeline_report import bounds_manifest
from tbench.results.point_cache import tool_versions
from tbench.stages.sweep import measured_shape_sets, plan_points
from tbench.stages.tracker import FAILED, RunTracker
from tbench.triton.monitor import PointMonitor
from tbench.triton.served import ServedModel, ServedServer, parse_served_model, read_served_model, served_infer
from tbench.triton.serving import REMOTE_LABEL

SERVED_CONFIG = "served_config.json"  # the model's config as the server serves it, in the run folder


def served_benchmark(request: BenchmarkRequest, hardware) -> str:
    """Measure `request.served_model` on the server at `request.server_url`; returns the URL of the run folder."""
    name, version = parse_served_model(request.served_model)
    req = check_served(request).model_copy(update={"model": name})
    with run_lifecycle(req, hardware, name, req.model_dump(mode="json")) as tracker:
        return measure_served(req, hardware, name, version, tracker, AsServed(req.server_url, tracker.layout))


class AsServed:
    """Where a served run's model is served and how its results name what serves it: by default someone else's
    server, as it serves the model (flows/repository.py: a copy of the user's repository on a server of ours)."""

    def __init__(self, url: str, layout):
        self.server = ServedServer(url, layout.server_log)

    def prepare(self, tracker: RunTracker) -> None:
        """What the run does before its server stage: nothing, the server is someone else's."""

    def labels(self, served: ServedModel) -> dict:
        """The results' columns that say what served the model."""
        return {
            "model_size": f"served v{served.version}" if served.version else "served",
            "gpu": REMOTE_LABEL,
            "backend": f"{served.kind} (as served)",
            "backend_accelerator": "as served",
        }

    def served_by(self, served: ServedModel) -> dict[str, str]:
        return {served.format: f"{served.kind} (as served)"}

    def steps(self, served: ServedModel) -> list[str]:
        """The models a pipeline runs, read at each point (an ensemble's steps, as served); none for one model."""
        return [step.model_name for step in served.config.ensemble_scheduling.step]

    def manifest(self) -> dict:
        """The manifest's keys of its own."""
        return {}

    def report(self) -> dict | None:
        """What the report says of where the model came from (None: a running server's)."""
        return None


def read_served(req: BenchmarkRequest, name: str, version: str, tracker: RunTracker, server: ServedServer):
    """The stages every served model's run starts with, asking only: the server answers and the model is ready (its
    config kept in the run folder), then perf_analyzer's inputs at each shape set. Returns (served, adapter, sets)."""
    layout = tracker.layout
    with tracker.stage("server"):  # the server is someone else's
        server.start()
        served = read_served_model(server.endpoints.grpc_url, name, version)
        tracker.save_json(layout.run_dir / SERVED_CONFIG, served.config_json())
        tracker.save_json(layout.iospec_json, served.io_spec.model_dump())
        tracker.served_by = {served.format: f"{served.kind} (as served)"}
    with tracker.stage("inputs"):
        adapter = ServedModelAdapter(
            name,
            server.endpoints.grpc_url,
            served.io_spec,
            served.batching,
            req.shapes,
            req.value_ranges,
            served.table_rows(getattr(server, "repository", None)),  # a repository tbench serves: its ONNX files
        )
        if req.input_data:
            adapter.use_input_data(local_path(req.input_data))
        shape_sets = [
            replace(s, inputs=replace(s.inputs, model_version=version))
            for s in measured_shape_sets(
                adapter,
                None,
                layout.run_dir,
                "none",  # the server may be on another machine: no shared memory
                answer=lambda chunk: served_infer(server.endpoints.grpc_url, served, chunk),
            )
        ]
        tracker.measured_shapes = list(dict.fromkeys(line for s in shape_sets for line in s.shapes))
        tracker.guessed_shapes = adapter.guessed_shapes
        tracker.guessed_values = adapter.guessed_values
    tracker.environment = {
        "server": server.identity(),
        "tools": tool_versions(),
        "served_model": {"name": name, "version": served.version, "config": served.config_json()},
    }
    return served, adapter, shape_sets


def measure_served(req: BenchmarkRequest, hardware, name: str, version: str, tracker: RunTracker, source) -> str:
    """Sweep the model `source` serves (AsServed, or another with its methods); returns the run folder's URL."""
    layout = tracker.layout
    server, served, sweep = source.server, None, None
    try:
        source.prepare(tracker)
        served, adapter, shape_sets = read_served(req, name, version, tracker, server)
        tracker.served_by = source.served_by(served)
        sweep = resolve_served(req, served.config.max_batch_size, hardware.has_gpu)
        labels = _labels(served, adapter.given_samples) | source.labels(served)
        for scenario in sweep.scenarios:
            points = with_intervals(
                plan_points(
                    [scenario],
                    sweep.batch_sizes,
                    sweep.concurrency,
                    sweep.request_rates,
                    sweep.request_distribution,
                    sweep.online_batch_size,
                ),
                req.trace,
                req.burstiness,
                sweep.measurement.seed,
                layout.run_dir / "arrivals",
                adapter.given_samples,
            )
            for shapes in shape_sets:  # one set unless the user swept shapes
                key = "-".join(filter(None, ("perf", scenario.value, served.format, shapes.tag)))
                with tracker.stage(key):
                    perf_task(
                        scenario,
                        [replace(p, shapes=shapes.tag) for p in points],
                        model=name,
                        grpc_url=server.endpoints.grpc_url,
                        spec=served.io_spec,
                        m=sweep.measurement,
                        layout=layout,
                        static={**labels, "shapes": shapes.label},
                        on_row=lambda t, k=key: tracker.save_points(k, t),
                        stopped_serving=server.stopped_serving,
                        inputs=shapes.inputs,
                        monitor=PointMonitor(
                            server.endpoints.grpc_url,
                            name,
                            server.processes,  # ours: its CPU and memory per point; a remote one's: none
                            server.endpoints.metrics_url,  # its latency histogram, where it exposes one
                            steps=source.steps(served),
                        ),
                        on_steps=tracker.save_steps,
                    )
    except BaseException as err:
        _finish(tracker, req, hardware, source, served, sweep, error=err)
        raise
    url = _finish(tracker, req, hardware, source, served, sweep)
    if tracker.status == FAILED:
        raise PerfAnalyzerError(f"{tracker.status_line}; the run folder is {url}")
    return url


def _labels(served: ServedModel, given) -> dict:
    """The results' static columns of a served model: what the server says it serves, not what tbench chose (the
    source's labels complete them)."""
    return {
        "model": served.name,
        "format": served.format,
        "model_format": served.model_format,
        "precision": "as served",
        "max_batch_size": served.config.max_batch_size,
        "model_instances": served.instances,
        "input_data": input_data_label(given),
        "batching": "dynamic" if served.queue_delay_us is not None else "static",
        "max_queue_delay_us": served.queue_delay_us or 0,
    }


def _finish(
    tracker: RunTracker,
    req: BenchmarkRequest,
    hardware,
    source: AsServed,
    served: ServedModel | None,
    sweep: ServedSweep | None,
    error: BaseException | None = None,
) -> str:
    layout = tracker.layout
    manifest = {
        **source.manifest(),
        "request": req.model_dump(mode="json"),
        "hardware": hardware.model_dump(),
        "served_model": (
            {"name": served.name, "version": served.version, "kind": served.kind, "config": SERVED_CONFIG}
            if served
            else None
        ),
        "served_by": tracker.served_by,
        "measured_shapes": tracker.measured_shapes,
        "guessed_shapes": tracker.guessed_shapes,
        "guessed_values": tracker.guessed_values,
        "environment": tracker.environment,
        "local_dir": str(layout.run_dir),
    }

    def report() -> None:
        with tracker.stage("metrics"):
            manifest["summary"] = summary = metrics_task(tracker.results)
            if not tracker.steps.empty:  # a pipeline: the step that bounded each scenario's best point
                manifest["pipeline_bounds"] = bounds_manifest(tracker.steps, tracker.results)
        with tracker.stage("report"):
            served_report_task(
                layout.report_md,
                tracker.results,
                run_id=layout.run_id,
                request=req,
                served=served,
                sweep=sweep,
                identity=tracker.environment.get("server", {}),
                hardware=hardware,
                summary=summary,
                stage_seconds=dict(tracker.stage_seconds),
                plots_dir=layout.plots_dir,
                status=tracker.status,
                error=tracker.error or tracker.status_line,
                measured_shapes=tracker.measured_shapes,
                guessed_shapes=tracker.guessed_shapes,
                guessed_values=tracker.guessed_values,
                source=source.report(),
                steps=tracker.steps,
            )

    return finish_run(tracker, error, manifest, server=source.server, output=req.output, report=report)
