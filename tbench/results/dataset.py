"""Every run's results in one partitioned Parquet dataset under the artifact root, queried across runs.

Layout (Hive-style, so Spark, DuckDB, pyarrow or pandas read it as one table):
``<root>/results/model=<model>/gpu=<gpu>/date=<YYYY-MM-DD>/<run_id>.parquet``, one file per run and (model, gpu),
written under a temporary name and moved into place. Partition values are URI-escaped (``gpu=NVIDIA%20A100-SXM4-80GB``,
as Hive and pyarrow's default segment encoding expect) and, as usual, not repeated inside the files, which hold the
other result columns plus ``run_id`` and ``run_status`` (the manifest's status when the run was stored). `query_results`
lists only the partitions a filter names and reads file by file, so runs written with other columns (an older version)
still read: missing columns are empty.

By default a query keeps the runs that completed (`completed`, or `completed_with_failures`: some points failed,
which their own `status` column says), not the ones that `failed` or were `interrupted`, whose points are
a partial picture. Files written before runs carried a status read as `unknown` and are kept: they were most runs'
only record, and the status column shows them for what they are.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import uuid
from pathlib import Path
from urllib.parse import quote, unquote

import pandas as pd

from tbench.core.storage import join, url_to_fs

DATASET = "results"
PARTITIONS = ("model", "gpu", "date")
COMPLETE = ("completed", "completed_with_failures")  # a run's status (stages/tracker.py) whose points stand for it
UNKNOWN = "unknown"  # a file from before runs carried their status, or a run folder without one


def partition_value(value) -> str:
    """A value as a path segment, URI-escaped (a missing value is Hive's default partition name)."""
    if value is None or (isinstance(value, float) and value != value) or str(value) == "":
        return "__HIVE_DEFAULT_PARTITION__"
    return quote(str(value), safe="")


def read_manifest(run_dir: Path) -> dict:
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def run_date(run_dir: Path) -> str:
    """The day the run started (its manifest), else today; UTC."""
    try:
        return dt.datetime.fromisoformat(read_manifest(run_dir)["started_at"]).date().isoformat()
    except (KeyError, ValueError, TypeError):
        return dt.datetime.now(dt.UTC).date().isoformat()


def add_run_to_dataset(run_dir: Path, root_url: str, run_id: str, status: str | None = None) -> list[str]:
    """Write the run's results.parquet into the dataset, with the run's status (given, else its manifest's); returns
    the paths written (none without results)."""
    source = Path(run_dir) / "results.parquet"
    if not source.is_file():
        return []
    table = pd.read_parquet(source)
    if table.empty:
        return []
    date = run_date(Path(run_dir))
    table = table.assign(run_id=run_id, run_status=status or read_manifest(run_dir).get("status") or UNKNOWN)
    fs, root = url_to_fs(join(root_url, DATASET))
    written = []
    for (model, gpu), part in table.groupby(["model", "gpu"], dropna=False, sort=True):
        folder = join(root, f"model={partition_value(model)}", f"gpu={partition_value(gpu)}", f"date={date}")
        path = join(folder, f"{run_id}.parquet")
        buffer = io.BytesIO()
        part.drop(columns=["model", "gpu"]).to_parquet(buffer, index=False)
        fs.makedirs(folder, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with fs.open(tmp, "wb") as f:
            f.write(buffer.getvalue())
        fs.mv(tmp, path)
        written.append(path)
    return written


def _glob_pattern(root: str, model: str | None, gpu: str | None) -> str:
    def segment(value: str | None) -> str:  # glob's own characters in an escaped value are escaped too
        return re.sub(r"([*?\[\]])", r"[\1]", partition_value(value)) if value else "*"

    return join(root, f"model={segment(model)}", f"gpu={segment(gpu)}", "date=*", "*.parquet")


def with_run_status(frame: pd.DataFrame) -> pd.DataFrame:
    """A file's rows with their run's status; a file written before runs carried one reads as unknown."""
    status = frame["run_status"].fillna(UNKNOWN) if "run_status" in frame.columns else UNKNOWN
    return frame.assign(run_status=status)


def query_results(
    root_url: str,
    model: str | None = None,
    gpu: str | None = None,
    since: str | None = None,
    include_incomplete: bool = False,
) -> pd.DataFrame:
    """Every stored point of the runs that match, across runs; `since` is an ISO date (inclusive). Runs that failed
    or were interrupted only with `include_incomplete` (see the module's docstring)."""
    fs, root = url_to_fs(join(root_url, DATASET))
    frames = []
    for path in sorted(fs.glob(_glob_pattern(root, model, gpu))):
        keys = {k: unquote(v) for k, v in re.findall(r"/(model|gpu|date)=([^/]+)", path)}
        if since and keys.get("date", "") < since:
            continue
        with fs.open(path, "rb") as f:
            frame = with_run_status(pd.read_parquet(f)).assign(**keys)
        if not include_incomplete:
            frame = frame[frame["run_status"].isin(COMPLETE + (UNKNOWN,))]
        frames.append(frame)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


BEST_KEYS = ["date", "run_id", "run_status", "model", "gpu", "format", "precision", "scenario"]


def best_per_run(results: pd.DataFrame) -> pd.DataFrame:
    """Per run x model x gpu x format x precision x scenario: the highest-throughput ok point and its p99."""
    if results.empty:
        return results
    ok = results[results.get("status", pd.Series("ok", index=results.index)).fillna("ok") == "ok"]
    ok = ok.dropna(subset=["throughput_infer_per_s"])
    if ok.empty:
        return ok
    keys = [k for k in BEST_KEYS if k in ok.columns]
    best = ok.loc[ok.groupby(keys, dropna=False)["throughput_infer_per_s"].idxmax()]
    columns = keys + [c for c in ("batch_size", "concurrency", "throughput_infer_per_s", "p99_ms") if c in best.columns]
    return best[columns].sort_values(keys).reset_index(drop=True)
