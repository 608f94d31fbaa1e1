"""Fast feedback: how long a fresh machine takes from the README's main command to its first measured point, and how
long the README's test command takes on a clean clone, run twice in a row.

Part `setup`: a clean clone of this repository (no virtual environment), with HOME in an empty temporary folder (so
uv's download cache and the Prefect home start empty), runs `./scripts/run.sh` as a user would. Recorded: the install
(until scripts/setup.sh has installed requirements.lock, from the venv's stamp file), the whole set-up (until `tbench
run` prints its run folder), and the first measured point (its line on the terminal). The run is then interrupted
with Ctrl-C (SIGINT to its process group), which must end it with exit code 130.

Part `suite`: another clean clone runs `./scripts/test.sh` (the README's test command, what CI runs) `--suite-runs`
times in a row; each run's wall time, its passed/skipped/failed counts and its 30 slowest tests (pytest's junit
report: setup, call and teardown of each test) and its failures (test and message) are recorded.

Usage: .venv/bin/python benchmarks/fast_feedback.py [--part setup|suite|both] [--suite-runs 2] [--size small]
(--size: the model size of the set-up part's run; the main command's own, full, by default)
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from provenance import REPO, RESULTS, recorded

POINT_LINE = re.compile(r"^\s+(offline|online|rate) batch \d+")


def clean_clone(into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(into)], check=True)
    return into


def measure_setup(work: Path, size: str | None) -> dict:
    clone = clean_clone(work / "clone")
    home = work / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    for key in ("UV_CACHE_DIR", "PREFECT_HOME", "PREFECT_API_URL", "TBENCH_CACHE_DIR"):
        env.pop(key, None)
    stamp = clone / ".venv" / ".tbench-installed"
    started = time.monotonic()
    proc = subprocess.Popen(
        ["./scripts/run.sh", "--output", str(work / "runs"), *(["--size", size] if size else [])],
        cwd=clone,
        env={**env, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    marks: dict[str, float] = {}
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            now = time.monotonic() - started
            if line.startswith("run ") and " in " in line:
                marks.setdefault("setup_s", now)
            if POINT_LINE.match(line):
                marks.setdefault("first_point_s", now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = started + 1200
    while time.monotonic() < deadline and "first_point_s" not in marks and proc.poll() is None:
        if "install_s" not in marks and stamp.exists():
            marks["install_s"] = time.monotonic() - started
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    reader.join(timeout=10)
    return {
        "command": f"./scripts/run.sh{' --size ' + size if size else ''}",
        "machine_state": "a clean clone, HOME empty: no venv, no uv cache, no Prefect database",
        **{key: round(value, 1) for key, value in marks.items()},
        "ctrl_c_exit_code": rc,
        "first_point_line": next((line.strip() for line in lines if POINT_LINE.match(line)), None),
        "last_lines": lines[-5:],
    }


def junit_summary(path: Path) -> dict:
    counts = {"passed": 0, "skipped": 0, "failed": 0}
    tests, failures = [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                failures.append({"test": name, "message": (child.get("message") or "")[:500]})
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        counts[outcome] += 1
        tests.append((float(case.get("time") or 0), name))
    slowest = [{"test": name, "s": round(seconds, 1)} for seconds, name in sorted(tests, reverse=True)[:30]]
    return {
        **counts,
        "failures": failures,
        "test_seconds_total": round(sum(s for s, _ in tests)),
        "slowest_30": slowest,
    }


def measure_suite(work: Path, runs: int) -> list[dict]:
    clone = clean_clone(work / "suite")
    results = []
    for i in range(runs):
        junit = work / f"junit-{i}.xml"
        started = time.monotonic()
        done = subprocess.run(
            ["./scripts/test.sh", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
            cwd=clone,
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - started
        summary = junit_summary(junit) if junit.exists() else {}
        results.append(
            {
                "run": i + 1,
                "fresh_venv": i == 0,
                "exit_code": done.returncode,
                "wall_s": round(wall, 1),
                **summary,
                "last_line": (done.stdout.strip().splitlines() or [""])[-1],
            }
        )
        print(f"suite run {i + 1}: exit {done.returncode}, {wall:.0f} s, {summary.get('passed')} passed")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("setup", "suite", "both"), default="both")
    parser.add_argument("--suite-runs", type=int, default=2)
    parser.add_argument("--size", default=None, help="The set-up part's model size (the main command's by default).")
    args = parser.parse_args()
    sizes = [f"resnet50 {args.size or 'full'}", "resnet50 small"]
    with recorded(RESULTS / "fast_feedback.json", model_sizes=sorted(set(sizes))) as record:
        with tempfile.TemporaryDirectory(prefix="tbench-fast-feedback-") as tmp:
            if args.part in ("setup", "both"):
                record["setup"] = measure_setup(Path(tmp), args.size)
                print(f"setup: {record['setup']}")
                record.save()
            if args.part in ("suite", "both"):
                record["suite"] = measure_suite(Path(tmp), args.suite_runs)


if __name__ == "__main__":
    main()
