"""Comparison with the published results: GPU names, the join, and the ratios."""

import pandas as pd
import pytest

from tasks.published import compare_with_published, load_published, published_gpu


@pytest.mark.parametrize("name, label", [
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-SXM4-40GB", None), ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-32GB", "V100-32GB"), ("NVIDIA A40", "A40"), ("NVIDIA A30", "A30"), ("NVIDIA H100 80GB HBM3", None),
    ("CPU", None),
])
def test_gpu_names_map_to_the_published_labels(name, label):
    assert published_gpu(name) == label


def _measured(gpu: str, published: pd.DataFrame) -> pd.DataFrame:
    """Two points shaped like a run's results: one with a published twin, one without."""
    twin = published[(published["model"] == "fastpitch") & (published["scenario"] == "offline")
                     & (published["gpu"] == "A40") & (published["precision"] == "FP16")].iloc[0]
    rows = [dict(model="fastpitch", scenario="offline", gpu=gpu, precision="FP16", model_format="TorchScript",
                 batch_size=int(twin["batch_size"]), concurrency=1, format="ts-trace", status="ok",
                 throughput_infer_per_s=twin["throughput_infer_per_s"] / 2, p99_ms=twin["p99_ms"] * 2),
            dict(model="fastpitch", scenario="offline", gpu=gpu, precision="FP16", model_format="TorchScript",
                 batch_size=999, concurrency=1, format="ts-trace", status="ok", throughput_infer_per_s=1.0, p99_ms=1.0)]
    return pd.DataFrame(rows)


def test_points_with_a_published_twin_get_ratios():
    published = load_published()
    both = compare_with_published(_measured("NVIDIA A40", published), published)
    assert len(both) == 1
    assert both["throughput_ratio"].iloc[0] == pytest.approx(0.5) and both["p99_ratio"].iloc[0] == pytest.approx(2.0)


def test_a_cpu_run_has_nothing_to_compare():
    published = load_published()
    assert compare_with_published(_measured("CPU", published), published).empty


def test_the_report_section_shows_both_or_says_why_not():
    from tasks.report import published_lines

    published = load_published()
    text = "\n".join(published_lines(_measured("NVIDIA A40", published)))
    assert "| Format   | Scenario   |" in text and "Published P99" in text and "0.5" in text
    text = "\n".join(published_lines(_measured("CPU", published)))
    assert "publish no results for this model on CPU" in text and "A100-80GB" in text
