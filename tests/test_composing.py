"""Composing-model latencies from a real perf_analyzer 2.51 log of an ensemble (two python-backend ONNX steps)."""

from pathlib import Path

from tbench.loadgen.perf_analyzer import parse_composing

GOLDEN = Path(__file__).parent / "golden" / "perf_analyzer" / "ensemble_b2_c1.log"


def test_last_block_per_composing_model():
    rows = parse_composing(GOLDEN.read_text())
    assert [r["composing_model"] for r in rows] == ["ens_a", "ens_b"]
    a, b = rows
    assert a["inference_count"] == 7286 and a["execution_count"] == 3643
    assert a["request_latency_ms"] == 0.291 and a["server_queue_ms"] == 0.057
    assert (a["server_compute_input_ms"], a["server_compute_infer_ms"], a["server_compute_output_ms"]) == (
        0.013,
        0.177,
        0.042,
    )
    assert b["server_compute_output_ms"] == 0.102 and b["overhead_ms"] == 0.001


def test_not_an_ensemble():
    assert parse_composing("Request concurrency: 1\n  Client:\n    Throughput: 5 infer/sec\n") == []
