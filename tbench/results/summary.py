"""Stage 7a: the numbers a reader looks for first, computed from the tidy table."""

from __future__ import annotations

import pandas as pd

from tbench.core.metrics import THROUGHPUT


def summarize(results: pd.DataFrame) -> dict:
    """Point counts, and per served format and scenario the best throughput, where, and the lowest latency; per shape
    set too where a --shape sweep measured several (the best of all would be the shortest shape's, every time)."""
    summary: dict = {
        "points": int(len(results)),
        "points_ok": int((results["status"] == "ok").sum()),
        "points_flagged": int((results["status"] != "ok").sum()),
        "best": [],
    }
    ok = results[results["status"] == "ok"]
    swept = "shapes" in ok and ok["shapes"].nunique() > 1
    for fmt in dict.fromkeys(ok["format"]):
        for scenario, axis in (("offline", "batch_size"), ("online", "concurrency"), ("rate", "request_rate")):
            rows = ok[(ok["format"] == fmt) & (ok["scenario"] == scenario)]
            for shapes, at_shapes in rows.groupby("shapes", sort=False, dropna=False) if swept else [(None, rows)]:
                if at_shapes.empty:
                    continue
                best = at_shapes.loc[at_shapes[THROUGHPUT.column].idxmax()]
                summary["best"].append(
                    {
                        "format": fmt,
                        "scenario": scenario,
                        **({"shapes": shapes} if swept else {}),
                        "best_throughput_infer_per_s": float(best[THROUGHPUT.column]),
                        "at": f"{axis.replace('_', ' ')} {best[axis]:g}",
                        "p99_ms_at_best": float(best["p99_ms"]),
                        "min_avg_ms": float(at_shapes["avg_ms"].min()),
                    }
                )
    return summary
