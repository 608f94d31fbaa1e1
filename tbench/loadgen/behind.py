"""Whether an open-loop (request-rate) point kept up with the load it was offered, and if not, whose limit it was.

A rate point's figures describe the offered load only if the server carried it. It did not when:

- it served less than was offered, beyond the arrivals' own randomness: a Poisson schedule's count over n requests
  varies by 1/sqrt(n), so 3/sqrt(n) (at least 2%); a constant schedule has no randomness, only a request at each
  window's edge, so 2%;
- its latency kept rising: a queue that grows shows as each window's latency higher than the last. perf_analyzer, in
  its asynchronous request-rate mode, accepts a point whose throughput is steady while latency is not, with a warning
  ("Request latency is not stabilizing"), and goes on; requests still queued when a window closes are not in its
  percentiles, so such a point's p99 reads low exactly when the queue grows. The warning alone is not the test: it
  fires whenever the last 3 windows' average latency differ by more than the stability percentage, which a server
  that keeps up does at high load (seen at 60% of a known capacity with 200-request windows, latency flat at 17-24
  ms). The test is a trend over all the point's windows, in the order measured: the Mann-Kendall statistic (one-sided,
  p < 0.01; Mann 1945, Kendall 1975: the rank test for a monotonic trend that makes no assumption on the noise's
  distribution) and a rise of the fitted (Theil-Sen) line over the windows of more than 10% of their median;
- perf_analyzer could not send on schedule (more than `max_delayed_pct` of the requests were late).

With every request's timestamps (perf_analyzer's --profile-export-file, `RequestLog`), the point is judged from them
instead (`kept_up_from_requests`): the windows' averages cannot tell a server at 85% of its capacity from one at 100%
(at 100% the queue is a random walk that wanders, at 85% it relaxes slowly from an empty start; both look alike over a
few windows), but the requests can. While requests wait, a server answers at its own pace: the gaps between answers
given while at least k requests were in flight are its service gaps, whatever the load, for every k up to its
instances (batching only makes a deeper backlog faster). The highest of those paces, less `EXPORT_Z` standard errors
(the gaps' own CV over their count), is a lower bound of what it can serve; the point kept up when that bound is above
the offered rate. It fell behind when it served short of it or when the mean latency of 10 equal blocks of the span
rose with a significant trend, unless most requests found the server idle (a light load: a rise there is its
requests slowing, a neighbour's doing, not a queue); else it is undetermined (measured again with longer windows by
the sweep).

Without either (requests too large to export, on a server whose trace we cannot read: docker, remote), the windows
alone cannot tell a server at capacity from one below it (a queue from an empty start grows too slowly to show over 3
windows), and the server's own figures decide: the load the offered rate puts on its instances is the rate times the
time an instance spends per request (Triton's compute input + infer + output, perf_analyzer's server breakdown) over
the instances. Its upper bound (`LOAD_Z` standard errors of a mean of that many requests, their CV taken as
`ASSUMED_SERVICE_CV`) below 1 is a server that keeps up, also where the windows' latency rose a little and 3 windows
cannot test the rise; else the point is undetermined, and the sweep measures it again with the requests that would
decide it (`InstanceLoad.requests_to_decide`). A rise the windows call a growing queue while the load's estimate is
below 1 is a queue still filling from an empty start (at 85% of capacity it takes seconds), or a limit outside the
instances: undetermined, measured again, never behind nor ok on that evidence. Under dynamic batching the breakdown
charges each request its whole batch's compute, so the time per request is taken from Triton's batch statistics where
the server keeps them (each execution once: tbench.stages.rate_verdict.busy_per_request_ms); the breakdown's, where it
must serve, overstates the load and errs towards undetermined.

Late sends are the load generator's own limit, not the server's: when the server served everything it was offered
(within the tolerance) and its latency was steady, the point is client-bound: the server sustains at least what was
served, and a higher rate needs more load generators, not another measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, get_args

import numpy as np

from tbench.loadgen.perf_analyzer import RequestLog, delayed_percent, parse_windows

LATENCY_NOT_STABLE = "Request latency is not stabilizing"
MAX_DELAYED_PCT = 1.0  # perf_analyzer warns of any late send; a few late sends do not change the load
TREND_P = 0.01  # the Mann-Kendall test's one-sided significance
RISE_LIMIT = 0.10  # and the rise over the windows, as a fraction of their median latency
# A queue that grows leaves the last window the slowest: more than GROWTH_FACTOR x the first is a growing queue on
# any number of windows; a rise above RISE_LIMIT with the served count over SHORT_SIGMAS Poisson standard deviations
# short of the offered one is too (calibrated in benchmarks/calibration_rates.py)
GROWTH_FACTOR = 3.0
SHORT_SIGMAS = 2.0

# per-request data (calibrated in benchmarks/calibration_rates.py)
EXPORT_Z = 4.0  # standard errors below the backlogged pace for a lower bound of the capacity (max over the levels)
MAX_LEVEL = 8  # backlog depths tried (requests in flight)
MIN_GAPS = 20  # answers given at one backlog depth before its pace counts
# at most this share of requests (its upper bound) found another in flight: a light load, far from saturation
LIGHT_LOAD_BUSY_SHARE = 0.5
MIN_GAP_CV = 0.1  # the gaps' CV counted at least this: a nearly constant service (or a too-short sample) is no proof
TREND_BLOCKS = 10  # equal blocks of the span whose mean latencies the trend test orders

# the windows alone (calibrated in benchmarks/calibration_rates.py)
ASSUMED_SERVICE_CV = 1.0  # per-request compute times' CV (an exponential service) for the mean's standard error
LOAD_Z = 4.0  # standard errors above the estimated load for its upper bound

KeptUpStatus = Literal["ok", "behind", "client_bound", "undetermined"]
KEPT_UP_STATUSES: tuple[str, ...] = get_args(KeptUpStatus)
CARRIED: tuple[KeptUpStatus, ...] = ("ok", "client_bound")  # the point carried its load (client-bound: at least)


def behind_tolerance(requests: int, distribution: str = "poisson") -> float:
    """How far below the offered rate a point's throughput may be and still count as keeping up: for Poisson arrivals
    three standard deviations of a count of `requests` (3/sqrt(n)), at least 2%; for a constant schedule 2%."""
    if distribution == "constant":
        return 0.02
    return max(0.02, 3 / math.sqrt(max(requests, 1)))


def mann_kendall_p(values: list[float]) -> float:
    """One-sided p-value of the Mann-Kendall test for an increasing trend (normal approximation with continuity
    correction; ties count zero). 1.0 for fewer than 3 values."""
    n = len(values)
    if n < 3:
        return 1.0
    s = sum(np.sign(values[j] - values[i]) for i in range(n) for j in range(i + 1, n))
    sigma = math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    return 1 - NormalDist().cdf((s - 1) / sigma) if s > 0 else 1.0


MIN_TREND_WINDOWS = next(n for n in range(3, 20) if mann_kendall_p(list(range(n))) < TREND_P)


def latency_rise(log_text: str) -> tuple[float, float, int] | None:
    """The windows' latency trend: (rise of the Theil-Sen line over the windows as a fraction of their median, the
    Mann-Kendall p-value, windows), over every window the log has, in order; None for fewer than 3."""
    latencies = [w.latency_us for w in parse_windows(log_text)]
    n = len(latencies)
    median = float(np.median(latencies)) if latencies else 0.0
    if n < 3 or median <= 0:
        return None
    slope = float(np.median([(latencies[j] - latencies[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]))
    return slope * (n - 1) / median, mann_kendall_p(latencies), n


def trend_decidable(windows: int, p: float = TREND_P) -> bool:
    """Whether the trend test can reach significance `p` on this many windows at all (a perfectly monotone rise gives
    Mann-Kendall's smallest p: 0.148 for 3 windows, 0.045 for 4, 0.014 for 5, 0.004 for 6)."""
    return mann_kendall_p(list(range(windows))) < p


def rose_to_the_end(latencies: list[float], factor: float) -> bool:
    """The last window is the slowest and more than `factor` times the first: the shape of a queue that kept growing
    until perf_analyzer stopped."""
    return len(latencies) >= 2 and latencies[-1] >= max(latencies) and latencies[-1] > factor * latencies[0]


def shortfall_sigmas(rate: float, served_rps: float, requests: int) -> float:
    """How far below the offered rate the point served, in standard deviations of a Poisson count of `requests`."""
    return (1 - served_rps / rate) * math.sqrt(max(requests, 1)) if rate > 0 else 0.0


@dataclass(frozen=True)
class InstanceLoad:
    """The load an offered rate puts on the server's instances (1 = every instance busy all the time), estimated over
    `requests` requests."""

    share: float
    requests: int

    @classmethod
    def estimate(cls, rate: float, busy_ms: float | None, instances: int | None, requests: int) -> InstanceLoad | None:
        """From `busy_ms` an instance spent per request over `requests` requests; None where a figure is missing."""
        if not busy_ms or not math.isfinite(busy_ms) or busy_ms <= 0 or not instances or requests < 1:
            return None
        return cls(rate * busy_ms / 1000 / instances, requests)

    def bound(self, z: float) -> float:
        """The share plus `z` standard errors of a mean of its requests (their CV taken as ASSUMED_SERVICE_CV)."""
        return self.share * (1 + z * ASSUMED_SERVICE_CV / math.sqrt(self.requests))

    @property
    def upper(self) -> float:
        return self.bound(LOAD_Z)

    def requests_to_decide(self) -> int | None:
        """Requests over which the upper bound falls below 1 at a pessimistic share (this estimate plus one standard
        error: the next measurement's estimate moves); None where that share is at or above 1."""
        pessimistic = self.bound(1.0)
        if pessimistic >= 1:
            return None
        return math.ceil((LOAD_Z * ASSUMED_SERVICE_CV * pessimistic / (1 - pessimistic)) ** 2)


@dataclass(frozen=True)
class KeptUp:
    """The verdict on one rate point (`status`, one of `KEPT_UP_STATUSES`), with the reason in words."""

    status: KeptUpStatus
    reason: str = ""
    delayed_pct: float = 0.0


def growing_queue(
    latencies: list[float],
    log_text: str,
    rate: float,
    served_rps: float,
    requests: int,
    distribution: str,
    rise_limit: float = RISE_LIMIT,
) -> str | None:
    """What in the windows shows a growing queue, in words, or None: latency rising to the last window while the
    served count fell short, a last window over GROWTH_FACTOR x the first, or a significant trend."""
    served = f"served {served_rps:.4g} req/s of {rate:.4g} offered"
    sigmas = shortfall_sigmas(rate, served_rps, requests) if distribution == "poisson" else 0.0
    if rose_to_the_end(latencies, 1 + rise_limit) and sigmas > SHORT_SIGMAS:
        return (
            f"{served} ({sigmas:.1f} standard deviations short) while latency rose to the last window "
            f"({latencies[0] / 1000:.3g} -> {latencies[-1] / 1000:.3g} ms): a growing queue"
        )
    if rose_to_the_end(latencies, GROWTH_FACTOR):
        return (
            f"latency rose {latencies[-1] / latencies[0]:.2g}x over {len(latencies)} windows, the last the slowest "
            f"({latencies[0] / 1000:.3g} -> {latencies[-1] / 1000:.3g} ms): a growing queue"
        )
    trend = latency_rise(log_text)
    if trend is not None and trend[0] > rise_limit and trend[1] < TREND_P:
        rise, p, windows = trend
        return f"latency rose {100 * rise:.0f}% over {windows} windows, a growing queue (trend p={p:.2g})"
    return None


def kept_up(
    rate: float,
    served_rps: float,
    requests: int,
    distribution: str,
    log_text: str,
    max_delayed_pct: float = MAX_DELAYED_PCT,
    rise_limit: float = RISE_LIMIT,
    request_log: RequestLog | None = None,
    busy_ms: float | None = None,
    instances: int | None = None,
) -> KeptUp:
    """Judge a measured rate point: offered `rate` requests/s, `served_rps` the requests/s perf_analyzer counted
    (its throughput over the batch size), `requests` the merged windows' requests, `log_text` its -v log; from every
    request's timestamps when `request_log` (its export) is given, else from the windows and the time one of the
    server's `instances` spent per request (`busy_ms`)."""
    delayed = delayed_percent(log_text)
    if request_log is not None and len(request_log) >= 2:
        return kept_up_from_requests(rate, served_rps, request_log, distribution, delayed, max_delayed_pct, rise_limit)
    tolerance = behind_tolerance(requests, distribution)
    verdict = dict(delayed_pct=delayed)
    latencies = [w.latency_us for w in parse_windows(log_text)]
    late = f"; {delayed:g}% of the sends were late" if delayed > max_delayed_pct else ""
    warned = " (perf_analyzer: not stabilizing)" if LATENCY_NOT_STABLE in log_text else ""
    served = f"served {served_rps:.4g} req/s of {rate:.4g} offered"
    if not served_rps >= rate * (1 - tolerance):  # NaN (nothing reported) included
        reason = f"{served} (more than {100 * tolerance:.1f}% behind){late}"
        return KeptUp("behind", reason, **verdict)
    rising = rose_to_the_end(latencies, 1 + rise_limit)
    load = InstanceLoad.estimate(rate, busy_ms, instances, requests)
    growing = growing_queue(latencies, log_text, rate, served_rps, requests, distribution, rise_limit)
    if growing and load is not None and load.share < 1:  # the compute says otherwise: measure longer
        reason = (
            f"{growing}, while the server's compute keeps its {instances} instance(s) {100 * load.share:.0f}% busy "
            f"(up to {100 * load.upper:.0f}% over {requests} requests): a queue still filling from an empty start, "
            "or a limit outside the instances; measure longer windows"
        )
        return KeptUp("undetermined", reason, **verdict)
    if growing:
        return KeptUp("behind", f"{growing}{late}{warned}", **verdict)
    confidently_below = load is not None and load.upper < 1  # the server's compute places the rate below capacity
    if rising and not trend_decidable(len(latencies)) and not confidently_below:
        reason = (
            f"latency rose to the last window ({latencies[0] / 1000:.3g} -> {latencies[-1] / 1000:.3g} ms) and "
            f"{len(latencies)} windows cannot tell a growing queue from noise (the trend test needs "
            f"{MIN_TREND_WINDOWS}); measure longer windows or a lower rate"
        )
        return KeptUp("undetermined", reason, **verdict)
    if load is None:
        reason = (
            f"{served}, latency steady over {len(latencies)} windows; without the requests' timestamps or the server's "
            "compute times per instance, the windows cannot tell a server at capacity from one below it"
        )
        return KeptUp("undetermined", reason, **verdict)
    if load.upper >= 1:
        needed = load.requests_to_decide()
        reason = (
            f"{served}: at {busy_ms:.3g} ms of compute per request on {instances} instance(s) the offered rate keeps "
            f"them {100 * load.share:.0f}% busy (up to {100 * load.upper:.0f}% over {requests} requests), too close "
            "to capacity for the windows to tell; "
            + (f"about {needed} requests would decide it" if needed else "measure a lower rate")
        )
        return KeptUp("undetermined", reason, **verdict)
    return kept_up_or_client_bound(rate, served_rps, delayed, max_delayed_pct)


def kept_up_or_client_bound(rate: float, served_rps: float, delayed: float, max_delayed_pct: float) -> KeptUp:
    """A point the server kept up with: ok, or client-bound where perf_analyzer sent too many requests late."""
    if delayed > max_delayed_pct:
        reason = (
            f"client-bound: {delayed:g}% of the sends were late while the server kept up "
            f"({served_rps:.4g} of {rate:.4g} req/s); it sustains at least {min(rate, served_rps):.4g} req/s"
        )
        return KeptUp("client_bound", reason, delayed_pct=delayed)
    return KeptUp("ok", delayed_pct=delayed)


@dataclass(frozen=True)
class Pace:
    """How fast the server answered while at least `level` requests were in flight: `rate` answers/s over `gaps`
    gaps between answers, `se` its relative standard error (the gaps' CV over sqrt(gaps))."""

    level: int
    rate: float
    se: float
    gaps: int

    def lower(self, z: float = EXPORT_Z) -> float:
        return self.rate * max(0.0, 1 - z * self.se)


def backlogged_paces(log: RequestLog, max_level: int = MAX_LEVEL, min_gaps: int = MIN_GAPS) -> list[Pace]:
    """The server's pace at each backlog depth 1..max_level with at least `min_gaps` gaps. Only up to the last listed
    send: a request sent later may still be in flight at the end and missing from the export, so the count in flight
    after it is not known."""
    cut = float(log.sent_s[-1])
    answered = np.sort(log.answered_s)
    answered = answered[answered <= cut]
    if len(answered) < 2:
        return []
    in_flight = np.searchsorted(log.sent_s, answered, side="right") - np.arange(1, len(answered) + 1)
    gaps = np.diff(answered)
    paces = []
    for level in range(1, max_level + 1):
        g = gaps[in_flight[:-1] >= level]
        if len(g) < min_gaps or g.mean() <= 0:
            break
        gap_cv = max(MIN_GAP_CV, float(g.std(ddof=1) / g.mean()))
        paces.append(Pace(level, 1 / float(g.mean()), gap_cv / math.sqrt(len(g)), len(g)))
    return paces


def busy_share_bound(log: RequestLog, z: float = EXPORT_Z) -> float:
    """An upper bound of the share of requests that found another one in flight when sent. Poisson arrivals see the
    server as time does (PASTA): a server whose requests mostly found it idle is far from saturated (the share is at
    least each instance's utilisation), though too few requests waited to show its pace (a light load)."""
    n = len(log)
    if n == 0:
        return 1.0
    answered = np.sort(log.answered_s)
    in_flight = np.arange(n) - np.searchsorted(answered, log.sent_s, side="right")
    busy = int(np.count_nonzero(in_flight > 0))
    return min(1.0, (busy + z * math.sqrt(busy + 1)) / n)


def block_latencies(log: RequestLog, blocks: int = TREND_BLOCKS) -> list[float]:
    """Mean latency of the requests answered in each of `blocks` equal blocks of the span (empty blocks left out)."""
    index = np.minimum((log.answered_s / log.span_s * blocks).astype(int), blocks - 1)
    return [float(log.latency_s[index == b].mean()) for b in range(blocks) if np.any(index == b)]


def theil_sen_rise(values: list[float]) -> float:
    """The rise of the Theil-Sen line over the values, as a fraction of their median."""
    n, median = len(values), float(np.median(values))
    if n < 2 or median <= 0:
        return 0.0
    slope = float(np.median([(values[j] - values[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]))
    return slope * (n - 1) / median


def kept_up_from_requests(
    rate: float,
    served_rps: float,
    log: RequestLog,
    distribution: str,
    delayed: float = 0.0,
    max_delayed_pct: float = MAX_DELAYED_PCT,
    rise_limit: float = RISE_LIMIT,
    z: float = EXPORT_Z,
) -> KeptUp:
    """Judge a rate point from every request's timestamps (see the module's docstring)."""
    verdict = dict(delayed_pct=delayed)
    late = f"; {delayed:g}% of the sends were late" if delayed > max_delayed_pct else ""
    n = len(log)
    served = f"served {served_rps:.4g} req/s of {rate:.4g} offered"
    tolerance = behind_tolerance(n, distribution)
    if not served_rps >= rate * (1 - tolerance):
        return KeptUp("behind", f"{served} (more than {100 * tolerance:.1f}% behind){late}", **verdict)
    paces = backlogged_paces(log)
    best = max(paces, key=lambda p: p.lower(z), default=None)
    blocks = block_latencies(log)
    rise, p = theil_sen_rise(blocks), mann_kendall_p(blocks)
    rising = rise > rise_limit and p < TREND_P
    # kept up: its pace while requests waited is clearly above the offered rate, or it was mostly idle (a light load:
    # there a latency that rose is its requests slowing, a neighbour's doing, not a queue, which needs a busy server)
    if (best is not None and best.lower(z) > rate) or busy_share_bound(log, z) < LIGHT_LOAD_BUSY_SHARE:
        return kept_up_or_client_bound(rate, served_rps, delayed, max_delayed_pct)
    if rising:
        reason = (
            f"latency rose {100 * rise:.0f}% over {len(blocks)} blocks of the {log.span_s:.3g} s span "
            f"({1000 * blocks[0]:.3g} -> {1000 * blocks[-1]:.3g} ms, trend p={p:.2g}): a growing queue{late}"
        )
        return KeptUp("behind", reason, **verdict)
    if best is None:
        reason = (
            f"{n} requests, too few waited (fewer than {MIN_GAPS} answers with one in flight) to show the server's "
            "pace; measure longer windows"
        )
    else:
        reason = (
            f"the server's pace while requests waited, {best.rate:.4g} req/s (at {best.level}+ in flight, "
            f"{best.gaps} answers, lower bound {best.lower(z):.4g}), is not clearly above the {rate:.4g} req/s "
            f"offered: {n} requests cannot tell whether it keeps up; measure longer windows"
        )
    return KeptUp("undetermined", reason, **verdict)
