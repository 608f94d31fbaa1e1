"""The percentile sample-size rule (MLPerf Inference's) and the falling-behind tolerance: pure arithmetic."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from tbench.capacity.statistics import PercentileRule


def test_default_rule_is_p99_at_95_percent_with_half_the_tail():
    rule = PercentileRule()
    assert (rule.percentile, rule.confidence, rule.margin_fraction) == (99, 0.95, 0.5)
    # z(0.975)^2 * 0.99 * 0.01 / 0.005^2 = 1521.2... -> 1522
    assert rule.requests() == 1522


@pytest.mark.parametrize(("percentile", "expected"), [(99, 262_742), (90, 23_886)])
def test_mlperf_setting_gives_the_papers_counts(percentile, expected):
    """MLPerf Inference (Reddi et al., ISCA 2020): 99% confidence, margin (1-p)/20."""
    assert PercentileRule(percentile=percentile, confidence=0.99, margin_fraction=0.05).requests() == expected


def test_requests_matches_the_formula_by_hand():
    z = 2.241402727604947  # standard normal quantile at 0.9875 (confidence 0.975)
    p, margin = 0.95, 0.05 * 0.25
    assert PercentileRule(percentile=95, confidence=0.975, margin_fraction=0.25).requests() == math.ceil(
        z * z * p * (1 - p) / margin**2
    )


@pytest.mark.parametrize("percentile", [50, 90, 95, 99])
def test_more_confidence_needs_more_requests(percentile):
    counts = [PercentileRule(percentile=percentile, confidence=c).requests() for c in (0.8, 0.9, 0.95, 0.99, 0.999)]
    assert counts == sorted(counts)
    assert len(set(counts)) == len(counts)


@pytest.mark.parametrize("percentile", [50, 90, 95, 99])
def test_smaller_margin_needs_more_requests(percentile):
    counts = [PercentileRule(percentile=percentile, margin_fraction=m).requests() for m in (1.0, 0.5, 0.2, 0.05)]
    assert counts == sorted(counts)
    assert len(set(counts)) == len(counts)


def test_halving_the_margin_quadruples_the_count():
    wide = PercentileRule(margin_fraction=0.5).requests()
    narrow = PercentileRule(margin_fraction=0.25).requests()
    assert abs(narrow - 4 * wide) <= 4  # ceil on each side


def test_higher_percentile_needs_more_requests_at_the_same_relative_margin():
    counts = [PercentileRule(percentile=p).requests() for p in (50, 90, 95, 99)]
    assert counts == sorted(counts)


@pytest.mark.parametrize(("percentile", "column"), [(99, "p99_ms"), (95, "p95_ms"), (90, "p90_ms"), (50, "p50_ms")])
def test_column(percentile, column):
    assert PercentileRule(percentile=percentile).column == column


def test_tail():
    assert PercentileRule().tail == pytest.approx(0.01)
    assert PercentileRule(percentile=90).tail == pytest.approx(0.1)


def test_describe_names_the_count_and_the_rule():
    text = PercentileRule().describe()
    assert "p99" in text
    assert "1,522 requests" in text
    assert "95% confidence" in text
    assert "p98.5..p99.5" in text
    assert "MLPerf" in text


def test_describe_of_mlperf_setting():
    text = PercentileRule(percentile=90, confidence=0.99, margin_fraction=0.05).describe()
    assert "p90" in text
    assert "23,886 requests" in text
    assert "99% confidence" in text
    assert "p89.5..p90.5" in text


@pytest.mark.parametrize(
    "fields",
    [
        {"percentile": 97},
        {"percentile": 100},
        {"percentile": "p99"},
        {"confidence": 1.0},
        {"confidence": 0.5},
        {"confidence": 95},
        {"margin_fraction": 0},
        {"margin_fraction": -0.1},
        {"margin_fraction": 1.5},
    ],
)
def test_invalid_settings_are_refused(fields):
    with pytest.raises(ValidationError):
        PercentileRule(**fields)


def test_rule_round_trips_through_json():
    rule = PercentileRule(percentile=95, confidence=0.99, margin_fraction=0.1)
    assert PercentileRule.model_validate_json(rule.model_dump_json()) == rule


def test_a_percentile_measurement_holds_the_requests_the_rule_needs():
    """The search's p99 budget and capacity's rate points: the 3 merged windows hold at least the rule's requests."""
    from tbench.capacity.statistics import percentile_measurement
    from tbench.request.benchmark import Measurement

    m = percentile_measurement(Measurement(), PercentileRule())
    assert m.min_requests == 508 and 3 * m.min_requests >= PercentileRule().requests()
    assert percentile_measurement(Measurement(min_requests=5000), PercentileRule()).min_requests == 5000
    assert percentile_measurement(Measurement(), PercentileRule(percentile=90)).min_requests == 47


def test_percentile_upper_bound_is_an_order_statistic_above_the_percentile():
    import numpy as np

    from tbench.capacity.statistics import percentile_upper_bound

    values = np.random.default_rng(0).exponential(1.0, 2000)
    upper = percentile_upper_bound(values, 99, 0.95)
    assert upper in values and upper > np.percentile(values, 99)
    assert percentile_upper_bound(values[:50], 99, 0.95) is None  # rank above n: cannot bound p99


def test_steady_latencies_drop_the_warm_up_and_the_end():
    import numpy as np

    from tbench.capacity.statistics import WARMUP_SHARE, steady_latencies
    from tbench.loadgen.perf_analyzer import RequestLog

    sent = np.linspace(0, 9.9, 100)
    log = RequestLog(sent, np.full(100, 0.01), 10.0, (0.0, 10.0))
    kept = steady_latencies(log, tail_s=1.0)
    assert len(kept) == int(np.sum((sent >= WARMUP_SHARE * 10) & (sent <= 9.0)))
