"""The sustainable rate under a latency SLO, as MLPerf's server scenario defines it: the highest Poisson request rate
whose percentile latency stays within the bound, over a run long enough for that percentile (statistics.py). Found by
a bracketing search over rates: from a start rate, double (or halve) until one rate passes and one fails, then bisect
(geometric middle) until the two are within `tolerance` of each other; each rate is measured again until its runs,
pooled, decide (rate_verdict). Pure logic: `measure(rate)` does the work.

Without exported requests (an image model's, too large to export) a point's p99 is perf_analyzer's merged windows'
figure, judged by its bound (statistics.windows_standard_error, at the rule's confidence): pass when its upper bound is
within the SLO, over_slo when its lower bound is above it, undetermined between; a rate's runs are pooled on their mean
(statistics.windows_score) as the exported path pools its counts. Other percentiles keep the windows' figure."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from statistics import NormalDist
from typing import Literal, get_args

import numpy as np
from pydantic import BaseModel, Field

from tbench.capacity.statistics import (
    PercentileRule,
    dose_response_score,
    exceedance_score,
    percentile_upper_bound,
    steady_latencies,
    tail_inflation,
    warmed_up_p99,
    windows_score,
    windows_standard_error,
)
from tbench.loadgen.behind import CARRIED
from tbench.loadgen.perf_analyzer import RequestLog

# A rate is measured again until its measurements, pooled, decide (rate_verdict), at most REPEATS times: near the answer
# one short run's percentile is too noisy to tell a rate that holds from one 10% above it, and measuring every rate
# that long would waste the time on rates far from it. Undecided after REPEATS: not shown to hold, so it fails.
# 12, not 6 (benchmarks/calibration.py, 300 simulated searches): the plan within 90% of the true rate in 0.67 of
# searches (6: 0.49) and above it in 0.013 (6: 0.023), for 46% more measuring time; 20 gave about 0.76 and 0.01 for
# twice the time. The flat cases need the runs: one run's share over the SLO varies about as much as its mean
REPEATS = 12
TOLERANCE = 0.05  # the bracket's width at which the search stops (passing and failing rates this close)
MAX_POINTS = 60  # measurements per search at most
# The answer is measured at least 1 + CONFIRMATIONS times: the highest of several noisy passes is biased towards a
# lucky one (the winner's curse), and three measurements also show the spread between runs (a rare slow spell that
# one run may miss entirely)
CONFIRMATIONS = 2
# A rate its own runs leave undecided is judged with its neighbours' too (neighbours_verdict): the measurements at rates
# within NEIGHBOURS of it, with at least one rate on either side (the fit then interpolates: where the share over the
# SLO bends upwards, as near saturation, a straight line between neighbours reads it high, not low)
NEIGHBOURS = 0.35

Status = Literal["pass", "client_bound", "over_slo", "behind", "undetermined", "too_few", "unstable", "error"]
STATUSES: tuple[str, ...] = get_args(Status)
PASSING: tuple[Status, ...] = ("pass", "client_bound")


class RatePoint(BaseModel):
    """One offered rate, measured and judged against the SLO."""

    rate: float = Field(description="Offered requests per second (Poisson arrivals).")
    status: Status
    reason: str = ""
    latency_ms: float | None = Field(None, description="The SLO's percentile latency at this rate.")
    latency_se_ms: float | None = Field(
        None, description="Without exported requests: the windows' p99's standard error (its bound's, and pooling's)."
    )
    slo_ms: float | None = Field(None, description="The latency SLO the point was judged against.")
    throughput: float | None = Field(None, description="Served inferences per second.")
    served_rps: float | None = Field(None, description="Served requests per second (throughput / batch size).")
    requests: int | None = Field(None, description="Requests the percentile comes from.")
    over_slo: int | None = Field(None, description="Of those, the requests slower than the SLO.")
    inflation: float | None = Field(
        None, description="How much more the count over the SLO varies than independent requests' would (clustering)."
    )
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
    replayed: bool = False,
) -> RatePoint:
    """A measured row (stages.sweep.measure_point's) at an offered rate -> pass, or why not. A point that fell behind
    its offered rate fails whatever its latency: its percentile describes a load it did not carry. A client-bound one
    (perf_analyzer could not send on time; the server kept up) passes as a lower bound of what the server sustains.
    With the point's exported `requests`, the percentile is an upper confidence bound from the requests after its
    warm-up (tbench.capacity.statistics), else perf_analyzer's merged windows' figure.

    `replayed`: the arrivals are a user's trace, replayed whole. Its requests are then the traffic in question, not a
    sample of a random process whose slow requests come in clusters: the percentile is the measured one, and the
    count over the SLO varies between replays only by the service's own noise (no clustering inflation)."""

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
        slo_ms=slo_ms,
    )
    bound, estimate = "", None
    if requests is not None:
        steady = steady_latencies(requests, tail_s=slo_ms / 1000) * 1000
        upper = percentile_upper_bound(steady, rule.percentile, rule.confidence, slo_ms)
        if replayed and len(steady):
            upper = float(np.percentile(steady, rule.percentile))
        point = point.model_copy(update={"latency_ms": upper, "requests": len(steady)})
        if len(steady):  # what the rate's pooled verdict counts (rate_verdict)
            estimate = float(np.percentile(steady, rule.percentile))
            inflation = 1.0 if replayed else tail_inflation(steady, rule.percentile, slo_ms)
            point = point.model_copy(update={"over_slo": int((steady > slo_ms).sum()), "inflation": inflation})
        bound = (
            f" (the trace's, {len(steady)} requests after the warm-up)"
            if replayed
            else f" (upper {100 * rule.confidence:g}% bound, {len(steady)} requests after the warm-up)"
        )
    status = row.get("status")
    if status not in CARRIED:  # undetermined is no pass: the windows could not show it kept up
        status = status if status in ("unstable", "behind", "undetermined") else "error"
        return point.model_copy(update={"status": status, "reason": str(row.get("error") or row.get("status"))})
    if point.served_rps is None:
        return point.model_copy(update={"status": "behind", "reason": "no throughput reported: nothing served"})
    if requests is not None and point.latency_ms is None:
        reason = f"{point.requests} requests after the warm-up cannot bound p{rule.percentile}: measure longer windows"
        return point.model_copy(update={"status": "too_few", "reason": reason, "latency_ms": estimate})
    if requests is None and (point.requests is None or point.requests < rule.requests()):
        reason = f"{point.requests or 0} requests measured; p{rule.percentile} needs {rule.requests()}"
        return point.model_copy(update={"status": "too_few", "reason": reason})
    if requests is None and rule.percentile == 99 and point.latency_ms is not None:
        warmed = warmed_up_p99(point.latency_ms, number("server_queue_ms"), number("server_compute_infer_ms"))
        point = windows_bound(point, number("p95_ms"), merged, slo_ms, rule, warmed)
        if point.status != "pass":
            return point
    if point.latency_ms is None or point.latency_ms > slo_ms:
        measured = "not reported" if point.latency_ms is None else f"{point.latency_ms:.3g} ms"
        reason = f"p{rule.percentile} {measured}{bound} > SLO {slo_ms:g} ms"
        return point.model_copy(update={"status": "over_slo", "reason": reason})
    if status == "client_bound":
        return point.model_copy(update={"status": "client_bound", "reason": str(row.get("error") or "")})
    return point


def windows_bound(
    point: RatePoint,
    p95_ms: float | None,
    window_requests: float | None,
    slo_ms: float,
    rule: PercentileRule,
    warmed_ms: float,
) -> RatePoint:
    """A windows p99 against the SLO by its bound at the rule's confidence, with its standard error: still a pass when
    its upper bound is within the SLO, over_slo when even its lower bound is above it, undetermined when the bound
    straddles it (no pass: measured again, its runs pooled). The p99 judged is `warmed_ms` (statistics.warmed_up_p99),
    its error scaled with it. Without a p95 the tail's spread is unknown: undetermined."""
    measured = point.latency_ms or 0.0
    error = windows_standard_error(p95_ms, measured, window_requests)
    if error is None:
        reason = f"p99 {measured:.3g} ms without a p95: its spread over {point.requests or 0} requests is unknown"
        return point.model_copy(update={"status": "undetermined", "reason": reason})
    latency, error = warmed_ms, error * warmed_ms / measured if measured else error
    z = NormalDist().inv_cdf(rule.confidence)
    low, high = latency - z * error, latency + z * error
    point = point.model_copy(update={"latency_ms": latency, "latency_se_ms": error})
    if high <= slo_ms:
        return point
    bound = (
        f"p99 {latency:.3g} ms (its {100 * rule.confidence:g}% bounds {low:.3g}..{high:.3g} ms, {point.requests} "
        f"requests in the merged windows)"
    )
    if low > slo_ms:
        return point.model_copy(update={"status": "over_slo", "reason": f"{bound} > SLO {slo_ms:g} ms"})
    return point.model_copy(update={"status": "undetermined", "reason": f"{bound} around SLO {slo_ms:g} ms"})


def poolable(point: RatePoint) -> bool:
    """Whether a measurement counts towards its rate's pooled verdict: it carried its load, and its percentile is one
    the pool can weigh (its requests counted, a run too short alone included; or a windows p99 with its error)."""
    if point.over_slo is not None and point.requests:
        return point.status in (*PASSING, "over_slo", "too_few")
    if point.latency_se_ms is not None:
        return point.status in (*PASSING, "over_slo", "undetermined")
    return point.status in PASSING


Verdict = Literal["pass", "fail", "undecided"]


def rate_verdict(points: list[RatePoint], rule: PercentileRule, z: float) -> tuple[Verdict, str]:
    """The verdict of the measurements at one rate, and why. Any that did not carry its load (behind, unstable, an
    error; too few requests where they cannot be pooled) fails the rate. Where each counted its requests over the SLO,
    they are pooled: the rate passes when the share over the SLO is below the percentile's tail by `z` standard errors
    (exceedance_score), fails when above it by `z`, and is undecided between. Windows p99s (no exported requests) are
    pooled on their mean, against the SLO by `z` of its standard errors (windows_score). Other percentiles without
    counts: each point's own verdict."""
    failed = next((p for p in points if not poolable(p)), None)
    if failed is not None:
        return "fail", failed.reason
    counted = all(p.over_slo is not None and p.requests for p in points)
    if not counted and all(p.latency_se_ms is not None and p.slo_ms is not None for p in points):
        return windows_verdict(points, z)
    if not counted:
        failed = next((p for p in points if not p.passed), None)
        return ("fail", failed.reason) if failed is not None else ("pass", "")
    requests, over = [p.requests or 0 for p in points], [p.over_slo or 0 for p in points]
    score = exceedance_score(requests, over, [p.inflation or 1.0 for p in points], rule.percentile)
    share = sum(over) / sum(requests)
    why = (
        f"{100 * share:.2g}% of {sum(requests):,} requests over the SLO in {len(points)} measurement(s), "
        f"{score:+.1f} standard errors from p{rule.percentile}'s {100 * rule.tail:.2g}%"
    )
    return ("pass" if score <= -z else "fail" if score >= z else "undecided"), why


def windows_verdict(points: list[RatePoint], z: float) -> tuple[Verdict, str]:
    """The pooled verdict of windows p99s at one rate (rate_verdict)."""
    slo = points[0].slo_ms or 0.0
    latencies = [p.latency_ms or 0.0 for p in points]
    score = windows_score(latencies, [p.latency_se_ms or 0.0 for p in points], slo)
    why = (
        f"p99 {float(np.mean(latencies)):.3g} ms, the mean of {len(points)} measurement(s) of "
        f"{sum(p.requests or 0 for p in points):,} requests in their merged windows, {score:+.1f} standard errors "
        f"from the SLO {slo:g} ms"
    )
    return ("pass" if score <= -z else "fail" if score >= z else "undecided"), why


def alone_verdict(point: RatePoint, rule: PercentileRule) -> RatePoint:
    """A measurement's verdict where no other is pooled with it (a colocated load's point). judge's over_slo says
    only that the percentile's upper confidence bound is above the SLO: a sample whose percentile is well within the
    SLO but whose slow requests came in one cluster (a stall of the machine) has a wide bound too. Its count over the
    SLO against the percentile's tail, at the bound's confidence (rate_verdict), tells a percentile shown to be over
    the SLO from one the requests cannot place: undetermined, not over_slo. A point too short to bound the percentile
    (too_few) is undetermined too, with its reason (what to measure longer)."""
    if point.status == "too_few":
        return point.model_copy(update={"status": "undetermined"})
    if point.status != "over_slo" or point.over_slo is None or not point.requests:
        return point
    verdict, why = rate_verdict([point], rule, NormalDist().inv_cdf(rule.confidence))
    if verdict == "fail":
        return point
    return point.model_copy(update={"status": "undetermined", "reason": f"{point.reason}, but {why}: cannot decide"})


def neighbours_verdict(points: list[RatePoint], rate: float, rule: PercentileRule, z: float) -> tuple[Verdict, str]:
    """The verdict at `rate` from the measurements at it and at rates around it (statistics.dose_response_score):
    undecided where they cannot say (no counted rate on either side, no request over the SLO, no fit)."""
    pooled = (*PASSING, "over_slo", "too_few")
    near = [
        p
        for p in points
        if p.status in pooled
        and p.over_slo is not None
        and p.requests
        and abs(math.log(p.rate / rate)) <= math.log1p(NEIGHBOURS)
    ]
    if not (any(p.rate < rate for p in near) and any(p.rate > rate for p in near)):
        return "undecided", ""
    score = dose_response_score(
        [p.requests or 0 for p in near],
        [p.over_slo or 0 for p in near],
        [p.inflation or 1.0 for p in near],
        [math.log(p.rate / rate) for p in near],
        rule.percentile,
    )
    if score is None:
        return "undecided", ""
    low, high = min(p.rate for p in near), max(p.rate for p in near)
    why = (
        f"with {len(near)} measurements at {len({p.rate for p in near})} rates from {low:.4g} to {high:.4g}/s, the "
        f"share over the SLO fitted to the rate is {score:+.1f} standard errors from p{rule.percentile}'s "
        f"{100 * rule.tail:.2g}% at {rate:.4g}/s"
    )
    return ("pass" if score <= -z else "fail" if score >= z else "undecided"), why


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
    ruled_out: bool = Field(
        False,
        description="Every rate tried, down to the lowest allowed, failed: no rate meets the SLO (False where a budget "
        "stopped the search before it could say so).",
    )
    confirmed: bool = Field(
        False, description="The answer's rate was measured 1 + CONFIRMATIONS times and passed, its measurements pooled."
    )
    verdicts: dict[str, str] = Field(
        {}, description="Each rate decided (as measured, '%g'): its verdict and why ('pass: 0.4% of 9,120...')."
    )

    @property
    def at_rate(self) -> RatePoint | None:
        """The passing point the answer is: of the measurements at the answer's rate, the one that served least, with
        the median of their percentiles and the pooled verdict's reason where the pool decided (while the search is
        unfinished: the highest rate that passed)."""
        if self.rate is None:  # a rate the search decided passed, else (points kept while it runs) one that passed
            decided = {r for r, verdict in self.verdicts.items() if verdict.startswith("pass")}
            points = [p for p in self.points if p.passed and (not self.verdicts or f"{p.rate:g}" in decided)]
            return max(points, key=lambda p: p.rate, default=None)
        at = [p for p in self.points if p.rate == self.rate and poolable(p)]
        if not at or (len(at) == 1 and at[0].passed):
            return at[0] if at else None
        latencies = [p.latency_ms for p in at if p.latency_ms is not None]
        status = "client_bound" if any(p.status == "client_bound" for p in at) else "pass"
        return min(at, key=lambda p: p.sustained_rps).model_copy(
            update={
                "status": status,
                "latency_ms": float(np.median(latencies)) if latencies else None,
                "requests": sum(p.requests or 0 for p in at),
                "over_slo": sum(p.over_slo or 0 for p in at) if all(p.over_slo is not None for p in at) else None,
                "reason": self.verdicts.get(f"{self.rate:g}", "").removeprefix("pass: "),
            }
        )

    @property
    def sustained_rps(self) -> float | None:
        """What a plan may count on: the answer's rate, or what was served there if less."""
        at = self.at_rate
        return at.sustained_rps if at else None


def find_sustainable_rate(
    measure: Callable[[float], RatePoint],
    start: float,
    *,
    tolerance: float = TOLERANCE,
    max_points: int = MAX_POINTS,
    min_rate: float = 0.1,
    max_rate: float | None = None,
    on_point: Callable[[RatePoint], None] | None = None,
    rule: PercentileRule | None = None,
    repeats: int = REPEATS,
    confirmations: int = CONFIRMATIONS,
    max_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> SustainableRate:
    """Bracket, then bisect; at most `max_points` measurements, and none started after `max_seconds` (`clock`'s).
    Each rate is measured until its measurements decide (rate_verdict), at most `repeats` times; the pooled test's z is
    the rule's confidence shared over those looks. The answer is the highest rate that passed, measured at least
    1 + `confirmations` times (one that then fails moves the bracket's top down to it and the answer to the highest
    other rate that passed)."""
    started = clock()
    rule = rule or PercentileRule()
    z = NormalDist().inv_cdf(1 - (1 - rule.confidence) / max(repeats, 1))
    # the neighbours' verdict looks again after every measurement near the rate: the confidence shared over them all
    z_neighbours = NormalDist().inv_cdf(1 - (1 - rule.confidence) / max(max_points, 1))
    result = SustainableRate()
    passed: set[float] = set()
    out_of_time = False  # the time budget, not the point budget, stopped it

    def at(rate: float) -> list[RatePoint]:
        return [p for p in result.points if p.rate == rate]

    def decide(rate: float, least: int = 1) -> tuple[bool | None, float]:
        """Measure `rate` until its verdict is decided on at least `least` measurements: (passed, the rate as
        measured), passed None when the point or time budget ran out first."""
        nonlocal out_of_time
        points = at(rate)
        while True:
            verdict, why = rate_verdict(points, rule, z) if points else ("undecided", "")
            if verdict == "undecided" and points:
                pooled, because = neighbours_verdict(result.points, rate, rule, z_neighbours)
                verdict, why = (pooled, because) if pooled != "undecided" else (verdict, why)
            if verdict == "fail" or (verdict == "pass" and len(points) >= least):
                break
            if len(points) >= max(repeats, least):
                verdict, why = "fail", f"not shown within the SLO after {len(points)} measurements: {why}"
                break
            if len(result.points) >= max_points:
                return None, rate
            if max_seconds is not None and clock() - started >= max_seconds:
                out_of_time = True
                return None, rate
            point = measure(rate)  # its rate is the one measured (perf_analyzer takes a rate rounded to its precision)
            result.points.append(point)
            if on_point:
                on_point(point)
            rate, points = point.rate, at(point.rate)
        result.verdicts[f"{rate:g}"] = f"{verdict}: {why}"
        (passed.add if verdict == "pass" else passed.discard)(rate)
        return verdict == "pass", rate

    def client_bound(rate: float) -> bool:
        """A passing rate perf_analyzer could not offer on time: no higher rate can be measured from here."""
        point = next((p for p in at(rate) if p.status == "client_bound"), None)
        if point is None:
            return False
        result.lower_bound = True
        result.stopped = (
            f"client-bound at {point.rate:.4g}/s: perf_analyzer could not send faster while the server kept up, so "
            f"the server sustains at least {point.sustained_rps:.4g}/s (a lower bound)"
        )
        return True

    lo: float | None = None  # highest passing rate
    hi: float | None = None  # lowest failing rate above lo
    need = 1 + confirmations
    while not result.lower_bound:
        least = 1
        if lo is None:  # find a rate that holds: the start, then halve below the lowest that failed
            rate = max(start, min_rate) if hi is None else hi / 2
            if hi is not None and rate < min_rate:
                result.stopped = f"failed down to {hi:g}/s (the lowest rate tried): {result.verdicts[f'{hi:g}']}"
                result.ruled_out = True
                break
        elif hi is None and (max_rate is None or lo < max_rate):  # double until one fails
            rate = lo * 2 if max_rate is None else min(lo * 2, max_rate)
        elif hi is not None and hi / lo > 1 + tolerance:  # bisect
            rate = math.sqrt(lo * hi)
        elif len(at(lo)) < need:  # confirm the answer: measured more, pooled, it must still pass
            rate, least = lo, need
        else:
            if hi is None:
                result.stopped = f"passed at the highest rate allowed ({max_rate:g}/s)"
            break
        before = (len(result.points), lo, hi)
        ok, measured = decide(rate, least)
        if ok is None:
            break
        if least == 1 and lo is not None and hi is not None and measured in (lo, hi):
            result.stopped = f"bracketed as finely as rates are set: passes at {lo:.4g}/s, fails at {hi:.4g}/s"
            break
        if ok:
            lo = measured if lo is None else max(lo, measured)
            client_bound(measured)
        else:
            hi = measured if hi is None else min(hi, measured)
            if lo is not None and measured <= lo:  # the answer failed its confirmation: the next rate that passed
                lo = max((r for r in passed if r < measured), default=None)
        if (len(result.points), lo, hi) == before:  # decided from what was measured before: nothing new to learn
            result.stopped = f"no rate left to measure between {lo} and {hi}"
            break
    budget = f"the time budget ({max_seconds:g} s)" if out_of_time else f"the point budget ({max_points})"
    result.confirmed = lo is not None and lo in passed and len(at(lo)) >= need
    if lo is not None and not result.confirmed and not result.lower_bound:
        result.stopped = result.stopped or f"{budget} was spent before {lo:.4g}/s was confirmed"
        lo = max((r for r in passed if len(at(r)) >= need), default=lo)
        result.confirmed = len(at(lo)) >= need
    if not result.stopped:
        if lo is not None and hi is not None and hi / lo <= 1 + tolerance:
            again = f" (measured {len(at(lo))} times)" if confirmations and result.confirmed else ""
            result.stopped = f"bracketed within {100 * tolerance:g}%: passes at {lo:.4g}/s{again}, fails at {hi:.4g}/s"
        else:
            result.stopped = f"{budget} was spent"
    result.rate, result.failed_above = lo, hi
    result.seconds = clock() - started
    return result
