"""Every subprocess starts here: argv lists (never a shell string), a log file, a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Completed:
    argv: list[str]
    returncode: int
    log_path: Path
    seconds: float
    timed_out: bool = False

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run(argv: list[str], log_path: Path, timeout: float, env: dict[str, str] | None = None,
        cwd: str | Path | None = None) -> Completed:
    """Run to completion, stdout+stderr into `log_path`; a timeout kills the whole process group."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=cwd)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc, timed_out = proc.wait(), True
    return Completed(argv, rc, log_path, time.monotonic() - start, timed_out)


def start(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a long-lived process in its own session so that stopping it reaches its children too."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    log.write(("$ " + " ".join(argv) + "\n").encode())
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()  # the child holds its own descriptor
    return proc


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
