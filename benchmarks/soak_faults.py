"""Runs under injected faults: the local stack (Prefect server, S3 over HTTP, the cpu pool with two process workers)
takes N small runs submitted through the API while a fault is injected at random moments. A harness module of
benchmarks/soak.py (the record's `soak` part).

The faults, each at a random moment (seeded): a worker SIGKILLed with its flow run's Python (the servers it started
are left behind, as on a crash; a new worker starts a few seconds later), the S3 endpoint stopped (SIGSTOP: it holds
its objects, as a real store does through an outage; moto keeps them only in memory) and resumed, a tritonserver
SIGKILLed, a perf_analyzer SIGKILLed, the staging disk filled (a tmpfs, for some seconds), and the Prefect server
stopped and started again on its port and database.

Each run ends as one of (OUTCOMES): completed (its results stored in S3), failed cleanly (a final state whose message
is one line, and a run folder whose manifest says why), failed without a run folder (a one-line message, but nothing
on the worker or in the store: refused or killed before it made its folder), infrastructure crashed (Prefect's
"infrastructure exited with non-zero status code": the run's process died, whatever it printed), or lost (no final
state by the end, a multi-line message or none, a completed run whose results are not in the store). Apart from the
outcome, each run's lost points: measured (the worker's run folder, else the stored manifest's count) and not in the
store. At the end, after the stack is down: leftover processes (tritonserver, perf_analyzer, the
python backend's stubs, the stack's own), shared memory no process maps, port reservations still locked, and the
device lock's held slots.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import psutil

REPO = Path(__file__).resolve().parents[1]
TBENCH = REPO / ".venv" / "bin" / "tbench"
RUN = [  # and --size
    *("resnet50", "--formats", "onnx", "--scenarios", "offline,online"),
    *("--batch-sizes", "1,4", "--concurrency", "1", "--window-s", "0.5", "--stability", "50"),
]
FAULTS = ("worker_kill", "s3_outage", "triton_kill", "perf_analyzer_kill", "disk_full", "prefect_restart")
MEASURING = ("tritonserver", "triton_python_backend_stub", "perf_analyzer")
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
# the stack's limit for a run Pending without starting (tbench.team.zombies): at 180 s, 5 of 30 runs were marked
# Crashed while their processes were still starting (30 runs submitted at once: 15 flow processes per worker importing
# at once on 2 cores), and some of them would have run
NEVER_STARTED_S = 600


@dataclass
class Fault:
    at_s: float
    kind: str
    detail: str = ""
    took_s: float = 0.0


@dataclass
class Soak:
    """The stack and what happened to it."""

    root: Path
    seed: int
    size: str = "small"
    progress: callable = print
    stack: object = None
    workers: list = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    staging_tmpfs: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    hung_submissions: int = 0

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def up(self) -> None:
        from tbench.team.stack import Stack

        self.staging.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(self.staging)], capture_output=True, text=True
        )
        self.staging_tmpfs = mounted.returncode == 0
        # shorter than the default (which leaves room for a docker worker's image pull), so the soak sees it act
        self.stack = Stack(root=self.root, pools=("cpu",), never_started_s=NEVER_STARTED_S).up()
        self.workers = [self.stack.worker]
        self.start_worker()

    def start_worker(self) -> None:
        self.stack.start_worker()
        self.workers.append(self.stack.worker)

    def client_env(self) -> dict:
        return {**os.environ, **self.stack.client_env()}

    def submit(self) -> str | None:
        """The submitted flow run's id; None when the submission was refused or hung (a user gives up and submits
        again: seen once, `tbench submit` waiting 300 s on a Prefect server whose SQLite database was locked)."""
        try:
            done = subprocess.run(
                [str(TBENCH), "submit", *RUN, "--size", self.size, "--pool", "cpu", "--no-follow"],
                env=self.client_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired:
            self.hung_submissions += 1
            return None
        lines = done.stdout.strip().splitlines()
        return lines[-1].strip() if done.returncode == 0 and lines else None

    # -- the faults ----------------------------------------------------------------------------------------------

    def inject(self, kind: str, rng: random.Random) -> str:
        if kind == "worker_kill":
            alive = [w for w in self.workers if w.poll() is None]
            if not alive:
                return "no worker alive"
            worker = rng.choice(alive)
            proc = psutil.Process(worker.pid)
            for p in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    if p.name() not in MEASURING:
                        p.kill()
            worker.wait(timeout=30)
            self.workers.remove(worker)
            time.sleep(rng.uniform(2, 8))
            self.start_worker()
            return f"worker pid {worker.pid} killed, a new one started"
        if kind == "s3_outage":
            s3 = psutil.Process(self.stack.s3.proc.pid)
            s3.suspend()
            pause = rng.uniform(5, 20)
            time.sleep(pause)
            s3.resume()
            return f"S3 stopped for {pause:.0f} s"
        if kind in ("triton_kill", "perf_analyzer_kill"):
            name = "tritonserver" if kind == "triton_kill" else "perf_analyzer"
            targets = self.measuring(name)
            if not targets:
                return f"no {name} running"
            target = rng.choice(targets)
            with contextlib.suppress(psutil.Error):
                target.kill()
            return f"{name} pid {target.pid} killed"
        if kind == "disk_full":
            if not self.staging_tmpfs:
                return "no tmpfs for the staging disk: skipped"
            filler, hold = self.staging / "filler", rng.uniform(3, 10)
            with open(filler, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 2**20)
            time.sleep(hold)
            filler.unlink(missing_ok=True)
            return f"staging disk full for {hold:.0f} s"
        if kind == "prefect_restart":
            from tbench.team.stack import stop_process

            stop_process(self.stack.server.pid)
            time.sleep(rng.uniform(1, 5))
            took = self.stack.start_server()
            return f"Prefect server restarted (up again in {took:.0f} s)"
        raise ValueError(kind)

    def measuring(self, name: str | None = None) -> list[psutil.Process]:
        """Processes serving or measuring a run of this soak (their argv names its staging folder)."""
        found = []
        for p in psutil.process_iter(["name", "cmdline"]):
            if (name is None and p.info["name"] in MEASURING) or p.info["name"] == name:
                if any(str(self.staging) in a for a in p.info["cmdline"] or []):
                    found.append(p)
        return found

    def fault_loop(self, stop: threading.Event, mean_gap_s: float) -> None:
        rng = random.Random(self.seed)
        kinds = list(FAULTS)
        while not stop.wait(rng.expovariate(1 / mean_gap_s)):
            if not kinds:
                kinds = list(FAULTS)
            kind = kinds.pop(rng.randrange(len(kinds)))  # every kind in turn, in a random order
            at = time.monotonic() - self.started
            began = time.monotonic()
            try:
                detail = self.inject(kind, rng)
            except Exception as err:  # noqa: BLE001 - a fault that could not be injected is recorded as such
                detail = f"not injected: {type(err).__name__}: {err}"
            fault = Fault(round(at, 1), kind, detail, round(time.monotonic() - began, 1))
            with self.lock:
                self.faults.append(fault)
            self.progress(f"fault at {fault.at_s:.0f} s: {kind}: {detail}")


def flow_runs(api_url: str, ids: list[str]) -> dict[str, dict]:
    """Each run's state, message, start and end (seconds since the epoch), from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    out = {}
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        for run_id in ids:
            run = client.read_flow_run(UUID(run_id))
            # a run's span begins when a worker took it (Pending), not at its start time: a run whose process
            # could not load it (the Prefect server restarting) gets its start time only when it is marked Crashed
            picked = [s.timestamp for s in client.read_flow_run_states(run.id) if s.type.value == "PENDING"]
            start = min(picked) if picked else run.start_time
            end = run.end_time or (run.state.timestamp if run.state and run.state.is_final() else None)
            out[run_id] = {
                "state": run.state.type.value if run.state else None,
                "message": (run.state.message or "") if run.state else "",
                "start": start.timestamp() if start else None,
                "end": end.timestamp() if end else None,
                "name": run.name,
            }
    return out


def local_runs(staging: Path) -> dict[str, dict]:
    """The run folders on the workers' disk by flow run id: their manifest and the points in results.csv."""
    import pandas as pd

    out = {}
    for manifest_path in staging.glob("*/manifest.json"):
        with contextlib.suppress(OSError, ValueError):
            manifest = json.loads(manifest_path.read_text())
            flow_run = str(manifest.get("flow_run_id") or "")
            results = manifest_path.parent / "results.csv"
            points = len(pd.read_csv(results)) if results.exists() else 0
            out[flow_run or manifest_path.parent.name] = {"dir": str(manifest_path.parent), "manifest": manifest}
            out[flow_run or manifest_path.parent.name]["points"] = points
    return out


STORED_RUNS = """
import json, sys, fsspec, pandas as pd
fs, root = fsspec.core.url_to_fs(sys.argv[1])
out = {}
for path in fs.glob(root.rstrip("/") + "/*/manifest.json"):
    manifest = json.loads(fs.cat_file(path))
    try:
        with fs.open(path.rsplit("/", 1)[0] + "/results.parquet", "rb") as f:
            points = len(pd.read_parquet(f))
    except FileNotFoundError:
        points = 0
    out[str(manifest.get("flow_run_id") or path)] = {"manifest": manifest, "points": points}
print(json.dumps(out))
"""


def stored_runs(env: dict, root_url: str) -> dict[str, dict]:
    """The runs in the S3 root by flow run id: their stored manifest and the points in results.parquet (another
    process, with the stack's environment). A completed run's folder leaves the worker once stored."""
    done = subprocess.run(
        [sys.executable, "-c", STORED_RUNS, root_url], env=env, capture_output=True, text=True, timeout=300
    )
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}


def held_port_locks() -> list[str]:
    from tbench.node.ports import RESERVATIONS

    held = []
    for path in RESERVATIONS.glob("*") if RESERVATIONS.exists() else []:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                held.append(f"port {path.name}")
            finally:
                os.close(fd)
    return held


def soak(
    runs: int = 30, seed: int = 0, mean_gap_s: float = 45.0, limit_s: float = 1500, size: str = "small", progress=print
) -> dict:
    from tbench.node.shm import unmapped_regions

    shm_before = set(unmapped_regions())
    locks_before = set(held_port_locks())
    root = Path(tempfile.mkdtemp(prefix="tbench-soak-"))
    s = Soak(root, seed, size, progress)
    stop = threading.Event()
    ids: list[str] = []
    before_next: list[str] = []
    next_state = None
    states: dict[str, dict] = {}
    try:
        s.up()
        progress(f"stack up in {root} (staging on tmpfs: {s.staging_tmpfs}); submitting {runs} runs")
        faults = threading.Thread(target=s.fault_loop, args=(stop, mean_gap_s), daemon=True)
        faults.start()
        deadline = time.monotonic() + limit_s
        submit_failures = 0
        for i in range(runs):
            run_id = None
            for _ in range(3):  # a submission during a Prefect restart is refused: the user submits again
                run_id = s.submit()
                if run_id:
                    break
                submit_failures += 1
                time.sleep(10)
            if run_id:
                ids.append(run_id)
            progress(f"submitted {i + 1}/{runs}: {run_id}")
        while time.monotonic() < deadline:
            try:
                states = flow_runs(s.stack.api_url, ids)
            except Exception:  # noqa: BLE001 - the server may be restarting: look again
                time.sleep(5)
                continue
            ended = sum(st["state"] in FINAL for st in states.values())
            progress(f"{ended}/{len(ids)} runs ended, {len(s.faults)} faults so far")
            if ended == len(ids):
                break
            time.sleep(15)
        stop.set()
        faults.join(timeout=120)
        time.sleep(5)
        for _ in range(12):  # the server may be restarting
            try:
                states = flow_runs(s.stack.api_url, ids)
                break
            except Exception:  # noqa: BLE001
                time.sleep(5)
        before_next = leftovers_now(s, shm_before, locks_before)
        # the faults are over: one more run, as a user would start after a crash; tbench cleans up after killed runs
        # lazily (the next run stops their servers, reclaims their device lock slot, marks their folders)
        next_run = s.submit()
        if next_run:
            ids_next = [next_run]
            for _ in range(60):
                with contextlib.suppress(Exception):
                    if flow_runs(s.stack.api_url, ids_next)[next_run]["state"] in FINAL:
                        break
                time.sleep(10)
        next_state = flow_runs(s.stack.api_url, [next_run])[next_run]["state"] if next_run else None
        local = local_runs(s.staging)
        stored = stored_runs(s.client_env(), s.stack.artifact_root)
        table = classify(ids, states, local, stored, s.faults, s.started)
        lock_slots = device_lock_slots(s.stack.api_url)
    finally:
        stop.set()
        if s.stack is not None:
            for w in s.workers:
                with contextlib.suppress(Exception):
                    from tbench.team.stack import stop_process

                    stop_process(w.pid)
            s.stack.worker = None
            s.stack.down()
        time.sleep(3)
        left_processes = [f"{p.info['name']} (pid {p.pid})" for p in leftover_processes(root)]
        if s.staging_tmpfs:  # the run folders' logs outlive the tmpfs, without their models
            with contextlib.suppress(OSError, shutil.Error):
                skip = shutil.ignore_patterns("filler", "*.onnx", "*.savedmodel", "*.pt", "model_repository")
                shutil.copytree(s.staging, root / "staging-kept", ignore=skip, dirs_exist_ok=True)
            subprocess.run(["umount", "-l", str(s.staging)], capture_output=True)
    left_shm = sorted(str(r) for r in set(unmapped_regions()) - shm_before)
    left_locks = sorted(set(held_port_locks()) - locks_before)
    leftovers = left_processes + left_shm + left_locks + ([f"device lock: {lock_slots} slots"] if lock_slots else [])
    counts = outcome_counts(table)
    untouched_failed = sum(not r["faults"] and r["outcome"] != "completed" for r in table)
    keep = counts["lost"] or counts["infrastructure_crashed"] or untouched_failed
    if keep:  # its logs (the workers', the server's, each run's) say what happened
        progress(
            f"kept {root} for its logs: {counts['lost']} runs lost, {counts['infrastructure_crashed']} crashed, "
            f"{untouched_failed} untouched runs failed"
        )
    else:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "runs_submitted": len(ids),
        "kept_root": str(root) if keep else None,
        "submissions_refused": submit_failures,
        "submissions_hung": s.hung_submissions,  # tbench submit still waiting after 300 s
        **counts,
        "lost_runs": counts["lost"],
        "lost_points": sum(r["lost_points"] for r in table),
        "untouched_runs": sum(not r["faults"] for r in table),
        "untouched_completed": sum(not r["faults"] and r["outcome"] == "completed" for r in table),
        "leftovers": leftovers,
        "leftovers_before_the_next_run": before_next,
        "next_run_state": next_state,
        "faults": [vars(f) for f in s.faults],
        "faults_by_kind": {k: sum(f.kind == k for f in s.faults) for k in FAULTS},
        "runs": table,
        "mean_gap_s": mean_gap_s,
        "staging_on_tmpfs": s.staging_tmpfs,
    }


def leftovers_now(s: Soak, shm_before: set, locks_before: set) -> list[str]:
    """What the killed runs left while the stack still runs: their processes, shared memory, the device lock."""
    from tbench.node.shm import unmapped_regions

    processes = [f"{p.info['name']} (pid {p.pid})" for p in s.measuring()]
    shm = sorted(str(r) for r in set(unmapped_regions()) - shm_before)
    slots = device_lock_slots(s.stack.api_url)
    return processes + shm + ([f"device lock: {slots} slots"] if slots else [])


OUTCOMES = ("completed", "failed_cleanly", "failed_without_run_folder", "infrastructure_crashed", "lost")
# Prefect's message when the run's process exited non-zero: not tbench's one line about what went wrong
INFRASTRUCTURE_CRASH = "infrastructure exited with non-zero status code"


def outcome_of(state: str | None, message: str, mine: dict | None, kept: dict | None) -> tuple[str, str]:
    """A run's outcome (one of OUTCOMES) and why, from its final state and message, its run folder on the worker
    (`mine`) and its stored copy (`kept`)."""
    manifest = (mine or kept or {}).get("manifest", {})
    if state == "COMPLETED":
        return ("completed", "") if kept is not None else ("lost", "completed, but its results are not in the store")
    one_line = bool(message.strip()) and "\n" not in message.strip()
    if state in ("FAILED", "CRASHED") and one_line:
        if INFRASTRUCTURE_CRASH in message:
            return "infrastructure_crashed", message
        if mine is None and kept is None:
            return "failed_without_run_folder", message
        if manifest.get("status") not in (None, "running") or mine is None:
            return "failed_cleanly", message  # the manifest says why (a killed run's, once the next run marked it)
    folder = "" if mine is not None else " (no run folder on the worker)"
    return "lost", f"state {state}: {message[:300]}{folder}"


def lost_points(mine: dict | None, kept: dict | None) -> int:
    """Points measured (the worker's run folder, else what the stored manifest counted) and not in the store; a run
    with no stored copy lost every point it measured."""
    stored_manifest = (kept or {}).get("manifest", {})
    measured = mine.get("points", 0) if mine else (stored_manifest.get("points") or {}).get("measured", 0)
    return max(0, measured - ((kept or {}).get("points") or 0))


def outcome_counts(table: list[dict]) -> dict[str, int]:
    return {k: sum(r["outcome"] == k for r in table) for k in OUTCOMES}


def classify(ids, states, local, stored, faults, started) -> list[dict]:
    """One row per submitted run: its outcome, the faults during its span, and points lost."""
    epoch_start = time.time() - (time.monotonic() - started)
    rows = []
    for run_id in ids:
        st = states.get(run_id, {})
        mine, kept = local.get(run_id), stored.get(run_id)
        begin, end = st.get("start"), st.get("end") or time.time()
        during = [
            f.kind for f in faults if begin is not None and begin - 5 <= epoch_start + f.at_s <= end + f.took_s + 5
        ]
        outcome, why = outcome_of(st.get("state"), st.get("message", ""), mine, kept)
        manifest = (mine or kept or {}).get("manifest", {})
        rows.append(
            {
                "flow_run": run_id,
                "state": st.get("state"),
                "outcome": outcome,
                "why": why,
                "faults": during,
                "points_on_worker": (mine or {}).get("points", 0),
                "points_stored": (kept or {}).get("points"),
                "lost_points": lost_points(mine, kept),
                "run_folder": mine is not None,
                "manifest": bool(mine or kept),
                "manifest_status": manifest.get("status"),
                "manifest_error": str(manifest.get("error") or "")[:300],
            }
        )
    return rows


def device_lock_slots(api_url: str) -> int:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tbench.node.device_lock import lock_name
    from tbench.node.hardware import detect

    with contextlib.suppress(Exception), temporary_settings({PREFECT_API_URL: api_url}):
        with get_client(sync_client=True) as client:
            return client.read_global_concurrency_limit_by_name(lock_name(detect())).active_slots
    return 0


def leftover_processes(root: Path) -> list[psutil.Process]:
    """What outlived the soak: a measuring process of its runs, or a stack process (argv naming its folder)."""
    return [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.pid != os.getpid() and any(str(root) in a for a in p.info["cmdline"] or [])
    ]


if __name__ == "__main__":
    print(json.dumps(soak(int(sys.argv[1]) if len(sys.argv) > 1 else 4), indent=2, default=str))
    signal.signal(signal.SIGINT, signal.SIG_DFL)
