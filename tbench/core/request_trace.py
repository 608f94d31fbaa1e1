"""A user's trace of request timestamps, to replay (tbench.loadgen.arrivals): a CSV with a `timestamp` column
(seconds; other columns are ignored, save a `batch_size` column, which must hold one value: perf_analyzer sends one
batch size per point, and a `sample` column), a JSONL file of {"timestamp": ...} objects (with an optional "sample"),
or a text file of one timestamp per line. A `sample` is the index (from 0) of the request's sample in the run's
`--input-data`: each request then carries that sample. Timestamps must be non-negative and in order; every mistake is
one line naming the line and the fix."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tbench.core.errors import ConfigError

if TYPE_CHECKING:
    from tbench.core.input_data import InputSamples

MIN_REQUESTS = 2
MAX_SAMPLE_VALUES = 20_000_000  # a trace's samples, one per request, in perf_analyzer's JSON (~10 bytes a value)


@dataclass(frozen=True)
class Trace:
    """A trace's timestamps (seconds from its first request) and where they came from."""

    times_s: np.ndarray
    source: str
    batch_size: int | None = None
    samples: np.ndarray | None = None  # per request, the index of its sample in the run's --input-data

    @property
    def span_s(self) -> float:
        return float(self.times_s[-1])

    @property
    def mean_rate(self) -> float:
        """Requests per second over the trace, its last interval closing the loop as perf_analyzer replays it
        (the mean interval)."""
        return (len(self.times_s) - 1) / self.span_s

    def check_samples(self, samples: InputSamples | None, batch_size: int) -> None:
        """A trace with a sample per request can be sent as it says: the samples given (--input-data), each index
        among them, one sample per request (batch size 1), and small enough for perf_analyzer's input data."""
        if self.samples is None:
            return
        if samples is None:
            raise ConfigError(f"trace {self.source} names a sample per request: give the samples with --input-data")
        if batch_size != 1:
            raise ConfigError(
                f"trace {self.source} names a sample per request, sent one per request: use batch size 1 (not "
                f"{batch_size})"
            )
        if int(self.samples.max()) >= samples.count:
            first = int(np.argmax(self.samples >= samples.count))
            raise ConfigError(
                f"trace {self.source}: request {first + 1} names sample {self.samples[first]}, but {samples.path} "
                f"holds {samples.count} samples (0 to {samples.count - 1})"
            )
        sizes = [sum(int(np.size(a)) for a in samples.one(i).values()) for i in range(samples.count)]
        values = int(np.asarray(sizes)[self.samples].sum())
        if values > MAX_SAMPLE_VALUES:
            raise ConfigError(
                f"trace {self.source}: its {len(self.samples)} requests' samples hold {values:,} values, more than "
                f"perf_analyzer's input data takes here ({MAX_SAMPLE_VALUES:,}): replay a shorter part of the trace, "
                "or drop its sample column"
            )

    def intervals_us(self, speed: float = 1.0) -> np.ndarray:
        """The intervals perf_analyzer sends at, sped up `speed` times."""
        return np.round(np.diff(self.times_s) / speed * 1e6).astype(np.int64)


def _numbers(values, source: str, first_line: int) -> np.ndarray:
    times = []
    for n, value in enumerate(values, start=first_line):
        try:
            t = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"trace {source} line {n}: {value!r} is not a timestamp (seconds)") from None
        if not math.isfinite(t) or t < 0:
            raise ConfigError(f"trace {source} line {n}: timestamp {value} is negative or not finite")
        if times and t < times[-1]:
            raise ConfigError(
                f"trace {source} line {n}: timestamp {t:g} comes before {times[-1]:g}: sort the trace by time"
            )
        times.append(t)
    return np.asarray(times, dtype=float)


def _sample_indices(values, source: str, first_line: int) -> np.ndarray:
    indices = []
    for n, value in enumerate(values, start=first_line):
        try:
            index = float(value)
        except (TypeError, ValueError):
            index = -1.0
        if not (math.isfinite(index) and index >= 0 and index == int(index)):
            raise ConfigError(
                f"trace {source} line {n}: sample {value!r} is not an index (0, 1, 2 ... into the --input-data samples)"
            )
        indices.append(int(index))
    return np.asarray(indices, dtype=np.int64)


def read_trace(path: str | Path) -> Trace:
    """A trace file (see the module's docstring); every mistake is one line naming the line and the fix."""
    import pandas as pd

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"trace {path} is not a file")
    batch = samples = None
    try:
        if path.suffix == ".csv":
            table = pd.read_csv(path)
            if "timestamp" not in table.columns:
                columns = ", ".join(map(str, table.columns))
                raise ConfigError(f"trace {path} has no timestamp column (columns: {columns})")
            times = _numbers(table["timestamp"].tolist(), str(path), 2)
            if "batch_size" in table.columns:
                sizes = set(table["batch_size"].tolist())
                if len(sizes) > 1:
                    raise ConfigError(
                        f"trace {path} holds batch sizes {sorted(sizes)}: perf_analyzer sends one batch size per "
                        "point, so split the trace by batch size"
                    )
                batch = int(sizes.pop())
            if "sample" in table.columns:
                samples = _sample_indices(table["sample"].tolist(), str(path), 2)
        elif path.suffix in (".jsonl", ".ndjson"):
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            objects = []
            for n, line in enumerate(lines, start=1):
                try:
                    found = json.loads(line)
                except ValueError:
                    found = None
                if not isinstance(found, dict) or "timestamp" not in found:
                    raise ConfigError(f"trace {path} line {n}: not a JSON object with a timestamp")
                objects.append(found)
            times = _numbers([o["timestamp"] for o in objects], str(path), 1)
            with_sample = [n for n, o in enumerate(objects, start=1) if "sample" in o]
            if with_sample and len(with_sample) < len(objects):
                missing = next(n for n, o in enumerate(objects, start=1) if "sample" not in o)
                raise ConfigError(
                    f"trace {path} line {missing}: no sample, where other lines have one: give every "
                    "request its sample, or none"
                )
            if with_sample:
                samples = _sample_indices([o["sample"] for o in objects], str(path), 1)
        else:
            times = _numbers([ln for ln in path.read_text().splitlines() if ln.strip()], str(path), 1)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ConfigError(f"trace {path} cannot be read: {str(err).splitlines()[0]}") from None
    if len(times) < MIN_REQUESTS or times[-1] <= times[0]:
        raise ConfigError(f"trace {path} needs at least {MIN_REQUESTS} requests over a span longer than 0 s")
    return Trace(times - times[0], str(path), batch, samples)


RAMP = "ramp:"  # a rate schedule given in place of a trace file: ramp:RATE:SECONDS,RATE:SECONDS,...


def ramp_trace(schedule: str, seed: int = 0) -> Trace:
    """A rate schedule as a trace: Poisson arrivals at each RATE (requests/s) for its SECONDS, one step after the
    other (`10:30,20:30,40:30` ramps up in three steps)."""
    steps = []
    for part in schedule.split(","):
        rate, _, seconds = part.partition(":")
        try:
            steps.append((float(rate), float(seconds)))
        except ValueError:
            raise ConfigError(f"cannot read the rate schedule {schedule!r}: use RATE:SECONDS,RATE:SECONDS") from None
        if not (steps[-1][0] > 0 and steps[-1][1] > 0 and math.isfinite(steps[-1][0] * steps[-1][1])):
            raise ConfigError(f"the rate schedule {schedule!r}: each rate and each duration must be above 0")
    rng = np.random.default_rng(seed)
    times, start = [], 0.0
    for rate, seconds in steps:
        n = rng.poisson(rate * seconds)
        times.append(start + np.sort(rng.uniform(0.0, seconds, n)))
        start += seconds
    merged = np.concatenate(times)
    if len(merged) < MIN_REQUESTS or merged[-1] <= merged[0]:
        raise ConfigError(f"the rate schedule {schedule!r} holds fewer than {MIN_REQUESTS} requests")
    return Trace(merged - merged[0], f"{RAMP}{schedule}")


def load_schedule(source: str, seed: int = 0) -> Trace:
    """A trace file (one handed over through the artifact store fetched first), or a rate schedule
    (`ramp:RATE:SECONDS,...`)."""
    from tbench.core.handover import local_path

    return ramp_trace(source.removeprefix(RAMP), seed) if source.startswith(RAMP) else read_trace(local_path(source))
