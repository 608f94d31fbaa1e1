"""Every subprocess starts here: argv lists (never a shell string), a log file, a timeout.

Each child runs in its own session (so stopping it reaches its children) and is written down in a registry folder
with the pid of the process that started it. A child whose owner died (SIGKILL, a crash, a second Ctrl-C) is an
orphan: `reap_orphans()`, called before every run, kills it, so a killed run never leaves a server behind for long.
An owner killed between starting a child and writing its pid down (a test kills a run at the moment its
perf_analyzer starts) leaves a pending entry instead, written before the start, whose token the child carries in its
environment: the reaper finds the child by it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from tbench.node import containers, shm


@dataclass
class Completed:
    argv: list[str]
    returncode: int
    log_path: Path
    seconds: float
    timed_out: bool = False

    def output_lines(self) -> list[str]:
        """What the command printed, line by line: its log without the "$ argv" header run() writes, blanks left out."""
        text = self.log_path.read_text(errors="replace")
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def registry_dir() -> Path:
    """Per user: one file per live child, named by its pid."""
    return Path(os.environ.get("TBENCH_PROCS_DIR", Path.home() / ".cache" / "tbench" / "procs"))


def started_at(pid: int) -> float | None:
    """A pid's start time tells a live process from a later one that reused its pid."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


CHILD_TOKEN = "TBENCH_CHILD_TOKEN"  # the environment variable a child is found by before its pid is written down


def _owned(argv: list[str]) -> dict:
    return {"owner": os.getpid(), "owner_started": started_at(os.getpid()), "argv0": Path(argv[0]).name}


def _write(name: str, entry: dict) -> None:
    """Whole or not at all (a reaper drops an entry it cannot read, and a run killed mid-write must not leave one)."""
    folder = registry_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{name}.{os.getpid()}.tmp"
        partial.write_text(json.dumps(entry))
        os.replace(partial, folder / f"{name}.json")
    except OSError:
        pass  # the registry only helps a later run clean up; a read-only home must not stop this one


def _spawn(argv: list[str], env: dict[str, str] | None, record: dict | None = None, **popen) -> subprocess.Popen:
    """Popen in a session of its own, written down: a pending entry first (its token in the child's environment),
    then the child's own entry (`record`: what `_register` keeps besides its pid), then the pending one dropped."""
    token = uuid.uuid4().hex
    pending = registry_dir() / f"pending-{token}.json"
    _write(pending.stem, {**_owned(argv), "token": token})
    child_env = {**(os.environ if env is None else env), CHILD_TOKEN: token}
    try:
        proc = subprocess.Popen(argv, env=child_env, start_new_session=True, **popen)
    except BaseException:
        pending.unlink(missing_ok=True)
        raise
    _register(proc, argv, **(record or {}))
    pending.unlink(missing_ok=True)
    return proc


def _register(
    proc: subprocess.Popen,
    argv: list[str],
    container: dict | None = None,
    scratch: list[Path] | None = None,
    shm_prefix: str | None = None,
) -> None:
    entry = {"pid": proc.pid, "started": started_at(proc.pid), **_owned(argv)}
    if container:  # a `docker run` client: killing it leaves the container running, so it is removed by name
        entry["container"] = container
    if scratch:  # the process's temporary folders (a trace file, a backend copy): a reaper removes them too
        entry["scratch"] = [str(path) for path in scratch]
    if shm_prefix:  # the name prefix of its python backend's shared memory: a reaper removes those regions by name
        entry["shm_prefix"] = shm_prefix
    _write(str(proc.pid), entry)


def forget(proc: subprocess.Popen) -> None:
    (registry_dir() / f"{proc.pid}.json").unlink(missing_ok=True)


def alive(pid: int, started: float | None) -> bool:
    """The process `pid` that started at `started` still runs (not a later one that reused its pid)."""
    return started is not None and started_at(pid) == started


def reap_orphans() -> list[str]:
    """Kill the process groups of children whose owner is gone, and remove the shared memory they mapped; returns
    what was killed, e.g. ['tritonserver (pid 12) and 2 shared memory regions']."""
    killed = []
    folder = registry_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if alive(entry["owner"], entry.get("owner_started")):
            continue  # its owner still runs: not ours to touch
        if "pid" not in entry:  # pending: its owner died before writing the child's pid down
            killed += [f"{entry.get('argv0', '?')} (pid {e['pid']})" for e in _pending_children(entry)]
            path.unlink(missing_ok=True)
            continue
        running = alive(entry["pid"], entry.get("started")) or entry.get("container")
        removed = _kill_and_clean(entry)  # a dead server's stubs may still run, and its regions are still there
        if running or removed:
            what = f"container {entry['container']['name']} via " if entry.get("container") else ""
            killed.append(
                f"{what}{entry.get('argv0', '?')} (pid {entry['pid']})"
                + (f" and {removed} shared memory regions" if removed else "")
            )
        path.unlink(missing_ok=True)
    return killed


def _pending_children(entry: dict) -> list[dict]:
    """Kill the children that carry a pending entry's token (found by their environment); their entries."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(CHILD_TOKEN) == entry.get("token") and os.getpgid(p.pid) == p.pid:
                found.append({**entry, "pid": p.pid, "started": p.create_time()})
        except (psutil.Error, ProcessLookupError):
            pass
    for child in found:
        _kill_and_clean(child)
    return found


def _kill_and_clean(entry: dict) -> int:
    """Kill a child's process group (and remove its container) and remove the shared memory its processes mapped;
    how many regions went."""
    pgid = entry["pid"]
    leader = alive(pgid, entry.get("started"))
    # a killed server's stubs stay in its group for a while (its pid is not reused while they do); a pid taken by
    # another process means the group is long gone
    members = shm.group_members(pgid) if leader or not psutil.pid_exists(pgid) else []
    regions = shm.mapped_regions(members)
    if members:
        _kill_pgid(pgid)
        _wait_gone(pgid)
    removed = 0
    if container := entry.get("container"):
        removed = containers.remove(container["docker"], container["name"], host=container.get("host"))
    for folder in entry.get("scratch") or []:
        shutil.rmtree(folder, ignore_errors=True)
    return removed + len(shm.remove(regions | shm.named(entry.get("shm_prefix"))))


def _wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """A killed orphan is not our child: poll until it is gone (its mappings go with it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and psutil.pid_exists(pid):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.Error:
            return
        time.sleep(0.05)


def kill_own_children(argv0: str | None = None) -> None:
    """The last resort of a second Ctrl-C: kill every child this process started and still has (only those whose
    program is `argv0`, where given: the perf_analyzers that threads of this process wait on, say)."""
    folder = registry_dir()
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if argv0 is not None and entry.get("argv0") != argv0:
            continue
        if "pid" not in entry:
            continue  # pending: its child is being started, and registered next
        if entry.get("owner") == os.getpid() and (alive(entry["pid"], entry.get("started")) or entry.get("container")):
            _kill_and_clean(entry)
            path.unlink(missing_ok=True)


def run(
    argv: list[str], log_path: Path, timeout: float, env: dict[str, str] | None = None, cwd: str | Path | None = None
) -> Completed:
    """Run to completion, stdout+stderr into `log_path`; a timeout, Ctrl-C or any error kills the whole process
    group."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = _spawn(argv, env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc, timed_out = proc.wait(), True
        except BaseException:  # Ctrl-C or SIGTERM while waiting: the child is in its own session and would go on
            kill_group(proc)
            proc.wait()
            raise
        finally:
            forget(proc)
    return Completed(argv, rc, log_path, time.monotonic() - start, timed_out)


def start(
    argv: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    outlives_caller: bool = False,
    container: dict | None = None,
    scratch: list[Path] | None = None,
    shm_prefix: str | None = None,
) -> subprocess.Popen:
    """Start a long-lived process in its own session so that stopping it reaches its children too; the caller stops
    it with `stop()` (or kill_group + forget). `outlives_caller`: a service meant to stay after this process exits
    (the local stack), which is never reaped as an orphan. `container` ({"docker": CLI, "name": NAME}): the process
    is a `docker run` client whose container a reaper removes too; `scratch`: temporary folders of its that a reaper
    removes (the caller removes them after a normal stop); `shm_prefix`: the name prefix of the shared memory regions it
    creates, which a reaper removes."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    log.write(("$ " + " ".join(argv) + "\n").encode())
    log.flush()
    if outlives_caller:  # never reaped: nothing to write down
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    else:
        record = {"container": container, "scratch": scratch, "shm_prefix": shm_prefix}
        proc = _spawn(argv, env, record, stdout=log, stderr=subprocess.STDOUT)
    log.close()  # the child holds its own descriptor
    return proc


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, a grace period, then SIGKILL to the whole group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc)
    proc.wait()
    forget(proc)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    _kill_pgid(proc.pid, sig)


def _kill_pgid(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
