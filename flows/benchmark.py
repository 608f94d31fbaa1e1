"""The benchmark flow: wiring only. Each stage is a Prefect task; a failed run still leaves its measured
results, its logs, a report and a manifest that says it failed and where."""

from __future__ import annotations

import sys
from dataclasses import asdict, replace

from prefect import flow
from prefect.states import Completed

from flows.lifecycle import finish_run, flow_run_id, run_lifecycle
from flows.repository import repository_benchmark
from flows.served import served_benchmark
from tasks.accuracy import accuracy_task
from tasks.baseline import baseline_task
from tasks.correctness import correctness_task
from tasks.export import export_task
from tasks.metrics import metrics_task
from tasks.perf import perf_task
from tasks.report import report_task
from tasks.repository import repository_task
from tasks.server import server_task
from tbench.core.enums import Format, Scenario
from tbench.core.errors import PerfAnalyzerError
from tbench.node import hardware as hw
from tbench.node.host_load import HostLoad
from tbench.node.placement import on_client_cpus
from tbench.planning.run_plan import Exported, RunPlan
from tbench.request.benchmark import BenchmarkRequest, adapter_for, adapter_notes, plain_name, request_from_argv
from tbench.results.pipeline_report import bounds_manifest
from tbench.results.point_cache import tool_versions
from tbench.stages.accuracy import require_same_answers
from tbench.stages.correctness import require_passed
from tbench.stages.direct import DIRECT_FORMATS, measure_direct, torch_device, with_triton, write_direct
from tbench.stages.store import run_url
from tbench.stages.sweep import SHM_REFUSED_NOTE, measured_shape_sets, refused_shared_memory
from tbench.stages.tensor_path import server_tensor_paths, tensor_words
from tbench.stages.tracker import COMPLETED_WITH_FAILURES, FAILED, STATE_COMPLETED_WITH_FAILURES, RunTracker
from tbench.team.pools import check_worker_hardware
from tbench.triton.monitor import PointMonitor
from tbench.triton.repository import OFFLINE_CONFIG, write_ensemble, write_offline_configs
from tbench.triton.server import configs_to_load, load_all
from tbench.triton.server_modes import make_server


@flow(name="triton-benchmark")
def benchmark_flow(request: BenchmarkRequest = BenchmarkRequest()) -> str:
    """Export, check, serve and measure one model in one or more formats; returns the URL of the run folder."""
    hardware = hw.detect()
    check_worker_hardware(hardware)  # a worker of the A100 pool must have an A100
    if request.served_model:  # a model someone else serves, measured where it is
        return served_benchmark(request, hardware)
    if request.repository:  # a model of the user's own repository, served from a copy
        return repository_benchmark(request, hardware)
    req = request.resolve(hardware.has_gpu)
    adapter = adapter_for(req)
    with run_lifecycle(req, hardware, req.model, req.model_dump(mode="json")) as tracker:
        return _benchmark(RunPlan(req, hardware), adapter, tracker)


def _benchmark(plan: RunPlan, adapter, tracker: RunTracker) -> str:
    """The run itself, under the device lock, stage by stage; a failed or interrupted run still leaves its results,
    logs, report and a manifest that says where it stopped."""
    req, layout = plan.req, tracker.layout
    server = None
    try:
        with tracker.stage("server"):  # what the server can do decides each model's serving format, before export
            server = make_server(
                req.server,
                layout.repository_dir,
                layout.server_log,
                http_port=req.http_port,
                grpc_port=req.grpc_port,
                url=req.server_url,
                **plan.server_options,
            )
            plan = plan.on_server(server.capabilities(), adapter.part_formats())
            req = plan.req
        with tracker.stage("export"):
            module = adapter.build()
            artifacts = export_task(adapter, module, req.formats, layout.models_dir, plan.conversion)
            parts = plan.parts(adapter, module, layout.models_dir)
            exported = Exported(
                module,
                artifacts,
                parts,
                [export_task(p.adapter, p.adapter.part.module, p.formats, p.out_dir, plan.conversion) for p in parts],
            )
            tracker.save_json(layout.iospec_json, adapter.io_spec().model_dump())
            # what was converted and what came from the conversion cache (cached: no conversion ran)
            tracker.save_json(layout.artifacts_json, [x.model_dump(mode="json") for x in exported.every_artifact])
        with tracker.stage("repository"):
            serving = plan.serving(exported)  # on the capabilities the server stage read
            tracker.served_by = serving.served_by_why
            configs = serving.configs
            for cfg, artifact, is_native in configs:
                repository_task(layout.repository_dir, cfg, artifact, is_native)
            if serving.composing:
                write_ensemble(
                    layout.repository_dir,
                    req.triton_name(Format.ENSEMBLE),
                    req.max_batch_size,
                    adapter.io_spec(),
                    [(name, a.io_spec) for name, a in serving.composing],
                )
            offline_configs = (
                write_offline_configs(layout.repository_dir, configs) if Scenario.OFFLINE in req.scenarios else {}
            )
            if req.scenarios[0] is Scenario.OFFLINE:  # the first sweep's configs from the start: no reload before it
                server.serve_from_start(OFFLINE_CONFIG, offline_configs)
            server.launch()  # its models load while the correctness check runs; server-start waits for them
        with tracker.stage("correctness"):
            tracker.correctness = correctness_task(adapter, module, artifacts, *plan.tolerances)
            for p, arts in zip(parts, exported.part_artifacts):
                checked = correctness_task(p.adapter, p.adapter.part.module, arts, *plan.tolerances)
                name = plain_name(req.part_name(p.adapter.part.name))
                tracker.correctness += [c.model_copy(update={"model": name}) for c in checked]
            tracker.save_json(layout.correctness_json, [c.model_dump(mode="json") for c in tracker.correctness])
            require_passed(tracker.correctness)
            shape_sets = measured_shape_sets(adapter, module, layout.run_dir, plan.shared_memory(adapter.io_spec()))
            inputs = shape_sets[0].inputs  # a --shape sweep's first set: the server's warm-up, the labels' defaults
            tracker.measured_shapes = list(dict.fromkeys(line for s in shape_sets for line in s.shapes))
            tracker.guessed_shapes = adapter.guessed_shapes
            tracker.guessed_values = adapter.guessed_values
        with tracker.stage("server-start"):
            server_task(server)
            serving = serving.confirmed(server)
            _record_tensor_paths(tracker, serving, server)
        measured = serving.measured(adapter.io_spec(), inputs, adapter.given_samples)
        for model in measured:
            with tracker.stage(f"accuracy-{model.format.value}"):
                result = accuracy_task(
                    adapter,
                    module,
                    server.endpoints.grpc_url,
                    model.name,
                    req.accuracy_samples,
                    req.accuracy_batch_size,
                    *plan.tolerances,
                    model.format,
                )
                tracker.accuracy.append(result)
                tracker.save_json(layout.accuracy_json, [r.model_dump(mode="json") for r in tracker.accuracy])
                require_same_answers(result, model.name)
        identity = server.identity()
        tracker.environment = {"server": identity, "tools": tool_versions(), "model_digests": serving.model_digests}
        tracker.environment["exporters"] = {a.format.value: a.exporter for a in exported.every_artifact if a.exporter}
        # the point cache is keyed on the inputs sent: one per shape set; read with --reuse (never across trials, whose
        # point is to measure again), kept by every run
        reuse = req.reuse_measurements and req.trials == 1
        caches = [serving.point_cache(identity, s.inputs, read=reuse) for s in shape_sets]
        host_load = HostLoad(own=server.processes)  # other processes' CPU, over the measured sweeps only
        tracker.host = host_load.summary  # filled in as it goes: an interrupted run keeps what was seen
        with host_load:
            for trial in range(1, req.trials + 1):
                if trial > 1:  # each trial in a server process of its own: the spread between them is run-to-run
                    with tracker.stage(f"server-restart-trial{trial}"):
                        server.stop()
                        server_task(server)
                with on_client_cpus(plan.placement, exclude=server.processes()):
                    for model in measured:
                        tracker.served_on[model.format.value] = model.device.model_dump()
                        for scenario in req.scenarios:
                            _measure_scenario(
                                plan,
                                tracker,
                                server,
                                model,
                                scenario,
                                offline_configs,
                                shape_sets,
                                caches,
                                adapter.given_samples,
                                trial,
                            )
        if req.direct:  # after the sweeps: the server idles while the framework runs alone
            with tracker.stage("direct"):
                _measure_direct(plan, tracker, exported, measured, adapter)
    except BaseException as err:
        _finish(tracker, plan, server, error=err)
        raise
    url = _finish(tracker, plan, server)
    if tracker.status == FAILED:  # every point failed: the flow run fails too, after its folder is stored
        raise PerfAnalyzerError(f"{tracker.status_line}; the run folder is {url}")
    if tracker.status == COMPLETED_WITH_FAILURES:  # the UI and `tbench submit` see it; a direct call still gets the URL
        return Completed(message=tracker.status_line, name=STATE_COMPLETED_WITH_FAILURES, data=url)
    return url


def _record_tensor_paths(tracker: RunTracker, serving, server) -> None:
    """The path each python-backend model's tensors took (DLPack or NumPy, as its instances said): per Triton model
    in the manifest, per format in the report (under its "Served by")."""
    req = serving.plan.req
    names = {a.format.value: [req.triton_name(a.format)] for a in serving.served}
    if serving.composing:
        names[Format.ENSEMBLE.value] = [name for name, _ in serving.composing]
    tracker.tensor_paths = server_tensor_paths(server.log_path)
    tracker.tensor_words = tensor_words(names, tracker.tensor_paths)


def _measure_direct(plan: RunPlan, tracker: RunTracker, exported: Exported, measured, adapter) -> None:
    """--direct: each measured format's exported model run by its own runtime at the offline batch sizes, on its
    served device with the server instance's threads; the rows set beside the offline points."""
    req, hardware = plan.req, plan.hardware
    threads = plan.placement.server_threads(req.model_instances, hardware.cpu_cores)
    devices = {m.format: torch_device(m.device.gpu_uuids, hardware.gpu_uuids) for m in measured}
    rows = []
    for artifact in exported.artifacts:
        if artifact.format in devices and artifact.format in DIRECT_FORMATS:
            rows += measure_direct(
                artifact.format,
                str(artifact.path),
                req.batch_sizes,
                lambda b: adapter.sample_batch(b, seed=7),
                devices[artifact.format],
                threads,
            )
    tracker.direct = with_triton(rows, tracker.results)
    write_direct(tracker.layout.run_dir, tracker.direct)


def _measure_scenario(
    plan: RunPlan,
    tracker: RunTracker,
    server,
    model,
    scenario: Scenario,
    offline_configs,
    shape_sets,
    caches,
    samples,
    trial: int,
) -> None:
    """One format's scenario in one trial, at every shape set: its models served with the offline configs for the
    offline scenario and with their own for every other, reloaded only where the server serves them otherwise now
    (once for every shape set), in a stage of its own (its seconds are not the sweep's, and an interrupt is named),
    and read back from the server before the first point."""
    offline = scenario is Scenario.OFFLINE
    wanted = {n: offline_configs[n] if offline else None for n in model.behind}
    if pending := configs_to_load(server, wanted):
        with tracker.stage(_stage_key(plan, "reload", scenario, model, trial)):
            load_all(server, pending)
    server.confirm(wanted)
    for shapes, cache in zip(shape_sets, caches):  # one set unless the user swept shapes
        _sweep(plan, tracker, server, model, scenario, shapes, cache, samples, trial)


def _stage_key(plan: RunPlan, what: str, scenario: Scenario, model, trial: int, shapes_tag: str = "") -> str:
    """A sweep's stage name (`perf-offline-onnx`, `reload-online-onnx-trial2`): its shape set and trial where a run
    has several."""
    trial_tag = f"trial{trial}" if plan.req.trials > 1 else ""
    return "-".join(filter(None, (what, scenario.value, model.format.value, shapes_tag, trial_tag)))


def _sweep(
    plan: RunPlan, tracker: RunTracker, server, model, scenario: Scenario, shapes, cache, samples, trial: int = 1
) -> None:
    """One format's sweep of one scenario at one shape set in one trial: a stage of its own, every point kept as
    measured."""
    key = _stage_key(plan, "perf", scenario, model, trial, shapes.tag)
    labels = {**model.labels, "shapes": shapes.label}
    with tracker.stage(key):
        table = perf_task(
            scenario,
            [
                replace(p, shapes=shapes.tag)
                for p in plan.points(scenario, tracker.layout.run_dir / "arrivals", samples)
            ],
            model=model.name,
            grpc_url=server.endpoints.grpc_url,
            spec=model.spec,
            m=plan.req.measurement,
            layout=tracker.layout,
            static={**labels, **model.batching(scenario), "trial": trial},
            on_row=lambda t: tracker.save_points(key, t),
            gpu_env=plan.gpu_env,  # perf_analyzer's CUDA memory: the server's GPU
            dynamic_max_batch=model.online.dynamic_max_batch if scenario is not Scenario.OFFLINE else 0,
            stopped_serving=server.stopped_serving,
            inputs=shapes.inputs,
            on_composing=tracker.save_composing,
            monitor=PointMonitor(
                server.endpoints.grpc_url,
                model.name,
                server.processes,
                server.endpoints.metrics_url,
                gpu_uuids=model.device.gpu_uuids,
                trace=server.request_trace(model.name),  # large requests' rate points: the server's timestamps
                steps=model.steps,  # an ensemble's composing models: where its time went (pipeline_steps.csv)
            ),
            on_steps=tracker.save_steps,
            cache=cache.for_model(labels) if cache else None,
        )
    # a server that refused client shared memory: its offline points went over gRPC, said once in the report
    if refused_shared_memory(table, shapes.inputs.shared_memory) and SHM_REFUSED_NOTE not in tracker.notes:
        tracker.notes.append(SHM_REFUSED_NOTE)


def _finish(tracker: RunTracker, plan: RunPlan, server, error: BaseException | None = None) -> str:
    """Stop the server, then report and store whatever the run has (flows/lifecycle.py: finish_run)."""
    req, hardware, layout = plan.req, plan.hardware, tracker.layout
    manifest = {
        "request": req.model_dump(mode="json"),
        "hardware": hardware.model_dump(),
        "served_on": tracker.served_on,  # per measured format: the results' gpu label, and why
        "served_by": tracker.served_by,  # per served format: the backend, and why a format was re-planned
        "tensor_paths": tracker.tensor_paths,  # per python-backend model: dlpack or numpy, and why
        "direct": [asdict(r) for r in tracker.direct],  # --direct: the framework's own figures beside Triton's
        # what the server could do (its version, backends, python runtimes): what the plan was made for
        "server_capabilities": plan.capabilities.manifest() if plan.capabilities else None,
        "notes": tracker.notes,
        "measured_shapes": tracker.measured_shapes,  # each dynamic dim's measured value
        "guessed_shapes": tracker.guessed_shapes,  # the dims no --shape set: tbench chose them
        "guessed_values": tracker.guessed_values,  # and the integers no --value-range set
        "environment": tracker.environment,  # server identity, tool versions, model digests (tbench.history)
        "host": tracker.host,  # other processes' CPU during the sweeps (tbench.node.host_load, tbench.history)
        # the server's and the client's CPU sets (tbench.node.placement) and the runtime's threads per instance
        "placement": {
            **plan.placement.manifest(),
            "intra_op_threads": plan.placement.server_threads(req.model_instances, hardware.cpu_cores),
        },
        "trials": req.trials,
        "artifact_url": run_url(req.output, layout.run_id),
        "local_dir": str(layout.run_dir),
        "flow_run_id": flow_run_id(),
    }

    def report() -> None:
        with tracker.stage("metrics"):
            manifest["summary"] = summary = metrics_task(tracker.results)
            if not tracker.steps.empty:  # an ensemble: the step that bounded each scenario's best point
                manifest["pipeline_bounds"] = bounds_manifest(tracker.steps, tracker.results)
        comparison_lines = []
        if req.baseline:  # after metrics: the results files it reads are complete
            with tracker.stage("compare-baseline"):
                comparison_lines, manifest["comparison"] = baseline_task(req.baseline, layout.run_dir, layout.plots_dir)
        with tracker.stage("report"):
            report_task(
                layout.report_md,
                tracker.results,
                run_id=layout.run_id,
                request=req,
                hardware=hardware,
                correctness=tracker.correctness,
                accuracy=tracker.accuracy,
                summary=summary,
                served_by=tracker.served_by,
                served_on=tracker.served_on,
                composing=tracker.composing,
                steps=tracker.steps,
                model_notes=adapter_notes(req) + [ln for n in tracker.notes for ln in (f"**Note**: {n}.", "")],
                stage_seconds=dict(tracker.stage_seconds),
                plots_dir=layout.plots_dir,
                status=tracker.status,
                error=tracker.error or tracker.status_line,
                comparison_lines=comparison_lines,
                measured_shapes=tracker.measured_shapes,
                guessed_shapes=tracker.guessed_shapes,
                guessed_values=tracker.guessed_values,
                direct=[asdict(r) for r in tracker.direct],
                tensors=tracker.tensor_words,
                host=tracker.host,
            )

    return finish_run(tracker, error, manifest, server=server, output=req.output, report=report)


if __name__ == "__main__":
    # A plain Prefect flow run: `python -m flows.benchmark resnet50 size=small batch_sizes=[1,4]`
    print(benchmark_flow(request_from_argv(sys.argv[1:])))
