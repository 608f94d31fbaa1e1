"""tbench.results.format_section: the report's pieces that need no run: a scenario whose every point was flagged still
has its section; the online scenario's note on points whose latency was the batcher's wait; the offline scenario's on a
batch that served less than a smaller one."""

from __future__ import annotations

import pandas as pd

from tbench.core.metrics import OK, UNSTABLE
from tbench.results.format_section import (
    FELL_MIN,
    QUEUE_SHARE,
    batch_fall_lines,
    flagged_only_lines,
    queue_wait_lines,
    scenario_rows,
)


def online(queue_ms: list[float], avg_ms: list[float], delay_us: float = 2000) -> pd.DataFrame:
    """As the Hugging Face ResNet's online sweep came out on the 2-core CPU (a small model, the guides' 2000 us)."""
    return pd.DataFrame(
        {
            "concurrency": [1, 2, 4, 8][: len(queue_ms)],
            "server_queue_ms": queue_ms,
            "avg_ms": avg_ms,
            "max_queue_delay_us": delay_us,
        }
    )


def test_low_concurrency_points_that_waited_for_a_batch_are_said_with_the_option_that_shortens_it():
    lines = queue_wait_lines(online([2.116, 2.073, 0.155, 1.053], [2.984, 3.257, 1.697, 3.218]))
    assert lines[0].startswith("**Note**: most of these requests' latency was the server's queue")
    assert "concurrency 1: 2.12 of 2.98 ms; concurrency 2: 2.07 of 3.26 ms)" in lines[0]
    assert "concurrency 4" not in lines[0] and "concurrency 8" not in lines[0]  # under QUEUE_SHARE of their latency
    assert "waits up to 2000 us" in lines[0] and "--queue-delay-us" in lines[0]


def test_a_model_slower_than_its_queue_or_a_run_without_a_delay_says_nothing():
    assert queue_wait_lines(online([2.0, 2.0], [27.0, 30.0])) == []  # the small ResNet-50: 2 of 27 ms
    assert (
        queue_wait_lines(online([0.9, 0.9], [0.9 / QUEUE_SHARE, 1.0])) == []
    )  # mostly queue, but under half the delay
    assert queue_wait_lines(online([0.01], [0.5], delay_us=0)) == []


def rows(*statuses: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"scenario": s, "status": st, "batch_size": 1, "concurrency": 1, "request_rate": None} for s, st in statuses]
    )


def test_a_scenario_with_no_point_within_its_checks_says_so_in_its_section():
    results = rows(("offline", UNSTABLE), ("offline", UNSTABLE), ("online", OK))
    offline = flagged_only_lines(results, "offline", scenario_rows(results, "offline"))
    assert offline[0] == "### Offline scenario" and f"(2 {UNSTABLE})" in offline[2]
    assert flagged_only_lines(results, "online", scenario_rows(results, "online")) == []  # it has its own section
    assert flagged_only_lines(results, "rate", scenario_rows(results, "rate")) == []  # not measured: nothing to say


def offline(throughputs: list[float], cvs: list[float], precision: str = "FP32") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "batch_size": [1, 2, 4, 8][: len(throughputs)],
            "throughput_infer_per_s": throughputs,
            "throughput_cv": cvs,
            "precision": precision,
            "model_instances": 1,
        }
    )


def test_a_batch_that_served_less_than_a_smaller_one_is_said_with_the_batch_to_prefer():
    """FastPitch's default run on the 2-core CPU (default_runs.json at 3a08ac8): batch 1 5.5 infer/s (windows ±3.0%),
    batch 2 4.6 (±0.03%)."""
    lines = batch_fall_lines(offline([5.5, 4.6], [0.0303, 0.0003]))
    assert lines[0].startswith("**Note**: batch 2 served 16% fewer inferences per second than batch 1 (5.5 -> 4.6")
    assert "its best offline point is batch 1" in lines[0]
    # each precision is its own sweep: only the one whose throughput fell is said
    both = pd.concat([offline([5.5, 4.6], [0.0303, 0.0003]), offline([5.0, 9.0], [0.01, 0.01], "FP16")])
    assert len([line for line in batch_fall_lines(both) if line]) == 1


def test_a_fall_within_the_windows_noise_or_a_rising_sweep_says_nothing():
    assert batch_fall_lines(offline([1222.4, 2173.7, 4155.0, 6335.7], [0.0228, 0.0211, 0.0188, 0.0472])) == []
    assert batch_fall_lines(offline([29.1, 28.0], [0.0232, 0.024])) == []  # 3.8% down, windows ±3.3%: 2 sigma is 6.7%
    assert batch_fall_lines(offline([100.0, 100.0 * (1 - FELL_MIN / 2)], [0.0, 0.0])) == []  # steady windows, 1% down
