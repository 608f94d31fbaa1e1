"""Side by side with the published results (the reference guides' tables, shipped as tbench/data/published_results.csv):
the same model, model size, scenario, GPU, precision and format, joined on batch size (offline) or concurrency (online).

The table's model_size is empty where a guide publishes one size: the model at its published dimensions, which the
adapters call "full" (PUBLISHED_SIZE); the recommenders name theirs (4B, 22B), as their adapters do. A `--size small`
run therefore has no published twin."""

from __future__ import annotations

import re
from importlib.resources import files

import pandas as pd

from tbench.core.metrics import THROUGHPUT

PUBLISHED_GPUS = ("A100-80GB", "V100-32GB", "A30", "A40", "T4")
PUBLISHED_SIZE = "full"  # the adapters' name for the published dimensions: what a published row without a size is


def published_gpu(name: str) -> str | None:
    """nvidia-smi's name ("NVIDIA A100-SXM4-80GB", "Tesla T4") as the published tables label it, or None."""
    upper = name.upper()
    for label in PUBLISHED_GPUS:
        family, _, memory = label.partition("-")
        if re.search(rf"\b{family}\b", upper) and (not memory or memory in upper):
            return label
    return None


def load_published() -> pd.DataFrame:
    return pd.read_csv(files("tbench") / "data" / "published_results.csv")


def published_sizes(published: pd.DataFrame) -> pd.Series:
    """Each published row's model size, PUBLISHED_SIZE where the table leaves it empty."""
    sizes = published["model_size"] if "model_size" in published else pd.Series(index=published.index, dtype=object)
    return sizes.fillna("").astype(str).str.strip().replace("", PUBLISHED_SIZE)


def compare_with_published(results: pd.DataFrame, published: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per measured point that has a published twin: both throughputs and p99s and their ratios."""
    published = load_published() if published is None else published
    ok = results[results["status"] == "ok"].copy()
    if ok.empty:
        return pd.DataFrame()
    ok["gpu"] = ok["gpu"].map(lambda g: published_gpu(str(g)))
    if "model_size" not in ok:  # a results table without sizes: no point can be matched with a published size
        ok["model_size"] = None
    keys = ["model", "model_size", "scenario", "gpu", "precision", "model_format", "batch_size", "concurrency"]
    ours = ok.dropna(subset=["gpu", "model_size"])[keys + ["format", THROUGHPUT.column, "p99_ms"]].astype(
        {"model_size": str}
    )
    theirs = published.assign(model_size=published_sizes(published))[keys + [THROUGHPUT.column, "p99_ms"]]
    both = ours.merge(theirs, on=keys, suffixes=("", "_published"))
    both["throughput_ratio"] = both[THROUGHPUT.column] / both[f"{THROUGHPUT.column}_published"]
    both["p99_ratio"] = both["p99_ms"] / both["p99_ms_published"]
    return both.sort_values(["format", "scenario", "batch_size", "concurrency"]).reset_index(drop=True)
