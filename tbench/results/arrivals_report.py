"""The report's pictures of a bursty or trace rate point: the rate offered and served over time, and each request's
latency at the moment it was sent, from the point's exported requests (where its requests were exported)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.loadgen.perf_analyzer import RequestLog, profile_export_path, read_profile_export

SCHEDULED = ("gamma", "trace")  # request_distribution values sent from a schedule file


def plot_over_time(requests: RequestLog, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    span = max(float(requests.answered_s.max()), float(requests.sent_s.max()))
    bins = np.arange(0.0, math.ceil(span) + 1.0, 1.0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    top.stairs(np.histogram(requests.sent_s, bins)[0], bins, label="offered (sent)", color="grey")
    top.stairs(np.histogram(requests.answered_s, bins)[0], bins, label="served (answered)", color="#76b900")
    top.set(ylabel="requests per second", title=title)
    top.legend(fontsize=8)
    bottom.plot(requests.sent_s, requests.latency_s * 1000, ".", ms=2, alpha=0.5)
    bottom.set(xlabel="seconds from the point's start", ylabel="latency (ms)")
    bottom.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def arrivals_lines(rate_rows: pd.DataFrame, run_dir: Path, plots_dir: Path, prefix: str) -> list[str]:
    """A picture per bursty or trace point whose requests were exported."""
    if "request_distribution" not in rate_rows:
        return []
    lines = []
    for row in rate_rows[rate_rows["request_distribution"].isin(SCHEDULED)].to_dict("records"):
        source = row.get("source_file")
        requests = read_profile_export(profile_export_path(run_dir / source)) if isinstance(source, str) else None
        if requests is None or len(requests) == 0:
            continue
        name = re.sub(r"_try\d+$", "", Path(source).stem)  # named for its point, whichever attempt measured it
        status = row.get("status", "ok")
        flag = "" if status == "ok" else f" ({status})"
        title = f"{row['request_distribution']} arrivals, mean {row['request_rate']:g} req/s{flag}: offered and served"
        plot = plot_over_time(requests, title, plots_dir / f"{prefix}{name}_over_time.png")
        lines += [f"![{title}]({plot.relative_to(run_dir).as_posix()})", ""]
    return lines
