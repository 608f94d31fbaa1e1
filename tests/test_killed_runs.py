"""A run killed outright leaves a `running` manifest; the next run on the machine rewrites it as failed, saying what
was measured and what to do (tbench.stages.killed). Real processes: one that exited, and this one."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from tbench.stages.killed import (
    KILLED_STAGE,
    RUNNING,
    RUNNING_DIR,
    killed_message,
    mark_ended,
    mark_killed_runs,
    mark_running,
    owner,
)
from tbench.stages.tracker import FAILED


def run_folder(root, name: str, who: dict, points: int = 0):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"run_id": name, "status": RUNNING, "owner": who}))
    if points:
        rows = "\n".join(f"{i},ok" for i in range(points))
        (folder / "results.csv").write_text(f"batch_size,status\n{rows}\n")
    return folder


def gone_owner() -> dict:
    """A process that ran and exited: what a SIGKILLed run's manifest names."""
    script = "import json; from tbench.stages.killed import owner; print(json.dumps(owner()))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_run_whose_process_is_gone_is_marked_failed_with_what_it_measured(tmp_path):
    killed = run_folder(tmp_path, "resnet50-killed", gone_owner(), points=3)
    assert mark_killed_runs(tmp_path) == ["resnet50-killed"]
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["status"] == FAILED and manifest["failed_stage"] == KILLED_STAGE
    assert manifest["error"] == killed_message(3) and "--reuse" in manifest["error"]
    assert manifest["points"]["measured"] == 3
    assert mark_killed_runs(tmp_path) == []  # marked once


def test_a_running_run_and_one_on_another_host_are_left_alone(tmp_path):
    mine = run_folder(tmp_path, "resnet50-running", owner())  # this process: alive
    elsewhere = run_folder(tmp_path, "resnet50-elsewhere", gone_owner() | {"host": socket.gethostname() + "-other"})
    assert mark_killed_runs(tmp_path) == []
    for folder in (mine, elsewhere):
        assert json.loads((folder / "manifest.json").read_text())["status"] == RUNNING


def test_no_root_and_unreadable_manifests_are_skipped(tmp_path):
    assert mark_killed_runs(tmp_path / "missing") == []
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    assert mark_killed_runs(tmp_path) == []


def test_a_run_start_reads_the_list_of_running_runs_not_every_manifest(tmp_path):
    killed = run_folder(tmp_path, "resnet50-killed", gone_owner(), points=2)
    mark_running(tmp_path, "resnet50-killed", gone_owner())
    unlisted = run_folder(tmp_path, "resnet50-unlisted", gone_owner())  # not on the list: not read
    assert mark_killed_runs(tmp_path) == ["resnet50-killed"]
    assert json.loads((killed / "manifest.json").read_text())["status"] == FAILED
    assert json.loads((unlisted / "manifest.json").read_text())["status"] == RUNNING
    assert not list((tmp_path / RUNNING_DIR).iterdir())  # marked, and off the list


def test_a_root_from_before_the_list_is_read_whole(tmp_path):
    run_folder(tmp_path, "resnet50-old", gone_owner())
    assert mark_killed_runs(tmp_path) == ["resnet50-old"]


def test_a_run_that_ended_comes_off_the_list_and_one_still_running_stays(tmp_path):
    folder = run_folder(tmp_path, "resnet50-done", owner())
    mark_running(tmp_path, "resnet50-done", owner())
    mark_ended(tmp_path, "resnet50-done")  # its manifest still says running (a final one that could not be written)
    assert (tmp_path / RUNNING_DIR / "resnet50-done.json").exists()
    (folder / "manifest.json").write_text(json.dumps({"run_id": "resnet50-done", "status": "completed"}))
    mark_ended(tmp_path, "resnet50-done")
    assert not (tmp_path / RUNNING_DIR / "resnet50-done.json").exists()


def finished_folder(root, name: str, status: str, artifact_url: str, error: str | None = None):
    """A run killed after it wrote its final manifest (status ended) and before its store finished: still listed."""
    folder = run_folder(root, name, gone_owner(), points=2)
    manifest = {"run_id": name, "status": status, "artifact_url": artifact_url, "error": error}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    mark_running(root, name, gone_owner())
    return folder


def test_a_run_killed_while_storing_says_so_and_how_to_finish_the_upload(tmp_path):
    import fsspec

    from tbench.stages.killed import killed_while_storing_message

    unstored = finished_folder(tmp_path, "resnet50-unstored", "completed", "memory://killed/runs/resnet50-unstored")
    failed = finished_folder(tmp_path, "resnet50-failed", FAILED, "memory://killed/runs/resnet50-failed", "sweep: x")
    stored = finished_folder(tmp_path, "resnet50-stored", "completed", "memory://killed/runs/resnet50-stored")
    fsspec.filesystem("memory").pipe("/killed/runs/resnet50-stored/manifest.json", b"{}")  # stored, killed later
    local = finished_folder(tmp_path, "resnet50-local", "completed", str(tmp_path / "resnet50-local"))
    assert sorted(mark_killed_runs(tmp_path)) == ["resnet50-failed", "resnet50-unstored"]
    said = json.loads((unstored / "manifest.json").read_text())
    assert said["status"] == FAILED and said["failed_stage"] == KILLED_STAGE
    assert said["error"] == killed_while_storing_message(unstored) and "tbench upload" in said["error"]
    kept = json.loads((failed / "manifest.json").read_text())
    assert kept["error"].startswith("sweep: x; then ")  # its own cause first
    # in its local root: it ended as it said, and stays
    assert json.loads((local / "manifest.json").read_text())["status"] == "completed"
    assert not stored.exists()  # stored, then killed (in its history stage): the copy the store has leaves staging
    assert mark_killed_runs(tmp_path) == []  # marked once: off the list


def test_a_killed_run_that_prefect_still_shows_running_is_marked_crashed_by_the_next_run(tmp_path, prefect_harness):
    """The zombie automation misses a run whose heartbeat events the server dropped (a SQLite database locked under
    load, in the soak): the next run on the machine, finding it killed, corrects its Prefect state (a real server)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    from flows.lifecycle import clean_up_killed_folders

    @flow
    def measured():
        pass

    with get_client(sync_client=True) as client:
        killed_id = client.create_flow_run(measured, state=Running()).id
        finished_id = client.create_flow_run(measured, state=Completed()).id
    for name, flow_run_id in (("resnet50-killed", killed_id), ("resnet50-finished", finished_id)):
        folder = run_folder(tmp_path, name, gone_owner(), points=2)
        manifest = json.loads((folder / "manifest.json").read_text()) | {"flow_run_id": str(flow_run_id)}
        (folder / "manifest.json").write_text(json.dumps(manifest))
    clean_up_killed_folders(tmp_path)
    with get_client(sync_client=True) as client:
        crashed = client.read_flow_run(killed_id).state
        finished = client.read_flow_run(finished_id).state
    assert crashed.type.value == "CRASHED" and crashed.message == killed_message(2)
    assert finished.type.value == "COMPLETED"  # a final state is left as it is
