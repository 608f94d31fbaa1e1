"""Paths are data: the one place that knows where things live inside a run folder."""

from __future__ import annotations

import datetime as dt
import posixpath
import uuid
from dataclasses import dataclass
from pathlib import Path

from tbench.core.enums import Scenario


def new_run_id(model: str, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.UTC)
    return f"{model}-{now:%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class RunLayout:
    """The local staging folder of one run; `store` copies it as is under `<root>/<run_id>/`."""

    root: Path
    run_id: str

    @property
    def run_dir(self) -> Path:
        return self.root / self.run_id

    @property
    def models_dir(self) -> Path:
        return self.run_dir / "models"

    @property
    def repository_dir(self) -> Path:
        return self.run_dir / "model_repository"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def plots_dir(self) -> Path:
        return self.run_dir / "plots"

    @property
    def perf_dir(self) -> Path:
        """Raw perf_analyzer CSVs, one per measured point and attempt."""
        return self.run_dir / "perf"

    @property
    def server_log(self) -> Path:
        return self.logs_dir / "tritonserver.log"

    @property
    def results_csv(self) -> Path:
        return self.run_dir / "results.csv"

    @property
    def results_parquet(self) -> Path:
        return self.run_dir / "results.parquet"

    @property
    def composing_csv(self) -> Path:
        """An ensemble's composing models: their own latency rows per measured point."""
        return self.run_dir / "composing.csv"

    @property
    def steps_csv(self) -> Path:
        """A pipeline's steps (an ensemble's, or the models a python model called): Triton's statistics per point."""
        return self.run_dir / "pipeline_steps.csv"

    @property
    def correctness_json(self) -> Path:
        return self.run_dir / "correctness.json"

    @property
    def accuracy_json(self) -> Path:
        return self.run_dir / "accuracy.json"

    @property
    def artifacts_json(self) -> Path:
        """What was converted, and what came from the conversion cache."""
        return self.run_dir / "artifacts.json"

    @property
    def iospec_json(self) -> Path:
        return self.run_dir / "io_spec.json"

    @property
    def request_json(self) -> Path:
        return self.run_dir / "request.json"

    @property
    def report_md(self) -> Path:
        return self.run_dir / "report.md"

    @property
    def manifest_json(self) -> Path:
        return self.run_dir / "manifest.json"

    def perf_csv(self, model: str, scenario: Scenario, point: str, attempt: int) -> Path:
        """One perf_analyzer call's CSV; `point` is the point's label (b4_c1, b1_r50_poisson)."""
        return self.perf_dir / f"{model}_{scenario.value}_{point}_try{attempt}.csv"

    def perf_log(self, model: str, scenario: Scenario, point: str, attempt: int) -> Path:
        return self.run_dir / perf_log_for(self.perf_csv(model, scenario, point, attempt).name)

    def create(self) -> RunLayout:
        for d in (self.run_dir, self.models_dir, self.logs_dir, self.plots_dir, self.perf_dir):
            d.mkdir(parents=True, exist_ok=True)
        return self


def perf_log_for(csv_file: str) -> str:
    """A perf_analyzer CSV's log, relative to the run folder: perf/X.csv -> logs/perf_analyzer/X.log. Readers of a
    stored run (the comparison, the point cache) find a point's log from its `source_file` this way."""
    stem = posixpath.splitext(posixpath.basename(str(csv_file).replace("\\", "/")))[0]
    return posixpath.join("logs", "perf_analyzer", f"{stem}.log")
