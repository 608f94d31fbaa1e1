"""Docker containers a run starts: the processes inside them, as this host sees them, and their removal.

Killing the `docker run` client (SIGKILL, a second Ctrl-C) does not stop its container, so a container is removed by
name, with the shared memory its processes mapped: with `--ipc=host` the python backend's regions live in this host's
/dev/shm and outlive a killed container.
"""

from __future__ import annotations

import os
import subprocess
import time

import psutil

from tbench.node import shm


def _docker(docker: str, *args: str, timeout: float = 60, host: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_HOST": host} if host else None  # the daemon the container was started on
    try:
        return subprocess.run([docker, *args], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess([docker, *args], 1, "", str(err))


def main_pid(docker: str, name: str, host: str | None = None) -> int | None:
    """The host pid of the container's first process; None when it does not run (or docker cannot tell)."""
    done = _docker(docker, "inspect", "--format", "{{.State.Pid}}", name, timeout=30, host=host)
    pid = done.stdout.strip()
    return int(pid) if done.returncode == 0 and pid.isdigit() and int(pid) > 0 else None


def processes(docker: str, name: str, host: str | None = None) -> list[psutil.Process]:
    """The container's processes: its first one and every descendant (tritonserver and its python stubs)."""
    pid = main_pid(docker, name, host)
    if pid is None:
        return []
    try:
        first = psutil.Process(pid)
        return [first, *first.children(recursive=True)]
    except psutil.Error:
        return []


def exists(docker: str, name: str, host: str | None = None) -> bool:
    return _docker(docker, "container", "inspect", name, timeout=30, host=host).returncode == 0


def remove(docker: str, name: str, wait_s: float = 20.0, host: str | None = None) -> int:
    """Remove the container, running or not, and the shared memory its processes mapped; how many regions went.
    `docker run --rm` removes a stopped container on its own, a moment later: wait for that before forcing it."""
    regions = shm.mapped_regions(processes(docker, name, host))
    deadline = time.monotonic() + wait_s
    while exists(docker, name, host) and time.monotonic() < deadline:
        if main_pid(docker, name, host) is not None:
            _docker(docker, "rm", "--force", name, host=host)
        time.sleep(0.2)
    if exists(docker, name, host):
        _docker(docker, "rm", "--force", name, host=host)
    return len(shm.remove(regions))
