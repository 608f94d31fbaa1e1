"""Arrivals other than a fixed rate, sent through perf_analyzer's custom intervals (--request-intervals: one interval
in microseconds per line, looped over): a user's trace of request timestamps replayed, optionally sped up
(tbench.core.request_trace reads it), and bursty arrivals (gamma intervals whose CV is the burstiness: 1 is
Poisson, above 1 bursts and lulls)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tbench.core.errors import ConfigError
from tbench.core.request_trace import Trace, load_schedule
from tbench.loadgen.perf_analyzer import RequestLog, perf_json_value

if TYPE_CHECKING:
    from tbench.core.input_data import InputSamples

ALIGN_INTERVALS = 64  # sent intervals matched against each offset into the schedule
MAX_OFFSETS = 20_000  # offsets tried (a longer schedule is matched on its first ones)


def gamma_intervals_us(rate: float, burstiness: float, count: int, seed: int = 0) -> np.ndarray:
    """`count` intervals of a gamma renewal process at `rate` requests/s whose intervals' CV is `burstiness`."""
    if rate <= 0 or burstiness <= 0:
        raise ConfigError("bursty arrivals need a rate and a burstiness above 0")
    shape = 1.0 / burstiness**2
    intervals = np.random.default_rng(seed).gamma(shape, 1.0 / (rate * shape), count)
    return np.round(intervals * 1e6).astype(np.int64)


def write_intervals(path: Path, intervals_us: np.ndarray) -> Path:
    """perf_analyzer's --request-intervals file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(str(int(i)) for i in intervals_us) + "\n")
    return path


def replay_error_us(sent_ns: np.ndarray, intervals_us: np.ndarray) -> dict[str, float]:
    """How far the intervals perf_analyzer actually sent at are from the ones it was given: the median and p99 of the
    absolute difference, in microseconds, and the mean rate sent over the one asked. The sends measured start anywhere
    in the looped schedule (after perf_analyzer's warm-up), so they are aligned to the offset into it that fits their
    first intervals best."""
    sent = np.diff(np.sort(np.asarray(sent_ns, dtype=np.int64))) / 1e3
    if len(sent) == 0:
        return {}
    given = np.asarray(intervals_us, dtype=float)
    head = sent[: min(ALIGN_INTERVALS, len(sent))]
    offsets = range(min(len(given), MAX_OFFSETS))
    best = min(offsets, key=lambda o: float(np.abs(head - np.resize(np.roll(given, -o), len(head))).sum()))
    asked = np.resize(np.roll(given, -best), len(sent))
    error = np.abs(sent - asked)
    return {
        "median_abs_error_us": float(np.median(error)),
        "p99_abs_error_us": float(np.percentile(error, 99)),
        "rate_sent_over_asked": float(asked.sum() / sent.sum()) if sent.sum() > 0 else math.nan,
        "intervals": int(len(sent)),
    }


GAMMA_SPAN_S = 300.0  # a bursty schedule's loop: long enough that its bursts are not one point's alone
GAMMA_MIN_INTERVALS = 1000


def with_intervals(
    points: list,
    trace: str | None,
    burstiness: float,
    seed: int,
    folder: Path,
    samples: InputSamples | None = None,
) -> list:
    """The points whose arrivals are bursty (gamma) or the `trace` file, each with its intervals file written in
    `folder` (a trace at the point's speed-up: its rate over the trace's mean rate); the others as they are. A trace
    with a sample per request also gets its input data (`trace_data`, from the run's `samples`)."""
    from dataclasses import replace

    if trace and any(p.distribution == "trace" for p in points):
        trace = load_schedule(trace)  # a rate schedule drawn as arrival_load drew it: the same mean rate
    out = []
    for p in points:
        if p.distribution == "trace" and isinstance(trace, Trace):
            intervals = trace.intervals_us(p.rate / trace.mean_rate)
            p = replace(p, schedule_requests=len(intervals), batch_size=trace.batch_size or p.batch_size)
            if trace.samples is not None:
                p = replace(p, data_file=str(trace_data(trace, samples, p.batch_size, folder)))
        elif p.distribution == "gamma":
            count = max(GAMMA_MIN_INTERVALS, math.ceil(p.rate * GAMMA_SPAN_S))
            intervals = gamma_intervals_us(p.rate, burstiness, count, seed)
        else:
            out.append(p)
            continue
        out.append(replace(p, intervals=str(write_intervals(folder / f"{p.label}.intervals", intervals))))
    return out


def trace_data(trace: Trace, samples: InputSamples | None, batch_size: int, folder: Path) -> Path:
    """perf_analyzer's input data for a trace with a sample per request: the samples in the trace's order, one entry
    per request. perf_analyzer sends its i-th scheduled request with the i-th entry, whichever of its threads sends it
    (checked on the server: tests/test_arrivals.py), and loops over the intervals and the entries together, as both
    have one line per request. Written once per trace and samples (its name is their digest)."""
    trace.check_samples(samples, batch_size)
    digest = hashlib.sha256(trace.samples.tobytes() + samples.digest().encode()).hexdigest()[:16]
    path = folder / f"trace-{digest}.data.json"
    if not path.exists():
        entries = [{name: perf_json_value(a) for name, a in samples.one(int(i)).items()} for i in trace.samples]
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"data": entries}))
    return path


def arrivals_fidelity(intervals_file: str, requests: RequestLog) -> dict:
    """A rate point's arrivals_* columns: how far its sends' intervals were from its schedule's."""
    schedule = np.loadtxt(intervals_file, dtype=np.int64, ndmin=1)
    error = replay_error_us(np.round(requests.sent_s * 1e9).astype(np.int64), schedule)
    return {
        "arrivals_median_error_us": error.get("median_abs_error_us"),
        "arrivals_p99_error_us": error.get("p99_abs_error_us"),
    }
