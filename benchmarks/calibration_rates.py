"""The rate verdicts calibrated against a simulated server whose truth is known: `kept_up` (did an open-loop rate point
carry its load?) and the capacity plan's sustainable-rate search.

The server is a FCFS queue with Poisson arrivals, c instances and a service-time distribution (gamma or lognormal with
a given CV), a constant client/network overhead, and a per-second slowdown noise (a neighbour on the machine). Its
capacity is c / mean service time; its steady-state percentiles come from a long run of the same queue. For each rate
point it produces what perf_analyzer reports in count_windows mode: windows that close at the first whole second by
which they hold the requested count of completed requests, each window's throughput, average latency and its standard
deviation, perf_analyzer's stopping rule (the last 3 windows within the stability percentage in both throughput and
latency, else at max trials a warning or a failure), the merged last 3 windows' request count, throughput and
percentiles, the server's queue and compute times, and the `-v` log text. The queue carries over from window to
window within a point and each point starts empty, as a real perf_analyzer call does. The project's own decision code
then runs unchanged on it: `tbench.stages.sweep.rate_point_verdict` (kept_up, as a sweep judges a rate point),
`tbench.capacity.rate_search.judge` and `find_sustainable_rate` (a capacity plan's search).

`calibrate(seed, scale)` returns {"rules": ..., "conditions": ..., "parameters": ...}; standalone it prints that JSON.
The real anchor (a sleeper python-backend model of known capacity on the real server) is benchmarks/capacity_truth.py.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from tbench.capacity.evaluate import rate_measurement
from tbench.capacity.rate_search import (
    CONFIRMATIONS,
    RatePoint,
    SustainableRate,
    find_sustainable_rate,
    judge,
)
from tbench.capacity.request import CapacityRequest
from tbench.capacity.statistics import WINDOWS_WARMUP, PercentileRule
from tbench.core.enums import Scenario
from tbench.loadgen import behind
from tbench.loadgen.perf_analyzer import STABLE_WINDOWS, Point, RequestLog, requests_from_export
from tbench.request.benchmark import Measurement
from tbench.stages.sweep import (
    RATE_STABILITY_PCT,
    measure_again,
    rate_point_verdict,
    requests_to_decide,
    retry_window_requests,
)

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Server:
    """A simulated server of known capacity."""

    service_ms: float = 10.0  # mean service time of one request
    cv: float = 0.2  # its coefficient of variation
    dist: str = "gamma"  # gamma or lognormal
    instances: int = 1
    overhead_ms: float = 0.3  # client and network, constant
    noise: float = 0.0  # sd of a per-second log slowdown factor (a noisy neighbour)

    @property
    def capacity(self) -> float:
        """Requests per second it serves at most (the noise's mean factor included)."""
        return self.instances * 1000.0 / (self.service_ms * math.exp(self.noise**2 / 2))

    def service_times(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Seconds."""
        mean = self.service_ms / 1000
        if self.cv <= 0:
            return np.full(shape, mean)
        if self.dist == "lognormal":
            sigma = math.sqrt(math.log1p(self.cv**2))
            return rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, shape)
        k = 1 / self.cv**2
        return rng.gamma(k, mean / k, shape)


def waits(arrivals: np.ndarray, service: np.ndarray, instances: int) -> np.ndarray:
    """Each request's time in queue (FCFS), per row (trial): Lindley's recursion in closed form for one instance
    (W_n = P_n - min_k<=n P_k over the partial sums P of service minus inter-arrival), Kiefer-Wolfowitz's workload
    vector for several."""
    if instances == 1:
        steps = service[:, :-1] - np.diff(arrivals, axis=1)
        walk = np.concatenate([np.zeros((len(arrivals), 1)), np.cumsum(steps, axis=1)], axis=1)
        return walk - np.minimum(np.minimum.accumulate(walk, axis=1), 0.0)
    rows, n = arrivals.shape
    work = np.zeros((rows, instances))
    out = np.empty((rows, n))
    gaps = np.diff(arrivals, axis=1, append=arrivals[:, -1:])
    index = np.arange(rows)
    for i in range(n):
        free = work.argmin(axis=1)
        out[:, i] = work[index, free]
        work[index, free] += service[:, i]
        np.maximum(work - gaps[:, i : i + 1], 0.0, out=work)
    return out


def sojourns(rng, server: Server, rate: float, rows: int, n: int):
    """Arrival times, latencies (overhead + wait + service) and server queue/compute times of `n` Poisson arrivals at
    `rate` per row, starting from an empty server at time 0. Seconds."""
    arrivals = np.cumsum(rng.exponential(1 / rate, (rows, n)), axis=1)
    service = server.service_times(rng, (rows, n))
    if server.noise > 0:  # a slowdown per second of the run, shared by the requests arriving in it
        seconds = int(arrivals[:, -1].max()) + 2
        factor = np.exp(rng.normal(0.0, server.noise, (rows, seconds)))
        service = service * np.take_along_axis(factor, arrivals.astype(int), axis=1)
    wait = waits(arrivals, service, server.instances)
    return arrivals, server.overhead_ms / 1000 + wait + service, wait, service


def steady_percentiles(rng, server: Server, rate: float, n: int = 400_000) -> dict[int, float]:
    """The steady-state latency percentiles (ms) at `rate`: one long run, its first 10% dropped."""
    rows = 4
    _, latency, _, _ = sojourns(rng, server, rate, rows, n // rows)
    kept = latency[:, n // rows // 10 :].ravel() * 1000
    return dict(zip(PERCENTILES, np.percentile(kept, PERCENTILES).tolist(), strict=True))


@dataclass
class Simulated:
    """What one perf_analyzer call at a rate reports."""

    log: str
    status: str  # ok (a measurement was merged) or unstable
    windows: int
    merged_requests: int
    throughput: float
    latency_ms: dict  # avg and p50..p99 of the merged windows
    queue_ms: float
    compute_ms: float
    seconds: float
    export: dict | None = None  # what --profile-export-file writes (perf_analyzer 2.51's format, tensors left out)


def perf_rate_points(
    rng,
    server: Server,
    rate: float,
    window_requests: int,
    max_trials: int,
    stability_pct: float,
    rows: int,
) -> list[Simulated]:
    """`rows` independent perf_analyzer calls at `rate` (Poisson, async), each from an empty server."""
    served = min(rate, server.capacity)
    window_s = math.ceil(window_requests / served * 1.15) + 1
    horizon = max_trials * window_s + 2
    n = int(rate * horizon * 1.1 + 8 * math.sqrt(rate * horizon) + 20)
    arrivals, latency, wait, service = sojourns(rng, server, rate, rows, n)
    departs = arrivals + latency
    order = np.argsort(departs, axis=1, kind="stable")
    latency, wait, service, arrivals = (
        np.take_along_axis(a, order, axis=1) for a in (latency, wait, service, arrivals)
    )
    departs = np.take_along_axis(departs, order, axis=1)
    # completions by each whole second: windows close on whole seconds from the first one's start
    second = np.minimum(np.ceil(departs), horizon + 1).astype(int)
    counts = np.zeros((rows, horizon + 2), dtype=int)
    np.add.at(counts, (np.repeat(np.arange(rows), n), second.ravel()), 1)
    done_by = np.cumsum(counts, axis=1)[:, : horizon + 1]  # done_by[t]: requests completed by second t
    return [
        _one_call(
            rate, arrivals[r], latency[r], wait[r], service[r], done_by[r], window_requests, max_trials, stability_pct
        )
        for r in range(rows)
    ]


def profile_export(rate: float, sent_s: np.ndarray, latency_s: np.ndarray, bounds: list[int]) -> dict:
    """perf_analyzer's --profile-export-file of one call: the requests answered by its last window's end (those still
    in flight are not listed), in the order answered, with the windows' boundaries; nanoseconds from an epoch."""
    epoch = 1_700_000_000 * 10**9
    sent = (sent_s * 1e9).astype(np.int64) + epoch
    answered = ((sent_s + latency_s) * 1e9).astype(np.int64) + epoch
    requests = [
        {"timestamp": s, "response_timestamps": [a]} for s, a in zip(sent.tolist(), answered.tolist(), strict=True)
    ]
    experiment = {
        "experiment": {"mode": "request_rate", "value": rate},
        "requests": requests,
        "window_boundaries": [epoch + b * 10**9 for b in bounds],
    }
    return {"experiments": [experiment], "version": "2.51.0", "service_kind": "triton", "endpoint": ""}


def _one_call(rate, arrivals, latency, wait, service, done_by, window_requests, max_trials, stability_pct) -> Simulated:
    seconds = np.arange(len(done_by))
    bounds, stats = [0], []
    stable_at, warned = None, False
    limit = 1 + stability_pct / 100
    for _ in range(max_trials):
        start = bounds[-1]
        enough = np.nonzero((done_by - done_by[start] >= window_requests) & (seconds > start))[0]
        end = int(enough[0]) if len(enough) else len(done_by) - 1
        bounds.append(end)
        lat = latency[done_by[start] : done_by[end]] * 1e6
        stats.append((len(lat) / max(end - start, 1), lat.mean() if len(lat) else np.inf, lat.std() if len(lat) else 0))
        if len(stats) >= STABLE_WINDOWS:
            tput = [s[0] for s in stats[-3:]]
            lats = [s[1] for s in stats[-3:]]
            tput_ok = min(tput) > 0 and max(tput) / min(tput) <= limit
            if tput_ok and max(lats) / min(lats) <= limit:
                stable_at = len(stats)
                break
    if stable_at is None:
        tput = [s[0] for s in stats[-3:]]
        warned = min(tput) > 0 and max(tput) / min(tput) <= limit
    passes = "".join(
        f"  Pass [{i}] throughput: {t:.6g} infer/sec. Avg latency: {int(a)} usec (std {int(s)} usec). \n"
        for i, (t, a, s) in enumerate(stats, 1)
    )
    head = f"Request Rate: {rate:g} inference requests per seconds\n{passes}"
    elapsed = float(bounds[-1])
    if stable_at is None and not warned:
        log = head + f"Failed to obtain stable measurement within {max_trials} windows.\n"
        return Simulated(log, "unstable", len(stats), 0, math.nan, {}, math.nan, math.nan, elapsed)
    first, last = done_by[bounds[-4]], done_by[bounds[-1]]
    merged = latency[first:last] * 1000
    tput = len(merged) / max(bounds[-1] - bounds[-4], 1)
    pct = dict(zip(PERCENTILES, np.percentile(merged, PERCENTILES), strict=True)) if len(merged) else {}
    lat_ms = {"avg": float(merged.mean()) if len(merged) else math.nan, **{p: float(v) for p, v in pct.items()}}
    queue_ms, compute_ms = float(wait[first:last].mean() * 1000), float(service[first:last].mean() * 1000)
    warning = "Warning: Request latency is not stabilizing. Please try lowering the request rate.\n" if warned else ""
    percentiles = "".join(f"    p{p} latency: {int(v * 1000)} usec\n" for p, v in pct.items())
    log = (
        head
        + warning
        + f"  Client: \n    Request count: {len(merged)}\n    Throughput: {tput:.6g} infer/sec\n"
        + f"    Avg latency: {int(lat_ms['avg'] * 1000)} usec\n{percentiles}"
        + f"  Server: \n    Inference count: {len(merged)}\n"
        + f"    Avg request latency: {int((queue_ms + compute_ms) * 1000)} usec (overhead 5 usec + queue "
        + f"{int(queue_ms * 1000)} usec + compute input 30 usec + compute infer {int(compute_ms * 1000)} usec + "
        + "compute output 10 usec)\n"
    )
    answered = done_by[bounds[-1]]
    export = profile_export(rate, arrivals[:answered], latency[:answered], bounds)
    return Simulated(log, "ok", len(stats), len(merged), tput, lat_ms, queue_ms, compute_ms, elapsed, export)


def perf_row(sim: Simulated) -> dict:
    """The tidy row tbench.stages.sweep.measure_point builds from a call (its columns the verdicts read)."""
    row = {"status": sim.status, "error": "" if sim.status == "ok" else "not stable", "measure_seconds": sim.seconds}
    if sim.status == "ok":
        row.update(
            throughput_infer_per_s=sim.throughput,
            window_requests=sim.merged_requests / STABLE_WINDOWS,
            avg_ms=sim.latency_ms["avg"],
            server_queue_ms=sim.queue_ms,
            server_compute_infer_ms=sim.compute_ms,
            **{f"p{p}_ms": sim.latency_ms[p] for p in PERCENTILES},
        )
    return row


def server_traced(export: dict, overhead_ms: float):
    """The requests of a call as the server's trace has them: the same requests, from their arrival at the server to
    their answer leaving it (the client's constant overhead, half each way, left out), over the same span."""
    log = requests_from_export(export)
    if log is None:
        return None
    half = overhead_ms / 2000
    return RequestLog(log.sent_s + half, log.latency_s - 2 * half, log.span_s, log.boundaries_s)


def judged_row(
    sim: Simulated, rate: float, source: str = "export", overhead_ms: float = 0.0, instances: int | None = None
) -> dict:
    """The row as a sweep keeps it: an open-loop point's figures hold only if it carried the load, judged from where
    stages.sweep.measure_point reads its requests (`source`, the results' requests_from column): perf_analyzer's
    export (small requests), the server's trace (larger ones, on a server we start), or neither (the windows, with the
    server's compute time per request on its `instances`, read from the server's model config)."""
    row = perf_row(sim)
    if sim.status == "ok":
        point = Point(Scenario.RATE, 1, None, rate, "poisson")
        requests = None
        if sim.export and source == "export":
            requests = requests_from_export(sim.export)
        elif sim.export and source == "server trace":
            requests = server_traced(sim.export, overhead_ms)
        instances = instances if requests is None else None
        row["requests_from"] = source if requests is not None else "windows"
        row.update(rate_point_verdict(point, row, sim.merged_requests, sim.log, requests, instances))
    return row


# --- kept_up -------------------------------------------------------------------------------------------------------

KEPT_UP_SERVERS = {
    "gamma cv0.2, 1 instance": Server(10.0, 0.2),
    "exponential, 1 instance": Server(10.0, 1.0),
    "lognormal cv0.5, 2 instances, noisy": Server(20.0, 0.5, "lognormal", 2, noise=0.05),
    "gamma cv0.2, 1 instance, slow (8/s)": Server(125.0, 0.2, noise=0.03),
}
LOADS_OK = (0.1, 0.5, 0.7, 0.85)
LOADS_SATURATED = (1.0, 1.05, 1.1, 1.25, 1.5)


def sweep_windows(rate: float, m: Measurement, attempt: int = 0) -> tuple[int, float]:
    """Requests per window and stability percentage a sweep's rate point gets (tbench.stages.sweep.measure_point)."""
    count = m.requests_per_window(None, 1, attempt, None, rate)
    return count, RATE_STABILITY_PCT


def sweep_rate_points(
    rng, server: Server, rate: float, m: Measurement, trials: int, source: str = "export"
) -> list[tuple[str, Simulated]]:
    """`trials` rate points measured as a sweep measures them: a point its requests could not judge (undetermined)
    measured again with longer windows (tbench.stages.sweep.measure_again), or, where the windows rule could not place
    its load below capacity, with the requests that would (retry_window_requests). Each: (status, the attempt that
    counted)."""
    point = Point(Scenario.RATE, 1, None, rate, "poisson")

    def judged(sim: Simulated) -> tuple[dict, Simulated]:
        return judged_row(sim, rate, source, server.overhead_ms, server.instances), sim

    count, stability = sweep_windows(rate, m)
    rows = [judged(sim) for sim in perf_rate_points(rng, server, rate, count, m.max_trials, stability, trials)]
    for attempt in range(1, m.retries + 1):
        again = [i for i, (row, _) in enumerate(rows) if measure_again(row, attempt - 1, m)]
        if not again:
            break
        planned, stability = sweep_windows(rate, m, attempt)
        by_count: dict[int, list[int]] = {}  # trials of one window size, simulated together
        for i in again:
            instances = server.instances if rows[i][0].get("requests_from") == "windows" else None
            deciding = requests_to_decide(point, rows[i][0], instances)
            by_count.setdefault(retry_window_requests(planned, deciding, rate), []).append(i)
        for count, trials_at in by_count.items():
            sims = perf_rate_points(rng, server, rate, count, m.max_trials, stability, len(trials_at))
            for i, sim in zip(trials_at, sims, strict=True):
                rows[i] = judged(sim)
    return [(row["status"], sim) for row, sim in rows]


def calibrate_kept_up(rng, trials: int) -> tuple[dict, dict]:
    m = Measurement()
    outcomes: dict[str, dict[float, list[str]]] = {}
    windows: list[int] = []
    requests: list[int] = []
    for name, server in KEPT_UP_SERVERS.items():
        outcomes[name] = {}
        for load in LOADS_OK + LOADS_SATURATED:
            rate = round(load * server.capacity, 3)
            judged = sweep_rate_points(rng, server, rate, m, trials)
            windows += [s.windows for _, s in judged]
            requests += [len(s.export["experiments"][0]["requests"]) for _, s in judged if s.export]
            outcomes[name][load] = [status for status, _ in judged]

    def share(loads, status):
        got = [s for o in outcomes.values() for load in loads for s in o[load]]
        return float(np.mean([s == status for s in got]))

    by_load = {
        f"{load:g}": {status: share([load], status) for status in ("ok", "behind", "undetermined", "unstable")}
        for load in LOADS_OK + LOADS_SATURATED
    }
    # requests too large to export (over 1,024 values: image models) are judged from the server's trace where we
    # start the server (embedded, local), by the window rule where we do not (docker, a remote server)
    large: dict[str, dict[float, list[str]]] = {"server trace": {}, "windows": {}}
    for source, statuses in large.items():
        for server in KEPT_UP_SERVERS.values():
            for load in (0.85, *LOADS_SATURATED):
                judged = sweep_rate_points(rng, server, round(load * server.capacity, 3), m, trials, source)
                statuses.setdefault(load, []).extend(status for status, _ in judged)

    def share_large(loads, status, source="server trace"):
        return float(np.mean([s == status for load in loads for s in large[source][load]]))

    rules = {
        "ok_at_saturation": share(LOADS_SATURATED, "ok"),
        "ok_at_85pct": share([0.85], "ok"),
        "ok_at_or_below_85pct": share(LOADS_OK, "ok"),
        "undetermined_share": share(LOADS_OK + LOADS_SATURATED, "undetermined"),
        "undetermined_at_85pct": share([0.85], "undetermined"),
        "by_load": by_load,
        "ok_at_saturation_large_requests": share_large(LOADS_SATURATED, "ok"),
        "ok_at_85pct_large_requests": share_large([0.85], "ok"),
        "undetermined_at_85pct_large_requests": share_large([0.85], "undetermined"),
        "ok_at_saturation_large_requests_untraced": share_large(LOADS_SATURATED, "ok", "windows"),
        "ok_at_85pct_large_requests_untraced": share_large([0.85], "ok", "windows"),
        "trials_per_load": trials * len(KEPT_UP_SERVERS),
    }
    conditions = {
        "loads_ok": list(LOADS_OK),
        "loads_saturated": list(LOADS_SATURATED),
        "servers": {name: asdict(s) | {"capacity_rps": s.capacity} for name, s in KEPT_UP_SERVERS.items()},
        "windows_per_point": _spread(windows),
        "requests_per_point": _spread(requests),
        "requests_per_window": f"a sweep's: max(min_requests {m.min_requests}, window_s {m.window_s} x rate), "
        f"doubled on a retry of an undetermined point ({m.retries} retry); every request exported (requests of at "
        "most 1,024 values), so perf_analyzer stops after 3 windows; *_large_requests: requests too large to export, "
        "judged from the server's trace (tbench.triton.trace: the same requests from their arrival at the server to "
        "their answer leaving it, the client's overhead left out) as on a server tbench starts (embedded, local); "
        "*_large_requests_untraced: judged by the window rule, as on a docker or remote server, with the server's mean "
        "compute time per request over the point and its instance count (the truth's own); its retry of a point whose "
        "load it could not place below capacity asks for the requests that would (tbench.stages.sweep."
        "retry_window_requests: windows of at most MAX_DECIDING_WINDOW_S)",
        "max_trials": m.max_trials,
        "arrivals": "poisson, sent on schedule (async); each point from an empty server",
        "not_tried": "dynamic batching; late sends (client-bound)",
    }
    return rules, conditions


# --- capacity ------------------------------------------------------------------------------------------------------

CAPACITY_CASES = {  # a server and an SLO as a multiple of its mean service time
    "gamma cv0.2, loose SLO (25x)": (Server(10.0, 0.2, noise=0.03), 25.0),
    "exponential, SLO 10x": (Server(10.0, 1.0, noise=0.03), 10.0),
    "lognormal cv0.5, SLO 5x": (Server(10.0, 0.5, "lognormal", noise=0.03), 5.0),
}
RULE = PercentileRule()
# the search as a capacity plan runs it by default (tbench.capacity.request.CapacityRequest)
SEARCH = {k: CapacityRequest.model_fields[k].default for k in ("tolerance", "max_points", "repeats")}


TRUTH_ARRIVALS = 8_000_000  # per steady-state percentile: the truth's own error is then about 0.3% of the rate


def true_sustainable_rate(rng, server: Server, slo_ms: float, percentile: int, n: int = TRUTH_ARRIVALS) -> float:
    """The highest rate whose steady-state percentile meets the SLO (bisection on long runs), below capacity."""
    lo, hi = 0.05 * server.capacity, 0.999 * server.capacity
    if steady_percentiles(rng, server, hi, n)[percentile] <= slo_ms:
        return hi
    for _ in range(14):
        mid = (lo + hi) / 2
        if steady_percentiles(rng, server, mid, n)[percentile] <= slo_ms:
            lo = mid
        else:
            hi = mid
    return lo


def simulated_measure(rng, server: Server, slo_ms: float, m: Measurement, log: list, windows: bool = False):
    """`measure(rate)` for find_sustainable_rate: one simulated perf_analyzer call sized as a capacity plan sizes it
    (tbench.capacity.evaluate.rate_measurement), its row judged as measure_rate judges it. `windows`: requests too
    large to export (an image model's), as on a server tbench starts: the load judged from the server's trace, the
    percentile from the merged windows (judge's windows path)."""

    def measure(rate: float) -> RatePoint:
        rate = round(rate, 3)
        count = m.requests_per_window(None, 1, 0, None, rate)
        sim = perf_rate_points(rng, server, rate, count, m.max_trials, RATE_STABILITY_PCT, 1)[0]
        log.append(sim.seconds)
        if windows:
            return judge(rate, 1, judged_row(sim, rate, "server trace", server.overhead_ms), slo_ms, RULE)
        requests = requests_from_export(sim.export) if sim.export else None
        return judge(rate, 1, judged_row(sim, rate), slo_ms, RULE, requests)

    return measure


CERTIFY_AT = 0.9  # of the true rate: how much measuring a pass there takes (runs_to_certify)
CERTIFY_RUNS = 200  # simulated runs at that rate per case (the spread of a clustered count needs many)


def runs_to_certify(rng, server: Server, slo_ms: float, truth: float, m: Measurement) -> dict:
    """What one run at CERTIFY_AT of the true rate tells about its percentile, and so how many runs, pooled, a rate
    test needs there to pass in 90% of searches: each run's count over the SLO against the percentile's tail (the
    expected count at the tail less the count, over the count's spread between runs) is a per-run z, and the pooled
    runs' z grows with the square root of their number. The search's own test (rate_verdict) must reach the z of its
    confidence shared over REPEATS looks; a 90% chance of reaching it needs 1.28 more on average."""
    spent: list[float] = []
    measure = simulated_measure(rng, server, slo_ms, m, spent)
    points = [measure(CERTIFY_AT * truth) for _ in range(CERTIFY_RUNS)]
    counted = [p for p in points if p.over_slo is not None and p.requests]
    n = np.array([p.requests for p in counted], dtype=float)
    over = np.array([p.over_slo for p in counted], dtype=float)
    margin = n * RULE.tail - over  # requests short of the percentile's tail, per run
    z_run = float(margin.mean() / margin.std(ddof=1)) if len(counted) > 2 and margin.std(ddof=1) > 0 else math.nan
    z_pass = NormalDist().inv_cdf(1 - (1 - RULE.confidence) / SEARCH["repeats"])
    runs = (z_pass + NormalDist().inv_cdf(0.9)) ** 2 / z_run**2 if z_run > 0 else math.inf
    return {
        "share_over_slo": float(over.sum() / n.sum()),
        "z_per_run": round(z_run, 3),
        "runs_to_pass_in_90pct": math.ceil(runs) if math.isfinite(runs) else None,
        "minutes_of_measuring": round(runs * float(np.mean(spent)) / 60, 1) if math.isfinite(runs) else None,
    }


def searched(rng, server: Server, slo_ms: float, m: Measurement, windows: bool = False) -> tuple[float, float, int]:
    """One capacity search on the simulated server: (the rate it plans with, seconds of measuring, points)."""
    spent: list[float] = []
    start = 0.5 * server.capacity * math.exp(rng.normal(0, 0.1))  # start_rate: half the back-to-back rate
    found: SustainableRate = find_sustainable_rate(
        simulated_measure(rng, server, slo_ms, m, spent, windows), start, rule=RULE, **SEARCH
    )
    return found.sustained_rps or 0.0, sum(spent), len(found.points)


def calibrate_windows(rng, searches: int, truths: dict[str, float]) -> dict:
    """The same searches on the same cases where no request is exported (judge's windows path: the percentile from the
    merged windows, judged by its bound): windows_above_truth, windows_within_085 and the rest, per case too."""
    m = rate_measurement(Measurement(), RULE)
    ratios, seconds, points, per_case = [], [], [], {}
    for name, (server, slo_factor) in CAPACITY_CASES.items():
        case = []
        for _ in range(searches):
            rate, spent, measured = searched(rng, server, slo_factor * server.service_ms, m, windows=True)
            case.append(rate / truths[name])
            seconds.append(spent)
            points.append(measured)
        per_case[name] = {
            "median_ratio": float(np.median(case)),
            "above_truth": above_truth(case),
            "within_085": share_within(case, 0.85),
        }
        ratios += case
    return {
        "windows_above_truth": above_truth(ratios),
        "windows_within_085": share_within(ratios, 0.85),
        "windows_within_090": share_within(ratios, 0.9),
        "windows_median_ratio": float(np.median(ratios)),
        "windows_p99_ratio": float(np.percentile(ratios, 99)),
        "windows_measurement_seconds_per_search": _spread(seconds),
        "windows_points_per_search": _spread(points),
        "windows_by_case": per_case,
    }


def calibrate_capacity(rng, searches: int, truth_n: int) -> tuple[dict, dict]:
    m = rate_measurement(Measurement(), RULE)
    ratios, seconds, points = [], [], []
    per_case, truths = {}, {}
    for name, (server, slo_factor) in CAPACITY_CASES.items():
        slo_ms = slo_factor * server.service_ms
        truth = true_sustainable_rate(np.random.default_rng(12345), server, slo_ms, RULE.percentile, truth_n)
        truths[name] = truth
        case = []
        for _ in range(searches):
            rate, spent, measured = searched(rng, server, slo_ms, m)
            case.append(rate / truth)
            seconds.append(spent)
            points.append(measured)
        per_case[name] = {
            "truth_rps": truth,
            "capacity_rps": server.capacity,
            "median_ratio": float(np.median(case)),
            "above_truth": float(np.mean(np.array(case) > 1.0)),
            "within_090": share_within(case, 0.9),
            "within_085": share_within(case, 0.85),
            f"at_{CERTIFY_AT:g}_of_truth": runs_to_certify(rng, server, slo_ms, truth, m),
        }
        ratios += case
    ratios = np.array(ratios)
    rules = {
        "above_truth": float(np.mean(ratios > 1.0)),
        "within_090": share_within(ratios, 0.9),
        "within_085": share_within(ratios, 0.85),
        "median_ratio": float(np.median(ratios)),
        "p01_ratio": float(np.percentile(ratios, 1)),
        "p99_ratio": float(np.percentile(ratios, 99)),
        "measurement_seconds_per_search": _spread(seconds),
        "points_per_search": _spread(points),
        "by_case": per_case,
        "searches": len(ratios),
        **calibrate_windows(rng, searches, truths),
    }
    conditions = {
        "cases": {
            name: asdict(server) | {"slo_ms": factor * server.service_ms, "capacity_rps": server.capacity}
            for name, (server, factor) in CAPACITY_CASES.items()
        },
        "truth": f"the highest rate whose steady-state percentile ({TRUTH_ARRIVALS:,} arrivals, first 10% dropped) "
        "meets the SLO",
        "percentile": RULE.percentile,
        "start": "half the capacity, times a lognormal factor (sd 0.1)",
        "windows": "windows_*: the same searches where no request is exported (an image model on a server tbench "
        "starts): the load judged from the server's trace, the p99 from the merged windows by its bound, the "
        f"warm-up's part added back (WINDOWS_WARMUP {WINDOWS_WARMUP:g}); above_truth: above the truth by more than "
        f"{100 * ABOVE_TRUTH_SLACK:g}%",
        **SEARCH,
        "not_tried": "dynamic batching, several instances",
    }
    return rules, conditions


ABOVE_TRUTH_SLACK = 0.01  # the truth's own error is about 0.3% of the rate (TRUTH_ARRIVALS)


def above_truth(ratios) -> float:
    """The share of plans above the true rate by more than ABOVE_TRUTH_SLACK."""
    return float(np.mean(np.asarray(ratios, dtype=float) > 1.0 + ABOVE_TRUTH_SLACK))


def share_within(ratios, low: float) -> float:
    """The share of plans at `low` of the true rate or more, and not above it."""
    a = np.asarray(ratios, dtype=float)
    return float(np.mean((a >= low) & (a <= 1.0)))


def _spread(values) -> dict:
    a = np.asarray(values, dtype=float)
    return {"min": float(a.min()), "median": float(np.median(a)), "max": float(a.max()), "mean": float(a.mean())}


def parameters() -> dict:
    kept = {k: getattr(behind, k) for k in dir(behind) if k.isupper() and isinstance(getattr(behind, k), int | float)}
    m = rate_measurement(Measurement(), RULE)
    capacity = {
        "percentile": RULE.percentile,
        "requests_per_point": RULE.requests(),
        "window_requests": m.min_requests,
        "window_s": m.window_s,
        "max_trials": m.max_trials,
        "confirmations": CONFIRMATIONS,
        **SEARCH,
    }
    return {"kept_up": kept, "capacity": capacity}


def calibrate(seed: int = 0, scale: float = 1.0) -> dict:
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    kept_rules, kept_conditions = calibrate_kept_up(rng, max(10, int(250 * scale)))
    cap_rules, cap_conditions = calibrate_capacity(rng, max(5, int(100 * scale)), TRUTH_ARRIVALS)
    return {
        "rules": {"kept_up": kept_rules, "capacity": cap_rules},
        "conditions": {"kept_up": kept_conditions, "capacity": cap_conditions},
        "parameters": parameters(),
        "seed": seed,
        "scale": scale,
        "seconds": round(time.monotonic() - started, 1),
    }


if __name__ == "__main__":
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(json.dumps(calibrate(scale=scale), indent=2))
