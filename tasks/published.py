"""Side by side with the published results (the reference guides' tables, shipped as tbench/data/published_results.csv):
the same model, scenario, GPU, precision and format, joined on batch size (offline) or concurrency (online)."""

from __future__ import annotations

import re
from importlib.resources import files

import pandas as pd

from tbench.metrics import THROUGHPUT

PUBLISHED_GPUS = ("A100-80GB", "V100-32GB", "A30", "A40", "T4")


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


def compare_with_published(results: pd.DataFrame, published: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per measured point that has a published twin: both throughputs and p99s and their ratios."""
    published = load_published() if published is None else published
    ok = results[results["status"] == "ok"].copy()
    if ok.empty:
        return pd.DataFrame()
    ok["gpu"] = ok["gpu"].map(lambda g: published_gpu(str(g)))
    keys = ["model", "scenario", "gpu", "precision", "model_format", "batch_size", "concurrency"]
    ours = ok.dropna(subset=["gpu"])[keys + ["format", THROUGHPUT.column, "p99_ms"]]
    theirs = published[keys + [THROUGHPUT.column, "p99_ms"]]
    both = ours.merge(theirs, on=keys, suffixes=("", "_published"))
    both["throughput_ratio"] = both[THROUGHPUT.column] / both[f"{THROUGHPUT.column}_published"]
    both["p99_ratio"] = both["p99_ms"] / both["p99_ms_published"]
    return both.sort_values(["format", "scenario", "batch_size", "concurrency"]).reset_index(drop=True)
