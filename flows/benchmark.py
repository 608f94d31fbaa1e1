"""The benchmark flow: wiring only. Each stage is a Prefect task; a failed run still leaves its measured
results, its logs, a report and a manifest that says it failed and where."""

from __future__ import annotations

import sys

from prefect import flow
from prefect.states import Completed

from flows.lifecycle import finish_run, run_lifecycle
from model_adapters.ensemble import part_adapters
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
from tbench.core.measured import input_data_label, shapes_label
from tbench.core.precision import results_precision
from tbench.core.progress import warn
from tbench.node import hardware as hw
from tbench.node.host_load import HostLoad
from tbench.planning.plan import (
    accelerator_label,
    confirm_devices,
    offline_shared_memory,
    plan_devices,
    point_cache,
    server_options,
    serving_config,
)
from tbench.request.benchmark import BenchmarkRequest, adapter_for, adapter_notes, plain_name, request_from_argv
from tbench.results.point_cache import tool_versions
from tbench.stages.accuracy import require_same_answers
from tbench.stages.correctness import require_passed
from tbench.stages.export import ConversionOptions
from tbench.stages.store import run_url
from tbench.stages.sweep import dynamic_shapes, plan_points, prepare_inputs
from tbench.stages.tracker import COMPLETED_WITH_FAILURES, FAILED, STATE_COMPLETED_WITH_FAILURES, RunTracker
from tbench.team.pools import check_worker_hardware
from tbench.triton.monitor import PointMonitor
from tbench.triton.repository import (
    backend_label,
    serves_natively,
    write_ensemble,
    write_offline_configs,
)
from tbench.triton.server import configs_loaded, make_server
from tbench.triton.serving import combined, pinned_env


@flow(name="triton-benchmark")
def benchmark_flow(request: BenchmarkRequest = BenchmarkRequest()) -> str:
    """Export, check, serve and measure one model in one or more formats; returns the URL of the run folder."""
    hardware = hw.detect()
    check_worker_hardware(hardware)  # a worker of the A100 pool must have an A100
    req = request.resolve(hardware.has_gpu)
    adapter = adapter_for(req)
    with run_lifecycle(req, hardware, req.model, req.model_dump(mode="json")) as tracker:
        return _benchmark(req, hardware, adapter, tracker)


def _benchmark(req, hardware, adapter, tracker: RunTracker) -> str:
    """The run itself, under the device lock; a failed or interrupted run still leaves its results, logs, report and
    a manifest that says where it stopped."""
    layout = tracker.layout
    server = None
    try:
        with tracker.stage("export"):
            module = adapter.build()
            options = ConversionOptions.for_run(req)
            artifacts = export_task(adapter, module, req.formats, layout.models_dir, options)
            # an ensemble's composing models, each exported in its own formats (the first one is served)
            parts = part_adapters(adapter, module) if adapter.is_ensemble else []
            part_artifacts = [
                export_task(
                    p,
                    p.part.module,
                    [Format.parse(f) for f in p.part.formats],
                    layout.models_dir / p.part.name,
                    options,
                )
                for p in parts
            ]
            tracker.save_json(layout.iospec_json, adapter.io_spec().model_dump())
            # what was converted and what came from the conversion cache (cached: no conversion ran)
            tracker.save_json(
                layout.run_dir / "artifacts.json",
                [x.model_dump(mode="json") for x in artifacts + [a for arts in part_artifacts for a in arts]],
            )
        with tracker.stage("correctness"):
            tracker.correctness = correctness_task(adapter, module, artifacts, req.tolerance_atol, req.tolerance_rtol)
            for p, arts in zip(parts, part_artifacts):
                checked = correctness_task(p, p.part.module, arts, req.tolerance_atol, req.tolerance_rtol)
                tracker.correctness += [
                    c.model_copy(update={"model": plain_name(req.part_name(p.part.name))}) for c in checked
                ]
            tracker.save_json(layout.correctness_json, [c.model_dump(mode="json") for c in tracker.correctness])
            require_passed(tracker.correctness)
            perf_inputs = prepare_inputs(
                adapter, module, layout.run_dir / "perf_input.json", shared_memory=offline_shared_memory(req, hardware)
            )
            given = adapter.given_samples
            sent = perf_inputs.sent or None  # the samples perf_analyzer is given, where they vary in shape
            tracker.measured_shapes = dynamic_shapes(
                adapter.io_spec(), perf_inputs.shapes, given.distribution(sent) if given is not None else None
            )
            if sent and len(sent) < given.count:  # the figures describe these samples, not the whole file
                warn(f"{len(sent)} of the {given.count} input samples are sent, spread over them: see the report")
        served = [a for fmt in req.serve_formats for a in artifacts if a.format is fmt]
        composing = [(req.part_name(p.part.name), arts[0]) for p, arts in zip(parts, part_artifacts)]
        with tracker.stage("server"):  # what the server can run decides how the repository serves each format
            server = make_server(
                req.server,
                layout.repository_dir,
                layout.server_log,
                http_port=req.http_port,
                grpc_port=req.grpc_port,
                url=req.server_url,
                **server_options(req, hardware),
            )
            backends = server.backends()
            native = {a.format: serves_natively(a.format, backends) for a in served + [a for _, a in composing]}
            # where each Triton model will run (tbench/serving.py), confirmed once the server has loaded them
            models = {req.triton_name(a.format): a for a in served} | dict(composing)
            devices = plan_devices(req, hardware, {name: (a.format, native[a.format]) for name, a in models.items()})
        tracker.served_by = {a.format.value: backend_label(a.format, native[a.format]) for a in served}
        if composing:
            tracker.served_by[Format.ENSEMBLE.value] = "ensemble of " + ", ".join(
                f"{plain_name(name)} ({backend_label(a.format, native[a.format])})" for name, a in composing
            )
        # what each Triton model is served with: (config, artifact, native); an ensemble's batching is its parts'
        configs = [
            (serving_config(req, hardware, a.format, devices[name], name), a, native[a.format])
            for name, a in models.items()
        ]
        with tracker.stage("repository"):
            for cfg, artifact, is_native in configs:
                repository_task(layout.repository_dir, cfg, artifact, is_native)
            if composing:
                write_ensemble(
                    layout.repository_dir,
                    req.triton_name(Format.ENSEMBLE),
                    req.max_batch_size,
                    adapter.io_spec(),
                    [(name, a.io_spec) for name, a in composing],
                )
            offline_configs = (
                write_offline_configs(layout.offline_configs_dir, configs) if Scenario.OFFLINE in req.scenarios else {}
            )
        with tracker.stage("server-start"):
            server_task(server)
            devices = confirm_devices(devices, server, hardware)
            by_format = {a.format: devices[name] for name, a in models.items()}
        # what Triton serves, as (format, io spec): each served format, or the ensemble over the composing models
        measured = [(a.format, a.io_spec) for a in served] + (
            [(Format.ENSEMBLE, adapter.io_spec())] if composing else []
        )
        for fmt, _ in measured:
            name = req.triton_name(fmt)
            with tracker.stage(f"accuracy-{fmt.value}"):
                result = accuracy_task(
                    adapter,
                    module,
                    server.endpoints.grpc_url,
                    name,
                    req.accuracy_samples,
                    req.accuracy_batch_size,
                    req.tolerance_atol,
                    req.tolerance_rtol,
                    fmt,
                )
                tracker.accuracy.append(result)
                tracker.save_json(layout.accuracy_json, [r.model_dump(mode="json") for r in tracker.accuracy])
                require_same_answers(result, name)
        identity = server.identity()
        tracker.environment = {
            "server": identity,
            "tools": tool_versions(),
            "model_digests": {a.format.value: a.source_hash for a in served + [a for _, a in composing]},
        }
        cache = (
            point_cache(req, hardware, identity, served + [a for _, a in composing], perf_inputs)
            if req.reuse_measurements
            else None
        )
        host_load = HostLoad(own=server.processes)  # other processes' CPU, over the measured sweeps only
        tracker.host = host_load.summary  # filled in as it goes: an interrupted run keeps what was seen
        with host_load:
            for fmt, spec in measured:
                name = req.triton_name(fmt)
                model_format = (
                    fmt.label
                    if fmt is not Format.ENSEMBLE
                    else f"{fmt.label} ({' + '.join(a.format.label for _, a in composing)})"
                )
                # the models behind this one: itself, or an ensemble's composing models
                behind = [n for n, _ in composing] if fmt is Format.ENSEMBLE else [name]
                device = combined({plain_name(n): devices[n] for n in behind})  # the results name no GPU it did not use
                tracker.served_on[fmt.value] = device.model_dump()
                static = {
                    "model": req.model,
                    "model_size": req.size,
                    "gpu": device.label,
                    "format": fmt.value,
                    "backend": tracker.served_by[fmt.value],
                    "model_format": model_format,
                    "backend_accelerator": accelerator_label(req, hardware, fmt, native, device),
                    "precision": results_precision(  # what ran (tbench/precision.py), not what was asked
                        [a for a in served if a.format is fmt] or [a for _, a in composing],
                        req.precision,
                        lambda f: accelerator_label(req, hardware, f, native, by_format[f]),
                    ),
                    "max_batch_size": req.max_batch_size,
                    "model_instances": req.model_instances,
                    "shapes": shapes_label(adapter.io_spec(), perf_inputs.shapes, perf_inputs.varying),
                    "input_data": input_data_label(adapter.given_samples),
                }
                for scenario in req.scenarios:
                    key = f"perf-{scenario.value}-{fmt.value}"
                    offline = scenario is Scenario.OFFLINE
                    served_as = serving_config(req, hardware, fmt, device)
                    served_as = served_as.static() if offline else served_as
                    batching = {"batching": served_as.batching, "max_queue_delay_us": served_as.queue_delay_us}
                    with (
                        tracker.stage(key),
                        configs_loaded(server, {n: offline_configs[n] for n in behind} if offline else {}),
                    ):
                        points = plan_points(
                            [scenario],
                            req.batch_sizes,
                            req.concurrency,
                            req.request_rates,
                            req.request_distribution,
                            req.online_batch_size,
                        )
                        perf_task(
                            scenario,
                            points,
                            model=name,
                            grpc_url=server.endpoints.grpc_url,
                            spec=spec,
                            m=req.measurement,
                            layout=layout,
                            static={**static, **batching},
                            on_row=lambda t, k=key: tracker.save_points(k, t),
                            gpu_env=pinned_env(req.server, hardware),  # perf_analyzer's CUDA memory: the server's GPU
                            server_alive=server.alive,
                            inputs=perf_inputs,
                            on_composing=tracker.save_composing,
                            monitor=PointMonitor(
                                server.endpoints.grpc_url,
                                name,
                                server.processes,
                                server.endpoints.metrics_url,
                                gpu_uuids=device.gpu_uuids,
                            ),
                            cache=cache.for_model(static) if cache else None,
                        )
    except BaseException as err:
        _finish(tracker, req, hardware, server, error=err)
        raise
    url = _finish(tracker, req, hardware, server)
    if tracker.status == FAILED:  # every point failed: the flow run fails too, after its folder is stored
        raise PerfAnalyzerError(f"{tracker.status_line}; the run folder is {url}")
    if tracker.status == COMPLETED_WITH_FAILURES:  # the UI and `tbench submit` see it; a direct call still gets the URL
        return Completed(message=tracker.status_line, name=STATE_COMPLETED_WITH_FAILURES, data=url)
    return url


def _finish(tracker: RunTracker, req, hardware, server, error: BaseException | None = None) -> str:
    """Stop the server, then report and store whatever the run has (flows/lifecycle.py: finish_run)."""
    layout = tracker.layout
    manifest = {
        "request": req.model_dump(mode="json"),
        "hardware": hardware.model_dump(),
        "served_on": tracker.served_on,  # per measured format: the results' gpu label, and why
        "measured_shapes": tracker.measured_shapes,  # each dynamic dim's measured value
        "environment": tracker.environment,  # server identity, tool versions, model digests (tbench.history)
        "host": tracker.host,  # other processes' CPU during the sweeps (tbench.node.host_load, tbench.history)
        "artifact_url": run_url(req.output, layout.run_id),
        "local_dir": str(layout.run_dir),
    }

    def report() -> None:
        with tracker.stage("metrics"):
            manifest["summary"] = summary = metrics_task(tracker.results)
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
                model_notes=adapter_notes(req),
                stage_seconds=dict(tracker.stage_seconds),
                plots_dir=layout.plots_dir,
                status=tracker.status,
                error=tracker.error or tracker.status_line,
                comparison_lines=comparison_lines,
                measured_shapes=tracker.measured_shapes,
            )

    return finish_run(tracker, error, manifest, server=server, output=req.output, report=report)


if __name__ == "__main__":
    # A plain Prefect flow run: `python -m flows.benchmark resnet50 size=small batch_sizes=[1,4]`
    print(benchmark_flow(request_from_argv(sys.argv[1:])))
