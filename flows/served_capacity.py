"""The capacity of a model someone else serves (`tbench capacity --served-model` with `--server-url`): wiring only.
Its configuration is the server's, so there is no search: the highest Poisson rate whose percentile holds under the
SLO (tbench.capacity.rate_search), and how many such servers the traffic needs and what they cost. Nothing on the
server is loaded or changed."""

from __future__ import annotations

from flows.lifecycle import finish_run, run_lifecycle
from flows.served import read_served
from tbench.capacity.costs import load_prices, plan, price_for
from tbench.capacity.evaluate import measure_rate, plan_arrivals, rate_measurement, start_rate
from tbench.capacity.rate_search import SustainableRate, find_sustainable_rate
from tbench.capacity.report import PoolAnswer, write_capacity_files
from tbench.capacity.request import CapacityRequest
from tbench.core import progress
from tbench.core.errors import ConfigError
from tbench.node import tools
from tbench.request.benchmark import PROFILE_MEASUREMENT, BenchmarkRequest
from tbench.request.served import check_served
from tbench.stages.sweep import formed_batch_sizes, warm_up
from tbench.triton.monitor import PointMonitor
from tbench.triton.served import ServedModel, ServedServer, parse_served_model


def served_capacity(request: BenchmarkRequest, cap: CapacityRequest, hardware) -> str:
    """Plan the capacity of `request.served_model` on its server; returns the URL of the run folder."""
    if cap.pools:
        raise ConfigError("--served-model measures the server it names from here: leave --pools out")
    name, version = parse_served_model(request.served_model)
    req = check_served(request).model_copy(update={"model": name})
    request_json = {"request": req.model_dump(mode="json"), "capacity": cap.model_dump(mode="json")}
    with run_lifecycle(req, hardware, f"{name}-capacity", request_json) as tracker:
        server, served, found = ServedServer(req.server_url, tracker.layout.server_log), None, None
        try:
            served, adapter, shape_sets = read_served(req, name, version, tracker, server)
            if len(shape_sets) > 1:
                raise ConfigError("a --shape sweep is measured by `tbench run`; capacity takes one shape")
            with tracker.stage("rate-search"):
                found = _sustainable_rate(
                    req, cap, served, server, shape_sets[0].inputs, tracker, adapter.given_samples
                )
        except BaseException as err:
            _finish(tracker, req, cap, hardware, server, served, found, error=err)
            raise
        return _finish(tracker, req, cap, hardware, server, served, found)


def _sustainable_rate(
    req, cap: CapacityRequest, served: ServedModel, server, inputs, tracker, samples
) -> SustainableRate:
    """Bracket and bisect the Poisson rate at batch 1 (tbench.capacity.rate_search), each point kept as measured."""
    grpc_url, spec = server.endpoints.grpc_url, served.io_spec
    # the client's GPU says nothing of the server's: the profile the user names, else the cpu profile's settings
    base = PROFILE_MEASUREMENT[req.profile or "cpu"]
    m = rate_measurement(req.measurement.apply(base) if req.measurement else base, cap.rule)
    latency = warm_up(
        grpc_url,
        served.name,
        spec,
        [1],
        m.warmup_requests,
        inputs.shapes,
        batching=served.batching,
        model_version=inputs.model_version,
        formed=formed_batch_sizes(1, served.dynamic_max_batch),
    )

    def at(rate: float):
        return measure_rate(
            rate,
            1,
            model=served.name,
            grpc_url=grpc_url,
            spec=spec,
            m=m,
            layout=tracker.layout,
            binary=tools.perf_analyzer_binary(),
            env=tools.perf_analyzer_env(),
            slo_ms=cap.slo_ms,
            rule=cap.rule,
            inputs=inputs,
            latency_s=latency.get(1),
            monitor=PointMonitor(grpc_url, served.name),
            arrivals=plan_arrivals(cap, tracker.layout.run_dir / "arrivals", samples, m.seed),
        )

    def measured(point) -> None:
        progress.emit("rate_point", rate=point.rate, status=point.status, latency_ms=point.latency_ms)

    return find_sustainable_rate(
        at,
        start_rate(latency.get(1), served.instances, cap.start_rps or cap.trace_rate()),
        tolerance=cap.tolerance,
        max_points=cap.max_points,
        rule=cap.rule,
        repeats=cap.repeats,
        max_seconds=cap.max_seconds,
        on_point=measured,
    )


def _finish(tracker, req, cap, hardware, server, served, found, error=None) -> str:
    layout = tracker.layout
    manifest = {
        "request": req.model_dump(mode="json"),
        "capacity": cap.model_dump(mode="json"),
        "hardware": hardware.model_dump(),
        "environment": tracker.environment,
        "local_dir": str(layout.run_dir),
    }

    def report() -> None:
        with tracker.stage("report"):
            answer = _answer(cap, served, found, req.model, f"the server at {req.server_url}")
            manifest["summary"] = answer.model_dump(mode="json", include={"status", "reason", "plan"})
            layout.report_md.write_text(write_capacity_files(layout.run_dir, [answer], cap, req.model))

    return finish_run(tracker, error, manifest, server=server, output=req.output, report=report)


def _answer(
    cap: CapacityRequest, served: ServedModel | None, found: SustainableRate | None, model: str, where: str
) -> PoolAnswer:
    """The served model's answer in the capacity report's terms: its configuration as served, its rate, its plan."""
    answer = PoolAnswer(pool=None, hardware=where, model=model, rate=found)
    if served is None or found is None:
        return answer.model_copy(update={"status": "failed", "reason": "the run stopped before its rate search"})
    config = served.config_json()
    answer = answer.model_copy(
        update={
            "configuration": {
                "format": f"{served.kind} (as served)",
                "instances": served.instances,
                "max_batch_size": served.config.max_batch_size,
                "preferred_batch_sizes": config.get("dynamic_batching", {}).get("preferred_batch_size", []),
                "queue_delay_us": served.queue_delay_us or 0,
            }
        }
    )
    if found.sustained_rps is None:
        return answer.model_copy(update={"status": "no_rate", "reason": f"no rate met the SLO: {found.stopped}"})
    price = price_for(load_prices(cap.prices), cap.pool) if cap.pool else None
    costs = plan(
        found.sustained_rps,
        cap.traffic_rps,
        cap.headroom,
        usd_per_hour=float(price["usd_per_hour"]) if price else None,
    )
    return answer.model_copy(update={"plan": costs, "price": price})
