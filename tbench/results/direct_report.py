"""The report's "Triton against the framework alone" section: `tbench run --direct`'s rows (tbench/stages/direct.py),
each offline point's throughput over the framework's own at the same format and batch size."""

from __future__ import annotations

import pandas as pd


def _figure(value, digits: int) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def direct_lines(rows: list[dict]) -> list[str]:
    """Nothing where the run measured no direct rows (the default: --direct not given)."""
    if not rows:
        return []
    table = pd.DataFrame(
        [
            {
                "Format": r["format"],
                "Batch": r["batch_size"],
                "Device": r["device"],
                "Threads": r["threads"],
                "Direct (infer/s)": _figure(r["throughput_infer_per_s"], 1),
                "Direct p50 (ms)": _figure(r["p50_ms"], 2),
                "Triton offline (infer/s)": _figure(r.get("triton_infer_per_s"), 1),
                "Triton / direct": _figure(r.get("triton_over_direct"), 2),
            }
            for r in rows
        ]
    )
    return [
        "## Triton against the framework alone",
        "",
        "Each exported model run directly by its runtime in tbench's process, on the device and with the threads it "
        "was served with, one call after another with its inputs already there, at the offline batch sizes "
        "(`direct.csv`). Triton / direct: the offline point's throughput over the framework's (1.0: serving costs "
        "nothing; a dash: no ok offline point at that batch size).",
        "",
        table.to_markdown(index=False),
        "",
    ]
