"""A rate point's verdict: whether an open-loop point carried its offered load, and how a point the windows could not
decide is measured again."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tbench.core.metrics import THROUGHPUT
from tbench.loadgen.behind import InstanceLoad, kept_up
from tbench.loadgen.perf_analyzer import (
    STABLE_WINDOWS,
    Point,
    RequestLog,
    compact_profile_export,
    read_profile_export,
)
from tbench.request.measurement import Measurement

# A rate point is judged by kept_up (from its requests, or from its windows and the server's compute times), not by
# perf_analyzer's agreement of windows: it is asked for a spread it always meets, so it stops after its first 3 windows
# (the point's span) and never calls an open-loop point "unstable" for the arrivals' own noise or a queue's random walk
RATE_STABILITY_PCT = 1000.0


MAX_DECIDING_WINDOW_S = 40.0  # a retry sized to decide a rate point: windows of at most this long at its rate


def requests_to_decide(point: Point, row: dict, instances: int | None) -> int | None:
    """Requests that would let the windows rule decide an undetermined rate point (the upper bound of the load its
    offered rate puts on the `instances` falls below 1: InstanceLoad.requests_to_decide); None for another verdict."""
    merged = row.get("window_requests", np.nan) * STABLE_WINDOWS
    if row.get("status") != "undetermined" or point.rate is None or instances is None or not merged >= 1:
        return None
    load = InstanceLoad.estimate(point.rate, busy_per_request_ms(row), instances, int(merged))
    return load.requests_to_decide() if load else None


def retry_window_requests(planned: int, deciding: int | None, rate: float) -> int:
    """Requests per window of a retry: the `planned` longer windows, or, for a point whose load the windows could not
    place below capacity, enough that its merged windows hold `deciding` requests, in windows of at most
    MAX_DECIDING_WINDOW_S at the offered `rate`."""
    if not deciding:
        return planned
    return max(planned, min(math.ceil(deciding / STABLE_WINDOWS), math.ceil(MAX_DECIDING_WINDOW_S * rate)))


def measure_again(row: dict, attempt: int, m: Measurement) -> bool:
    """Whether a measured rate point is measured again with longer windows: its requests could not tell whether it
    kept up (undetermined), and a retry is left."""
    return row.get("status") == "undetermined" and attempt < m.retries


# what a rate point's verdict read (the requests_from column): (exported, requests read) -> where from
REQUESTS_FROM = {
    (True, True): "export",
    (True, False): "windows",  # an export perf_analyzer left empty
    (False, True): "server trace",
    (False, False): "windows",
}


def point_requests(export: Path | None) -> RequestLog | None:
    """A rate point's exported requests, its file then rewritten with their timestamps only (small); None without."""
    if export is None:
        return None
    requests = read_profile_export(export)
    compact_profile_export(export)
    return requests


def busy_per_request_ms(row: dict) -> float | None:
    """The time an instance spent per request: Triton's batch statistics (each execution once, `triton_busy_ms`),
    else compute input + infer + output of perf_analyzer's server breakdown (which charges each request its whole
    batch's: under dynamic batching a load several times too high); None where the server gave neither."""
    busy = row.get("triton_busy_ms")
    if busy is not None and np.isfinite(busy) and busy > 0:
        return float(busy)
    infer = row.get("server_compute_infer_ms")
    if infer is None or not np.isfinite(infer):
        return None
    parts = (row.get(c) for c in ("server_compute_input_ms", "server_compute_output_ms"))
    return float(infer) + sum(float(v) for v in parts if v is not None and np.isfinite(v))


def rate_point_verdict(
    point: Point,
    row: dict,
    merged: int | None,
    log_text: str,
    requests: RequestLog | None = None,
    instances: int | None = None,
) -> dict:
    """What a measured open-loop point's row becomes: its late sends, and its status and reason when it did not carry
    the load (behind, client-bound, or undetermined when its requests, or its windows and the server's compute time
    per request on its `instances` without them, cannot tell)."""
    served = row[THROUGHPUT.column] / point.batch_size
    verdict = kept_up(
        point.rate,
        served,
        merged or 0,
        point.distribution,
        log_text,
        request_log=requests,
        busy_ms=busy_per_request_ms(row),
        instances=instances,
    )
    update = {"delayed_pct": verdict.delayed_pct}
    if verdict.status != "ok":
        update.update(status=verdict.status, error=verdict.reason)
    return update
