"""A run as `tbench compare` reads it: its tidy results, each ok point's noise from the perf_analyzer log of the
attempt that counted (tbench.loadgen.perf_analyzer.noise_from_log), the p99's standard error from the requests it rests
on, and the run's manifest (its host load). See tbench.results.compare for the rule that judges two of them."""

from __future__ import annotations

import json
import math
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.core.layout import perf_log_for
from tbench.core.metrics import RESULT_COLUMNS
from tbench.core.storage import url_to_fs
from tbench.loadgen.perf_analyzer import DEFAULT_NOISE, STABLE_WINDOWS, Noise, noise_from_log
from tbench.results.comparison import P99_Z, TPUT, _missing


@dataclass
class RunResults:
    """A run's tidy results plus, per ok point, its noise columns: throughput_cv, latency_cv, noise_windows,
    noise_assumed, noise_note."""

    source: str  # the folder, as given
    name: str  # the folder's name (the run id for a run folder)
    results: pd.DataFrame
    manifest: dict = field(default_factory=dict)  # the run's manifest.json where it has one (its host load)

    @property
    def neighbour_cpu_pct(self) -> float:
        """Other processes' mean CPU over the run's sweeps (100 = one core; NaN where not recorded)."""
        host = self.manifest.get("host") or {}
        value = (host.get("other_cpu_pct") or {}).get("mean")
        return math.nan if value is None else float(value)

    @property
    def cpu_speed(self) -> float:
        """The CPU probe's best reading, before or after the run's sweeps (tbench.node.cpu_speed; NaN where not
        recorded)."""
        speed = ((self.manifest.get("host") or {}).get("cpu_speed") or {}).values()
        values = [float(v) for v in speed if isinstance(v, (int, float)) and v > 0]
        return max(values) if values else math.nan

    @property
    def ok(self) -> pd.DataFrame:
        return self.results[self.results["status"] == "ok"]


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel


def _read_text(fs, path: str) -> str | None:
    try:
        with fs.open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:  # FileNotFoundError, PermissionError, ...: the noise is assumed
        return None


def _read_manifest(fs, root: str) -> dict:
    """The run's manifest.json; {} where it has none or it cannot be read."""
    text = _read_text(fs, _join(root, "manifest.json"))
    try:
        manifest = json.loads(text) if text else {}
    except ValueError:
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _why_no_results(fs, root: str) -> str:
    """Why a folder has no results file: a run that ended before its first point (its manifest says how), or not a
    run folder at all."""
    ended = _read_manifest(fs, root).get("error")
    if ended:
        return f"the run measured no point ({ended}): give a run that measured some"
    return "no results.parquet or results.csv: give a run folder (or its results file)"


def load_run(path_or_url: str | Path, default_noise: float = DEFAULT_NOISE) -> RunResults:
    """A run folder (local path or fsspec URL; or its results.parquet / results.csv itself) -> its results and noise.

    Reads ``results.parquet`` (else ``results.csv``); for each ok point the log of its counting attempt gives the noise;
    a point whose log is missing gets `default_noise` with ``noise_assumed`` set."""
    source = str(path_or_url)
    fs, root = url_to_fs(source)
    if root.endswith((".parquet", ".csv")) and fs.isfile(root):
        candidates, root = [root], posixpath.dirname(root)
    else:
        candidates = [_join(root, "results.parquet"), _join(root, "results.csv")]
    found = next((p for p in candidates if fs.exists(p)), None)
    if found is None:
        raise FileNotFoundError(f"{source}: {_why_no_results(fs, root)}")
    with fs.open(found, "rb") as f:
        results = pd.read_parquet(f) if found.endswith(".parquet") else pd.read_csv(f, keep_default_na=True)
    for col in RESULT_COLUMNS:
        if col not in results.columns:
            results[col] = np.nan
    if results["status"].isna().all():  # results written before the status column: a number is a measured point
        results["status"] = np.where(results[TPUT].notna(), "ok", "error")
    # results written before window_requests: in count_windows mode a window holds --measurement-request-count
    results["window_requests"] = results["window_requests"].fillna(results["measurement_request_count"])
    results = results.reset_index(drop=True)

    noise = []
    for _, row in results.iterrows():
        if row["status"] != "ok":
            noise.append(Noise(math.nan, math.nan, 0, False))
            continue
        src = row["source_file"]
        text = None if _missing(src) or str(src) == "" else _read_text(fs, _join(root, perf_log_for(src)))
        if text is None:
            noise.append(Noise(default_noise, default_noise, 0, True, "no perf_analyzer log"))
        else:
            n = noise_from_log(text, default=default_noise)
            if math.isnan(n.throughput_cv) or math.isnan(n.latency_cv):  # e.g. a zero mean: not a usable noise
                n = Noise(default_noise, default_noise, 0, True, "unusable measurement windows")
            noise.append(n)
    name = posixpath.basename(root.rstrip("/")) or source
    return RunResults(source=source, name=name, results=with_noise(results, noise), manifest=_read_manifest(fs, root))


def with_noise(results: pd.DataFrame, noise: list[Noise]) -> pd.DataFrame:
    """The results with each row's noise columns (`noise`: one per row, from its windows): throughput_cv, latency_cv,
    p99_cv (the larger of the windows' latency CV and the p99's standard error), noise_windows, noise_assumed and
    noise_note."""
    results = results.copy()
    results["throughput_cv"] = [n.throughput_cv for n in noise]
    results["latency_cv"] = [n.latency_cv for n in noise]
    p99_se = [
        p99_standard_error(p95, p99, requests)
        for p95, p99, requests in zip(results["p95_ms"], results["p99_ms"], results["window_requests"])
    ]
    results["p99_cv"] = [_largest(n.latency_cv, se) for n, se in zip(noise, p99_se)]
    results["noise_windows"] = [n.windows for n in noise]
    results["noise_assumed"] = [n.assumed for n in noise]
    results["noise_note"] = [n.note for n in noise]
    return results


def p99_requests(window_requests: float) -> float:
    """The requests a point's p99 rests on: perf_analyzer's merged stable windows (NaN when not recorded)."""
    return math.nan if _missing(window_requests) else STABLE_WINDOWS * float(window_requests)


def p99_standard_error(p95_ms: float, p99_ms: float, window_requests: float) -> float:
    """The relative standard error of a p99 measured from the merged windows' n requests, from order statistics: the
    p99's rank n*0.99 moves by ± sqrt(n*0.99*0.01) (binomial), i.e. the tail beyond it holds 1% ± s of the requests;
    the point's own p95..p99 give the tail's exponential scale, (p99 - p95) / ln 5, which maps those tail shares to
    latencies: x(u) = p99 + scale * ln(0.01 / u). Half the interval is the standard error. Where the interval's
    upper end lies beyond the sample (u under half a request), it stops there: for n under `MIN_P99_REQUESTS` the
    change is undetermined anyway. (The density at p99 taken as the p95..p99 average understates this ~2.5x.)
    perf_analyzer logs no per-window p99, and the windows' average latency is far steadier than their tail; NaN
    where the point lacks the numbers."""
    values = [p95_ms, p99_ms, window_requests]
    if any(_missing(v) for v in values) or p99_ms <= 0 or window_requests <= 0:
        return math.nan
    n = p99_requests(window_requests)
    scale = max(float(p99_ms) - float(p95_ms), 0.0) / math.log(5.0)
    spread = P99_Z * math.sqrt(0.99 * 0.01 / n)
    beyond_high, beyond_low = 0.01 + spread, max(0.01 - spread, 0.5 / n)
    return scale * math.log(beyond_high / beyond_low) / 2.0 / float(p99_ms)


def _largest(*values: float) -> float:
    """The largest of the values that are not missing (NaN when none is)."""
    return max((float(v) for v in values if not _missing(v)), default=math.nan)
