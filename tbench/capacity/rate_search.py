"""The sustainable rate under a latency SLO, as MLPerf's server scenario defines it: the highest Poisson request rate
whose percentile latency stays within the bound, over a run long enough for that percentile (statistics.py). Found by
a bracketing search over rates: from a start rate, double (or halve) until one rate passes and one fails, then bisect
(geometric middle) until the two are within `tolerance` of each other. Pure logic: `measure(rate)` does the work."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal, get_args

from pydantic import BaseModel, Field

from tbench.capacity.statistics import PercentileRule, percentile_upper_bound, steady_latencies
from tbench.loadgen.perf_analyzer import RequestLog

# The answer is measured again before it is kept: a short run's percentile is noisy, and the highest of several
# noisy passes is biased towards a lucky one (the winner's curse); a rate must pass every time to be the answer
CONFIRMATIONS = 1

Status = Literal["pass", "client_bound", "over_slo", "behind", "undetermined", "too_few", "unstable", "error"]
STATUSES: tuple[str, ...] = get_args(Status)
PASSING: tuple[Status, ...] = ("pass", "client_bound")


class RatePoint(BaseModel):
    """One offered rate, measured and judged against the SLO."""

    rate: float = Field(description="Offered requests per second (Poisson arrivals).")
    status: Status
    reason: str = ""
    latency_ms: float | None = Field(None, description="The SLO's percentile latency at this rate.")
    throughput: float | None = Field(None, description="Served inferences per second.")
    served_rps: float | None = Field(None, description="Served requests per second (throughput / batch size).")
    requests: int | None = Field(None, description="Requests the percentile comes from.")
    delayed_pct: float | None = Field(None, description="Requests perf_analyzer could not send on time, %.")
    power_w: float | None = None
    joules_per_inference: float | None = Field(
        None, description="The serving GPUs' energy over the point (their counter's difference) per inference served."
    )
    seconds: float = 0.0
    source_file: str = ""

    @property
    def passed(self) -> bool:
        """Within the SLO at the load it carried (client-bound: at least that load)."""
        return self.status in PASSING

    @property
    def sustained_rps(self) -> float:
        """What the point shows the server sustains: the offered rate, or less where it served less (within the
        arrivals' randomness, as judged) -- a plan must not count requests that were offered but not served."""
        return min(self.rate, self.served_rps) if self.served_rps else self.rate


def per_inference(energy_j: float | None, requests: float | None, batch_size: int) -> float | None:
    """Energy per inference: the energy over the point over the inferences the server served in the same span."""
    return energy_j / (requests * batch_size) if energy_j is not None and requests else None


def judge(
    rate: float,
    batch_size: int,
    row: dict,
    slo_ms: float,
    rule: PercentileRule,
    requests: RequestLog | None = None,
) -> RatePoint:
    """A measured row (stages.sweep.measure_point's) at an offered rate -> pass, or why not. A point that fell behind
    its offered rate fails whatever its latency: its percentile describes a load it did not carry. A client-bound one
    (perf_analyzer could not send on time; the server kept up) passes as a lower bound of what the server sustains.
    With the point's exported `requests`, the percentile is an upper confidence bound from the requests after its
    warm-up (tbench.capacity.statistics), else perf_analyzer's merged windows' figure."""

    def number(key):
        value = row.get(key)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

    merged = number("window_requests")
    throughput = number("throughput_infer_per_s")
    point = RatePoint(
        rate=rate,
        status="pass",
        latency_ms=number(rule.column),
        throughput=throughput,
        served_rps=throughput / batch_size if throughput is not None else None,
        requests=round(merged * 3) if merged else None,
        delayed_pct=number("delayed_pct"),
        power_w=number("gpu_power_w"),
        joules_per_inference=per_inference(number("gpu_energy_j"), number("triton_requests"), batch_size),
        seconds=number("measure_seconds") or 0.0,
        source_file=str(row.get("source_file") or ""),
    )
    bound = ""
    if requests is not None:
        steady = steady_latencies(requests, tail_s=slo_ms / 1000)
        upper = percentile_upper_bound(steady * 1000, rule.percentile, rule.confidence, slo_ms)
        point = point.model_copy(update={"latency_ms": upper, "requests": len(steady)})
        bound = f" (upper {100 * rule.confidence:g}% bound, {len(steady)} requests after the warm-up)"
    status = row.get("status")
    if status not in ("ok", "client_bound"):  # undetermined is no pass: the windows could not show it kept up
        status = status if status in ("unstable", "behind", "undetermined") else "error"
        return point.model_copy(update={"status": status, "reason": str(row.get("error") or row.get("status"))})
    if point.served_rps is None:
        return point.model_copy(update={"status": "behind", "reason": "no throughput reported: nothing served"})
    if requests is not None and point.latency_ms is None:
        reason = f"{point.requests} requests after the warm-up cannot bound p{rule.percentile}: measure longer windows"
        return point.model_copy(update={"status": "too_few", "reason": reason})
    if requests is None and (point.requests is None or point.requests < rule.requests()):
        reason = f"{point.requests or 0} requests measured; p{rule.percentile} needs {rule.requests()}"
        return point.model_copy(update={"status": "too_few", "reason": reason})
    if point.latency_ms is None or point.latency_ms > slo_ms:
        measured = "not reported" if point.latency_ms is None else f"{point.latency_ms:.3g} ms"
        reason = f"p{rule.percentile} {measured}{bound} > SLO {slo_ms:g} ms"
        return point.model_copy(update={"status": "over_slo", "reason": reason})
    if status == "client_bound":
        return point.model_copy(update={"status": "client_bound", "reason": str(row.get("error") or "")})
    return point


class SustainableRate(BaseModel):
    """The search's answer and every point it rests on, in the order they were measured."""

    rate: float | None = Field(None, description="The highest rate that passed (requests/s); None if none did.")
    failed_above: float | None = Field(None, description="The lowest rate that failed above it; None if none did.")
    points: list[RatePoint] = []
    seconds: float = 0.0
    stopped: str = Field("", description="Why the search stopped where it did.")
    lower_bound: bool = Field(
        False, description="The load generator could not offer more: the server sustains at least this rate."
    )

    confirmed: bool = Field(False, description="The answer's rate passed again when measured a second time.")

    @property
    def at_rate(self) -> RatePoint | None:
        """The passing point the answer is: of the measurements at the answer's rate, the one that served least (the
        highest rate that passed while the search is unfinished)."""
        if self.rate is not None:
            at = [p for p in self.points if p.passed and p.rate == self.rate]
            return min(at, key=lambda p: p.sustained_rps, default=None)
        return max((p for p in self.points if p.passed), key=lambda p: p.rate, default=None)

    @property
    def sustained_rps(self) -> float | None:
        """What a plan may count on: the answer's rate, or what was served there if less."""
        at = self.at_rate
        return at.sustained_rps if at else None


def find_sustainable_rate(
    measure: Callable[[float], RatePoint],
    start: float,
    *,
    tolerance: float = 0.1,
    max_points: int = 10,
    min_rate: float = 0.1,
    max_rate: float | None = None,
    on_point: Callable[[RatePoint], None] | None = None,
    confirmations: int = CONFIRMATIONS,
) -> SustainableRate:
    """Bracket, then bisect; at most `max_points` measurements. The answer is the highest rate that passed, measured
    `confirmations` more times and passing each (a confirmation that fails moves the bracket's top down to it and the
    answer to the highest other rate that passed)."""
    started = time.monotonic()
    result = SustainableRate()
    lo: float | None = None  # highest passing rate
    hi: float | None = None  # lowest failing rate above lo

    def run(rate: float) -> RatePoint:
        point = measure(rate)  # its rate is the one measured (perf_analyzer takes a rate rounded to its precision)
        result.points.append(point)
        if on_point:
            on_point(point)
        return point

    def client_bound(point: RatePoint) -> bool:
        """A passing point perf_analyzer could not offer on time: no higher rate can be measured from here."""
        if point.status != "client_bound":
            return False
        result.lower_bound = True
        result.stopped = (
            f"client-bound at {point.rate:.4g}/s: perf_analyzer could not send faster while the server kept up, so "
            f"the server sustains at least {point.sustained_rps:.4g}/s (a lower bound)"
        )
        return True

    rate = max(start, min_rate)
    while len(result.points) < max_points:  # bracket
        point = run(rate)
        rate = point.rate
        if point.passed:
            lo = rate if lo is None else max(lo, rate)
            if client_bound(point) or hi is not None:
                break
            if max_rate is not None and rate >= max_rate:
                result.stopped = f"passed at the highest rate allowed ({max_rate:g}/s)"
                break
            rate = rate * 2 if max_rate is None else min(rate * 2, max_rate)
        else:
            hi = rate if hi is None else min(hi, rate)
            if lo is not None:
                break
            if rate / 2 < min_rate:
                result.stopped = f"failed down to {rate:g}/s (the lowest rate tried): {point.reason}"
                break
            rate /= 2
    passes: dict[float, int] = {}  # rate -> times it passed (a rate that failed once is out)
    for p in result.points:
        passes[p.rate] = passes.get(p.rate, 0) + 1 if p.passed else 0
    passes = {r: n for r, n in passes.items() if n}
    while not result.lower_bound and lo is not None and len(result.points) < max_points:
        if hi is not None and hi / lo > 1 + tolerance:  # bisect
            point = run(math.sqrt(lo * hi))
            if point.rate in (lo, hi):  # the rate's precision cannot split the bracket further
                result.stopped = f"bracketed as finely as rates are set: passes at {lo:.4g}/s, fails at {hi:.4g}/s"
                break
        elif passes[lo] <= confirmations:  # confirm the answer: measured again, it must pass again
            point = run(lo)
        else:
            break
        if point.passed:
            passes[point.rate] = passes.get(point.rate, 0) + 1
            lo = max(lo, point.rate)
            if client_bound(point):
                break
        else:
            hi = point.rate if hi is None else min(hi, point.rate)
            passes.pop(point.rate, None)
            if point.rate <= lo:  # the answer failed its confirmation: back to the highest other rate that passed
                lo = max((r for r in passes if r < point.rate), default=None)
    if lo is not None and passes.get(lo, 0) <= confirmations and not result.lower_bound:
        result.stopped = result.stopped or f"the point budget ({max_points}) was spent before {lo:.4g}/s was confirmed"
        lower = [r for r, n in passes.items() if n > confirmations]
        lo = max(lower, default=lo)
    result.confirmed = lo is not None and passes.get(lo, 0) > confirmations
    if not result.stopped:
        if lo is not None and hi is not None and hi / lo <= 1 + tolerance:
            again = f" (confirmed by {confirmations} more)" if confirmations and result.confirmed else ""
            result.stopped = f"bracketed within {100 * tolerance:g}%: passes at {lo:.4g}/s{again}, fails at {hi:.4g}/s"
        else:
            result.stopped = f"the point budget ({max_points}) was spent"
    result.rate, result.failed_above = lo, hi
    result.seconds = time.monotonic() - started
    return result
