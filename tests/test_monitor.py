"""The per-point server view: statistics diffs, the cross-check against perf_analyzer, GPU metrics parsing."""

import math

from tasks.monitor import cross_check, parse_gpu_metrics, per_request_ms

from conftest import GOLDEN


def test_statistics_diff_is_per_request_ms():
    before = {"count": 100, "queue": 10_000_000, "compute_input": 0, "compute_infer": 50_000_000, "compute_output": 0}
    after = {"count": 300, "queue": 30_000_000, "compute_input": 2_000_000, "compute_infer": 250_000_000, "compute_output": 4_000_000}
    got = per_request_ms(before, after)
    assert got["triton_requests"] == 200 and got["triton_queue_ms"] == 0.1 and got["triton_compute_infer_ms"] == 1.0
    assert got["triton_compute_input_ms"] == 0.01 and got["triton_compute_output_ms"] == 0.02
    assert per_request_ms(before, before) == {"triton_requests": 0}


def test_cross_check_ignores_stages_too_small_to_compare():
    row = {"triton_queue_ms": 2.0, "server_queue_ms": 2.2, "triton_compute_infer_ms": 10.0, "server_compute_infer_ms": 9.0,
           "triton_compute_input_ms": 0.01, "server_compute_input_ms": 0.03}
    assert math.isclose(cross_check(row), 0.1)  # infer: 1/10; queue 0.2/2.2 is smaller; input is below 0.05 ms
    assert math.isnan(cross_check({"triton_queue_ms": 1.0}))


def test_gpu_metrics_from_tritons_prometheus_text():
    got = parse_gpu_metrics((GOLDEN / "triton" / "metrics_gpu.txt").read_text())
    assert got == {"gpu_util_pct": 50.0, "gpu_mem_mb": 3072.0, "gpu_power_w": 273.75}
    assert parse_gpu_metrics('nv_inference_request_success{model="m",version="1"} 3') == {}
