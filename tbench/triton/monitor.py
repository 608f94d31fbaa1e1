"""What the server did during one measured point, next to what perf_analyzer saw: Triton's statistics API (queue and
compute times per request, diffed over the point) cross-checked against the client CSV, the server's CPU and memory
(its processes, sampled), on GPU nodes GPU utilisation, memory and power from Triton's metrics endpoint, and where the
server exposes one (`--metrics-config histogram_latencies=true`) its per-model latency histogram, diffed over the
point: a server-side p50/p99 estimate per point (latency_histogram, histogram_columns). For a pipeline (an ensemble,
or a python model calling others) every step's statistics too: where its time went (tbench.core.pipeline_steps)."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import psutil

from tbench.core.pipeline_steps import ModelCounters, counters_from_statistics, step_rows
from tbench.triton.served import serving_instances
from tbench.triton.server import CALL_TIMEOUT_S

if TYPE_CHECKING:
    from tbench.loadgen.perf_analyzer import RequestLog

# Triton's per-model statistics (cumulative ns) -> our per-request columns in ms
STAT_FIELDS = {
    "queue": "triton_queue_ms",
    "compute_input": "triton_compute_input_ms",
    "compute_infer": "triton_compute_infer_ms",
    "compute_output": "triton_compute_output_ms",
}
BUSY_STAGES = ("compute_input", "compute_infer", "compute_output")  # an instance's time on an execution
# the client CSV's server-side breakdown each statistic is checked against
CHECKED_AGAINST = {
    "triton_queue_ms": "server_queue_ms",
    "triton_compute_input_ms": "server_compute_input_ms",
    "triton_compute_infer_ms": "server_compute_infer_ms",
    "triton_compute_output_ms": "server_compute_output_ms",
}
GPU_METRICS = {
    "nv_gpu_utilization": "gpu_util_pct",
    "nv_gpu_memory_used_bytes": "gpu_mem_mb",
    "nv_gpu_power_usage": "gpu_power_w",
}
# Triton's per-GPU families (DCGM, one series per GPU, labelled gpu_uuid); only the GPUs serving the model are read
GPU_FAMILIES = (
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
)

STEPS_KEY = "pipeline_steps"  # a stop's row: the pipeline's step rows (tbench.core.pipeline_steps.step_rows)
ENERGY_TOTAL = "gpu_energy_total_j"
# Triton refreshes its GPU metrics, the energy counter included, once per --metrics-interval-ms (default 2000): the
# servers tbench starts pass this, so a point's energy is known to about one interval's worth at each end of its span
METRICS_INTERVAL_MS = 100

_METRIC_LINE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_ANY_LINE = re.compile(r"^(\w+)(?:\{([^}]*)\})?\s+(\S+)(?:\s+\d+)?$")  # a sample, labels and timestamp optional

# Triton's per-model latency histogram (core PR 396, named in the 26.01 release notes; on every model, decoupled or
# not; present only with `--metrics-config histogram_latencies=true`): request to first response, in ms. Its series
# carry the labels model and version (namespace where namespacing is on, `_<tag>` per model tag); the buckets are
# `<family>_bucket{...,le="<bound>"}` (cumulative, the last `+Inf`), beside `<family>_count` and `<family>_sum`.
LATENCY_HISTOGRAM = "nv_inference_first_response_histogram_ms"
# Triton's own buckets (100, 500, 2000, 5000 ms) cannot place a p99 of a few ms; a model config's `model_metrics`
# (model_metrics_pbtxt) sets these: 0.05 ms to about 26 s in steps of sqrt(2), so a quantile's bucket is at most
# about 1.41x wide.
LATENCY_BUCKETS_MS = tuple(float(f"{0.05 * 2 ** (k / 2):.3g}") for k in range(39))
# a quantile is estimated only where the bucket holding it is at most this many times as wide (upper / lower bound):
# a p50 of 2 ms inside Triton's default first bucket (0-100 ms) would otherwise read as 50 ms
MAX_BUCKET_RATIO = 2.0
HISTOGRAM_COLUMNS = {
    "requests": "triton_hist_requests",
    "mean": "triton_hist_mean_ms",
    "p50": "triton_hist_p50_ms",
    "p99": "triton_hist_p99_ms",
}


def model_statistics(client, model: str) -> dict[str, int]:
    """Cumulative request count and ns per stage of one model (all versions), from the gRPC statistics API; "busy":
    the ns its instances computed, each execution once (its batch statistics), where a request's stages count its
    whole batch's."""
    stats = client.get_inference_statistics(model_name=model, as_json=True, client_timeout=CALL_TIMEOUT_S)
    totals = {"count": 0, "busy": 0, **{k: 0 for k in STAT_FIELDS}}
    for version in stats.get("model_stats", []):
        inference = version.get("inference_stats", {})
        totals["count"] += int(inference.get("success", {}).get("count", 0))
        for key in STAT_FIELDS:
            totals[key] += int(inference.get(key, {}).get("ns", 0))
        for batch in version.get("batch_stats", []):
            totals["busy"] += sum(int(batch.get(k, {}).get("ns", 0)) for k in BUSY_STAGES)
    return totals


def per_request_ms(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Average ms per request of each stage over the requests between two snapshots."""
    count = after["count"] - before["count"]
    if count <= 0:
        return {"triton_requests": 0}
    busy = after.get("busy", 0) - before.get("busy", 0)  # none: a server without batch statistics
    return {
        "triton_requests": count,
        **{col: (after[k] - before[k]) / count / 1e6 for k, col in STAT_FIELDS.items()},
        **({"triton_busy_ms": busy / count / 1e6} if busy > 0 else {}),
    }


def cross_check(row: dict) -> float:
    """Largest relative difference between Triton's own per-request times and perf_analyzer's server breakdown, over
    the stages that take at least 0.05 ms (smaller ones are all rounding). perf_analyzer reads the same API over its
    measurement windows only, so warm-up and discarded windows make a few percent of difference; much more means one
    of the two is not measuring what we think."""
    diffs = []
    for ours, theirs in CHECKED_AGAINST.items():
        a, b = row.get(ours), row.get(theirs)
        if a is None or b is None or np.isnan(a) or np.isnan(b) or max(a, b) < 0.05:
            continue
        diffs.append(abs(a - b) / max(a, b))
    return max(diffs) if diffs else float("nan")


def gpu_series(text: str) -> dict[str, dict[str, float]]:
    """Triton's Prometheus text -> {GPU UUID: {family: value}} for the per-GPU families (GPU_FAMILIES)."""
    series: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _METRIC_LINE.match(line.strip())
        if not match or match.group(1) not in GPU_FAMILIES:
            continue
        uuid = dict(_LABEL.findall(match.group(2))).get("gpu_uuid")
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if uuid:
            series.setdefault(uuid, {})[match.group(1)] = value
    return series


def parse_gpu_metrics(text: str, gpu_uuids: Collection[str]) -> dict[str, float]:
    """The serving GPUs' utilisation (%, the mean over them), memory used (MB, their sum) and power (W, their sum).
    Other GPUs of the node are left out: another run, or nothing, may be using them. A page without the serving GPUs
    (GPU metrics off, DCGM unavailable) gives nothing rather than some other GPU's numbers."""
    series = gpu_series(text)
    chosen = [series[u] for u in dict.fromkeys(gpu_uuids) if u in series]
    out: dict[str, float] = {}

    def values(family: str) -> list[float]:
        return [s[family] for s in chosen if family in s]

    if util := values("nv_gpu_utilization"):
        out["gpu_util_pct"] = 100.0 * float(np.mean(util))  # Triton reports 0..1
    if used := values("nv_gpu_memory_used_bytes"):
        out["gpu_mem_mb"] = sum(used) / 2**20
    if power := values("nv_gpu_power_usage"):
        out["gpu_power_w"] = sum(power)
    if energy := values("nv_energy_consumption"):
        out[ENERGY_TOTAL] = sum(energy)  # a counter since the server started: a point's energy is its difference
    return out


@dataclass(frozen=True)
class Histogram:
    """One model's latency histogram as a scrape shows it (every version summed): cumulative counts per upper bound
    (ms, sorted, `inf` last), the observations' count and sum (ms)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float


def latency_histogram(text: str, model: str, family: str = LATENCY_HISTOGRAM) -> Histogram | None:
    """The model's histogram of `family` from Triton's Prometheus text; None where the page has none for it (a server
    without histograms: the embedded 2.51, or one started without `histogram_latencies=true`)."""
    buckets: dict[float, float] = {}
    totals = {"count": 0.0, "sum": 0.0}
    seen = False
    for line in text.splitlines():
        match = _ANY_LINE.match(line.strip())
        if not match or not match.group(1).startswith(family):
            continue
        suffix = match.group(1)[len(family) :]
        labels = dict(_LABEL.findall(match.group(2) or ""))
        if labels.get("model") != model or suffix not in ("", "_bucket", "_count", "_sum"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if suffix in ("_count", "_sum"):
            totals[suffix[1:]] += value
            seen = True
        elif "le" in labels:  # a bucket (Triton's docs print them without the `_bucket` suffix: both are read)
            bound = float(labels["le"])  # "+Inf" -> inf
            buckets[bound] = buckets.get(bound, 0.0) + value
            seen = True
    if not seen or not buckets:
        return None
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), totals["count"], totals["sum"])


def histogram_delta(before: Histogram, after: Histogram) -> Histogram | None:
    """What the histogram gained between two scrapes; None where the two do not line up (other buckets, or counters
    that went back: the model was reloaded between them)."""
    if before.bounds != after.bounds:
        return None
    cumulative = tuple(a - b for a, b in zip(after.cumulative, before.cumulative))
    count = after.count - before.count
    if count < 0 or any(c < 0 for c in cumulative) or after.sum < before.sum:
        return None
    return Histogram(after.bounds, cumulative, count, after.sum - before.sum)


def histogram_quantile(q: float, h: Histogram, max_ratio: float = MAX_BUCKET_RATIO) -> float | None:
    """The q-quantile (0..1) of a histogram's observations, Prometheus's way: the bucket that holds it, linearly
    interpolated between its bounds (the first bucket's lower bound is 0). None where it has no observations, where
    the quantile falls past the last finite bound, or where its bucket is more than `max_ratio` times as wide (upper /
    lower bound): a figure its buckets cannot resolve."""
    total = h.cumulative[-1] if h.cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(h.bounds, h.cumulative):
        if cumulative >= rank and cumulative > below:
            if bound == float("inf") or lower <= 0 or bound / lower > max_ratio:
                return None
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = bound, cumulative
    return None


def histogram_columns(before: Histogram | None, after: Histogram | None) -> dict[str, float]:
    """A point's columns from the scrapes at its start and end: the requests the histogram counted over it, their
    exact mean (its sum over its count) and the p50 and p99 its buckets place. Empty where either scrape had none."""
    delta = histogram_delta(before, after) if before is not None and after is not None else None
    if delta is None or delta.count <= 0:
        return {}
    row = {HISTOGRAM_COLUMNS["requests"]: delta.count, HISTOGRAM_COLUMNS["mean"]: delta.sum / delta.count}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        value = histogram_quantile(q, delta)
        if value is not None:
            row[HISTOGRAM_COLUMNS[name]] = value
    return row


def model_metrics_pbtxt(buckets: tuple[float, ...] = LATENCY_BUCKETS_MS, family: str = LATENCY_HISTOGRAM) -> str:
    """A model config's `model_metrics` block giving the latency histogram these buckets (core PR 405: an older
    server refuses the field; only for a server started with `histogram_latencies=true`)."""
    values = ", ".join(f"{b:g}" for b in buckets)
    return (
        "model_metrics {\n  metric_control: [\n    {\n"
        f'      metric_identifier: {{ family: "{family}" }}\n'
        f"      histogram_options: {{ buckets: [ {values} ] }}\n"
        "    }\n  ]\n}\n"
    )


@dataclass
class _Samples:
    cpu: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    gpu: list[dict[str, float]] = field(default_factory=list)
    energy: list[tuple[float, float, int]] = field(default_factory=list)  # (monotonic s, counter J, requests served)


@dataclass(frozen=True)
class LoadEnergy:
    """The serving GPUs' energy while the model served a steady load: per request, with what it rests on."""

    joules_per_request: float
    joules: float  # the counter's difference over the span
    requests: int  # requests served in the same span
    span_s: float
    uncertainty_j: float  # of `joules`: one metrics interval's energy at each end (the counter is up to one poll old)


def energy_under_load(
    times: np.ndarray, energy: np.ndarray, requests: np.ndarray, interval_s: float = METRICS_INTERVAL_MS / 1000
) -> LoadEnergy | None:
    """Energy per request over the span the server was serving, from readings taken together of the energy counter
    and the served-request count. The span starts one reading after the first that saw requests served (the counter
    may be one poll old, still idle) and ends at the last reading before serving stopped, so perf_analyzer's start-up
    and wind-down (idle power, no requests) are left out; under a steady load the measured windows draw the same
    energy per request as the whole span. None when fewer than two readings fall under load."""
    times, energy, requests = (np.asarray(a, dtype=float) for a in (times, energy, requests))
    serving = np.flatnonzero(np.diff(requests) > 0)  # reading k -> k+1 saw requests served
    if serving.size == 0:
        return None
    first, last = serving[0] + 2, serving[-1]
    if last <= first:  # too short to leave the edges out: the whole span that served anything
        first, last = serving[0], serving[-1] + 1
    joules, served = energy[last] - energy[first], requests[last] - requests[first]
    span = times[last] - times[first]
    if served <= 0 or span <= 0:
        return None
    edge = joules / span * interval_s
    return LoadEnergy(joules / served, joules, int(served), span, float(np.hypot(edge, edge)))


class PointMonitor:
    """Start before a point, stop after it: the statistics diff, and samples of the server's CPU, memory and GPUs."""

    def __init__(
        self,
        grpc_url: str,
        model: str,
        processes=lambda: [],
        metrics_url: str | None = None,
        gpu_uuids: Collection[str] = (),
        interval_s: float = 0.5,
        energy_interval_s: float = METRICS_INTERVAL_MS / 1000,
        trace=None,
        steps: Collection[str] = (),
    ):
        self.grpc_url, self.model, self.processes = grpc_url, model, processes
        self.steps = list(steps)  # the models a pipeline may run: read at start and end (STEPS_KEY in stop's row)
        self._steps_before: dict[str, ModelCounters] | None = None
        self._instances: dict[str, int | None] | None = None
        self.gpu_uuids = list(gpu_uuids)  # the GPUs serving the model (tbench.serving); none: no GPU columns
        self.metrics_url = metrics_url if self.gpu_uuids else None
        self.histogram_url = metrics_url or None  # the latency histogram, read wherever the server has one
        self._has_histogram: bool | None = None  # False once a page was read without it: not scraped again
        self.interval_s = interval_s
        self.energy_interval_s = energy_interval_s  # readings of the energy counter and the request count, together
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._energy_thread: threading.Thread | None = None
        self._samples = _Samples()
        self._before: dict[str, int] | None = None
        self._histogram_before: Histogram | None = None
        self._energy_before: float | None = None
        self.trace = trace  # the server's RequestTrace of the model (tbench.triton.trace), where it has one
        self._tracing = False
        self.requests: RequestLog | None = None  # the point's requests as the server saw them, when traced

    def _client(self):
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url)

    def start(self, trace_requests: bool = False) -> None:
        """`trace_requests`: also take every request's timestamps from the server's trace (where it has one)."""
        self._samples, self._stop = _Samples(), threading.Event()
        self.requests = None
        self._tracing = bool(trace_requests and self.trace is not None and self.trace.start())
        try:
            with self._client() as client:
                self._before = model_statistics(client, self.model)
        except Exception:
            self._before = None  # no statistics: the point is still measured, its stats columns stay empty
        self._steps_before = self._step_counters()
        self._energy_before = self._energy()
        self._histogram_before = self._histogram()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        if self.metrics_url:
            self._energy_thread = threading.Thread(target=self._sample_energy, daemon=True)
            self._energy_thread.start()

    def _step_counters(self) -> dict[str, ModelCounters] | None:
        """The pipeline's and its steps' counters now, from one statistics call for every model; None without steps
        or statistics."""
        if not self.steps:
            return None
        try:
            with self._client() as client:
                found = counters_from_statistics(
                    client.get_inference_statistics(as_json=True, client_timeout=CALL_TIMEOUT_S)
                )
        except Exception:
            return None
        return {name: c for name, c in found.items() if name == self.model or name in self.steps}

    def _step_instances(self) -> dict[str, int | None]:
        """Each step's instance count as served (the pipeline's too), read once."""
        if self._instances is None:
            self._instances = {n: serving_instances(self.grpc_url, n) for n in [self.model, *self.steps]}
        return self._instances

    def _histogram(self) -> Histogram | None:
        """The model's latency histogram now, where the server exposes one (read at the point's start and end)."""
        if not self.histogram_url or self._has_histogram is False:
            return None
        try:
            with urllib.request.urlopen(self.histogram_url, timeout=2) as reply:
                found = latency_histogram(reply.read().decode(), self.model)
        except (OSError, ValueError):
            return None
        if self._has_histogram is None:
            self._has_histogram = found is not None
        return found

    def _gpu_metrics(self) -> dict[str, float]:
        if not self.metrics_url:
            return {}
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as reply:
                return parse_gpu_metrics(reply.read().decode(), self.gpu_uuids)
        except OSError:
            return {}

    def _energy(self) -> float | None:
        """The serving GPUs' energy counter now (J), read beside the statistics snapshots so both span the same
        requests."""
        return self._gpu_metrics().get(ENERGY_TOTAL)

    def _sample_energy(self) -> None:
        """The energy counter beside the model's served-request count, every energy interval (energy_under_load)."""
        try:
            client = self._client()
        except Exception:
            return
        with client:
            while not self._stop.wait(self.energy_interval_s):
                try:
                    served = model_statistics(client, self.model)["count"]
                except Exception:
                    return  # no statistics: the point keeps the counter's difference over it
                joules = self._energy()
                if joules is not None:
                    self._samples.energy.append((time.monotonic(), joules, served))

    def _sample(self) -> None:
        procs = {p.pid: p for p in self.processes()}
        for p in procs.values():
            try:
                p.cpu_percent(None)  # the first call only sets the reference point
            except psutil.Error:
                pass
        while not self._stop.wait(self.interval_s):
            cpu = rss = 0.0
            for p in list(procs.values()):
                try:
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                except psutil.Error:
                    procs.pop(p.pid, None)
            if procs:
                self._samples.cpu.append(cpu)
                self._samples.rss.append(rss / 2**20)
            if gpu := self._gpu_metrics():
                self._samples.gpu.append(gpu)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        for thread in (self._thread, self._energy_thread):
            if thread:
                thread.join(timeout=5)
        if self._tracing:
            self.requests, self._tracing = self.trace.stop(), False
        row: dict[str, float] = {}
        energy_after = self._energy()
        if self._energy_before is not None and energy_after is not None:
            row["gpu_energy_j"] = energy_after - self._energy_before
        if self._before is not None:
            try:
                with self._client() as client:
                    row.update(per_request_ms(self._before, model_statistics(client, self.model)))
            except Exception:
                pass
        if self._steps_before is not None and (after := self._step_counters()) is not None:
            row[STEPS_KEY] = step_rows(self.model, self._steps_before, after, self._step_instances())
        row.update(self._energy_columns(row.get("triton_requests")))
        if self._histogram_before is not None:
            row.update(histogram_columns(self._histogram_before, self._histogram()))
        if self._samples.cpu:
            row["server_cpu_pct"] = float(np.mean(self._samples.cpu))  # 100 = one core busy
            row["server_rss_mb"] = float(np.max(self._samples.rss))
        for column in GPU_METRICS.values():
            values = [s[column] for s in self._samples.gpu if column in s]
            if values:
                row[column] = float(np.mean(values)) if column != "gpu_mem_mb" else float(np.max(values))
        return row

    def _energy_columns(self, requests: float | None) -> dict[str, float]:
        """The point's energy as its requests drew it under load (energy_under_load x the point's requests: the
        idle start-up and wind-down left out), its uncertainty and the span it was measured over."""
        if len(self._samples.energy) < 2:
            return {}
        times, joules, served = np.array(self._samples.energy).T
        load = energy_under_load(times, joules, served, METRICS_INTERVAL_MS / 1000)
        if load is None:
            return {}
        scale = requests / load.requests if requests else 1.0
        return {
            "gpu_energy_j": load.joules * scale,
            "gpu_energy_uncertainty_j": load.uncertainty_j * scale,
            "gpu_energy_span_s": load.span_s,
            "gpu_joules_per_request": load.joules_per_request,
        }


class NoMonitor:
    requests = None

    def start(self, trace_requests: bool = False) -> None: ...

    def stop(self) -> dict[str, float]:
        return {}
