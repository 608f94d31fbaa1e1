"""Runs killed outright (SIGKILL, a crash, a dead worker) say so: a run writes a `running` manifest with its owner
(host, pid and the pid's start time) as soon as its folder exists, and the next run on the machine that finds one
whose owner is gone rewrites it as failed, with what was measured and what to do. Without this a killed run's folder
had points and no manifest, and nothing told its user why it ended.

The runs still running are listed beside the run folders (RUNNING_DIR: a small file per run, its owner), so a run
start reads those, not every manifest of a root that holds hundreds of runs. A root from before the list is read
whole, until a run there starts the list."""

from __future__ import annotations

import csv
import json
import os
import socket
from pathlib import Path

from tbench.core.storage import is_remote, store_errors, url_to_fs
from tbench.node.procs import alive, started_at
from tbench.stages.run_status import COMPLETED, FAILED, RUNNING
from tbench.stages.store import discard_staged, write_manifest

KILLED_STAGE = "killed"
RUNNING_DIR = ".running"  # under the root of the run folders: <run id>.json, the owner of each run not ended


def owner() -> dict:
    """This process, as a `running` manifest names it."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_started": started_at(os.getpid())}


def killed_message(points: int) -> str:
    return (
        "the run's process was killed before it finished (SIGKILL, a crash, a dead worker); the "
        f"{points} points it measured are kept in results.csv: run it again with --reuse to measure only the rest"
    )


def killed_while_storing_message(run_dir: Path) -> str:
    return (
        "the run's process was killed while it stored the run (a dead worker), and the store has no copy of it: every "
        f"point is kept in {run_dir}; `tbench upload {run_dir}` finishes the upload"
    )


def _stored(manifest: dict) -> bool | None:
    """Whether a run that reached its finish is in its store (its manifest there, written last); None when the store
    cannot say now. A run of a local root is stored where it was written."""
    url = manifest.get("artifact_url") or ""
    if not is_remote(url):
        return True
    try:
        fs, path = url_to_fs(url)
        return bool(fs.exists(f"{path}/manifest.json"))
    except store_errors():
        return None


def mark_running(root: Path, run_id: str, who: dict) -> None:
    """List the run as running (its folder's manifest says so too) until `mark_ended`."""
    listed = root / RUNNING_DIR
    listed.mkdir(exist_ok=True)
    (listed / f"{run_id}.json").write_text(json.dumps(who))


def mark_ended(root: Path, run_id: str) -> None:
    """Take the run off the list once its manifest no longer says running (one that could not be rewritten stays
    listed: the next run marks it killed)."""
    if _status(root / run_id / "manifest.json") != RUNNING:
        (root / RUNNING_DIR / f"{run_id}.json").unlink(missing_ok=True)


def mark_killed_runs(root: Path) -> list[str]:
    """The listed runs under `root` whose owner is a process of this host that is gone, their manifests rewritten as
    failed (failed stage `killed`); returns their run ids. A listed run that ended is taken off the list, and its
    staged copy removed where it was completed and stored remotely."""
    if not root.is_dir():
        return []
    listed = root / RUNNING_DIR
    if not listed.is_dir():  # a root from before the list: its running manifests (a run start then makes the list)
        for path in root.glob("*/manifest.json"):
            manifest = _read(path)
            if manifest and manifest.get("status") == RUNNING and isinstance(manifest.get("owner"), dict):
                mark_running(root, path.parent.name, manifest["owner"])
    marked = []
    for entry in sorted(listed.glob("*.json")) if listed.is_dir() else []:
        who = _read(entry) or {}
        if who.get("host") != socket.gethostname() or alive(int(who.get("pid", -1)), who.get("pid_started")):
            continue
        run_id = entry.name.removesuffix(".json")
        path = root / run_id / "manifest.json"
        manifest = _read(path)
        if manifest and manifest.get("status") == RUNNING:
            points = _points(path.parent / "results.csv")
            manifest.update(
                status=FAILED,
                failed_stage=KILLED_STAGE,
                error=killed_message(points),
                points={"measured": points, "failed": 0},
            )
            try:
                write_manifest(path.parent, manifest)
            except OSError:
                continue  # a full or read-only disk: the next run tries again
            marked.append(str(manifest.get("run_id") or run_id))
        elif manifest and (stored := _stored(manifest)) is not True:
            if stored is None:  # the store cannot say now: the next run asks again
                continue
            # killed between writing its final manifest and storing it: that manifest says it ended, the store has
            # nothing, and the folder it names stays behind on the worker
            why = killed_while_storing_message(path.parent)
            if manifest.get("status") == FAILED:
                manifest["error"] = f"{manifest.get('error') or 'failed'}; then {why}"
            else:
                manifest.update(status=FAILED, failed_stage=KILLED_STAGE, error=why)
            try:
                write_manifest(path.parent, manifest)
            except OSError:
                continue
            marked.append(str(manifest.get("run_id") or run_id))
        elif manifest and manifest.get("status") == COMPLETED:
            # stored, then killed (in its history stage): the store has it all (a failed run keeps its copy)
            discard_staged(path.parent, manifest.get("artifact_url") or "")
        entry.unlink(missing_ok=True)
    return marked


def read_manifest(run_dir: Path) -> dict | None:
    """A run folder's manifest, None where it cannot be read."""
    return _read(run_dir / "manifest.json")


def _read(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _status(manifest: Path) -> str | None:
    return (_read(manifest) or {}).get("status")


def _points(results_csv: Path) -> int:
    try:
        with results_csv.open(newline="") as f:
            return max(0, sum(1 for _ in csv.reader(f)) - 1)
    except (OSError, csv.Error):
        return 0
