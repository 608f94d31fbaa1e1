"""The per-point server view: statistics diffs, the cross-check against perf_analyzer, GPU metrics parsing."""

import math

import numpy as np
import pytest
from conftest import GOLDEN

from tbench.node.hardware import parse_gpu_query
from tbench.triton.monitor import (
    ENERGY_TOTAL,
    METRICS_INTERVAL_MS,
    PointMonitor,
    cross_check,
    energy_under_load,
    gpu_series,
    model_statistics,
    parse_gpu_metrics,
    per_request_ms,
)


def test_statistics_diff_is_per_request_ms():
    before = {"count": 100, "queue": 10_000_000, "compute_input": 0, "compute_infer": 50_000_000, "compute_output": 0}
    after = {
        "count": 300,
        "queue": 30_000_000,
        "compute_input": 2_000_000,
        "compute_infer": 250_000_000,
        "compute_output": 4_000_000,
    }
    got = per_request_ms(before, after)
    assert got["triton_requests"] == 200 and got["triton_queue_ms"] == 0.1 and got["triton_compute_infer_ms"] == 1.0
    assert got["triton_compute_input_ms"] == 0.01 and got["triton_compute_output_ms"] == 0.02
    assert per_request_ms(before, before) == {"triton_requests": 0}
    assert "triton_busy_ms" not in got  # no batch statistics: none said


def test_the_instances_busy_time_counts_each_execution_once_from_the_batch_statistics():
    """Triton's per-request stages charge each request its whole batch's compute; its batch statistics count each
    execution once: 100 executions of 4 requests of 2 ms are 0.5 ms of an instance per request, not 2."""

    class Client:
        def get_inference_statistics(self, **kwargs):
            execution = {"count": "100", "ns": str(100 * 2_000_000)}
            return {
                "model_stats": [
                    {
                        "inference_stats": {"success": {"count": "400"}, "compute_infer": {"ns": str(400 * 2_000_000)}},
                        "batch_stats": [{"batch_size": "4", "compute_infer": execution}],
                    }
                ]
            }

    after = model_statistics(Client(), "m")
    assert after["count"] == 400 and after["busy"] == 200_000_000
    got = per_request_ms({**after, "count": 0, "busy": 0, "compute_infer": 0}, after)
    assert got["triton_compute_infer_ms"] == 2.0 and got["triton_busy_ms"] == 0.5


def test_cross_check_ignores_stages_too_small_to_compare():
    row = {
        "triton_queue_ms": 2.0,
        "server_queue_ms": 2.2,
        "triton_compute_infer_ms": 10.0,
        "server_compute_infer_ms": 9.0,
        "triton_compute_input_ms": 0.01,
        "server_compute_input_ms": 0.03,
    }
    assert math.isclose(cross_check(row), 0.1)  # infer: 1/10; queue 0.2/2.2 is smaller; input is below 0.05 ms
    assert math.isnan(cross_check({"triton_queue_ms": 1.0}))


PAGE = (GOLDEN / "triton" / "metrics_4gpu.txt").read_text()
UUIDS = parse_gpu_query((GOLDEN / "nvidia_smi" / "query_a100x4.csv").read_text())["gpu_uuids"]


def test_gpu_metrics_from_tritons_prometheus_text():
    got = parse_gpu_metrics(
        (GOLDEN / "triton" / "metrics_gpu.txt").read_text(), ["GPU-5d5b7e6a-0b8a-3b3c-9d5e-2f3c1a7e9b01"]
    )
    assert got == {"gpu_util_pct": 71.0, "gpu_mem_mb": 2048.0, "gpu_power_w": 212.5}
    assert parse_gpu_metrics('nv_inference_request_success{model="m",version="1"} 3', ["GPU-x"]) == {}


def test_every_gpu_of_a_four_gpu_page_is_read_by_its_uuid():
    series = gpu_series(PAGE)
    assert list(series) == UUIDS  # the page's GPUs are nvidia-smi's
    assert series[UUIDS[3]] == {
        "nv_gpu_utilization": 0.93,
        "nv_gpu_memory_total_bytes": 85899345920,
        "nv_gpu_memory_used_bytes": 1073741824,
        "nv_gpu_power_usage": 287.75,
        "nv_gpu_power_limit": 400,
        "nv_energy_consumption": 109334.6,
    }


def test_only_the_serving_gpu_is_measured():
    """GPU 0 holds another process's 41 GiB: summing the page would charge it to the model."""
    assert parse_gpu_metrics(PAGE, [UUIDS[1]]) == {
        "gpu_util_pct": 87.0,
        "gpu_mem_mb": 3072.0,
        "gpu_power_w": 312.5,
        ENERGY_TOTAL: 118902.377,
    }


def test_several_serving_gpus_mean_utilisation_and_sum_memory_and_power():
    got = parse_gpu_metrics(PAGE, [UUIDS[1], UUIDS[3]])
    assert got["gpu_util_pct"] == pytest.approx(90.0)  # the mean: each GPU's share of its own time
    assert got["gpu_mem_mb"] == 4096.0 and got["gpu_power_w"] == 600.25  # sums: what the model holds and draws
    assert got[ENERGY_TOTAL] == pytest.approx(118902.377 + 109334.6)


def test_a_page_without_the_serving_gpu_gives_nothing_rather_than_another_gpus_numbers():
    assert parse_gpu_metrics(PAGE, ["GPU-00000000-0000-0000-0000-000000000000"]) == {}
    assert parse_gpu_metrics(PAGE, []) == {}


def test_the_monitor_polls_gpu_metrics_only_for_a_model_on_a_gpu():
    assert PointMonitor("h:1", "m", metrics_url="http://h:2/metrics").metrics_url is None
    assert PointMonitor("h:1", "m", metrics_url="http://h:2/metrics", gpu_uuids=[UUIDS[1]]).metrics_url


def test_a_points_energy_is_the_counters_difference_over_it(monkeypatch):
    """Triton's energy counter (J since the server started), read when the point starts and when it stops: the
    difference is the point's energy, whatever the power did in between."""
    readings = iter([1000.0, 1250.5])
    monitor = PointMonitor("h:1", "m", metrics_url="http://h:2/metrics", gpu_uuids=[UUIDS[1]], interval_s=60)
    monkeypatch.setattr(monitor, "_energy", lambda: next(readings))
    monkeypatch.setattr(monitor, "_client", lambda: (_ for _ in ()).throw(OSError("no statistics here")))
    monitor.start()
    assert monitor.stop()["gpu_energy_j"] == pytest.approx(250.5)


def test_energy_over_the_load_with_the_counter_refreshed_every_100_ms_is_within_5pct_of_the_truth():
    """A 7 s point: 1.2 s of perf_analyzer start-up at 60 W idle, 6 s of load at 250 W and 800 requests/s, 0.3 s of
    wind-down. Triton refreshes its counter every 100 ms; the monitor reads it beside the served-request count every
    100 ms. J per request over the load is 250/800; the whole span's difference would charge the idle start-up too."""
    step = 0.001
    t = np.arange(0, 7.5, step)
    loaded = (t >= 1.2) & (t < 7.2)
    energy = np.cumsum(np.where(loaded, 250.0, 60.0) * step)
    served = np.cumsum(loaded * 800.0 * step)
    interval = METRICS_INTERVAL_MS / 1000
    reads = np.arange(0.037, 7.5, interval)
    polls = np.floor((reads - 0.061) / interval) * interval + 0.061  # the counter is as of Triton's last poll
    load = energy_under_load(reads, np.interp(polls, t, energy), np.floor(np.interp(reads, t, served)), interval)
    assert METRICS_INTERVAL_MS <= 100
    assert load.joules_per_request == pytest.approx(250 / 800, rel=0.05)
    assert load.uncertainty_j / load.joules < 0.05 and 5.0 < load.span_s < 6.0
    whole = (np.interp(7.45, t, energy) - energy[0]) / served[-1]
    assert whole / (250 / 800) - 1 > 0.05  # the start-up's idle energy, charged to the requests


def test_the_point_reports_the_energy_its_requests_drew_under_load(monkeypatch):
    monitor = PointMonitor("h:1", "m", metrics_url="http://h:2/metrics", gpu_uuids=[UUIDS[1]])
    monitor._samples.energy = [
        (0.1 * k, 100.0 + (25.0 * k if k > 3 else 6.0 * k), 10 * max(0, k - 3)) for k in range(30)
    ]
    columns = monitor._energy_columns(requests=300)
    assert columns["gpu_joules_per_request"] == pytest.approx(2.5)
    assert columns["gpu_energy_j"] == pytest.approx(750.0) and columns["gpu_energy_uncertainty_j"] > 0
