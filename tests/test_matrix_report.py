"""The cross-GPU report, fed with the guides' published results (several GPUs per model)."""

from __future__ import annotations

import pandas as pd

from tasks.matrix_report import matrix_markdown, side_by_side
from tbench.search_surface import published


def test_gpus_side_by_side_from_the_published_tables(tmp_path):
    table = published()
    resnet = table[(table["model"] == "resnet50") & (table["precision"] == "FP16")].assign(format="tf-trt", status="ok")
    wide = side_by_side(resnet)
    gpus = sorted(resnet["gpu"].unique())
    assert len(gpus) >= 2 and set(wide["Scenario"]) == {"offline", "online"}
    for gpu in gpus:
        assert f"{gpu}: best infer/s" in wide.columns and f"{gpu}: p99 ms" in wide.columns
    # the offline cell is each GPU's highest published throughput, with the batch size it came at
    a100 = resnet[(resnet["gpu"] == gpus[0]) & (resnet["scenario"] == "offline")]
    best = a100.loc[a100["throughput_infer_per_s"].idxmax()]
    cell = wide[wide["Scenario"] == "offline"].iloc[0][f"{gpus[0]}: best infer/s"]
    assert cell == f"{best['throughput_infer_per_s']:.1f} (b{best['batch_size']:g})"

    runs = pd.DataFrame([{"pool": g, "state": "COMPLETED"} for g in gpus])
    text = matrix_markdown(resnet, runs, tmp_path)
    assert "## Best points per GPU" in text and f"{len(gpus)} runs; {len(gpus)} completed." in text
    assert (tmp_path / "plots" / "resnet50_tf-trt_FP16_offline_gpus.png").exists()
