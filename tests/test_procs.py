"""Child processes are recorded with their owner: a child whose owner died is reaped by the next run, others never."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from tbench.node import procs, shm

OWNER = """
import sys
from pathlib import Path
from tbench.node import procs, shm
scratch = Path(sys.argv[1]).parent / "scratch"  # a temporary folder of the child's (a server's trace, say)
scratch.mkdir()
child = procs.start(["sleep", "300"], Path(sys.argv[1]), scratch=[scratch])
print(child.pid)
"""  # exits without stopping its child: what a SIGKILL'd run leaves


def orphan_of(script: str, tmp_path) -> int:
    """The pid of the child that an owner running `script` started and left behind."""
    owner = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "orphan.log")], capture_output=True, text=True, timeout=60
    )
    return int(owner.stdout.strip())


def wait_gone(pid: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_child_whose_owner_died_is_reaped_and_one_whose_owner_lives_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_PROCS_DIR", str(tmp_path / "procs"))
    orphan = orphan_of(OWNER, tmp_path)
    ours = procs.start(["sleep", "300"], tmp_path / "ours.log")
    try:
        assert psutil.pid_exists(orphan)
        assert json.loads((tmp_path / "procs" / f"{orphan}.json").read_text())["argv0"] == "sleep"
        assert (tmp_path / "scratch").is_dir()
        assert procs.reap_orphans() == [f"sleep (pid {orphan})"]
        assert not (tmp_path / "scratch").exists()  # its temporary folder went with it
        wait_gone(orphan)
        assert ours.poll() is None and procs.reap_orphans() == []  # our own child stays
    finally:
        procs.stop(ours, timeout_s=1)
    assert not list((tmp_path / "procs").glob("*.json"))  # stopped and reaped children leave no record


def test_a_record_of_a_pid_now_used_by_another_process_is_dropped_not_killed(tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_PROCS_DIR", str(tmp_path / "procs"))
    (tmp_path / "procs").mkdir()
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:  # a record naming a live pid with another start time: the pid was reused, the orphan is long gone
        (tmp_path / "procs" / f"{bystander.pid}.json").write_text(
            json.dumps(
                {"pid": bystander.pid, "started": 1.0, "owner": 1, "owner_started": 1.0, "argv0": "tritonserver"}
            )
        )
        assert procs.reap_orphans() == []
        assert bystander.poll() is None and not list((tmp_path / "procs").glob("*.json"))
    finally:
        bystander.kill()
        bystander.wait()


def test_a_dead_servers_record_removes_its_regions_by_name_and_no_others(tmp_path, monkeypatch):
    """A server killed with its stubs maps nothing any more: its python backend's regions are known by their prefix."""
    monkeypatch.setenv("TBENCH_PROCS_DIR", str(tmp_path / "procs"))
    (tmp_path / "procs").mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    prefix = f"tbench-test{gone.pid}-shm-"
    theirs = [shm.SHM_DIR / f"{prefix}{i}" for i in range(2)]
    other = shm.SHM_DIR / f"tbench-test{gone.pid}-other"
    for region in [*theirs, other]:
        region.write_bytes(b"\0" * 16)
    try:
        (tmp_path / "procs" / f"{gone.pid}.json").write_text(
            json.dumps(
                {
                    "pid": gone.pid,
                    "started": 1.0,
                    "owner": 1,
                    "owner_started": 1.0,
                    "argv0": "tritonserver",
                    "shm_prefix": prefix,
                }
            )
        )
        assert procs.reap_orphans() == [f"tritonserver (pid {gone.pid}) and 2 shared memory regions"]
        assert not any(r.exists() for r in theirs) and other.exists()
    finally:
        for region in [*theirs, other]:
            region.unlink(missing_ok=True)


KILLED_WHILE_STARTING = """
import os, sys
from pathlib import Path
from tbench.node import procs
def killed(proc, *args, **kwargs):  # the owner dies right after the start, before writing the pid down
    print(proc.pid, flush=True)
    os._exit(0)  # no clean-up of any kind
procs._register = killed
procs.start(["sleep", "300"], Path(sys.argv[1]))
"""


def test_a_child_whose_owner_died_before_writing_its_pid_down_is_found_and_reaped(tmp_path, monkeypatch):
    """CI on a busy core: a run killed at the moment its perf_analyzer started left it running, unregistered."""
    monkeypatch.setenv("TBENCH_PROCS_DIR", str(tmp_path / "procs"))
    orphan = orphan_of(KILLED_WHILE_STARTING, tmp_path)
    try:
        assert psutil.pid_exists(orphan)
        (pending,) = (tmp_path / "procs").glob("*.json")  # only the entry written before the start
        assert "pid" not in json.loads(pending.read_text())
        assert procs.reap_orphans() == [f"sleep (pid {orphan})"]
        wait_gone(orphan)
        assert not list((tmp_path / "procs").glob("*.json"))
    finally:
        if psutil.pid_exists(orphan):
            psutil.Process(orphan).kill()


def test_a_started_child_leaves_no_pending_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("TBENCH_PROCS_DIR", str(tmp_path / "procs"))
    done = procs.run(["true"], tmp_path / "true.log", timeout=30)
    child = procs.start(["sleep", "300"], tmp_path / "sleep.log")
    try:
        assert done.returncode == 0
        assert [p.name for p in (tmp_path / "procs").glob("*.json")] == [f"{child.pid}.json"]
    finally:
        procs.stop(child, timeout_s=1)
