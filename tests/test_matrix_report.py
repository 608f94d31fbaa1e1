"""The cross-GPU report, fed with the guides' published results (several GPUs per model)."""

from __future__ import annotations

import pandas as pd

from tbench.results.matrix_report import matrix_markdown, side_by_side
from tbench.search.surface import published


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


def test_runs_that_did_not_finish_are_listed_and_kept_out_of_the_tables(tmp_path):
    from flows.matrix import load_results
    from tbench.results.html_report import write_html_report

    table = published()
    resnet = table[(table["model"] == "resnet50") & (table["precision"] == "FP16")].assign(format="tf-trt", status="ok")
    stored = {}
    for gpu in ("A100-80GB", "T4", "V100-32GB"):  # the V100 run failed midway but stored what it measured
        stored[gpu] = tmp_path / "runs" / gpu
        stored[gpu].mkdir(parents=True)
        resnet[resnet["gpu"] == gpu].to_parquet(stored[gpu] / "results.parquet", index=False)
    row = {"model": "resnet50", "format": "tf-trt", "precision": "fp16", "reason": ""}
    runs = [
        {**row, "pool": "a100", "state": "COMPLETED", "flow_run": "f-a100", "run_url": str(stored["A100-80GB"])},
        {**row, "pool": "t4", "state": "COMPLETED", "flow_run": "f-t4", "run_url": str(stored["T4"])},
        {
            **row,
            "pool": "v100",
            "state": "FAILED",
            "flow_run": "f-v100",
            "run_url": str(stored["V100-32GB"]),
            "reason": "Flow run encountered an exception: ServerStartError: model a|b did not load",
        },
        {
            **row,
            "pool": "a40",
            "state": "CANCELLED",
            "flow_run": "f-a40",
            "run_url": None,
            "reason": "no worker picked it up within 600 s (state SCHEDULED, pool a40 NOT_READY); cancelled",
        },
    ]

    results = load_results(runs)
    assert set(results["gpu"]) == {"A100-80GB", "T4"}  # the failed run's partial points stay out of the comparison
    out = tmp_path / "matrix"
    text = matrix_markdown(results, pd.DataFrame(runs), out)
    assert "4 runs; 2 completed. 2 did not finish" in text
    wide = side_by_side(results)
    assert not [c for c in wide.columns if c.startswith(("V100", "A40"))]
    section = text.split("## Runs that did not finish", 1)[1].split("## Best points per GPU", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "Pool",
        "Model",
        "Format",
        "Precision",
        "State",
        "Reason",
        "Flow run",
        "Run folder",
    ]
    assert len(lines) == 4  # header, rule, and one row per run that did not finish
    assert (
        "| v100 " in lines[2]
        and "| FAILED " in lines[2]
        and "model a\\|b did not load" in lines[2]
        and "f-v100" in lines[2]
    )
    assert "| a40 " in lines[3] and "| CANCELLED " in lines[3] and "within 600 s (state SCHEDULED" in lines[3]
    assert "A100-80GB: best infer/s" in text and "T4: best infer/s" in text

    (out / "report.md").write_text(text)
    html = write_html_report(out / "report.md").read_text()
    # the message with a | in it is one cell of the rendered table, not split across two
    assert "model a|b did not load</td>" in html


def test_a_rate_point_is_labelled_by_its_offered_rate():
    from tbench.results.matrix_report import load_label

    row = pd.Series({"batch_size": 1, "concurrency": float("nan"), "request_rate": 50.0})
    assert (load_label("rate", row), load_label("offline", row)) == ("r50", "b1")
    assert load_label("online", pd.Series({"batch_size": 1, "concurrency": 4, "request_rate": float("nan")})) == "c4"
