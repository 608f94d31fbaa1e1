"""Traffic from a trace, against a server of known capacity: how faithfully perf_analyzer replays a trace, and whether
a capacity plan on the trace finds the speed-up that truly holds.

The server is the sleeper (tbench.triton.sleeper: 5 ms a request, one at a time), served by an embedded server; the
trace is bursty (gamma intervals of CV 2, 1,500 requests, 60 requests/s), as a user's file would be (a CSV with a
timestamp column).
- Fidelity: `tbench run --served-model sleeper --trace` at speed-ups 1 and 2; each point's arrivals_*_error_us (the
  intervals perf_analyzer sent at against the trace's, from the exported requests).
- The plan: `tbench capacity --served-model sleeper --trace ... --slo-p99-ms 150`; the planned speed-up is the
  sustainable rate over the trace's mean rate.
- The truth: the sleeper's service time measured (closed loop, 4 requests in flight: its throughput is 1 / service
  time, overheads included), then the trace sped up through a FIFO queue with that service time (Lindley's recursion):
  the highest speed-up whose p99 sojourn (plus the client's round trip measured at one request in flight, less the
  service time) is within the SLO, bisected. The trace as it is replayed (once, from an empty server) is the truth the
  plan answers for: its requests are the traffic. Beside it, the trace taken as periodic traffic (looped 20 times, the
  first loop left out), which bursts pile up over.
Goal: planned / true speed-up within [0.90, 1.00].

Usage: .venv/bin/python benchmarks/trace_replay.py [--service-ms 5]
Writes benchmarks/results/trace.json (`planned_over_true`, the fidelity figures, the trace and the truth), whole.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from capacity_truth import sleeper_measurement
from provenance import RESULTS, recorded

from tbench.core.enums import Scenario
from tbench.core.layout import RunLayout
from tbench.core.request_trace import read_trace
from tbench.loadgen.perf_analyzer import Point
from tbench.request.benchmark import Measurement
from tbench.stages.sweep import measure_point
from tbench.triton.process_server import EmbeddedServer
from tbench.triton.sleeper import MODEL, sleeper_repository

TBENCH = str(Path(sys.executable).with_name("tbench"))
SERVICE_MS = 5.0
SLO_MS = 150.0
TRACE = {"requests": 1500, "rate": 60.0, "burstiness": 2.0, "seed": 1}
LOOPS = 20


def bursty_trace(path: Path) -> Path:
    rng = np.random.default_rng(TRACE["seed"])
    shape = 1 / TRACE["burstiness"] ** 2
    times = np.cumsum(rng.gamma(shape, 1 / (TRACE["rate"] * shape), TRACE["requests"]))
    path.write_text("timestamp\n" + "\n".join(f"{t - times[0]:.6f}" for t in times) + "\n")
    return path


def tbench(*args: str) -> Path:
    done = subprocess.run([TBENCH, *args], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"tbench {' '.join(args)} failed ({done.returncode}): {done.stdout[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def p99_sojourn(times_s: np.ndarray, speed: float, service_s: float, extra_s: float, loops: int = 1) -> float:
    """The p99 of the time in system of the trace at `speed` through a FIFO server of constant service time, from an
    empty server (Lindley: W_n = max(0, W_{n-1} + S - A_n)), plus the client's extra time; with `loops` > 1 the trace
    looped that many times, the first loop left out."""
    gaps = np.diff(times_s) / speed
    arrivals = np.concatenate([[0.0], np.tile(np.append(gaps, gaps.mean()), loops)[: loops * len(times_s) - 1]])
    sums = np.cumsum(service_s - arrivals)
    waits = np.maximum(sums - np.minimum.accumulate(np.minimum(sums, 0.0)), 0.0) - service_s + arrivals[0]
    waits = np.maximum(waits, 0.0)
    kept = waits[len(times_s) :] if loops > 1 else waits
    return float(np.percentile(kept, 99)) + service_s + extra_s


def true_speed(times_s: np.ndarray, service_s: float, extra_s: float, loops: int = 1) -> float:
    mean_rate = (len(times_s) - 1) / times_s[-1]
    lo, hi = 0.01, 1.0 / (service_s * mean_rate)  # at hi the server is never idle
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p99_sojourn(times_s, mid, service_s, extra_s, loops) <= SLO_MS / 1000 else (lo, mid)
    return lo


def measured_service(server, work: Path) -> tuple[float, float]:
    """(service time, the client's extra time) in seconds: closed loop at 4 in flight (the server never idle: its
    throughput is 1 / service time) and at 1 (the latency is service + the round trip)."""
    common, latency = sleeper_measurement(server, RunLayout(work, "truth").create())
    full = measure_point(Point(Scenario.ONLINE, 1, 4), m=Measurement(window_s=5.0), latency_s=latency, **common)
    one = measure_point(Point(Scenario.ONLINE, 1, 1), m=Measurement(window_s=5.0), latency_s=latency, **common)
    service = 1.0 / float(full["throughput_infer_per_s"])
    return service, max(0.0, float(one["p50_ms"]) / 1000 - service)


def main() -> None:
    global SERVICE_MS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-ms", type=float, default=SERVICE_MS, help="the sleeper's service time, ms")
    SERVICE_MS = parser.parse_args().service_ms
    with recorded(RESULTS / "trace.json", model_sizes=[f"sleeper {SERVICE_MS:g} ms"]) as record:
        work = Path(tempfile.mkdtemp(prefix="tbench-trace-bench-"))
        trace_file = bursty_trace(work / "trace.csv")
        trace = read_trace(trace_file)
        repo = sleeper_repository(work / "repo", SERVICE_MS)
        record.update(trace={**TRACE, "span_s": round(trace.span_s, 2), "mean_rate": round(trace.mean_rate, 3)})
        with EmbeddedServer(repo, work / "server.log") as server:
            url = f"{server.endpoints.grpc_url},{server.endpoints.http_url}"
            service_s, extra_s = measured_service(server, work)
            truth = true_speed(trace.times_s, service_s, extra_s)
            periodic = true_speed(trace.times_s, service_s, extra_s, loops=LOOPS)
            record.update(
                true_speed_periodic=round(periodic, 4),
                service_ms=round(service_s * 1000, 3),
                client_extra_ms=round(extra_s * 1000, 3),
                slo_p99_ms=SLO_MS,
                true_speed=round(truth, 4),
                true_rate=round(truth * trace.mean_rate, 3),
            )
            record.save()
            run = tbench(
                "run", "--served-model", MODEL, "--server-url", url, "--scenarios", "rate", "--trace", str(trace_file),
                "--trace-speed", "1,2", "--output", str(work / "runs"),
            )  # fmt: skip
            rows = pd.read_csv(run / "results.csv")
            record["fidelity"] = [
                {
                    "speed": round(float(r["request_rate"]) / trace.mean_rate, 3),
                    "status": r["status"],
                    "median_abs_error_us": r["arrivals_median_error_us"],
                    "p99_abs_error_us": r["arrivals_p99_error_us"],
                    "mean_interval_us": round(1e6 / float(r["request_rate"]), 1),
                }
                for r in rows.to_dict("records")
            ]
            record.save()
            plan = tbench(
                "capacity", "--served-model", MODEL, "--server-url", url, "--trace", str(trace_file),
                "--slo-p99-ms", f"{SLO_MS:g}", "--traffic", "1", "--max-points", "24", "--output", str(work / "runs"),
            )  # fmt: skip
            answer = json.loads((plan / "capacity.json").read_text())["answers"][0]
        sustainable = answer["plan"]["sustainable_rps"] if answer.get("plan") else None
        planned = sustainable / trace.mean_rate if sustainable else None
        record.update(
            planned_speed=None if planned is None else round(planned, 4),
            planned_over_true=None if planned is None else round(planned / truth, 4),
            planned_over_periodic=None if planned is None else round(planned / periodic, 4),
            within_goal=planned is not None and 0.90 <= planned / truth <= 1.00,
            search={"points": len(answer["rate"]["points"]), "stopped": answer["rate"]["stopped"]},
        )
        print(
            f"true speed-up {truth:.3f}, planned {planned}, ratio {record['planned_over_true']}; "
            f"fidelity {record['fidelity']}"
        )


if __name__ == "__main__":
    main()
