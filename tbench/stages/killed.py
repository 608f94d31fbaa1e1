"""Runs killed outright (SIGKILL, a crash, a dead worker) say so: a run writes a `running` manifest with its owner
(host, pid and the pid's start time) as soon as its folder exists, and the next run on the machine that finds one
whose owner is gone rewrites it as failed, with what was measured and what to do. Without this a killed run's folder
had points and no manifest, and nothing told its user why it ended."""

from __future__ import annotations

import csv
import json
import os
import socket
from pathlib import Path

from tbench.node.procs import alive, started_at
from tbench.stages.store import write_manifest

RUNNING = "running"  # a manifest's status while its run runs; never a run's final status
KILLED_STAGE = "killed"


def owner() -> dict:
    """This process, as a `running` manifest names it."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_started": started_at(os.getpid())}


def killed_message(points: int) -> str:
    return (
        "the run's process was killed before it finished (SIGKILL, a crash, a dead worker); the "
        f"{points} points it measured are kept in results.csv: run it again with --reuse to measure only the rest"
    )


def mark_killed_runs(root: Path) -> list[str]:
    """The run folders under `root` whose `running` manifest names a process of this host that is gone, rewritten as
    failed (failed stage `killed`); returns their run ids."""
    marked = []
    for path in root.glob("*/manifest.json") if root.is_dir() else []:
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        who = manifest.get("owner") or {}
        if manifest.get("status") != RUNNING or who.get("host") != socket.gethostname():
            continue
        if alive(int(who.get("pid", -1)), who.get("pid_started")):
            continue
        points = _points(path.parent / "results.csv")
        manifest.update(
            status="failed",
            failed_stage=KILLED_STAGE,
            error=killed_message(points),
            points={"measured": points, "failed": 0},
        )
        try:
            write_manifest(path.parent, manifest)
        except OSError:
            continue  # a full or read-only disk: the next run tries again
        marked.append(str(manifest.get("run_id") or path.parent.name))
    return marked


def _points(results_csv: Path) -> int:
    try:
        with results_csv.open(newline="") as f:
            return max(0, sum(1 for _ in csv.reader(f)) - 1)
    except (OSError, csv.Error):
        return 0
