"""perf_analyzer, in one place: the command line of one call, its CSV, its -v log (windows, their noise, the
requests they merged), a rate point's per-request export and the composing models' rows of an ensemble."""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.core.enums import Scenario
from tbench.core.errors import PerfAnalyzerError
from tbench.core.iospec import IoSpec
from tbench.core.metrics import AVG, BREAKDOWN, METRICS
from tbench.request.benchmark import Measurement

UNSTABLE_MARK = "Failed to obtain stable measurement"
# What Triton answers a client shared memory registration when it runs without --allow-client-shm=true (2.68 on:
# server src/common.h kClientShmDisabledErrorStr); perf_analyzer prints it when it registers its regions
CLIENT_SHM_REFUSED = "Client shared memory is disabled"


@dataclass(frozen=True)
class Point:
    scenario: Scenario
    batch_size: int
    concurrency: int | None  # None for request-rate points: open loop, no fixed number of clients
    rate: float | None = None  # requests per second (rate scenario)
    distribution: str = "constant"  # request arrivals: constant, poisson, or gamma / trace (sent from `intervals`)
    shapes: str = ""  # the shape set of a --shape sweep (tbench.core.shape_sets.shape_tags); "" without a sweep
    # gamma (bursty) and trace arrivals: perf_analyzer's --request-intervals file (tbench.loadgen.arrivals); `rate`
    # is then their mean rate
    intervals: str = ""
    schedule_requests: int = 0  # a trace's requests: the point's 3 windows hold at least the whole trace once
    # a trace's samples in its order, one request each (tbench.loadgen.arrivals.trace_data): perf_analyzer sends its
    # input data entries in its schedule's order, the i-th request the i-th entry; "" sends the run's inputs
    data_file: str = ""

    @property
    def label(self) -> str:
        """How the point names its files: b4_c1, or b1_r50_poisson for a request rate (then the shape set's tag)."""
        if self.rate is not None:
            label = f"b{self.batch_size}_r{self.rate:g}_{self.distribution}"
        else:
            label = f"b{self.batch_size}_c{self.concurrency}"
        return f"{label}_{self.shapes}" if self.shapes else label

    def describe(self) -> str:
        load = (
            f"rate {self.rate:g}/s {self.distribution}" if self.rate is not None else f"concurrency {self.concurrency}"
        )
        return f"{self.scenario.value} batch {self.batch_size} {load}" + (f" at {self.shapes}" if self.shapes else "")


@dataclass(frozen=True)
class PerfInputs:
    """What perf_analyzer sends: real samples as JSON input data, concrete shapes for dynamic dims, and the size of
    one sample's largest output (measured) so shared-memory regions fit outputs with dynamic dims."""

    data_file: Path | None = None
    shapes: dict[str, list[int]] | None = None
    batching: bool = True  # False: the model has no batch axis, each request is whole (max_batch_size 0)
    # inputs whose samples vary in shape: each request is sent at its sample's own shape, which perf_analyzer reads
    # from the data file; a --shape would make it refuse every other one
    varying: tuple[str, ...] = ()
    # the user's samples written to the data file (indices), where they vary in shape: what the report describes
    sent: tuple[int, ...] = ()
    sample_output_bytes: int | None = None
    shared_memory: str = "system"  # offline scenario: "system", or "cuda" when client and server share a GPU node
    model_version: str = ""  # the version asked for (a served model's, where the user named one); "": the server's


def output_shm_bytes(spec: IoSpec, batch_size: int, sample_output_bytes: int | None = None) -> int:
    """Room for the largest output of one request, for --output-shared-memory-size. Outputs with dynamic dims are
    sized from a real sample's outputs (`sample_output_bytes`, one sample's largest output), with headroom."""
    if sample_output_bytes is not None:
        return max(2 * batch_size * sample_output_bytes, 1024)
    sizes = [batch_size * math.prod(max(d, 1) for d in t.shape) * t.np_dtype.itemsize for t in spec.outputs]
    return max(sizes + [1024])


def shape_args(spec: IoSpec, shapes: dict[str, list[int]] | None, varying: tuple[str, ...] = ()) -> list[str]:
    """--shape for every input with a dynamic non-batch dimension, so perf_analyzer sends what the model takes; not
    for the `varying` ones, whose shapes the data file gives per sample."""
    args = []
    for t in spec.inputs:
        if -1 in t.shape and t.name not in varying:
            if not shapes or t.name not in shapes:
                raise PerfAnalyzerError(
                    f"input {t.name} has dynamic dims {t.shape}; perf_analyzer needs a concrete shape for it"
                )
            args += ["--shape", f"{t.name}:{','.join(map(str, shapes[t.name]))}"]
    return args


def load_args(point: Point) -> list[str]:
    if point.intervals:  # its own schedule, looped; asynchronous, as below
        return ["--request-intervals", point.intervals, "--async"]
    if point.rate is not None:
        # asynchronous calls: open-loop arrivals are sent on schedule however many requests are in flight (synchronous
        # calls wait for a free client thread, and fall behind the offered rate as latency grows)
        return ["--request-rate-range", f"{point.rate:g}", "--request-distribution", point.distribution, "--async"]
    return ["--concurrency-range", str(point.concurrency)]


def perf_json_value(sample: np.ndarray) -> dict:
    """One sample of one input in perf_analyzer's JSON input data. FP16 and BF16 go as their little-endian bytes (b64),
    the only form perf_analyzer takes them in; other values as numbers, floats unrounded (a float32 written as its
    double is read back exactly: perf_analyzer sends what correctness and accuracy checked)."""
    shape = list(sample.shape) or [1]  # a tensor whose only axis is the batch is served as [1] (config.served_dims)
    if sample.dtype.kind == "O":  # strings (BYTES): perf_analyzer sends each as its UTF-8 bytes
        return {"content": [v.decode() if isinstance(v, bytes) else str(v) for v in sample.ravel()], "shape": shape}
    if sample.dtype.itemsize == 2 and sample.dtype.kind == "f" or sample.dtype.name == "bfloat16":
        raw = np.ascontiguousarray(sample, dtype=sample.dtype.newbyteorder("<")).tobytes()
        return {"b64": base64.b64encode(raw).decode("ascii"), "shape": shape}
    return {"content": sample.ravel().tolist(), "shape": shape}


def perf_argv(
    binary: Path,
    model: str,
    grpc_url: str,
    point: Point,
    m: Measurement,
    request_count: int,
    csv_path: Path,
    spec: IoSpec,
    inputs: PerfInputs = PerfInputs(),
    profile_export: Path | None = None,
) -> list[str]:
    """One perf_analyzer call; `profile_export`: where it writes every request's timestamps (a rate point's
    `profile_export_path`, see `export_fits`)."""
    argv = [
        str(binary),
        "-m",
        model,
        "-u",
        grpc_url,
        "-i",
        "grpc",
        "-b",
        str(point.batch_size),
        *load_args(point),
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(request_count),
        "--stability-percentage",
        str(m.stability_percentage),
        "--max-trials",
        str(m.max_trials),
        "-f",
        str(csv_path),
        "--verbose-csv",
        "-v",  # every window's throughput and latency in the log: why a point did not stabilise
        *shape_args(spec, inputs.shapes, inputs.varying),
    ]
    if inputs.model_version:
        argv += ["-x", inputs.model_version]
    if point.data_file or inputs.data_file:
        argv += ["--input-data", str(point.data_file or inputs.data_file)]
    if profile_export is not None:
        argv += ["--profile-export-file", str(profile_export)]
    if point.scenario is Scenario.OFFLINE and inputs.shared_memory != "none":
        argv += [
            "--shared-memory",
            inputs.shared_memory,
            "--output-shared-memory-size",
            str(output_shm_bytes(spec, point.batch_size, inputs.sample_output_bytes)),
        ]
    return argv


def parse_perf_csv(path: Path) -> dict[str, float]:
    """One perf_analyzer CSV (one concurrency) -> tidy metric columns in our units."""
    frame = pd.read_csv(path)
    if frame.empty:
        raise ValueError(f"{path} has no measurement row")
    row = frame.iloc[0]
    # a concurrency sweep writes the clients; a request-rate one the rate
    values = (
        {"concurrency": int(row["Concurrency"])}
        if "Concurrency" in frame.columns
        else {"request_rate": float(row["Request Rate"])}
    )
    for metric in METRICS:
        if metric.csv_header in frame.columns:
            values[metric.column] = float(row[metric.csv_header]) * metric.scale
    if AVG.column not in values:
        values[AVG.column] = sum(values[m.column] for m in BREAKDOWN)
    return values


# --- the -v log: its windows, their noise, the requests they merged ---

STABLE_WINDOWS = 3  # a stable measurement is the average of perf_analyzer's last 3 windows
DEFAULT_NOISE = 0.05  # CV assumed for a point whose perf_analyzer log is missing

# "  Pass [3] throughput: 2460.07 infer/sec. Avg latency: 809 usec (std 269 usec)." (p99 latency with --percentile)
_NUM = r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
PASS_RE = re.compile(rf"Pass \[(\d+)\] throughput: ({_NUM}) infer/sec\.\s+(?:Avg|p\d+) latency: ({_NUM}) usec")
REQUEST_COUNT_LINE = re.compile(r"Client:\s*\n\s*Request count: (\d+)")


@dataclass(frozen=True)
class Window:
    """One perf_analyzer measurement window ("Pass" line)."""

    index: int
    throughput: float  # infer/s
    latency_us: float  # avg latency (p<N> when perf_analyzer ran with --percentile)


def parse_windows(log_text: str) -> list[Window]:
    """Every "Pass [i] throughput: ..." line of a perf_analyzer -v log, in order."""
    return [Window(int(m[1]), float(m[2]), float(m[3])) for m in PASS_RE.finditer(log_text)]


def refused_client_shm(log: str) -> bool:
    """Whether the server refused perf_analyzer's shared memory regions: Triton 2.68 on, started without
    --allow-client-shm=true, answers their registration with this (CLIENT_SHM_REFUSED)."""
    return CLIENT_SHM_REFUSED in log


def pass_throughputs(log: str) -> list[float]:
    """Each window's throughput (infer/s)."""
    return [w.throughput for w in parse_windows(log)]


DELAYED_LINE = re.compile(r"([0-9.]+)% of the requests were delayed")


def delayed_percent(log: str) -> float:
    """Of an open-loop (request-rate) point, the requests perf_analyzer could not send on schedule, in % (it warns
    only when some were)."""
    found = DELAYED_LINE.findall(log)
    return float(found[-1]) if found else 0.0


def merged_requests(log: str) -> int | None:
    """The requests of the merged stable windows."""
    found = REQUEST_COUNT_LINE.search(log)
    return int(found.group(1)) if found else None


def window_seconds(merged: int | None, batch_size: int, throughput: float) -> float:
    """How long one of the point's windows lasted: the merged windows' requests at the measured throughput (infer/s),
    per window. perf_analyzer closes a count window at the first whole second by which it has the requested count,
    so this is what the point actually measured over."""
    if not merged or not throughput or throughput <= 0:
        return float("nan")
    return merged * batch_size / throughput / STABLE_WINDOWS


def cv(values) -> float:
    """Coefficient of variation: sample standard deviation (ddof=1) over the mean; NaN for fewer than 2 values."""
    a = np.asarray(list(values), dtype=float)
    if len(a) < 2 or not np.all(np.isfinite(a)) or a.mean() == 0:
        return math.nan
    return float(a.std(ddof=1) / abs(a.mean()))


@dataclass(frozen=True)
class Noise:
    throughput_cv: float
    latency_cv: float
    windows: int  # how many windows the CVs come from (0 when assumed)
    assumed: bool
    note: str = ""


def noise_from_log(log_text: str, windows: int = STABLE_WINDOWS, default: float = DEFAULT_NOISE) -> Noise:
    """CV of throughput and avg latency over the last `windows` Pass lines (the ones perf_analyzer averaged)."""
    used = parse_windows(log_text)[-windows:]
    if len(used) < 2:
        return Noise(default, default, 0, True, f"{len(used)} measurement window(s) in the log")
    return Noise(cv(w.throughput for w in used), cv(w.latency_us for w in used), len(used), False)


# --- a rate point's per-request export (--profile-export-file) ---

# perf_analyzer 2.51's export is {"experiments": [{"experiment": {"mode": "request_rate", "value": R},
# "requests": [{"timestamp": SEND_NS, "request_inputs": {...}, "response_timestamps": [NS, ...],
# "response_outputs": [...]}, ...], "window_boundaries": [NS, ...]}], "version": "2.51.0", ...}. It holds the requests
# of every window it measured (the unstable first ones too, not only the 3 it merged), in no particular order, each with
# its input and output tensors written out as numbers; a request still in flight when the last window closed is not in
# it (seen on a sleeper server at 115% of its capacity: the requests of the last 1.4 s, its queue, were absent). The
# boundaries are the windows' edges, the first the call's start: the span the requests were sent and answered in.
PROFILE_EXPORT_SUFFIX = ".requests.json"
# the tensors make the file ~20 bytes per value per request, and perf_analyzer holds them in memory through the run
# (an input of 4,096 floats left the file empty): the export is asked for only where a request's tensors are small
EXPORT_MAX_VALUES = 1024


def profile_export_path(csv_path: Path) -> Path:
    """A rate point's per-request export, beside its CSV: perf/X_try0.csv -> perf/X_try0.requests.json."""
    return csv_path.with_name(csv_path.stem + PROFILE_EXPORT_SUFFIX)


def export_fits(spec: IoSpec, batch_size: int, inputs: PerfInputs = PerfInputs()) -> bool:
    """Whether one request's tensors are small enough to export every request (at most EXPORT_MAX_VALUES values of
    inputs and outputs); dynamic dims count as their measured shapes, unknown ones as large."""
    shapes = inputs.shapes or {}
    values = 0
    for t in spec.inputs + spec.outputs:
        dims = shapes.get(t.name) or t.shape
        if any(d < 0 for d in dims):
            if t in spec.outputs and inputs.sample_output_bytes is not None:
                values += inputs.sample_output_bytes // max(t.np_dtype.itemsize, 1)
                continue
            return False
        values += math.prod(dims)
    return batch_size * values <= EXPORT_MAX_VALUES


@dataclass(frozen=True)
class RequestLog:
    """The requests a rate point's export lists, in send order: when each was sent and how long it took (seconds from
    the call's start), and the span of the call's windows. Requests in flight at the end are not in it."""

    sent_s: np.ndarray
    latency_s: np.ndarray
    span_s: float
    boundaries_s: tuple[float, ...]

    @property
    def answered_s(self) -> np.ndarray:
        return self.sent_s + self.latency_s

    def __len__(self) -> int:
        return len(self.sent_s)


def requests_from_export(export: dict) -> RequestLog | None:
    """The first experiment of a parsed export -> RequestLog; None when it has no requests or no windows."""
    experiments = export.get("experiments") or []
    if not experiments:
        return None
    exp = experiments[0]
    rows = [r for r in exp.get("requests") or [] if r.get("response_timestamps")]
    bounds = exp.get("window_boundaries") or []
    if not rows or len(bounds) < 2:
        return None
    sent = np.array([r["timestamp"] for r in rows], dtype=np.int64)
    answered = np.array([r["response_timestamps"][-1] for r in rows], dtype=np.int64)
    order = np.argsort(sent, kind="stable")
    start = int(bounds[0])
    return RequestLog(
        sent_s=(sent[order] - start) / 1e9,
        latency_s=(answered[order] - sent[order]) / 1e9,
        span_s=(int(bounds[-1]) - start) / 1e9,
        boundaries_s=tuple((int(b) - start) / 1e9 for b in bounds),
    )


def read_profile_export(path: Path) -> RequestLog | None:
    """A rate point's export file -> RequestLog; None when it is missing, empty or not an export."""
    try:
        export = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return requests_from_export(export) if isinstance(export, dict) else None


def compact_profile_export(path: Path) -> None:
    """Rewrite an export with its timestamps only (the same format without the tensors), so a stored run keeps every
    request's timing in a small file."""
    try:
        export = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    for exp in export.get("experiments") or []:
        exp["requests"] = [
            {"timestamp": r["timestamp"], "response_timestamps": r.get("response_timestamps", [])}
            for r in exp.get("requests") or []
        ]
    path.write_text(json.dumps(export, separators=(",", ":")))


# --- the composing models of an ensemble ---

COMPOSING_COLUMNS = [
    "model",
    "composing_model",
    "scenario",
    "format",
    "batch_size",
    "concurrency",
    "request_rate",
    "inference_count",
    "execution_count",
    "request_latency_ms",
    "overhead_ms",
    "server_queue_ms",
    "server_compute_input_ms",
    "server_compute_infer_ms",
    "server_compute_output_ms",
]

_HEADER = re.compile(r"^\s*(\S+), version: *(\S*)\s*$")
_COUNT = re.compile(r"^\s*(Inference|Execution) count: (\d+)")
_LATENCY = re.compile(r"Avg request latency: (\d+) usec \((.*)\)")
_PART = re.compile(r"(overhead|queue|compute input|compute infer|compute output) (\d+) usec")
_PART_COLUMNS = {
    "overhead": "overhead_ms",
    "queue": "server_queue_ms",
    "compute input": "server_compute_input_ms",
    "compute infer": "server_compute_infer_ms",
    "compute output": "server_compute_output_ms",
}


def parse_composing(log: str) -> list[dict]:
    """The last "Composing models:" block of a perf_analyzer log (the reported measurement; -v prints one per
    window before it): one dict per composing model, latencies in ms. Empty when the model is not an ensemble."""
    start = log.rfind("Composing models:")
    if start < 0:
        return []
    rows: list[dict] = []
    for line in log[start:].splitlines()[1:]:
        if (header := _HEADER.match(line)) and "usec" not in line:
            rows.append({"composing_model": header.group(1)})
        elif not rows:
            continue
        elif count := _COUNT.match(line):
            rows[-1][f"{count.group(1).lower()}_count"] = int(count.group(2))
        elif latency := _LATENCY.search(line):
            rows[-1]["request_latency_ms"] = int(latency.group(1)) / 1000
            for name, value in _PART.findall(latency.group(2)):
                rows[-1][_PART_COLUMNS[name]] = int(value) / 1000  # usec -> ms
        elif line.strip() and not line.startswith(" "):
            break  # the block ends at the next unindented line ("Inferences/Second vs. ...")
    return rows
