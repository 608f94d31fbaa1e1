"""Faults, for real: `tbench run` in a terminal-like session (its own process group), interrupted or with a component
killed under it. Each test checks what the user saw (one line, the exit code), what was kept (the points measured
before the fault, a manifest that says how the run ended) and what was left (no server, no perf_analyzer, no shared
memory, no device lock held)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tbench.node.shm import unmapped_regions

pytestmark = pytest.mark.e2e

TBENCH = str(Path(sys.executable).with_name("tbench"))
SWEEP = [
    "resnet50",
    "--size",
    "small",
    "--formats",
    "onnx",
    "--scenarios",
    "offline,online",
    "--batch-sizes",
    "1,2",
    "--concurrency",
    "1",
    "--window-s",
    "0.5",
    "--stability",
    "50",  # plumbing, not numbers: an unstable point under the other test worker's load is measured again
]


@pytest.fixture
def as_in_a_users_terminal(monkeypatch):
    """A user's default path: no PREFECT_API_URL (conftest's session server is not theirs), so each run starts its
    private API server, and an interrupted run must stop it too. The other faults' runs use the test process's server
    (conftest's prefect_api_server): each private one costs seconds of CPU on the suite's busy cores."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


class CliRun:
    """`tbench run ...` (or another `command`) as a user starts it in a terminal: its own session, so a signal to its
    group is a Ctrl-C."""

    def __init__(self, args: list[str], output: Path, command: str = "run"):
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            [TBENCH, command, *args, "--output", str(output)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "250"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float = 300) -> float:
        """Seconds from the start until a line holding `text` was printed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if text in line:
                    return at
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {text!r}:\n{self.output}"
            time.sleep(0.2)
        raise AssertionError(f"no {text!r} within {timeout} s:\n{self.output}")

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float = 300) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return rc

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def run_dir(self) -> Path:
        line = next(line for _, line in self.lines if line.startswith("run "))
        return Path(line.split(" in ", 1)[1].strip())


def run_processes(run_dir: Path, name: str | None = None) -> list[psutil.Process]:
    """Processes serving or measuring this run (their argv names its folder), `name`d ones only if given; one whose
    argv cannot be read (exiting) is not one of them."""
    return [
        p
        for p in psutil.process_iter(["cmdline", "name"])
        if (name is None or p.info["name"] == name) and any(str(run_dir) in a for a in p.info["cmdline"] or [])
    ]


def leftovers(run_dir: Path) -> list[str]:
    """Processes still serving or measuring this run, and shared memory that no process maps any more."""
    return [f"{p.info['name']} (pid {p.pid})" for p in run_processes(run_dir)] + lasting_unmapped_regions()


# Shared memory that no process mapped before any test ran (every worker collects before the first test): left on this
# machine by something else, not by the code under test (CI runs on a machine that people and earlier runs use)
LEFT_BEFORE = frozenset(unmapped_regions())


def lasting_unmapped_regions() -> list[str]:
    """Shared memory that no process maps, on two looks a second apart: a region that a test in the other worker is
    creating right now is unmapped for a moment."""
    first = set(unmapped_regions()) - LEFT_BEFORE
    if first:
        time.sleep(1.0)
    return sorted(str(region) for region in first & set(unmapped_regions()))


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def lock_slots() -> int:
    """Active slots of this machine's device lock, read through the same Prefect database the CLI uses."""
    script = (
        "from prefect.client.orchestration import get_client\n"
        "from tbench.node.device_lock import lock_name\nfrom tbench.node.hardware import detect\n"
        "with get_client(sync_client=True) as c: "
        "print(c.read_global_concurrency_limit_by_name(lock_name(detect())).active_slots)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **_prefect_env()},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


def _prefect_env() -> dict:
    from tbench.core.settings import PREFECT_DEFAULTS

    return {k: os.environ.get(k, v) for k, v in PREFECT_DEFAULTS.items()}


@pytest.mark.usefixtures("as_in_a_users_terminal")
def test_ctrl_c_once_twice_then_a_kill_leave_nothing_behind_and_the_next_run_measures_at_once(tmp_path):
    # 1. Ctrl-C in the middle of the sweep
    first = CliRun(SWEEP, tmp_path / "runs")
    first.wait_for("offline batch")
    first.signal_group(signal.SIGINT)
    assert first.finish(timeout=120) == 130, first.output
    assert "Traceback" not in first.output and "interrupted by Ctrl-C (SIGINT) during perf-" in first.output
    run_dir = first.run_dir()
    m = manifest(run_dir)
    assert m["status"] == "interrupted" and m["failed_stage"].startswith("perf-") and m["points"]["measured"] >= 1
    kept = pd.read_csv(run_dir / "results.csv")
    assert len(kept) == m["points"]["measured"]  # ok or unstable: measured, and kept
    assert not leftovers(run_dir)
    assert lock_slots() == 0

    # 2. Ctrl-C twice: the second one does not wait for the clean-up
    impatient = CliRun(SWEEP, tmp_path / "runs")
    impatient.wait_for("accuracy-onnx")  # the stage right before the sweep: its server is up
    impatient.signal_group(signal.SIGINT)
    time.sleep(0.5)
    interrupted_again = time.monotonic()
    impatient.signal_group(signal.SIGINT)
    assert impatient.finish(timeout=60) == 130, impatient.output
    assert time.monotonic() - interrupted_again < 15, impatient.output
    assert "Traceback" not in impatient.output
    assert not leftovers(impatient.run_dir())  # its server was killed with its shared memory

    # 3. SIGKILL in the middle of the sweep: nothing can clean up, so the server stays until the next run
    killed = CliRun(SWEEP, tmp_path / "runs")
    killed.wait_for("accuracy-onnx")
    killed.signal_group(signal.SIGKILL)
    killed.finish(timeout=60)
    orphans = leftovers(killed.run_dir())
    assert any("tritonserver" in o for o in orphans), orphans

    # 4. the next run reclaims the lock at once, stops the orphans and measures within a minute
    after = CliRun(
        [
            "resnet50",
            "--size",
            "small",
            "--formats",
            "onnx",
            "--scenarios",
            "offline",
            "--batch-sizes",
            "1",
            "--window-s",
            "0.5",
            "--stability",
            "50",
        ],
        tmp_path / "runs",
    )
    measuring = after.wait_for("accuracy-onnx")  # the stage right before the first point
    assert after.finish() == 0, after.output
    assert measuring < 60, after.output
    assert "reclaimed the device lock" in after.output
    assert not leftovers(killed.run_dir()), leftovers(killed.run_dir())
    print(f"after a Ctrl-C and a SIGKILL, the next run started measuring {measuring:.1f} s after it was started")


def test_a_server_that_crashes_mid_sweep_fails_the_run_in_one_line_and_keeps_the_points(tmp_path):
    """A segmentation fault of the server (SIGSEGV): Triton's own handler says so in its log, in the words the run
    reads (tbench.triton.server.FATAL_SIGNAL), and the run stops at its next failed point."""
    from tbench.triton.server import fatal_signal

    run = CliRun(SWEEP, tmp_path / "runs")
    run.wait_for("offline batch")
    run_dir = run.run_dir()
    server = next(iter(run_processes(run_dir, "tritonserver")))
    server.send_signal(signal.SIGSEGV)
    assert run.finish() == 1, run.output
    assert "Traceback" not in run.output and "the Triton server crashed (Signal (11) received. in its log" in run.output
    assert fatal_signal(run_dir / "logs" / "tritonserver.log") == "Signal (11) received."
    m = manifest(run_dir)
    assert m["status"] == "failed" and m["failed_stage"].startswith("perf-")
    assert (pd.read_csv(run_dir / "results.csv")["status"] != "error").any()
    assert not leftovers(run_dir)


def test_a_server_that_crashes_mid_capacity_search_stops_it_at_the_first_failed_rate(tmp_path):
    """A capacity plan's rate search on a crashed server: its first failed rate ends it, naming the crash, the rates
    measured before kept (it went on halving down to 0.1 req/s once, every rate an error, and the run said only that
    the server "stopped serving")."""
    from tbench.capacity.rate_search import SustainableRate

    run = CliRun(
        [
            *("resnet50", "--size", "small", "--instances", "1", "--max-batch-sizes", "4", "--percentile", "90"),
            *("--slo-p99-ms", "500", "--traffic", "100", "--window-s", "0.1", "--start-rps", "20"),
        ],
        tmp_path / "runs",
        command="capacity",
    )
    run.wait_for("/s: ")  # the first rate judged ("rate 20/s: pass"): the next one crashes
    run_dir = run.run_dir()
    next(iter(run_processes(run_dir, "tritonserver"))).send_signal(signal.SIGSEGV)
    assert run.finish() == 1, run.output
    assert "Traceback" not in run.output
    assert "the Triton server crashed (Signal (11) received. in its log" in run.output, run.output
    (kept,) = (run_dir / "search").glob("*/sustainable_rate.json")
    points = SustainableRate.model_validate_json(kept.read_text()).points
    assert points and all(p.status != "error" for p in points), points  # none measured on the dead server
    assert manifest(run_dir)["status"] == "failed"
    assert not leftovers(run_dir)
    assert lock_slots() == 0


def test_a_perf_analyzer_killed_mid_point_fails_that_point_only(tmp_path):
    run = CliRun(SWEEP, tmp_path / "runs")
    run.wait_for("offline batch")
    run_dir = run.run_dir()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the next point's perf_analyzer
        measuring = run_processes(run_dir, "perf_analyzer")
        if measuring:
            measuring[0].kill()
            break
        time.sleep(0.1)
    else:
        pytest.fail("no perf_analyzer of the run was seen")
    assert run.finish() == 3, run.output  # completed with failed points
    assert "completed with failed points: 1 of" in run.output
    m = manifest(run_dir)
    assert m["status"] == "completed_with_failures" and m["points"]["failed"] == 1
    results = pd.read_csv(run_dir / "results.csv")
    assert (results["status"] == "error").sum() == 1 and (results["status"] != "error").sum() == len(results) - 1
    assert not leftovers(run_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs to fill needs root")
def test_a_full_disk_fails_the_run_in_one_line_and_keeps_what_was_written(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        run = CliRun(SWEEP, disk / "runs")
        run.wait_for("offline batch")
        run_dir = run.run_dir()
        kept = pd.read_csv(run_dir / "results.csv")
        with open(disk / "filler", "wb") as filler:  # every byte left, taken
            try:
                while True:
                    filler.write(b"\0" * 2**20)
            except OSError:
                pass
        rc = run.finish()
        assert rc == 1, run.output
        assert "Traceback" not in run.output and "No space left on device" in run.output
        after = pd.read_csv(run_dir / "results.csv")  # atomic writes: the last complete table survives
        assert len(after) >= len(kept) >= 1
        assert not leftovers(run_dir)
        assert lock_slots() == 0
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
