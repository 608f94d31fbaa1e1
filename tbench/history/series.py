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
from tbench.core.metrics import OK
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


def point_load(key: dict) -> str:
    """The load of a point (SERIES_KEYS -> value): 'batch 8', 'concurrency 4' or 'rate 50/s poisson'."""
    if pd.notna(key.get("request_rate")):
        return f"rate {key['request_rate']:g}/s {key.get('request_distribution') or ''}".strip()
    if key.get("scenario") == "offline":
        return f"batch {int(key['batch_size'])}"
    batch = f", batch {int(key['batch_size'])}" if key["batch_size"] != 1 else ""
    return f"concurrency {int(key['concurrency'])}{batch}"


def measured_at(key: dict) -> list[str]:
    """The shapes and input data a point was measured at, where they were recorded."""
    return [str(key[k]) for k in ("shapes", "input_data") if key.get(k) and pd.notna(key[k])]


def point_name(key: dict) -> str:
    """A point in words: model and size · format, precision and GPU · scenario and load (· shapes, input data)."""
    served = f"{key['format']} {key['precision']} · {key['gpu']}"
    load = " · ".join([f"{key['scenario']} {point_load(key)}", *measured_at(key)])
    return f"{key['model']} {key['model_size']} · {served} · {load}"


@dataclass
class Series:
    key: dict  # SERIES_KEYS -> value
    metric: Metric
    runs: pd.DataFrame  # run_id, started_at, value, noise: one row per run, oldest first
    changes: list = field(default_factory=list)  # tbench.history.detect.Change, filled by the caller

    @property
    def point(self) -> str:
        """The load of the point: 'batch 8', 'concurrency 4' or 'rate 50/s poisson'."""
        return point_load(self.key)

    @property
    def measured_at(self) -> list[str]:
        """The shapes and input data the point was measured at, where they were recorded (not for a fixed-shape model
        on synthetic data)."""
        return measured_at(self.key)

    @property
    def name(self) -> str:
        return f"{point_name(self.key)} · {self.metric.label}"

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
    """Every point of every complete stored run (tbench.results.dataset), whatever its status (a point a run lost is
    news: tbench.history.lost), and the runs' manifests, each point with its run's start time (`started_at`)."""
    points = query_results(root, model=model, gpu=gpu)
    if points.empty:
        return points, {}
    manifests = read_manifests(root, sorted(points["run_id"].unique()))
    started = {run_id: m.get("started_at") for run_id, m in manifests.items()}
    points = points.assign(started_at=pd.to_datetime(points["run_id"].map(started), utc=True, errors="coerce"))
    points = points.dropna(subset=["started_at"])
    for column in ("status", "error", "throughput_cv", "latency_cv", *SERIES_KEYS):
        if column not in points.columns:
            points[column] = pd.NA
    return points, manifests


def served(points: pd.DataFrame) -> pd.Series:
    """Which points their run served (status ok); a point stored before the status column, by its measured
    throughput (as tbench compare reads such runs)."""
    measured = points["throughput_infer_per_s"].notna() if "throughput_infer_per_s" in points else True
    status = points["status"] if "status" in points else pd.Series(pd.NA, index=points.index)
    return (status == OK).fillna(False) | (status.isna() & measured)


def keyed_points(points: pd.DataFrame) -> pd.DataFrame:
    """`points` with SERIES_KEYS comparable across runs: missing values as None, and synthetic input data as what
    runs stored before the label measured (one series across the upgrade)."""
    keyed = points.assign(**{k: points[k].astype(object).where(points[k].notna(), None) for k in SERIES_KEYS})
    keyed["input_data"] = keyed["input_data"].where(keyed["input_data"] != SYNTHETIC, None)
    return keyed


def build_series(points: pd.DataFrame, metrics: list[Metric] = METRICS) -> list[Series]:
    """Every series of the points their runs served (load_points, `served`), each metric of each point, its runs oldest
    first (one value per run: the median where a run measured the point more than once)."""
    points = points[served(points)] if not points.empty else points
    if points.empty:
        return []
    found = []
    for key_values, rows in keyed_points(points).groupby(SERIES_KEYS, dropna=False, sort=True):
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
