"""Provenance of the figures in benchmarks/results/: every results file is written whole by one invocation of one
command, and says which.

    from provenance import RESULTS, recorded

    with recorded(RESULTS / "default_runs.json", model_sizes=["resnet50 full"]) as record:
        record["settings"] = [...]      # the results of this invocation, nothing else
        record.save()                   # optional: an interim copy (marked "complete": false) in case it is killed

On a normal exit the file is replaced, atomically (a temporary file in the same folder, then a rename), by
{"provenance": {...}, **record}. The provenance block holds `command` (the interpreter and sys.argv, shell-quoted, as
typed from the repository root), `commit` and `dirty` (the git tree at the start, benchmarks/results/ left out),
`machine` (tbench.node.hardware.detect(): CPU model, cores, memory, GPUs, plus the Python version), `started` and
`ended` (UTC, ISO 8601), `wall_s`, `model_sizes` ("MODEL SIZE" strings, at least one), and `complete`.

Nothing here reads an existing results file: there is no merge and no append. A record starts empty, so what the file
says was measured by the invocation named in it; a re-run replaces the file whole. If the body raises, the file is left
as it was, unless the invocation already saved an interim copy; then that copy is rewritten with "complete": false and
the error.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO = BENCHMARKS_DIR.parent
RESULTS = BENCHMARKS_DIR / "results"

# the fields every provenance block has; tests/test_benchmark_provenance.py checks the files against it
FIELDS = ("command", "commit", "dirty", "machine", "started", "ended", "wall_s", "model_sizes", "complete")

# results file -> the one command that writes it, from the repository root (docs/concepts/benchmarks.md lists the same)
COMMANDS = {
    "deployment_latency.json": ".venv/bin/python benchmarks/deployment_latency.py --size small --runs 3",
    "capacity.json": ".venv/bin/python benchmarks/capacity.py",
    "capacity_truth.json": ".venv/bin/python benchmarks/capacity_truth.py",
    "latency_verdict.json": ".venv/bin/python benchmarks/latency_verdict.py",
    "change_detection.json": ".venv/bin/python benchmarks/change_detection.py",
    "calibration.json": ".venv/bin/python benchmarks/calibration.py",
    "soak.json": ".venv/bin/python benchmarks/soak.py",
    "history.json": ".venv/bin/python benchmarks/history.py",
    "model_files.json": "PYTHONPATH=SCRATCH .venv/bin/python benchmarks/model_files.py",
    "default_runs.json": ".venv/bin/python benchmarks/default_runs.py",
    "machine_noise.json": ".venv/bin/python benchmarks/machine_noise.py",
    "real_aa.json": ".venv/bin/python benchmarks/real_aa.py",
    "cpu_probe.json": ".venv/bin/python benchmarks/cpu_probe.py",
    "real_aa_planted.json": ".venv/bin/python benchmarks/real_aa.py --planted-only 8",
    "real_ab_sessions.json": ".venv/bin/python benchmarks/real_ab_sessions.py --sessions 10 --aa-sessions 3",
    "fast_feedback.json": ".venv/bin/python benchmarks/fast_feedback.py",
    "docker_vs_embedded.json": ".venv/bin/python benchmarks/docker_vs_embedded.py --size small --repeats 2",
    "gpu_check.json": ".venv/bin/python benchmarks/gpu_check.py",
    "gpu_kit_build.json": ".venv/bin/python benchmarks/gpu_kit_build.py",
    "client_install.json": ".venv/bin/python benchmarks/client_install.py",
    "served_model.json": ".venv/bin/python benchmarks/served_model.py --rounds 2",
    "shape_sweep.json": "PYTHONPATH=SCRATCH .venv/bin/python benchmarks/shape_sweep.py",
    "rerun_savings.json": ".venv/bin/python benchmarks/rerun_savings.py --model resnet50 --size small",
    "search_real.json": ".venv/bin/python benchmarks/search.py --part real --size small --concurrency 8",
    "search_simulated.json": ".venv/bin/python benchmarks/search.py --part simulated",
    "peer_model_analyzer.json": (
        ".venv/bin/python benchmarks/peer_model_analyzer.py --repositories single,ensemble --rounds 5"
    ),
    "user_repositories.json": ".venv/bin/python benchmarks/user_repositories.py",
    "serving_overhead.json": ".venv/bin/python benchmarks/serving_overhead.py --sizes small,full --rounds 2",
    "tensor_paths.json": ".venv/bin/python benchmarks/tensor_paths.py --rounds 12",
    "stack_databases.json": ".venv/bin/python benchmarks/stack_databases.py --size small --runs 2",
    "ui_submissions.json": ".venv/bin/python benchmarks/ui_submissions.py",
    "fleet.json": ".venv/bin/python benchmarks/fleet.py",
    "trace.json": ".venv/bin/python benchmarks/trace_replay.py",
    "pt2_adapters.json": ".venv/bin/python benchmarks/pt2_adapters.py --size small",
    "todays_stack.json": ".venv/bin/python benchmarks/todays_stack.py",
    "serving_matrix.json": ".venv/bin/python benchmarks/serving_matrix.py",
}

_open: set[Path] = set()  # results files a `recorded` block of this process is writing


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _shown(path: str, cwd: Path, root: Path) -> str:
    """A path as typed from the repository root: relative when it lies under it, absolute otherwise. Symlinks are
    kept (a virtualenv's python is a link to the system's, and the link is what was run)."""
    full = os.path.abspath(os.path.join(cwd, path))
    rel = os.path.relpath(full, root)
    return full if rel == ".." or rel.startswith(".." + os.sep) else rel


def command_line(
    argv: list[str] | None = None,
    orig_argv: list[str] | None = None,
    executable: str | None = None,
    cwd: str | Path | None = None,
    root: str | Path = REPO,
) -> str:
    """The invocation as one shell-quoted string a user would type in the repository root, e.g.
    `.venv/bin/python benchmarks/repeatability.py --size full`: the interpreter, its own options (from
    sys.orig_argv: -u, -X ..., -m MODULE), the script and sys.argv[1:] as given."""
    if orig_argv is None:  # sys.orig_argv describes sys.argv, not an argv given here
        orig_argv = getattr(sys, "orig_argv", []) if argv is None else []
    argv, orig = list(sys.argv if argv is None else argv), list(orig_argv)
    cwd, root = Path(cwd or os.getcwd()), Path(root)
    python = _shown(executable or sys.executable, cwd, root)
    args = argv[1:]
    head = orig[1 : len(orig) - len(args)] if orig and orig[len(orig) - len(args) :] == args else []
    if len(head) >= 2 and head[-2] == "-m":  # python -m benchmarks.search: argv[0] is the module's file
        words = [python, *head, *args]
    else:  # python [options] SCRIPT: the options as typed, the script from the repository root
        words = [python, *head[:-1], _shown(argv[0], cwd, root), *args] if argv else [python]
    return shlex.join(words)


def git_state(root: str | Path = REPO) -> tuple[str | None, bool | None, list[str]]:
    """(commit, dirty, changed paths) of the tree `root` is in; benchmarks/results/ does not count (a previous
    benchmark's output is not code). (None, None, []) where there is no git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=True
        ).stdout

    try:
        # a tree copied into another checkout (the GPU check's export) is not that checkout: its state is unknown
        if Path(git("rev-parse", "--show-toplevel").strip()).resolve() != Path(root).resolve():
            return None, None, []
        commit = git("rev-parse", "HEAD").strip()
        status = git(
            "status", "--porcelain", "--untracked-files=normal", "--", ":/", ":(top,exclude)benchmarks/results"
        )
    except (OSError, subprocess.SubprocessError):
        return None, None, []
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return commit, bool(changed), changed


def machine() -> dict:
    """tbench.node.hardware.detect() (CPU model, cores, memory, GPUs, driver, OS, host) and the Python version."""
    from tbench.node.hardware import detect

    return {**detect().model_dump(), "python": platform.python_version()}


def _plain(value):
    """json's fallback: numpy scalars and arrays as Python numbers and lists, anything else as its str()."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _finite(value):
    """NaN and infinities as null: JSON has no such numbers (Python writes NaN, which other readers refuse)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_atomic(path: str | Path, data: dict) -> Path:
    """`data` as JSON at `path`, replacing the file whole: a temporary file in the same folder, fsync'ed, renamed over
    it. A reader sees the old file or the new one, never a mixture; a failure leaves the old one as it was. A number
    that is not finite is written as null."""
    path = Path(path)
    plain = _finite(json.loads(json.dumps(data, default=_plain)))  # numpy values as Python's first, then NaN as null
    text = json.dumps(plain, indent=2, allow_nan=False) + "\n"  # before touching the disk: a bad value changes nothing
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


class Record(dict):
    """The results of one invocation (a dict the script fills), with the provenance taken when it began."""

    def __init__(self, path: Path, model_sizes: list[str], command: str):
        super().__init__()
        self.path, self.model_sizes, self.command = path, list(model_sizes), command
        self.started, self._t0 = utc_now(), time.monotonic()
        self.commit, self.dirty, self.changed = git_state()
        self.machine = machine()
        self.saved = False

    def provenance(self, complete: bool) -> dict:
        sizes = [str(s) for s in self.model_sizes if str(s).strip()]
        if not sizes:
            raise ValueError(
                f"{self.path.name}: no model size recorded; every figure names the model size(s) it measured"
            )
        out = {
            "command": self.command,
            "commit": self.commit,
            "dirty": self.dirty,
            "machine": self.machine,
            "started": self.started,
            "ended": utc_now(),
            "wall_s": round(time.monotonic() - self._t0, 3),
            "model_sizes": sizes,
            "complete": complete,
        }
        if self.changed:
            out["dirty_paths"] = self.changed[:50]
        return out

    def _write(self, complete: bool, error: str | None = None) -> Path:
        if "provenance" in self:
            raise ValueError(
                f"{self.path.name}: 'provenance' is written by benchmarks/provenance.py, not by the script"
            )
        block = self.provenance(complete)
        if error:
            block["error"] = error
        return write_atomic(self.path, {"provenance": block, **self})

    def save(self) -> Path:
        """An interim copy of what this invocation measured so far (`"complete": false`), replacing the file whole;
        the end of the `recorded` block writes the final one."""
        self.saved = True
        return self._write(complete=False)


@contextlib.contextmanager
def recorded(
    path: str | Path, model_sizes: list[str] | tuple[str, ...] = (), *, argv: list[str] | None = None
) -> Iterator[Record]:
    """Collect one invocation's results and write them, with their provenance, to `path` (replacing it whole).

    `model_sizes`: "MODEL SIZE" strings (e.g. "resnet50 small"); may also be set or extended on the record inside the
    block (`record.model_sizes`), but the file is not written without one. `argv` stands in for sys.argv (tests).
    A second `recorded` block for the same file in the same process is refused: one result set per file.
    """
    path = Path(path).resolve()
    if path in _open:
        raise RuntimeError(f"{path} is already being recorded by this invocation; results are never merged")
    _open.add(path)
    try:
        sizes = [model_sizes] if isinstance(model_sizes, str) else list(model_sizes)  # one "MODEL SIZE" string
        record = Record(path, sizes, command_line(argv))
        try:
            yield record
        except BaseException as e:
            if record.saved:  # the interim copy stays, saying the invocation did not finish
                with contextlib.suppress(Exception):  # the body's error is the one to see
                    record._write(complete=False, error=f"{type(e).__name__}: {e}")
            raise
        written = record._write(complete=True)
        print(f"written {written} ({record.command})", flush=True)
    finally:
        _open.discard(path)
