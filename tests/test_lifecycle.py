"""A run's finish (flows.lifecycle.finish_run): what was measured is stored whatever fails before the store."""

from __future__ import annotations

import errno
import json

import fsspec
import pytest

from flows.lifecycle import finish_run
from tbench.core.layout import RunLayout
from tbench.stages.tracker import FAILED, RunTracker


def test_a_report_that_cannot_be_written_still_leaves_the_run_stored_saying_why(tmp_path, prefect_harness):
    layout = RunLayout(tmp_path / "staging", "resnet50-full").create()
    (layout.run_dir / "results.csv").write_text("batch_size,status\n1,ok\n")
    tracker = RunTracker(layout)

    def report():  # the disk filled while the report was written
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        finish_run(tracker, None, {"flow_run_id": "f-1"}, server=None, output="memory://finish/runs", report=report)
    fs = fsspec.filesystem("memory")
    stored = json.loads(fs.cat_file("/finish/runs/resnet50-full/manifest.json"))
    assert stored["status"] == FAILED and "No space left on device" in stored["error"]
    assert stored["flow_run_id"] == "f-1"
    assert fs.cat_file("/finish/runs/resnet50-full/results.csv").startswith(b"batch_size")  # the points, stored
    assert layout.run_dir.exists()  # a failed run keeps its copy


def test_a_run_its_worker_refused_says_why_in_the_store_and_a_command_lines_run_leaves_nothing(tmp_path, monkeypatch):
    import flows.lifecycle as lifecycle
    from tbench.core.errors import ConfigError
    from tbench.request.benchmark import BenchmarkRequest

    req = BenchmarkRequest(model="resnet50", output="memory://refused/runs")
    refusal = ConfigError("only 0 MiB free on the disk of /staging: free some space there")
    assert lifecycle.record_refusal(req, tmp_path, "resnet50-cli", refusal) is None  # said to its user, and that is all
    monkeypatch.setattr(lifecycle, "flow_run_id", lambda: "f-9")  # a deployment's run, on its worker
    assert lifecycle.record_refusal(req, tmp_path, "resnet50-r", refusal) == "memory://refused/runs/resnet50-r"
    fs = fsspec.filesystem("memory")
    stored = json.loads(fs.cat_file("/refused/runs/resnet50-r/manifest.json"))
    assert stored["status"] == FAILED and stored["failed_stage"] == lifecycle.PREFLIGHT_STAGE
    assert stored["error"] == str(refusal) and stored["flow_run_id"] == "f-9"
    assert not fs.exists("/refused/runs/resnet50-cli") and not list(tmp_path.iterdir())  # nothing on the worker's disk
