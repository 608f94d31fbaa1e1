"""The partitioned results dataset: written per run, queried across runs with partition filters."""

from __future__ import annotations

import json

import pandas as pd

from tbench.results.dataset import add_run_to_dataset, best_per_run, partition_value, query_results


def fake_run(root, run_id, model, gpu, day, throughputs):
    run = root / "staging" / run_id
    run.mkdir(parents=True)
    rows = [
        {
            "model": model,
            "gpu": gpu,
            "format": "onnx",
            "precision": "FP32",
            "scenario": "offline",
            "batch_size": b,
            "concurrency": 1,
            "throughput_infer_per_s": t,
            "p99_ms": 1.0 + b,
            "status": "ok" if t else "unstable",
        }
        for b, t in throughputs
    ]
    pd.DataFrame(rows).to_parquet(run / "results.parquet", index=False)
    (run / "manifest.json").write_text(json.dumps({"run_id": run_id, "started_at": f"{day}T10:00:00+00:00"}))
    return run


def test_runs_land_in_their_partitions_and_query_back(tmp_path):
    store = tmp_path / "store"
    a = fake_run(tmp_path, "r1", "resnet50", "NVIDIA A100-SXM4-80GB", "2026-11-20", [(1, 100.0), (8, 400.0)])
    b = fake_run(tmp_path, "r2", "resnet50", "CPU", "2026-11-22", [(1, 10.0), (8, None)])
    c = fake_run(tmp_path, "r3", "dlrm", "CPU", "2026-11-22", [(64, 5000.0)])
    written = [p for run, rid in ((a, "r1"), (b, "r2"), (c, "r3")) for p in add_run_to_dataset(run, str(store), rid)]
    assert sorted(p.replace(str(store), "") for p in written) == [
        "/results/model=dlrm/gpu=CPU/date=2026-11-22/r3.parquet",
        "/results/model=resnet50/gpu=CPU/date=2026-11-22/r2.parquet",
        "/results/model=resnet50/gpu=NVIDIA%20A100-SXM4-80GB/date=2026-11-20/r1.parquet",
    ]
    assert not list(store.rglob("*.tmp-*"))

    everything = query_results(str(store))
    assert len(everything) == 5 and set(everything["run_id"]) == {"r1", "r2", "r3"}
    assert set(query_results(str(store), model="resnet50", gpu="NVIDIA A100-SXM4-80GB")["run_id"]) == {"r1"}
    assert set(query_results(str(store), since="2026-11-21")["run_id"]) == {"r2", "r3"}
    assert query_results(str(tmp_path / "nothing")).empty
    # pyarrow reads the same folder as one Hive-partitioned dataset
    import pyarrow.dataset as ds

    table = ds.dataset(store / "results", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 5 and "NVIDIA A100-SXM4-80GB" in table.column("gpu").to_pylist()

    best = best_per_run(everything)
    assert list(best["run_id"]) == ["r1", "r2", "r3"]
    assert list(best["throughput_infer_per_s"]) == [400.0, 10.0, 5000.0]  # the unstable point is not a best


def test_a_run_without_results_adds_nothing(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    assert add_run_to_dataset(run, str(tmp_path / "store"), "r") == []
    assert (
        partition_value("NVIDIA A100/80GB") == "NVIDIA%20A100%2F80GB"
        and partition_value(None) == "__HIVE_DEFAULT_PARTITION__"
    )


def test_the_run_status_is_stored_and_incomplete_runs_are_left_out_by_default(tmp_path):
    store = tmp_path / "store"
    statuses = {"done": "completed", "partly": "completed_with_failures", "broken": "failed", "stopped": "interrupted"}
    for run_id, status in statuses.items():
        run = fake_run(tmp_path, run_id, "resnet50", "CPU", "2026-11-22", [(1, 10.0), (8, 40.0)])
        manifest = json.loads((run / "manifest.json").read_text())
        (run / "manifest.json").write_text(json.dumps({**manifest, "status": status}))
        add_run_to_dataset(run, str(store), run_id)  # the status from the manifest, as `tbench upload` stores it
    # a run stored by store_task: the status it is given wins over a manifest that says nothing
    given = fake_run(tmp_path, "given", "resnet50", "CPU", "2026-11-22", [(1, 5.0)])
    add_run_to_dataset(given, str(store), "given", status="failed")
    # a file from before runs carried a status: no run_status column at all
    old = store / "results/model=resnet50/gpu=CPU/date=2026-11-21/old.parquet"
    old.parent.mkdir(parents=True)
    pd.DataFrame(
        [
            {
                "format": "onnx",
                "scenario": "offline",
                "batch_size": 1,
                "throughput_infer_per_s": 7.0,
                "status": "ok",
                "run_id": "old",
            }
        ]
    ).to_parquet(old, index=False)

    one = pd.read_parquet(store / "results/model=resnet50/gpu=CPU/date=2026-11-22/broken.parquet")
    assert set(one["run_status"]) == {"failed"}

    kept = query_results(str(store))
    assert dict(kept.groupby("run_id")["run_status"].first()) == {
        "done": "completed",
        "partly": "completed_with_failures",
        "old": "unknown",
    }
    everything = query_results(str(store), include_incomplete=True)
    assert dict(everything.groupby("run_id")["run_status"].first()) == {**statuses, "given": "failed", "old": "unknown"}
    best = best_per_run(everything)
    assert dict(zip(best["run_id"], best["run_status"])) == {**statuses, "given": "failed", "old": "unknown"}


def test_a_run_folder_without_a_status_stores_unknown(tmp_path):
    run = fake_run(tmp_path, "r", "resnet50", "CPU", "2026-11-22", [(1, 10.0)])
    add_run_to_dataset(run, str(tmp_path / "store"), "r")
    assert list(query_results(str(tmp_path / "store"))["run_status"]) == ["unknown"]
