"""The capacity rule proved against a server whose capacity is known: a python-backend model that sleeps a set service
time per request (one instance, no batching, so it serves one request at a time: an M/D/1 queue under Poisson
arrivals, capacity 1 / service time).

For each service time:
- true capacity: the server saturated (closed loop, 4 requests in flight, so it is never idle) serves exactly its
  capacity, overhead included; the nominal 1/service time is recorded beside it;
- the plan: the sustainable-rate search a capacity plan runs (`tbench.capacity.evaluate.measure_rate`, the same
  measurement, checks and verdict, and `find_sustainable_rate`), under a loose p99 SLO of 100 x the service time (where
  the queue's own answer is close to capacity: the plan must not exceed it) and a tight one of 3 x the service time;
- the M/D/1 queue's own answer to each SLO: the highest utilisation whose p99 sojourn (wait + service) meets it, from
  Lindley's recursion over 2 million simulated Poisson arrivals with the measured service time;
- every rate point with its verdict, and whether the rule before this change (served within 3/sqrt(n) of offered, at
  most 1% of sends late, p99 within the SLO; no look at rising latency) would have passed it.

Goal: planned / true capacity in [0.90, 1.00] under the loose SLO, never above 1.

Usage: .venv/bin/python benchmarks/capacity_truth.py [--service-ms 10,20]
Writes benchmarks/results/capacity_truth.json, whole, with its provenance (benchmarks/provenance.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from provenance import RESULTS, recorded

from tbench.capacity.evaluate import measure_rate, rate_measurement, start_rate
from tbench.capacity.rate_search import RatePoint, find_sustainable_rate
from tbench.capacity.statistics import PercentileRule
from tbench.core.enums import Scenario
from tbench.core.layout import RunLayout, perf_log_for
from tbench.loadgen.behind import behind_tolerance
from tbench.loadgen.perf_analyzer import PerfInputs, Point, delayed_percent
from tbench.node import tools
from tbench.request.benchmark import Measurement
from tbench.stages.sweep import measure_point, warm_up
from tbench.triton.process_server import EmbeddedServer
from tbench.triton.sleeper import MODEL, SPEC, sleeper_repository

RULE = PercentileRule()  # p99 from 1,522 requests, as a capacity plan's default
SLO_FACTORS = {"loose": 100.0, "tight": 3.0}


def md1_sustainable_utilisation(slo_in_services: float, percentile: float = 99, arrivals: int = 2_000_000) -> float:
    """The highest utilisation rho of an M/D/1 queue (service time 1) whose `percentile` sojourn time is within
    `slo_in_services`: Lindley's recursion W_n = max(0, W_{n-1} + 1 - A_n), solved in closed form over the cumulative
    sums (W_n = S_n - min(0, min_k<=n S_k)), bisected on rho with common random numbers."""
    gaps = np.random.default_rng(0).exponential(1.0, arrivals)

    def p_sojourn(rho: float) -> float:
        steps = 1.0 - gaps / rho  # service 1, inter-arrival time exponential with mean 1/rho
        sums = np.cumsum(steps)
        waits = sums - np.minimum(np.minimum.accumulate(sums), 0.0)
        return float(np.percentile(waits[arrivals // 10 :], percentile)) + 1.0  # the first tenth warms the queue

    lo, hi = 0.01, 0.9999
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_sojourn(mid) <= slo_in_services else (lo, mid)
    return lo


def former_rule_passes(point: RatePoint, slo_ms: float) -> bool | None:
    """The verdict of the rule before this change on the same measurement: served within 3/sqrt(n) (at least 2%) of
    offered, at most 1% of sends late, enough requests and the p99 within the SLO."""
    if point.served_rps is None or point.requests is None or point.latency_ms is None:
        return None
    tolerance = behind_tolerance(point.requests)  # the Poisson rule, unchanged
    return (
        point.served_rps >= point.rate * (1 - tolerance)
        and (point.delayed_pct or 0.0) <= 1.0
        and point.requests >= RULE.requests()
        and point.latency_ms <= slo_ms
    )


def sleeper_measurement(server, layout: RunLayout) -> tuple[dict, float]:
    """measure_point's keyword arguments for the sleeper on `server`, and its latency once warmed up (seconds)."""
    measure = dict(
        model=MODEL,
        grpc_url=server.endpoints.grpc_url,
        spec=SPEC,
        layout=layout,
        binary=tools.perf_analyzer_binary(),
        env=tools.perf_analyzer_env(),
        inputs=PerfInputs(shared_memory="none"),
    )
    return measure, warm_up(server.endpoints.grpc_url, MODEL, SPEC, [1], requests=5)[1]


def one_service_time(service_ms: float, work: Path, tolerance: float, max_points: int) -> dict:
    repo = sleeper_repository(work / f"repo_{service_ms:g}", service_ms)
    layout = RunLayout(work, f"sleeper_{service_ms:g}ms").create()
    with EmbeddedServer(repo, work / f"server_{service_ms:g}.log") as server:
        measure, latency = sleeper_measurement(server, layout)
        saturated = measure_point(
            Point(Scenario.ONLINE, 1, 4), m=Measurement(window_s=5.0), latency_s=latency, **measure
        )
        capacity = float(saturated["throughput_infer_per_s"])
        record = {
            "service_ms": service_ms,
            "nominal_capacity_req_s": round(1000 / service_ms, 3),
            "true_capacity_req_s": round(capacity, 3),
            "true_capacity_measured_as": "closed loop, 4 requests in flight, windows of 5 s, "
            f"{saturated['status']}, {saturated['window_requests']:.0f} requests per window",
            "slos": {},
        }
        for name, factor in SLO_FACTORS.items():
            slo_ms = factor * service_ms
            m = rate_measurement(Measurement(), RULE)
            found = find_sustainable_rate(
                lambda rate, slo_ms=slo_ms, m=m: measure_rate(
                    rate, 1, slo_ms=slo_ms, rule=RULE, m=m, latency_s=latency, **measure
                ),
                start_rate(latency, 1),
                tolerance=tolerance,
                max_points=max_points,
            )
            planned = found.sustained_rps
            rho = md1_sustainable_utilisation(slo_ms * capacity / 1000)  # the SLO in measured service times
            points = []
            for p in found.points:
                log = layout.run_dir / perf_log_for(p.source_file) if p.source_file else Path("/nonexistent")
                points.append(
                    {
                        "offered_req_s": p.rate,
                        "utilisation": round(p.rate / capacity, 4),
                        "status": p.status,
                        "reason": p.reason,
                        "p99_ms": p.latency_ms,
                        "served_req_s": p.served_rps,
                        "requests": p.requests,
                        "delayed_pct": delayed_percent(log.read_text()) if log.is_file() else None,
                        "former_rule_passes": former_rule_passes(p, slo_ms),
                        "seconds": round(p.seconds, 1),
                    }
                )
            record["slos"][name] = {
                "slo_p99_ms": slo_ms,
                "planned_req_s": None if planned is None else round(planned, 3),
                "ratio": None if planned is None else round(planned / capacity, 4),
                "md1_req_s": round(rho * capacity, 3),
                "md1_utilisation": round(rho, 4),
                "planned_over_md1": None if planned is None else round(planned / (rho * capacity), 4),
                "stopped": found.stopped,
                "search_s": round(found.seconds, 1),
                "points": points,
            }
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-ms", default="10,20", help="service times to plan, ms, comma-separated")
    parser.add_argument("--tolerance", type=float, default=0.05, help="the rate search's bracket, as a fraction")
    parser.add_argument("--max-points", type=int, default=10, help="most rates per search")
    args = parser.parse_args()
    times = [float(t) for t in args.service_ms.split(",")]
    with (
        recorded(RESULTS / "capacity_truth.json", model_sizes=[f"sleeper {t:g}ms" for t in times]) as record,
        tempfile.TemporaryDirectory(prefix="capacity-truth-") as tmp,
    ):
        record["rule"] = RULE.describe()
        record["search"] = {"tolerance": args.tolerance, "max_points": args.max_points}
        record["cases"] = []
        for t in times:
            case = one_service_time(t, Path(tmp), args.tolerance, args.max_points)
            record["cases"].append(case)
            record.save()
            for name, s in case["slos"].items():
                print(
                    f"{t:g} ms {name}: capacity {case['true_capacity_req_s']:.1f}/s, planned {s['planned_req_s']}/s "
                    f"(ratio {s['ratio']}), M/D/1 {s['md1_req_s']}/s; {s['stopped']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
