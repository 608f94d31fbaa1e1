"""Bookkeeping of one run: stage timings and outcome, what each stage found (results saved as they arrive), logs."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import time
from pathlib import Path

import pandas as pd

from tbench import progress
from tbench.artifacts import AccuracyResult, CorrectnessResult
from tbench.composing import COMPOSING_COLUMNS
from tbench.errors import BenchError
from tbench.layout import RunLayout
from tbench.metrics import RESULT_COLUMNS
from tasks.store import write_local_atomic


class _RunLogFormatter(logging.Formatter):
    """Names the flow or task run a Prefect record came from (Prefect puts it in the record's extras)."""

    def format(self, record: logging.LogRecord) -> str:
        record.run = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None) or record.name
        return super().format(record)


class RunTracker:
    def __init__(self, layout: RunLayout):
        self.layout = layout
        self.started = dt.datetime.now(dt.timezone.utc)
        self.stage_seconds: dict[str, float] = {}
        self.stage_status: dict[str, str] = {}
        self.failed_stage: str | None = None
        self.error: str | None = None
        self.results = pd.DataFrame(columns=RESULT_COLUMNS)
        self._tables: dict[str, pd.DataFrame] = {}
        self.composing = pd.DataFrame(columns=COMPOSING_COLUMNS)  # an ensemble's steps, per measured point
        self.correctness: list[CorrectnessResult] = []
        self.accuracy: list[AccuracyResult] = []  # one per served format
        self.served_by: dict[str, str] = {}  # format -> the backend serving it, once the server stage has decided
        self._log_handler: logging.Handler | None = None

    @contextlib.contextmanager
    def stage(self, name: str):
        progress.emit("stage_start", stage=name)
        start = time.monotonic()
        try:
            yield
        except BaseException as err:
            self.stage_status[name] = "failed"
            self.failed_stage = self.failed_stage or name
            self.error = self.error or (str(err) if isinstance(err, BenchError) else f"{type(err).__name__}: {err}")
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

    def save_composing(self, rows: list[dict]) -> None:
        """An ensemble's per composing model latencies, appended after every measured point."""
        added = pd.DataFrame(rows, columns=COMPOSING_COLUMNS)
        self.composing = added if self.composing.empty else pd.concat([self.composing, added], ignore_index=True)
        write_local_atomic(self.layout.composing_csv, self.composing.to_csv(index=False))

    def save_json(self, path: Path, value) -> None:
        write_local_atomic(path, json.dumps(value, indent=2, default=str))

    @property
    def status(self) -> str:
        return "failed" if self.failed_stage else "completed"

    def manifest(self, **extra) -> dict:
        return {
            "run_id": self.layout.run_id,
            "status": self.status,
            "failed_stage": self.failed_stage,
            "error": self.error,
            "started_at": self.started.isoformat(),
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "stages": {k: {"status": self.stage_status.get(k), "seconds": round(v, 3)} for k, v in self.stage_seconds.items()},
            "logs": "logs/",
            **extra,
        }

    def capture_logs(self) -> None:
        """Prefect's run logs also go to logs/prefect.log in the run folder."""
        self._log_handler = logging.FileHandler(self.layout.logs_dir / "prefect.log")
        self._log_handler.setFormatter(_RunLogFormatter("%(asctime)s %(levelname)s %(run)s: %(message)s"))
        logging.getLogger("prefect").addHandler(self._log_handler)

    def release_logs(self) -> None:
        if self._log_handler:
            logging.getLogger("prefect").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
