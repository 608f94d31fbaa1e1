"""Series: one measured thing over time, built from the results dataset of any artifact root (local or fsspec URL).

A series is one metric (throughput, p50 or p99 latency) of one point (a batch size, concurrency or rate) of one model,
size, format, precision, GPU (or CPU) and scenario, across the stored runs that measured it, in the order they ran.
The serving configuration (instances, max batch, queue delay), the server and the tools are not part of the key: a
nightly sweep whose configuration or software changed is the same series with a change in it, which
`tbench.history.attribute` then puts down to what differed.

Each value carries its own measured noise: the CV of the point's stable windows (`throughput_cv`, `latency_cv`),
empty for runs stored before points kept it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from tbench.core.measured import SYNTHETIC
from tbench.core.storage import join, url_to_fs
from tbench.results.dataset import query_results

# what makes two runs' points the same point
SERIES_KEYS = [
    "model",
    "model_size",
    "gpu",
    "format",
    "precision",
    "scenario",
    "batch_size",
    "concurrency",
    "request_rate",
    "request_distribution",
    "shapes",  # None for a model without dynamic dims, as in runs stored before the label
    "input_data",
]


@dataclass(frozen=True)
class Metric:
    column: str
    label: str
    noise_column: str
    higher_is_better: bool
    unit: str


METRICS = [
    Metric("throughput_infer_per_s", "throughput", "throughput_cv", True, "infer/s"),
    Metric("p50_ms", "p50 latency", "latency_cv", False, "ms"),
    Metric("p99_ms", "p99 latency", "latency_cv", False, "ms"),
]


@dataclass
class Series:
    key: dict  # SERIES_KEYS -> value
    metric: Metric
    runs: pd.DataFrame  # run_id, started_at, value, noise: one row per run, oldest first
    changes: list = field(default_factory=list)  # tbench.history.detect.Change, filled by the caller

    @property
    def point(self) -> str:
        """The load of the point: 'batch 8', 'concurrency 4' or 'rate 50/s poisson'."""
        k = self.key
        if pd.notna(k.get("request_rate")):
            return f"rate {k['request_rate']:g}/s {k.get('request_distribution') or ''}".strip()
        if k.get("scenario") == "offline":
            return f"batch {int(k['batch_size'])}"
        return f"concurrency {int(k['concurrency'])}" + (
            f", batch {int(k['batch_size'])}" if k["batch_size"] != 1 else ""
        )

    @property
    def measured_at(self) -> list[str]:
        """The shapes and input data the point was measured at, where they were recorded (not for a fixed-shape model
        on synthetic data)."""
        return [str(self.key[k]) for k in ("shapes", "input_data") if self.key.get(k) and pd.notna(self.key[k])]

    @property
    def name(self) -> str:
        k = self.key
        served = f"{k['format']} {k['precision']} · {k['gpu']}"
        load = " · ".join([f"{k['scenario']} {self.point}", *self.measured_at])
        return f"{k['model']} {k['model_size']} · {served} · {load} · {self.metric.label}"

    @property
    def slug(self) -> str:
        k = self.key
        parts = [k["model_size"], k["format"], k["precision"], k["gpu"], k["scenario"], self.point, *self.measured_at]
        parts.append(self.metric.label)
        return "-".join("".join(c if c.isalnum() else "_" for c in str(p)) for p in parts)


def read_manifests(root: str, run_ids: list[str]) -> dict[str, dict]:
    """Each run's manifest.json (`<root>/<run_id>/manifest.json`), fetched together; a run without one maps to {}."""
    if not run_ids:
        return {}
    fs, base = url_to_fs(join(root, run_ids[0]))
    base = base.rsplit("/", 1)[0]
    paths = {f"{base}/{run_id}/manifest.json": run_id for run_id in run_ids}
    found = fs.cat(list(paths), on_error="omit")
    manifests = {run_id: {} for run_id in run_ids}
    for path, raw in found.items():
        run_id = paths.get(path) or paths.get(fs._strip_protocol(path))
        try:
            manifests[run_id] = json.loads(raw)
        except ValueError:  # a manifest cut short: the run is left out, as one without a manifest
            continue
    return manifests


def load_points(root: str, model: str | None = None, gpu: str | None = None) -> tuple[pd.DataFrame, dict[str, dict]]:
    """The ok points of every complete stored run (tbench.results.dataset) and the runs' manifests, each point with its
    run's start time (`started_at`)."""
    points = query_results(root, model=model, gpu=gpu)
    if points.empty:
        return points, {}
    points = points[points["status"] == "ok"].copy()
    manifests = read_manifests(root, sorted(points["run_id"].unique()))
    started = {run_id: m.get("started_at") for run_id, m in manifests.items()}
    points["started_at"] = pd.to_datetime(points["run_id"].map(started), utc=True, errors="coerce")
    points = points.dropna(subset=["started_at"])
    for column in ("throughput_cv", "latency_cv", *SERIES_KEYS):
        if column not in points.columns:
            points[column] = pd.NA
    return points, manifests


def build_series(points: pd.DataFrame, metrics: list[Metric] = METRICS) -> list[Series]:
    """Every series in `points` (load_points), each metric of each point, its runs oldest first (one value per run:
    the median where a run measured the point more than once)."""
    if points.empty:
        return []
    found = []
    keyed = points.assign(**{k: points[k].astype(object).where(points[k].notna(), None) for k in SERIES_KEYS})
    # synthetic data is what runs stored before the label measured: one series across the upgrade
    keyed["input_data"] = keyed["input_data"].where(keyed["input_data"] != SYNTHETIC, None)
    for key_values, rows in keyed.groupby(SERIES_KEYS, dropna=False, sort=True):
        key = dict(zip(SERIES_KEYS, key_values))
        for metric in metrics:
            per_run = (
                rows.dropna(subset=[metric.column])
                .groupby("run_id", as_index=False)
                .agg(
                    started_at=("started_at", "first"),
                    value=(metric.column, "median"),
                    noise=(metric.noise_column, "median"),
                )
                .sort_values("started_at", kind="stable")
                .reset_index(drop=True)
            )
            if not per_run.empty:
                found.append(Series(key=key, metric=metric, runs=per_run))
    return found
