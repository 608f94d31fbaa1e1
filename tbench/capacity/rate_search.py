"""The sustainable rate under a latency SLO, as MLPerf's server scenario defines it: the highest Poisson request rate
whose percentile latency stays within the bound, over a run long enough for that percentile (statistics.py). Found by
a bracketing search over rates: from a start rate, double (or halve) until one rate passes and one fails, then bisect
(geometric middle) until the two are within `tolerance` of each other. Pure logic: `measure(rate)` does the work."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from tbench.capacity.statistics import PercentileRule, behind_tolerance

Status = Literal["pass", "over_slo", "behind", "too_few", "unstable", "error"]


class RatePoint(BaseModel):
    """One offered rate, measured and judged against the SLO."""

    rate: float = Field(description="Offered requests per second (Poisson arrivals).")
    status: Status
    reason: str = ""
    latency_ms: float | None = Field(None, description="The SLO's percentile latency at this rate.")
    throughput: float | None = Field(None, description="Served inferences per second.")
    requests: int | None = Field(None, description="Requests the percentile comes from.")
    delayed_pct: float | None = Field(None, description="Requests perf_analyzer could not send on time, %.")
    power_w: float | None = None
    seconds: float = 0.0
    source_file: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def judge(
    rate: float,
    batch_size: int,
    row: dict,
    slo_ms: float,
    rule: PercentileRule,
    delayed_pct: float | None = None,
    max_delayed_pct: float = 1.0,
) -> RatePoint:
    """A measured row (tbench.sweep.measure_point's) at an offered rate -> pass, or why not. A point that falls
    behind its offered rate fails whatever its latency: its percentile describes a load it did not carry."""

    def number(key):
        value = row.get(key)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

    merged = number("window_requests")
    point = RatePoint(
        rate=rate,
        status="pass",
        latency_ms=number(rule.column),
        throughput=number("throughput_infer_per_s"),
        requests=round(merged * 3) if merged else None,
        delayed_pct=delayed_pct,
        power_w=number("gpu_power_w"),
        seconds=number("measure_seconds") or 0.0,
        source_file=str(row.get("source_file") or ""),
    )
    if row.get("status") != "ok":
        status = "unstable" if row.get("status") == "unstable" else "error"
        return point.model_copy(update={"status": status, "reason": str(row.get("error") or row.get("status"))})
    served = (point.throughput or 0.0) / batch_size
    tolerance = behind_tolerance(point.requests or 0)
    if served < rate * (1 - tolerance):
        reason = f"served {served:.3g} req/s of {rate:.3g} offered (more than {100 * tolerance:.1f}% behind)"
        return point.model_copy(update={"status": "behind", "reason": reason})
    if delayed_pct is not None and delayed_pct > max_delayed_pct:
        reason = f"{delayed_pct:g}% of the requests could not be sent on time (limit {max_delayed_pct:g}%)"
        return point.model_copy(update={"status": "behind", "reason": reason})
    if point.requests is None or point.requests < rule.requests():
        reason = f"{point.requests or 0} requests measured; p{rule.percentile} needs {rule.requests()}"
        return point.model_copy(update={"status": "too_few", "reason": reason})
    if point.latency_ms is None or point.latency_ms > slo_ms:
        measured = "not reported" if point.latency_ms is None else f"{point.latency_ms:.3g} ms"
        reason = f"p{rule.percentile} {measured} > SLO {slo_ms:g} ms"
        return point.model_copy(update={"status": "over_slo", "reason": reason})
    return point


class SustainableRate(BaseModel):
    """The search's answer and every point it rests on, in the order they were measured."""

    rate: float | None = Field(None, description="The highest rate that passed (requests/s); None if none did.")
    failed_above: float | None = Field(None, description="The lowest rate that failed above it; None if none did.")
    points: list[RatePoint] = []
    seconds: float = 0.0
    stopped: str = Field("", description="Why the search stopped where it did.")

    @property
    def at_rate(self) -> RatePoint | None:
        """The passing point the answer is (the highest rate that passed)."""
        return max((p for p in self.points if p.passed), key=lambda p: p.rate, default=None)


def find_sustainable_rate(
    measure: Callable[[float], RatePoint],
    start: float,
    *,
    tolerance: float = 0.1,
    max_points: int = 10,
    min_rate: float = 0.1,
    max_rate: float | None = None,
    on_point: Callable[[RatePoint], None] | None = None,
) -> SustainableRate:
    """Bracket, then bisect; at most `max_points` measurements. The answer is the highest rate that passed."""
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

    rate = max(start, min_rate)
    while len(result.points) < max_points:  # bracket
        point = run(rate)
        rate = point.rate
        if point.passed:
            lo = rate if lo is None else max(lo, rate)
            if hi is not None:
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
    while lo is not None and hi is not None and hi / lo > 1 + tolerance and len(result.points) < max_points:
        point = run(math.sqrt(lo * hi))
        if point.rate in (lo, hi):  # the rate's precision cannot split the bracket further
            result.stopped = f"bracketed as finely as rates are set: passes at {lo:.4g}/s, fails at {hi:.4g}/s"
            break
        if point.passed:
            lo = point.rate
        else:
            hi = point.rate
    if not result.stopped:
        if lo is not None and hi is not None and hi / lo <= 1 + tolerance:
            result.stopped = f"bracketed within {100 * tolerance:g}%: passes at {lo:.4g}/s, fails at {hi:.4g}/s"
        else:
            result.stopped = f"the point budget ({max_points}) was spent"
    result.rate, result.failed_above = lo, hi
    result.seconds = time.monotonic() - started
    return result
