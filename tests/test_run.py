"""A run's status tells the truth: completed, completed with failed points, failed, interrupted."""

from __future__ import annotations

import json
import signal

import pandas as pd
import pytest

from tbench.core.errors import ServerStartError
from tbench.core.layout import RunLayout
from tbench.stages.tracker import COMPLETED, COMPLETED_WITH_FAILURES, FAILED, INTERRUPTED, RunTracker


class FakeTermination(BaseException):  # the shape of Prefect's TerminationSignal
    signal = signal.SIGTERM


@pytest.fixture
def tracker(tmp_path) -> RunTracker:
    return RunTracker(RunLayout(tmp_path, "run-1").create())


def points(*statuses: str) -> pd.DataFrame:
    return pd.DataFrame({"status": list(statuses), "scenario": "offline"})


def test_point_failures_decide_between_completed_with_failures_and_failed(tracker):
    assert tracker.status == COMPLETED and tracker.status_line == ""
    tracker.results = points("ok", "unstable")
    assert tracker.status == COMPLETED  # unstable points are flagged, not failed
    tracker.results = points("ok", "error", "unstable")
    assert tracker.status == COMPLETED_WITH_FAILURES and tracker.status_line.startswith(
        "1 of 3 perf_analyzer points failed"
    )
    tracker.results = points("error", "error")
    assert tracker.status == FAILED


@pytest.mark.parametrize(
    "err, name",
    [
        (KeyboardInterrupt(), "Ctrl-C (SIGINT)"),
        (KeyboardInterrupt("SIGTERM"), "SIGTERM"),
        (FakeTermination(), "SIGTERM"),
    ],
)
def test_an_interrupt_names_the_signal_and_the_stage_and_wins_over_later_errors(tracker, err, name):
    with pytest.raises(type(err)), tracker.stage("perf-online-onnx"):
        raise err
    tracker.record_error(RuntimeError("the report failed afterwards"))
    assert tracker.status == INTERRUPTED and tracker.failed_stage == "perf-online-onnx"
    assert tracker.error == f"interrupted by {name} during perf-online-onnx"
    assert tracker.stage_status["perf-online-onnx"] == "interrupted"


def test_an_unexpected_exception_is_one_line_and_the_manifest_says_failed(tracker):
    with pytest.raises(ValueError), tracker.stage("correctness"):
        raise ValueError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions\nStacktrace: ...")
    assert tracker.status == FAILED
    assert tracker.error == "ValueError: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions"
    tracker.write_manifest(request={"model": "x"})
    manifest = json.loads((tracker.layout.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_stage"] == "correctness"
    assert manifest["points"] == {"measured": 0, "failed": 0}


def test_a_bench_error_keeps_its_own_message(tracker):
    with pytest.raises(ServerStartError), tracker.stage("server-start"):
        raise ServerStartError("model resnet50 failed to load: see server.log")
    assert tracker.error == "model resnet50 failed to load: see server.log"


def test_a_manifest_that_cannot_be_written_does_not_raise(tracker, tmp_path):
    tracker.layout.run_dir.chmod(0o500)
    try:
        tracker.write_manifest()  # logged; the caller goes on to stop the server
    finally:
        tracker.layout.run_dir.chmod(0o700)


def test_a_full_disk_at_the_logs_last_flush_does_not_hide_the_runs_own_error(tracker, caplog):
    """The soak's disk-full fault: the run's log file could not be flushed as it was released, and that OSError was
    what the run ended with, in place of its own one-line error."""
    import logging

    tracker.capture_logs()
    handler = tracker._log_handler

    def full(*_):
        raise OSError(28, "No space left on device")

    handler.flush = full  # what FileHandler.close() calls first
    logging.getLogger("prefect").info("a line still in the buffer")
    tracker.release_logs()
    assert handler not in logging.getLogger("prefect").handlers and tracker._log_handler is None
    assert "No space left on device" in caplog.text


def test_on_a_full_disk_the_final_manifest_is_written_in_the_old_ones_space(tracker, monkeypatch):
    """The soak's lost runs: they failed on a full staging disk, the manifest could not be replaced, and it said
    `running` for ever. Its own space still takes how the run ended."""
    import tbench.stages.tracker as tracker_module
    from tbench.stages.killed import RUNNING

    tracker.write_manifest(status=RUNNING, request={"model": "resnet50", "batch_sizes": list(range(64))})

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracker_module, "write_manifest", full)
    tracker.record_error(ServerStartError("tritonserver exited at start"), "server")
    tracker.write_manifest(status=tracker.status)
    written = json.loads((tracker.layout.run_dir / "manifest.json").read_text())
    assert written["status"] == FAILED and written["failed_stage"] == "server"
    assert "tritonserver exited at start" in written["error"]
    tracker.write_manifest(status=RUNNING)  # a start on a full disk keeps what is there
    assert json.loads((tracker.layout.run_dir / "manifest.json").read_text()) == written
