"""The sustainable-rate search: judging one measured row against the SLO, and the bracketing search against a
simulated system whose true capacity is known (pure logic, no server)."""

from __future__ import annotations

import math
import random

import pytest

from tbench.capacity.rate_search import (
    CONFIRMATIONS,
    NEIGHBOURS,
    PASSING,
    REPEATS,
    STATUSES,
    RatePoint,
    SustainableRate,
    alone_verdict,
    find_sustainable_rate,
    judge,
    neighbours_verdict,
    rate_verdict,
)
from tbench.capacity.statistics import WINDOWS_WARMUP, PercentileRule, windows_standard_error

RULE = PercentileRule()  # p99, 1522 requests
SLO_MS = 50.0


def row(**overrides) -> dict:
    """A row as stages.sweep.measure_point returns it: 600 requests per window (1800 merged), 100 inferences/s."""
    base = {
        "status": "ok",
        "error": "",
        "throughput_infer_per_s": 100.0,
        "p95_ms": 15.0,
        "p99_ms": 20.0,
        "window_requests": 600.0,
        "measure_seconds": 18.5,
        "source_file": "points/rate_100.csv",
        "gpu_power_w": 210.0,
    }
    return base | overrides


# -- judge ---------------------------------------------------------------------------------------------------------


def test_judge_pass_carries_the_rows_numbers():
    point = judge(100.0, 1, row(), SLO_MS, RULE)
    assert point.status == "pass"
    assert point.passed
    assert point.reason == ""
    assert point.rate == 100.0
    assert point.latency_ms == 20.0
    assert point.throughput == 100.0
    assert point.requests == 1800  # window_requests x 3 (the merged windows)
    assert point.power_w == 210.0
    assert point.seconds == 18.5
    assert point.source_file == "points/rate_100.csv"
    assert point.delayed_pct is None


def test_judge_latency_comes_from_the_rules_column():
    rule = PercentileRule(percentile=90)  # needs 139 requests
    point = judge(100.0, 1, row(p99_ms=80.0, p90_ms=30.0), SLO_MS, rule)
    assert point.latency_ms == 30.0
    assert point.status == "pass"


def test_judge_at_the_slo_with_no_spread_in_the_tail_passes():
    """p95 = p99: the tail beyond the p99 has no spread, so neither has the estimate: judged on it."""
    assert judge(100.0, 1, row(p95_ms=SLO_MS, p99_ms=SLO_MS), SLO_MS, RULE).status == "pass"


def test_judge_over_slo():
    point = judge(100.0, 1, row(p95_ms=50.0, p99_ms=50.5), SLO_MS, RULE)
    assert point.status == "over_slo"
    assert not point.passed
    assert point.latency_ms == 50.5
    assert "p99" in point.reason and "50" in point.reason


def test_judge_takes_the_sweeps_behind_verdict_whatever_the_latency():
    """measure_point judges whether a rate point kept up (tbench.loadgen.behind); a behind point fails, its reason
    kept, even at a good latency."""
    reason = "served 90 req/s of 100 offered (more than 7.1% behind)"
    point = judge(100.0, 1, row(status="behind", error=reason, p99_ms=1.0), SLO_MS, RULE)
    assert point.status == "behind" and not point.passed and point.reason == reason


def test_judge_client_bound_passes_as_a_lower_bound_when_the_slo_holds():
    reason = "client-bound: 2.4% of the sends were late ..."
    point = judge(100.0, 1, row(status="client_bound", error=reason, delayed_pct=2.4), SLO_MS, RULE)
    assert point.status == "client_bound" and point.passed and point.reason == reason and point.delayed_pct == 2.4
    assert judge(100.0, 1, row(status="client_bound", p95_ms=78.0, p99_ms=80.0), SLO_MS, RULE).status == "over_slo"
    assert judge(100.0, 1, row(status="client_bound", window_requests=10.0), SLO_MS, RULE).status == "too_few"


def test_what_a_point_sustains_is_what_it_served_never_more_than_offered():
    assert judge(100.0, 1, row(throughput_infer_per_s=96.0), SLO_MS, RULE).sustained_rps == 96.0
    assert judge(100.0, 1, row(throughput_infer_per_s=103.0), SLO_MS, RULE).sustained_rps == 100.0
    assert judge(100.0, 4, row(throughput_infer_per_s=392.0), SLO_MS, RULE).served_rps == 98.0  # per request


def test_judge_too_few_requests():
    # 500 x 3 = 1500 < 1522
    point = judge(100.0, 1, row(window_requests=500.0), SLO_MS, RULE)
    assert point.status == "too_few"
    assert point.requests == 1500
    assert "1500" in point.reason and "1522" in point.reason


def test_judge_just_enough_requests_passes():
    # 507.34 x 3 = 1522.02 -> 1522
    assert judge(100.0, 1, row(window_requests=507.34), SLO_MS, RULE).status == "pass"


def test_judge_too_few_uses_the_rules_count():
    mlperf = PercentileRule(confidence=0.99, margin_fraction=0.05)  # 262,742
    assert judge(100.0, 1, row(), SLO_MS, mlperf).status == "too_few"
    assert judge(100.0, 1, row(window_requests=90_000.0), SLO_MS, mlperf).status == "pass"


def test_judge_too_few_comes_before_over_slo():
    """A percentile from too few requests says nothing either way about the SLO."""
    assert judge(100.0, 1, row(window_requests=10.0, p99_ms=500.0), SLO_MS, RULE).status == "too_few"


@pytest.mark.parametrize("status", ["unstable", "error"])
def test_judge_passes_unstable_and_error_through(status):
    point = judge(100.0, 1, row(status=status, error=f"perf_analyzer said {status}"), SLO_MS, RULE)
    assert point.status == status
    assert point.reason == f"perf_analyzer said {status}"
    assert not point.passed


def test_judge_failed_row_without_error_gives_its_status_as_reason():
    point = judge(100.0, 1, row(status="unstable", error=""), SLO_MS, RULE)
    assert point.status == "unstable"
    assert point.reason == "unstable"


def test_judge_unknown_status_is_an_error():
    point = judge(100.0, 1, row(status="timeout", error=None), SLO_MS, RULE)
    assert point.status == "error"
    assert point.reason == "timeout"


def test_judge_error_row_wins_over_good_numbers():
    assert judge(100.0, 1, row(status="error", error="boom"), SLO_MS, RULE).status == "error"


def test_judge_nan_values_are_missing():
    nan = float("nan")
    point = judge(100.0, 1, row(gpu_power_w=nan, measure_seconds=nan, source_file=None), SLO_MS, RULE)
    assert point.status == "pass"
    assert point.power_w is None
    assert point.seconds == 0.0
    assert point.source_file == ""


def test_judge_nan_window_requests_is_too_few():
    point = judge(100.0, 1, row(window_requests=float("nan")), SLO_MS, RULE)
    assert point.requests is None
    assert point.status == "too_few"


def test_judge_missing_window_requests_is_too_few():
    values = row()
    del values["window_requests"]
    point = judge(100.0, 1, values, SLO_MS, RULE)
    assert point.requests is None
    assert point.status == "too_few"


def test_judge_nan_throughput_is_behind():
    point = judge(100.0, 1, row(throughput_infer_per_s=float("nan")), SLO_MS, RULE)
    assert point.throughput is None
    assert point.status == "behind"


def test_judge_nan_numbers_on_an_error_row():
    nan = float("nan")
    bad = row(status="error", error="no csv", throughput_infer_per_s=nan, p99_ms=nan, window_requests=nan)
    point = judge(100.0, 1, bad, SLO_MS, RULE)
    assert point.status == "error"
    assert (point.latency_ms, point.throughput, point.requests) == (None, None, None)


@pytest.mark.parametrize("missing", ["nan", "absent"])
def test_judge_nan_latency_fails_the_point(missing):
    values = row(p99_ms=float("nan"))
    if missing == "absent":
        del values["p99_ms"]
    point = judge(100.0, 1, values, SLO_MS, RULE)
    assert point.latency_ms is None
    assert not point.passed


def test_judge_numpy_values():
    np = pytest.importorskip("numpy")
    values = row(throughput_infer_per_s=np.float64(100.0), p99_ms=np.float64(20.0), gpu_power_w=np.float64(np.nan))
    point = judge(100.0, 1, values, SLO_MS, RULE)
    assert point.status == "pass"
    assert point.power_w is None
    assert isinstance(point.latency_ms, float)


# -- find_sustainable_rate against a simulated system -----------------------------------------------------------------


CAPACITY = 123.0


class System:
    """Passes iff the offered rate is at most its capacity; records every rate it was asked for."""

    def __init__(self, capacity: float | None = CAPACITY, rounding: int | None = None):
        self.capacity = capacity
        self.rounding = rounding
        self.asked: list[float] = []

    def __call__(self, rate: float) -> RatePoint:
        self.asked.append(rate)
        measured = round(rate, self.rounding) if self.rounding is not None else rate
        if self.capacity is not None and measured <= self.capacity:
            return RatePoint(rate=measured, status="pass", latency_ms=10.0, throughput=measured)
        return RatePoint(rate=measured, status="over_slo", reason=f"p99 too high at {measured:g}/s", latency_ms=99.0)


def assert_brackets(found: SustainableRate, capacity: float, tolerance: float):
    assert found.rate is not None and found.failed_above is not None
    assert found.rate <= capacity < found.failed_above
    assert found.rate * (1 + tolerance) >= found.failed_above
    assert found.rate >= capacity / (1 + tolerance)
    assert "bracketed" in found.stopped


def test_start_below_capacity_doubles_then_bisects():
    system = System()
    found = find_sustainable_rate(system, 10.0, tolerance=0.1)
    assert system.asked[:5] == [10.0, 20.0, 40.0, 80.0, 160.0]  # doubling until one fails
    assert all(80.0 < r < 160.0 for r in system.asked[5:])  # then only inside the bracket
    assert_brackets(found, CAPACITY, 0.1)
    assert len(found.points) <= 10 + CONFIRMATIONS


def test_start_above_capacity_halves_then_bisects():
    system = System()
    found = find_sustainable_rate(system, 1000.0)
    assert system.asked[:5] == [1000.0, 500.0, 250.0, 125.0, 62.5]  # halving until one passes
    assert all(62.5 < r < 125.0 for r in system.asked[5:])
    assert_brackets(found, CAPACITY, 0.1)


def test_start_at_capacity():
    found = find_sustainable_rate(System(), CAPACITY)
    assert_brackets(found, CAPACITY, 0.1)
    assert found.rate == CAPACITY


@pytest.mark.parametrize("capacity", [0.37, 3.0, 47.5, 123.0, 999.0, 12_345.0])
@pytest.mark.parametrize("start", [0.5, 7.0, 100.0, 5000.0])
@pytest.mark.parametrize("tolerance", [0.02, 0.1, 0.3])
def test_search_brackets_the_capacity(capacity, start, tolerance):
    found = find_sustainable_rate(System(capacity), start, tolerance=tolerance, max_points=60)
    assert_brackets(found, capacity, tolerance)
    assert found.at_rate is not None and found.at_rate.rate == found.rate
    assert found.failed_above in [p.rate for p in found.points if not p.passed]


def test_tighter_tolerance_takes_more_points():
    loose = find_sustainable_rate(System(), 10.0, tolerance=0.3, max_points=40)
    tight = find_sustainable_rate(System(), 10.0, tolerance=0.01, max_points=40)
    assert len(tight.points) > len(loose.points)
    assert tight.failed_above / tight.rate <= 1.01


def test_failing_everywhere_gives_no_rate():
    system = System(capacity=None)
    found = find_sustainable_rate(system, 10.0, min_rate=0.1)
    assert found.rate is None
    assert found.failed_above is not None
    assert found.at_rate is None
    assert "failed down to" in found.stopped and found.ruled_out
    assert "p99 too high" in found.stopped  # the last point's reason
    assert all(not p.passed for p in found.points)
    assert min(system.asked) >= 0.1
    assert min(system.asked) < 0.2  # went down to the floor, not stopping early
    assert system.asked == [10.0 / 2**k for k in range(len(system.asked))]


def test_capacity_below_min_rate_gives_no_rate():
    found = find_sustainable_rate(System(capacity=0.05), 1.0, min_rate=0.1)
    assert found.rate is None
    assert "failed down to" in found.stopped and found.ruled_out


def test_start_below_min_rate_starts_at_min_rate():
    system = System()
    find_sustainable_rate(system, 0.001, min_rate=0.5, max_points=3)
    assert system.asked == [0.5, 1.0, 2.0]


def test_max_points_is_respected_while_bracketing():
    system = System(capacity=1e9)
    found = find_sustainable_rate(system, 1.0, max_points=3)
    assert len(found.points) == 3
    assert found.rate == 4.0
    assert found.failed_above is None
    assert "budget" in found.stopped


@pytest.mark.parametrize("max_points", [1, 2, 4, 6, 7])
def test_max_points_is_respected_while_bisecting(max_points):
    found = find_sustainable_rate(System(), 10.0, tolerance=0.001, max_points=max_points)
    assert len(found.points) <= max_points
    if found.rate is not None:
        assert found.rate <= CAPACITY
    assert "budget" in found.stopped


def test_no_measurement_starts_after_the_time_budget():
    """On a noisy machine a rate can take `repeats` runs of minutes each: with max_seconds the search stops once that
    long has passed, its answer the highest rate that had passed, and says the time budget stopped it."""
    system, now = System(), [0.0]

    def timed(rate: float) -> RatePoint:
        now[0] += 30.0  # each measurement takes 30 s
        return system(rate)

    found = find_sustainable_rate(timed, 10.0, tolerance=0.001, max_seconds=100.0, clock=lambda: now[0])
    assert len(found.points) == 4  # started at 0, 30, 60 and 90 s; none at 120
    assert found.rate == 80.0 and found.failed_above is None
    assert found.stopped.startswith("the time budget (100 s) was spent"), found.stopped
    assert found.seconds == 120.0 and not found.ruled_out


def test_a_time_budget_spent_before_any_rate_passed_rules_nothing_out():
    """Every rate measured so far failed, but the budget stopped the halving before the lowest rate: no rate is shown
    to meet the SLO, and none is ruled out (the capacity answer says undetermined, not no_rate)."""
    system, now = System(capacity=1.0), [0.0]

    def timed(rate: float) -> RatePoint:
        now[0] += 30.0
        return system(rate)

    found = find_sustainable_rate(timed, 10.0, min_rate=0.1, max_seconds=60.0, clock=lambda: now[0])
    assert found.rate is None and all(not p.passed for p in found.points)
    assert not found.ruled_out and found.stopped.startswith("the time budget (60 s) was spent"), found.stopped


def test_max_rate_stops_the_doubling():
    system = System(capacity=1000.0)
    found = find_sustainable_rate(system, 10.0, max_rate=50.0)
    assert system.asked == [10.0, 20.0, 40.0] + [50.0] * (1 + CONFIRMATIONS)  # the answer measured again
    assert found.rate == 50.0 and found.confirmed
    assert found.failed_above is None
    assert "highest rate allowed" in found.stopped and "50" in found.stopped


def test_max_rate_above_capacity_still_brackets():
    system = System()
    found = find_sustainable_rate(system, 10.0, max_rate=150.0)
    assert max(system.asked) <= 150.0
    assert_brackets(found, CAPACITY, 0.1)


def test_at_rate_is_the_highest_passing_point():
    found = find_sustainable_rate(System(), 10.0)
    passing = [p for p in found.points if p.passed]
    assert len(passing) >= 2
    assert found.at_rate.rate == found.rate == max(p.rate for p in passing) and found.at_rate.passed
    assert found.verdicts[f"{found.rate:g}"].startswith("pass")


def test_at_rate_of_an_empty_result_is_none():
    assert SustainableRate().at_rate is None


def test_on_point_sees_every_point_in_order():
    seen: list[RatePoint] = []
    found = find_sustainable_rate(System(), 10.0, on_point=seen.append)
    assert len(seen) == len(found.points)
    assert all(a is b for a, b in zip(seen, found.points))


def test_points_are_in_the_order_measured():
    system = System()
    found = find_sustainable_rate(system, 1000.0)
    assert [p.rate for p in found.points] == system.asked


@pytest.mark.parametrize("start", [1.0, 10.0, 333.0])
@pytest.mark.parametrize("rounding", [0, 1, 3])
def test_rounded_rates_give_a_consistent_answer(start, rounding):
    """perf_analyzer takes a rate rounded to its precision: the answer is a rate that was really measured."""
    system = System(rounding=rounding)
    found = find_sustainable_rate(system, start, max_points=20)
    measured = [p.rate for p in found.points]
    assert found.rate in measured
    assert found.failed_above in measured
    assert found.rate <= CAPACITY < found.failed_above
    assert found.at_rate is not None and found.at_rate.rate == found.rate
    assert all(p.passed == (p.rate <= CAPACITY) for p in found.points)


def test_bisection_stops_when_the_rate_precision_cannot_split_the_bracket():
    system = System(rounding=0)  # perf_analyzer's precision coarser than the tolerance
    found = find_sustainable_rate(system, 1.0, tolerance=0.005, max_points=20)
    measured = [p.rate for p in found.points]
    assert (found.rate, found.failed_above) == (123.0, 124.0)  # as close as whole rates allow
    assert len(measured) - len(set(measured)) <= 1  # the middle that rounds onto an end, once; not the budget
    assert "finely" in found.stopped


def test_rounded_rates_still_bracket_within_tolerance():
    found = find_sustainable_rate(System(rounding=1), 10.0, tolerance=0.05, max_points=20)
    assert_brackets(found, CAPACITY, 0.05)


def test_non_pass_statuses_all_count_as_failing():
    for status in ("over_slo", "behind", "too_few", "unstable", "error"):

        def measure(rate, status=status):
            return RatePoint(rate=rate, status="pass" if rate <= CAPACITY else status, reason=status)

        found = find_sustainable_rate(measure, 10.0)
        assert found.rate is not None and found.rate <= CAPACITY < found.failed_above


def test_result_round_trips_through_json():
    found = find_sustainable_rate(System(), 10.0)
    again = SustainableRate.model_validate_json(found.model_dump_json())
    assert again == found
    assert again.at_rate == found.at_rate
    assert again.confirmed and f"measured {1 + CONFIRMATIONS} times" in again.stopped


def test_search_is_geometric_between_bracket_ends():
    system = System()
    find_sustainable_rate(system, 10.0)
    # the first bisection point is the geometric middle of 80 (passed) and 160 (failed)
    assert system.asked[5] == pytest.approx(math.sqrt(80.0 * 160.0))


def test_a_client_bound_point_ends_the_search_with_a_lower_bound():
    """Above 300/s perf_analyzer cannot send on time while the server keeps up: no higher rate can be measured, so
    the answer is 'at least' the client-bound point's served rate, and the search stops there."""

    def measure(rate: float) -> RatePoint:
        status = "client_bound" if rate > 300 else "pass"
        return RatePoint(rate=rate, status=status, latency_ms=5.0, throughput=rate, served_rps=rate * 0.99)

    found = find_sustainable_rate(measure, 100.0, max_points=10)
    assert [p.rate for p in found.points] == [100.0, 200.0, 400.0]
    assert found.lower_bound and found.rate == 400.0 and found.sustained_rps == pytest.approx(396.0)
    assert "client-bound at 400/s" in found.stopped and "at least 396" in found.stopped


def test_a_plan_counts_what_was_served():
    found = find_sustainable_rate(
        lambda rate: RatePoint(
            rate=rate, status="pass" if rate <= CAPACITY else "over_slo", latency_ms=5.0, served_rps=0.97 * rate
        ),
        CAPACITY / 2,
        max_points=20,
    )
    assert not found.lower_bound and found.sustained_rps == pytest.approx(0.97 * found.rate)


def test_energy_per_inference_is_the_points_energy_over_the_inferences_the_server_served():
    point = judge(100.0, 4, row(gpu_energy_j=900.0, triton_requests=1500), SLO_MS, RULE)
    assert point.joules_per_inference == pytest.approx(900.0 / 6000)
    assert judge(100.0, 1, row(), SLO_MS, RULE).joules_per_inference is None  # no GPU: none


# -- the winner's curse: a noisy system whose passes above capacity are luck ------------------------------------------


class LuckySystem(System):
    """Passes at or below its capacity; up to 30% above it, passes the first time a rate is measured (a lucky short
    run: near capacity a short run's percentile reads low), and fails when measured again."""

    def __call__(self, rate: float) -> RatePoint:
        lucky = self.capacity < rate <= 1.3 * self.capacity and rate not in self.asked
        point = super().__call__(rate)
        return point.model_copy(update={"status": "pass", "reason": ""}) if lucky else point


def test_a_lucky_pass_above_capacity_is_not_kept_unconfirmed():
    system = LuckySystem()
    found = find_sustainable_rate(system, 10.0, max_points=40)
    assert found.rate is not None and found.rate <= CAPACITY and found.confirmed
    assert found.at_rate is not None and found.at_rate.rate == found.rate
    # without the confirmation, the search keeps the lucky pass above capacity
    unconfirmed = find_sustainable_rate(LuckySystem(), 10.0, max_points=20, confirmations=0)
    assert unconfirmed.rate > CAPACITY


def test_an_undetermined_point_is_not_a_pass():
    assert "undetermined" in STATUSES
    point = judge(100.0, 1, row(status="undetermined", error="3 windows cannot tell"), SLO_MS, RULE)
    assert point.status == "undetermined" and not point.passed and point.reason == "3 windows cannot tell"


def test_judge_from_exported_requests_uses_an_upper_bound_after_the_warm_up():
    import numpy as np

    from tbench.loadgen.perf_analyzer import RequestLog

    rng = np.random.default_rng(0)
    sent = np.sort(rng.uniform(0, 30, 3000))
    latency = np.where(sent < 5, 0.2, rng.uniform(0.005, 0.010, 3000))  # a slow start, then fast
    log = RequestLog(sent, latency, 30.0, (0.0, 30.0))
    row = {"status": "ok", "throughput_infer_per_s": 100.0, "window_requests": 1000, "p99_ms": 200.0}
    point = judge(100.0, 1, row, 50.0, PercentileRule(), log)
    assert point.status == "pass" and point.latency_ms <= 10.0
    slow = RequestLog(sent, np.full(3000, 0.06), 30.0, (0.0, 30.0))
    assert judge(100.0, 1, row, 50.0, PercentileRule(), slow).status == "over_slo"


def test_a_replayed_trace_is_judged_on_its_own_percentile_without_clustering():
    """A trace replayed whole is the traffic itself: its p99 is measured, not bounded, and its slow requests (one
    burst's) are not a clustered sample of a random process."""
    import numpy as np

    from tbench.loadgen.perf_analyzer import RequestLog

    sent = np.linspace(0, 30, 3000)
    latency = np.where((sent > 20) & (sent < 20.25), 0.08, 0.01)  # one burst: 25 requests over the SLO
    log = RequestLog(sent, latency, 30.0, (0.0, 30.0))
    row = {"status": "ok", "throughput_infer_per_s": 100.0, "window_requests": 1000, "p99_ms": 10.0}
    sampled, replayed = (judge(100.0, 1, row, 50.0, PercentileRule(), log, replayed=r) for r in (False, True))
    assert replayed.inflation == 1.0 and sampled.inflation > 1.0 and replayed.over_slo == sampled.over_slo
    from tbench.capacity.statistics import steady_latencies

    steady = steady_latencies(log, tail_s=0.05) * 1000  # the requests after the warm-up, as judge takes them
    assert replayed.latency_ms == pytest.approx(float(np.percentile(steady, 99)))
    assert replayed.latency_ms <= sampled.latency_ms
    assert "the trace's" in judge(100.0, 1, row, 5.0, PercentileRule(), log, replayed=True).reason


# -- a rate's measurements pooled: measured again until they decide ----------------------------------------------------


def counted(rate: float, over: int, requests: int = 1500, inflation: float = 1.0, status: str = "pass") -> RatePoint:
    return RatePoint(rate=rate, status=status, requests=requests, over_slo=over, inflation=inflation, latency_ms=9.0)


def test_pooled_measurements_pass_fail_or_stay_undecided():
    assert rate_verdict([counted(50, 2)], RULE, 2.5)[0] == "pass"  # 0.13% over the SLO: far below p99's 1%
    assert rate_verdict([counted(50, 60)], RULE, 2.5)[0] == "fail"  # 4%
    verdict, why = rate_verdict([counted(50, 9)], RULE, 2.5)  # 0.6%: one run cannot tell
    assert verdict == "undecided" and "0.6% of 1,500 requests" in why
    assert rate_verdict([counted(50, 9)] * 6, RULE, 2.5)[0] == "pass"  # six runs can: 0.6% of 9,000
    assert rate_verdict([counted(50, 2), counted(50, 0, status="behind")], RULE, 2.5)[0] == "fail"


def test_a_run_whose_slow_requests_cluster_counts_for_less():
    # no request over the SLO in 1,500 is a pass from independent requests, not from a few long slow spells
    assert rate_verdict([counted(50, 0)], RULE, 2.5)[0] == "pass"
    assert rate_verdict([counted(50, 0, inflation=40.0)], RULE, 2.5)[0] == "undecided"


def test_three_runs_that_disagree_widen_the_pooled_verdict():
    steady = [counted(50, 0)] * 3  # each agrees with the others: pass
    assert rate_verdict(steady, RULE, 2.5)[0] == "pass"
    spell = [counted(50, 0), counted(50, 0), counted(50, 20)]  # one run met a slow spell the others missed
    assert rate_verdict(spell, RULE, 2.5)[0] == "undecided"


def test_tail_inflation_sees_clusters_where_nothing_is_over_the_slo():
    import numpy as np

    from tbench.capacity.statistics import tail_inflation, variance_inflation

    rng = np.random.default_rng(1)
    latencies = rng.uniform(5, 10, 5000)
    latencies[1000:1060] += 30  # one slow spell: its 60 requests in a row, all under the SLO of 50
    assert variance_inflation(latencies, 50.0) == 1.0  # nothing over the SLO: no spread to measure
    assert tail_inflation(latencies, 99, 50.0) > 5.0


class CountingSystem:
    """A server whose share of requests over the SLO rises with the rate (1% at its capacity): each measurement of
    1,500 requests draws its count (binomial, fixed seed)."""

    def __init__(self, capacity: float = CAPACITY, seed: int = 0):
        import numpy as np

        self.capacity, self.rng, self.asked = capacity, np.random.default_rng(seed), []

    def __call__(self, rate: float) -> RatePoint:
        self.asked.append(rate)
        share = min(1.0, 0.01 * (rate / self.capacity) ** 8)
        return counted(rate, int(self.rng.binomial(1500, share)))


def test_rates_near_the_answer_are_measured_more_than_those_far_from_it():
    system = CountingSystem()
    found = find_sustainable_rate(system, 10.0, rule=RULE)
    assert found.rate is not None and found.rate <= CAPACITY and found.confirmed
    times = {rate: system.asked.count(rate) for rate in system.asked}
    assert times[10.0] == times[20.0] == 1  # far below: one run decides
    assert max(times.values()) > 2  # near the answer: several runs pooled
    assert all(n <= REPEATS for n in times.values())  # REPEATS at most


class FirstLuckySystem(CountingSystem):
    """Every rate's first run up to 3x its capacity is lucky (nothing over the SLO); later runs tell the truth."""

    def __call__(self, rate: float) -> RatePoint:
        first = rate not in self.asked and rate <= 3 * self.capacity
        point = super().__call__(rate)
        return point.model_copy(update={"over_slo": 0}) if first else point


def test_an_answer_that_fails_its_confirmation_with_nothing_below_steps_down():
    system = FirstLuckySystem()
    # 300 passes by luck, then fails when measured again
    found = find_sustainable_rate(system, 300.0, rule=RULE, max_points=160)
    assert found.verdicts["300"].startswith("fail")
    assert found.rate is not None and found.rate <= CAPACITY and found.confirmed
    assert min(system.asked) < 300.0 / 1.9  # it stepped down below the lucky rate


def test_an_unfinished_search_answers_only_with_a_rate_it_decided():
    lucky = counted(200.0, 0)  # one run passed on its own, the pooled runs at its rate failed
    found = SustainableRate(
        points=[lucky, counted(200.0, 60)], verdicts={"200": "fail: 2% of 3,000 requests over the SLO"}
    )
    assert found.at_rate is None and found.sustained_rps is None
    assert SustainableRate(points=[lucky]).at_rate is lucky  # points kept while it runs, nothing decided yet


# -- a rate its own runs leave undecided, judged with its neighbours' -------------------------------------------------


def test_neighbouring_rates_decide_what_one_rates_runs_cannot():
    own = [counted(50, 6)]  # 0.4%: one run cannot tell
    assert rate_verdict(own, RULE, 2.4)[0] == "undecided"
    around = [*own, *[counted(45, 3)] * 3, *[counted(55, 10)] * 3]  # 0.2% just below, 0.67% just above
    verdict, why = neighbours_verdict(around, 50, RULE, 3.1)
    assert verdict == "pass" and "7 measurements at 3 rates from 45 to 55/s" in why
    above = [counted(50, 22), *[counted(45, 15)] * 3, *[counted(55, 35)] * 3]  # 1.5% at the rate, rising
    assert neighbours_verdict(above, 50, RULE, 3.1)[0] == "fail"


def test_neighbours_on_one_side_only_or_far_away_do_not_count():
    below = [counted(50, 6), *[counted(45, 3)] * 6]  # a line from below would be an extrapolation
    assert neighbours_verdict(below, 50, RULE, 3.1)[0] == "undecided"
    far = [counted(50, 6), *[counted(20, 0)] * 6, *[counted(100, 200)] * 6]  # beyond NEIGHBOURS of the rate
    assert all(abs(math.log(p.rate / 50)) > math.log1p(NEIGHBOURS) for p in far[1:])
    assert neighbours_verdict(far, 50, RULE, 3.1)[0] == "undecided"
    behind = [counted(50, 6), *[counted(45, 3, status="behind")] * 3, *[counted(55, 10)] * 3]
    assert neighbours_verdict(behind, 50, RULE, 3.1)[0] == "undecided"  # a run that did not carry its load


def test_a_share_that_falls_with_the_rate_is_pooled_without_a_slope():
    from tbench.capacity.statistics import dose_response_score

    rising = dose_response_score([1500] * 3, [3, 6, 10], [1.0] * 3, [-0.1, 0.0, 0.1], 99)
    falling = dose_response_score([1500] * 3, [10, 6, 3], [1.0] * 3, [-0.1, 0.0, 0.1], 99)
    share = 19 / 4500  # noise, not a share that falls: all runs as one, its logit's standard error
    pooled = (math.log(share / (1 - share)) - math.log(0.01 / 0.99)) * math.sqrt(4500 * share * (1 - share))
    assert falling == pytest.approx(pooled)
    assert rising < falling  # a slope through the rate: the runs above it say less about it than their count
    assert dose_response_score([1500] * 2, [0, 0], [1.0] * 2, [-0.1, 0.1], 99) is None  # nothing to fit


def test_a_fit_that_runs_away_cannot_decide_and_does_not_crash():
    """Every slow request in one run at the rate above (a simulated search's, seed 11): the logistic fit separates
    the runs, its covariance is not a variance, and the search once stopped on a math domain error."""
    from tbench.capacity.statistics import dose_response_score

    requests = [1537, 1570, 1666, 1594, 1544, 1570, 1597, 1572]
    over = [0, 0, 0, 0, 0, 0, 360, 0]
    inflations = [
        16.105378262541095,
        7.184327184327187,
        13.15052296083756,
        16.04124122306718,
        9.358191197723432,
        10.69229944229944,
        124.1967165216535,
        16.205734154834648,
    ]
    log_rates = [-0.04332506953550167] * 5 + [0.04332013805163771] * 2 + [0.0]
    assert dose_response_score(requests, over, inflations, log_rates, 99) is None


def clustered(seed: int, inflation: float = 8.0):
    """A server whose share over the SLO rises slowly (1% at its capacity, 0.66% at 90% of it) and whose slow requests
    come in clusters: each run's count varies `inflation` times a binomial's (a gamma-Poisson draw, fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def measure(rate: float) -> RatePoint:
        mean = 1500 * min(1.0, 0.01 * (rate / CAPACITY) ** 4)
        draw = rng.poisson(rng.gamma(mean / (inflation - 1), inflation - 1)) if mean > 0 else 0
        return counted(rate, int(min(1500, draw)), inflation=inflation)

    return measure


def median_answer(seeds: int = 30) -> float:
    answers = []
    for seed in range(seeds):
        found = find_sustainable_rate(clustered(seed), 40.0, rule=RULE)
        assert found.rate is None or found.rate <= CAPACITY, found.verdicts
        answers.append((found.rate or 0) / CAPACITY)
    return sorted(answers)[seeds // 2]


def test_the_search_pools_neighbouring_rates_and_stays_below_the_capacity(monkeypatch):
    pooled = median_answer()
    monkeypatch.setattr("tbench.capacity.rate_search.NEIGHBOURS", 0.0)  # each rate's own runs only
    alone = median_answer()
    assert pooled > alone


def test_a_point_alone_whose_slow_requests_came_in_one_stall_is_undetermined_not_over_the_slo():
    """As a colocated load's point was seen on a loaded machine: p90 12 ms against an SLO of 60 ms, but the few slow
    requests (140 ms) all in one stall, so the p90's upper bound is above the SLO. Judged alone (nothing to pool it
    with), its requests cannot place the p90 either side of the SLO: undetermined; so is one too clustered to bound it
    at all (too_few). A point whose slow requests are spread and many is over the SLO."""
    import numpy as np

    from tbench.loadgen.perf_analyzer import RequestLog

    rule = PercentileRule(percentile=90)
    rng = np.random.default_rng(3)
    sent = np.sort(rng.uniform(0, 7.2, 360))
    fast = rng.uniform(0.004, 0.012, 360)
    stalled = np.where((sent > 4.0) & (sent < 4.1), 0.14, fast)  # one stall: every request in a tenth of a second
    row = {"status": "ok", "throughput_infer_per_s": 50.0, "window_requests": 114, "p90_ms": 11.8}
    point = judge(50.0, 1, row, 60.0, rule, RequestLog(sent, stalled, 7.2, (0.0, 7.2)))
    assert point.status == "over_slo" and point.latency_ms > 60.0 and point.over_slo < 0.1 * point.requests
    alone = alone_verdict(point, rule)
    assert alone.status == "undetermined" and not alone.passed and "cannot decide" in alone.reason
    spread = np.where(rng.uniform(size=360) < 0.3, 0.14, fast)  # 30% over the SLO, throughout
    over = judge(50.0, 1, row, 60.0, rule, RequestLog(sent, spread, 7.2, (0.0, 7.2)))
    assert alone_verdict(over, rule) == over and over.status == "over_slo"
    passing = judge(50.0, 1, row, 60.0, rule, RequestLog(sent, fast, 7.2, (0.0, 7.2)))
    assert alone_verdict(passing, rule) == passing and passing.status == "pass"
    longer = np.where((sent > 4.0) & (sent < 4.25), 0.14, fast)  # a longer stall: too clustered to bound the p90
    short = judge(50.0, 1, row, 60.0, rule, RequestLog(sent, longer, 7.2, (0.0, 7.2)))
    assert short.status == "too_few"
    assert alone_verdict(short, rule).status == "undetermined" and "measure longer" in alone_verdict(short, rule).reason


# -- the windows path: no exported requests (an image model), the p99 judged by its bound ------------------------------


def test_a_windows_p99_passes_only_when_its_upper_bound_holds_the_slo():
    """A p99 of 48.5 ms against 50, its tail's p95..p99 spanning 8.5 ms: from 1,800 requests its bound reaches past the
    SLO (undetermined, measured again), from 18,000 it holds (pass); at 56 ms even the lower bound breaks it."""
    straddling = judge(100.0, 1, row(p95_ms=40.0, p99_ms=48.5), SLO_MS, RULE)
    assert straddling.status == "undetermined" and not straddling.passed
    assert straddling.latency_se_ms == pytest.approx(windows_standard_error(40.0, 48.5, 600.0))
    assert "bounds" in straddling.reason and "SLO 50" in straddling.reason
    more = judge(100.0, 1, row(p95_ms=40.0, p99_ms=48.5, window_requests=6000.0), SLO_MS, RULE)
    assert more.status == "pass" and more.latency_se_ms < straddling.latency_se_ms
    assert judge(100.0, 1, row(p95_ms=50.0, p99_ms=56.0), SLO_MS, RULE).status == "over_slo"


def test_a_windows_p99_without_a_p95_cannot_be_bounded():
    values = row()
    del values["p95_ms"]
    point = judge(100.0, 1, values, SLO_MS, RULE)
    assert point.status == "undetermined" and "without a p95" in point.reason


def test_a_windows_p99_has_the_warm_up_added_back_by_the_queues_share():
    """A queue four times the compute time (near saturation: the windows' empty start reads low) raises a 44 ms p99 by
    WINDOWS_WARMUP x 16; no queue, nothing."""
    queued = row(p95_ms=40.0, p99_ms=44.0, server_queue_ms=40.0, server_compute_infer_ms=10.0)
    assert judge(100.0, 1, queued, 60, RULE).latency_ms == pytest.approx(44.0 * (1 + WINDOWS_WARMUP * 16))
    idle = judge(100.0, 1, queued | {"server_queue_ms": 0.0}, 60, RULE)
    assert idle.latency_ms == 44.0


def test_the_windows_path_bounds_only_p99_other_percentiles_keep_their_figure():
    rule = PercentileRule(percentile=90)
    point = judge(100.0, 1, row(p90_ms=49.0), SLO_MS, rule)
    assert point.status == "pass" and point.latency_se_ms is None


def test_windows_runs_at_a_rate_are_pooled_on_their_mean():
    """Each run alone straddles the SLO; pooled, twelve runs at 48.5 ms pass and twelve at 51.5 ms fail, at the search's
    shared z; two runs cannot decide."""
    z = 2.64
    under = judge(100.0, 1, row(p95_ms=40.0, p99_ms=48.5), SLO_MS, RULE)
    over = judge(100.0, 1, row(p95_ms=43.0, p99_ms=51.5), SLO_MS, RULE)
    assert {under.status, over.status} == {"undetermined"}
    assert rate_verdict([under] * 2, RULE, z)[0] == "undecided"
    verdict, why = rate_verdict([under] * 12, RULE, z)
    assert verdict == "pass" and "12 measurement(s)" in why
    assert rate_verdict([over] * 12, RULE, z)[0] == "fail"
    spread = [judge(100.0, 1, row(p95_ms=p - 8.5, p99_ms=p), SLO_MS, RULE) for p in (33.5, 48.5, 63.5) * 4]
    assert rate_verdict(spread, RULE, z)[0] == "undecided"  # the same mean, but the runs disagree: no pass


def test_a_search_on_windows_p99s_stays_at_or_below_the_rate_that_holds():
    """A system whose true p99 is 10 / (1 - rate / 125) ms (the SLO 50 ms holds up to 100/s), each run's windows p99
    off by 8% (seeded): the plan is never above 100/s, and within 0.85 of it."""
    rng = random.Random(3)

    def measure(rate: float) -> RatePoint:
        true = 10.0 / (1 - rate / 125) if rate < 125 else 1e4
        p99 = true * math.exp(rng.gauss(0, 0.08))
        return judge(rate, 1, row(p95_ms=0.8 * p99, p99_ms=p99, throughput_infer_per_s=rate), SLO_MS, RULE)

    for _ in range(5):
        found = find_sustainable_rate(measure, 40.0)
        assert found.rate is not None and 85.0 <= found.rate <= 100.0, found.stopped
        assert found.at_rate.status in PASSING and "merged windows" in found.verdicts[f"{found.rate:g}"]
