"""Bookkeeping of one run: stage timings and outcome, what each stage found (results saved as they arrive), logs."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import time
from pathlib import Path

import pandas as pd

from tbench.core import progress
from tbench.core.artifacts import AccuracyResult, CorrectnessResult
from tbench.core.errors import BenchError, error_line
from tbench.core.layout import RunLayout
from tbench.core.metrics import RESULT_COLUMNS
from tbench.core.pipeline_steps import STEP_COLUMNS
from tbench.loadgen.perf_analyzer import COMPOSING_COLUMNS
from tbench.node.interrupts import is_interrupt, signal_name
from tbench.stages.run_status import COMPLETED, COMPLETED_WITH_FAILURES, FAILED, INTERRUPTED, RUNNING
from tbench.stages.store import write_local_atomic, write_manifest

STATE_COMPLETED_WITH_FAILURES = "CompletedWithFailures"  # the flow run's state name (type COMPLETED) in Prefect


class _RunLogFormatter(logging.Formatter):
    """Names the flow or task run a Prefect record came from (Prefect puts it in the record's extras)."""

    def format(self, record: logging.LogRecord) -> str:
        record.run = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None) or record.name
        return super().format(record)


class RunTracker:
    def __init__(self, layout: RunLayout):
        self.layout = layout
        self.started = dt.datetime.now(dt.UTC)
        self.stage_seconds: dict[str, float] = {}
        self.stage_status: dict[str, str] = {}
        self.failed_stage: str | None = None
        self.interrupted = False  # by Ctrl-C or SIGTERM, in failed_stage
        self.error: str | None = None
        self.results = pd.DataFrame(columns=RESULT_COLUMNS)
        self._tables: dict[str, pd.DataFrame] = {}
        self.composing = pd.DataFrame(columns=COMPOSING_COLUMNS)  # an ensemble's steps, per measured point
        self.steps = pd.DataFrame(columns=STEP_COLUMNS)  # a pipeline's steps from Triton's statistics, per point
        self.correctness: list[CorrectnessResult] = []
        self.accuracy: list[AccuracyResult] = []  # one per served format
        self.served_by: dict[str, str] = {}  # format -> the backend serving it, once the server stage has decided
        self.served_on: dict[str, dict] = {}  # format -> where it ran (tbench.serving.ServedOn), once measured
        self.tensor_paths: dict[str, dict] = {}  # Triton model -> the path its runtime's tensors took (tensor_path.py)
        self.tensor_words: dict[str, str] = {}  # format -> that path in the report's words
        self.direct: list = []  # --direct: the framework's own figures (tbench.stages.direct.DirectRow)
        self.notes: list[str] = []  # one line each, for the report (and the manifest): client shared memory refused
        self.measured_shapes: list[str] = []  # inputs with a dynamic dim and the shape perf_analyzer sent
        self.guessed_shapes: dict[str, list[int]] = {}  # of those, the dims no --shape set (tbench chose them)
        self.guessed_values: dict[str, str] = {}  # integer inputs no --value-range set: the values tbench sent
        # what was underneath the numbers (the server that answered, tool and runtime versions, each served model's
        # source digest), so a change in a history of runs can be put down to what differed
        self.environment: dict = {}
        # other processes' CPU while the sweeps measured (tbench.node.host_load), so a noisy neighbour can be named
        self.host: dict = {}
        self._log_handler: logging.Handler | None = None

    @contextlib.contextmanager
    def stage(self, name: str):
        progress.emit("stage_start", stage=name)
        start = time.monotonic()
        try:
            yield
        except BaseException as err:
            self.stage_status[name] = "interrupted" if is_interrupt(err) else "failed"
            self.record_error(err, name)
            raise
        else:
            self.stage_status[name] = "completed"
        finally:
            self.stage_seconds[name] = time.monotonic() - start
            progress.emit("stage_end", stage=name, seconds=self.stage_seconds[name], status=self.stage_status[name])

    def save_points(self, sweep: str, table: pd.DataFrame) -> None:
        """Called after every measured point of a sweep: CSV and Parquet always hold everything measured so far."""
        self._tables[sweep] = table
        table = pd.concat([t for t in self._tables.values() if not t.empty], ignore_index=True)
        self.results = table
        write_local_atomic(self.layout.results_csv, table.to_csv(index=False))
        tmp = self.layout.results_parquet.with_suffix(".parquet.tmp")
        table.to_parquet(tmp, index=False)
        tmp.replace(self.layout.results_parquet)

    def save_steps(self, rows: list[dict]) -> None:
        """A pipeline's step rows (tbench.core.pipeline_steps), appended after every measured point."""
        added = pd.DataFrame(rows, columns=STEP_COLUMNS)
        self.steps = added if self.steps.empty else pd.concat([self.steps, added], ignore_index=True)
        write_local_atomic(self.layout.steps_csv, self.steps.to_csv(index=False))

    def save_composing(self, rows: list[dict]) -> None:
        """An ensemble's per composing model latencies, appended after every measured point."""
        added = pd.DataFrame(rows, columns=COMPOSING_COLUMNS)
        self.composing = added if self.composing.empty else pd.concat([self.composing, added], ignore_index=True)
        write_local_atomic(self.layout.composing_csv, self.composing.to_csv(index=False))

    def save_json(self, path: Path, value) -> None:
        write_local_atomic(path, json.dumps(value, indent=2, default=str))

    def record_error(self, err: BaseException, stage: str | None = None) -> None:
        """The first error (or interrupt) of the run and where it happened; later ones are only logged."""
        if self.error is not None:
            return
        self.failed_stage = self.failed_stage or stage
        self.interrupted = is_interrupt(err)
        if self.interrupted:
            self.error = f"interrupted by {signal_name(err)}" + (f" during {stage}" if stage else "")
        else:
            self.error = str(err) if isinstance(err, BenchError) else f"{type(err).__name__}: {error_line(err)}"

    @property
    def failed_points(self) -> int:
        return int((self.results["status"] == "error").sum()) if "status" in self.results else 0

    @property
    def status(self) -> str:
        if self.interrupted:
            return INTERRUPTED
        if self.error is not None:
            return FAILED
        if self.failed_points and self.failed_points == len(self.results):
            return FAILED  # every point failed: nothing was measured
        return COMPLETED_WITH_FAILURES if self.failed_points else COMPLETED

    @property
    def status_line(self) -> str:
        """Why the run is not `completed`, in one line (empty when it is)."""
        if self.error is not None:
            return self.error
        if self.failed_points:
            return (
                f"{self.failed_points} of {len(self.results)} perf_analyzer points failed "
                "(see the report's Flagged points)"
            )
        return ""

    def manifest(self, **extra) -> dict:
        return {
            "run_id": self.layout.run_id,
            "status": self.status,
            "failed_stage": self.failed_stage,
            "error": self.error or self.status_line or None,
            "points": {"measured": len(self.results), "failed": self.failed_points},
            "started_at": self.started.isoformat(),
            "finished_at": dt.datetime.now(dt.UTC).isoformat(),
            "stages": {
                k: {"status": self.stage_status.get(k), "seconds": round(v, 3)} for k, v in self.stage_seconds.items()
            },
            "logs": "logs/",
            **extra,
        }

    def write_manifest(self, **extra) -> None:
        """The manifest in the local run folder, now: whatever fails or interrupts next, the run says where it got.
        Never raises (a full disk must not keep the server from being stopped next); a failure is logged."""
        try:
            write_manifest(self.layout.run_dir, self.manifest(**extra))
        except OSError as err:
            logging.getLogger("prefect.tbench").error(f"could not write {self.layout.run_dir}/manifest.json: {err}")
            if extra.get("status") != RUNNING:  # a run's end, not its start
                self._manifest_in_place()

    def _manifest_in_place(self) -> None:
        """On a full disk the manifest cannot be replaced (a new file needs space), but the one already there can be
        overwritten in its own space: how the run ended, in a few fields, so that it does not say `running` for
        ever. The rest of it is lost; results.csv and the logs keep what was measured."""
        path = self.layout.run_dir / "manifest.json"
        full = self.manifest()
        kept = {key: full[key] for key in ("run_id", "status", "failed_stage", "error", "points")}
        brief = json.dumps(kept | {"note": "written in place on a full disk: the full manifest could not be"}).encode()
        try:
            with path.open("r+b") as f:
                if len(brief) > path.stat().st_size:
                    return  # it would need more space than the disk has
                f.write(brief)
                f.truncate()
        except OSError:
            pass  # nothing left to try: the next run that finds it `running` marks it (tbench.stages.killed)

    def capture_logs(self) -> None:
        """Prefect's run logs also go to logs/prefect.log in the run folder."""
        self._log_handler = logging.FileHandler(self.layout.logs_dir / "prefect.log")
        self._log_handler.setFormatter(_RunLogFormatter("%(asctime)s %(levelname)s %(run)s: %(message)s"))
        logging.getLogger("prefect").addHandler(self._log_handler)

    def release_logs(self) -> None:
        if self._log_handler:
            logging.getLogger("prefect").removeHandler(self._log_handler)
            try:
                self._log_handler.close()  # flushes: on a full disk that fails, and must not hide the run's own error
            except OSError as err:
                logging.getLogger("prefect.tbench").error(f"could not finish {self.layout.logs_dir}/prefect.log: {err}")
            self._log_handler = None
