"""Comparison with the published results: GPU names, the join, and the ratios."""

import pandas as pd
import pytest

from tbench.results.published import (
    PUBLISHED_SIZE,
    compare_with_published,
    load_published,
    published_gpu,
    published_sizes,
)


@pytest.mark.parametrize(
    "name, label",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", None),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA A30", "A30"),
        ("NVIDIA H100 80GB HBM3", None),
        ("CPU", None),
    ],
)
def test_gpu_names_map_to_the_published_labels(name, label):
    assert published_gpu(name) == label


def _measured(gpu: str, published: pd.DataFrame) -> pd.DataFrame:
    """Two points shaped like a run's results: one with a published twin, one without."""
    twin = published[
        (published["model"] == "fastpitch")
        & (published["scenario"] == "offline")
        & (published["gpu"] == "A40")
        & (published["precision"] == "FP16")
    ].iloc[0]
    rows = [
        dict(
            model="fastpitch",
            model_size="full",
            scenario="offline",
            gpu=gpu,
            precision="FP16",
            model_format="TorchScript",
            batch_size=int(twin["batch_size"]),
            concurrency=1,
            format="ts-trace",
            status="ok",
            throughput_infer_per_s=twin["throughput_infer_per_s"] / 2,
            p99_ms=twin["p99_ms"] * 2,
        ),
        dict(
            model="fastpitch",
            model_size="full",
            scenario="offline",
            gpu=gpu,
            precision="FP16",
            model_format="TorchScript",
            batch_size=999,
            concurrency=1,
            format="ts-trace",
            status="ok",
            throughput_infer_per_s=1.0,
            p99_ms=1.0,
        ),
    ]
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
    from tbench.results.report import published_lines

    published = load_published()
    text = "\n".join(published_lines(_measured("NVIDIA A40", published)))
    assert "| Format   | Scenario   |" in text and "Published P99" in text and "0.5" in text
    text = "\n".join(published_lines(_measured("CPU", published)))
    assert "publish no results for this model on CPU" in text and "A100-80GB" in text


def test_published_rows_without_a_size_are_the_full_model():
    sizes = published_sizes(load_published())
    assert set(sizes) == {"full", "4B", "22B"}
    assert PUBLISHED_SIZE == "full"


def test_the_join_is_on_model_size_too():
    """A golden results frame: the same point measured on the small and the full model, and DLRM at 4B and at tiny.
    Only the full model and the published DLRM size have published twins."""
    published = load_published()
    full = _measured("NVIDIA A40", published).iloc[[0]]
    small = full.assign(model_size="small", throughput_infer_per_s=123.0)
    dlrm_twin = published[(published["model"] == "dlrm") & (published["model_size"] == "4B")].iloc[0]
    dlrm = pd.DataFrame(
        [
            dict(
                model="dlrm",
                model_size=size,
                scenario=dlrm_twin["scenario"],
                gpu="NVIDIA A100-SXM4-80GB",
                precision=dlrm_twin["precision"],
                model_format=dlrm_twin["model_format"],
                batch_size=int(dlrm_twin["batch_size"]),
                concurrency=int(dlrm_twin["concurrency"]),
                format="ensemble",
                status="ok",
                throughput_infer_per_s=dlrm_twin["throughput_infer_per_s"],
                p99_ms=dlrm_twin["p99_ms"],
            )
            for size in ("4B", "tiny")
        ]
    )
    both = compare_with_published(pd.concat([full, small, dlrm], ignore_index=True), published)
    assert sorted(zip(both["model"], both["model_size"])) == [("dlrm", "4B"), ("fastpitch", "full")]
    assert both.loc[both["model"] == "dlrm", "throughput_ratio"].iloc[0] == pytest.approx(1.0)
    assert compare_with_published(small, published).empty
    assert compare_with_published(full.drop(columns="model_size"), published).empty  # no size: nothing to match


def test_the_report_says_the_size_counts():
    from tbench.results.report import published_lines

    published = load_published()
    small = _measured("NVIDIA A40", published).assign(model_size="small")
    text = "\n".join(published_lines(small))
    assert "publish no results for this model on NVIDIA A40 at this size, precision and format" in text
    assert "published sizes of this model: full" in text
    assert "Matched on model, size" in "\n".join(published_lines(_measured("NVIDIA A40", published)))
