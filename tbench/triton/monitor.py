"""What the server did during one measured point, next to what perf_analyzer saw: Triton's statistics API (queue and
compute times per request, diffed over the point) cross-checked against the client CSV, the server's CPU and memory
(its processes, sampled), and on GPU nodes GPU utilisation, memory and power from Triton's metrics endpoint."""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import psutil

# Triton's per-model statistics (cumulative ns) -> our per-request columns in ms
STAT_FIELDS = {
    "queue": "triton_queue_ms",
    "compute_input": "triton_compute_input_ms",
    "compute_infer": "triton_compute_infer_ms",
    "compute_output": "triton_compute_output_ms",
}
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

ENERGY_TOTAL = "gpu_energy_total_j"

_METRIC_LINE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def model_statistics(client, model: str) -> dict[str, int]:
    """Cumulative request count and ns per stage of one model (all versions), from the gRPC statistics API."""
    stats = client.get_inference_statistics(model_name=model, as_json=True)
    totals = {"count": 0, **{k: 0 for k in STAT_FIELDS}}
    for version in stats.get("model_stats", []):
        inference = version.get("inference_stats", {})
        totals["count"] += int(inference.get("success", {}).get("count", 0))
        for key in STAT_FIELDS:
            totals[key] += int(inference.get(key, {}).get("ns", 0))
    return totals


def per_request_ms(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Average ms per request of each stage over the requests between two snapshots."""
    count = after["count"] - before["count"]
    if count <= 0:
        return {"triton_requests": 0}
    return {"triton_requests": count, **{col: (after[k] - before[k]) / count / 1e6 for k, col in STAT_FIELDS.items()}}


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


@dataclass
class _Samples:
    cpu: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    gpu: list[dict[str, float]] = field(default_factory=list)


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
    ):
        self.grpc_url, self.model, self.processes = grpc_url, model, processes
        self.gpu_uuids = list(gpu_uuids)  # the GPUs serving the model (tbench.serving); none: no GPU columns
        self.metrics_url = metrics_url if self.gpu_uuids else None
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples = _Samples()
        self._before: dict[str, int] | None = None
        self._energy_before: float | None = None

    def _client(self):
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url)

    def start(self) -> None:
        self._samples, self._stop = _Samples(), threading.Event()
        try:
            with self._client() as client:
                self._before = model_statistics(client, self.model)
        except Exception:
            self._before = None  # no statistics: the point is still measured, its stats columns stay empty
        self._energy_before = self._energy()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

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
        if self._thread:
            self._thread.join(timeout=5)
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
        if self._samples.cpu:
            row["server_cpu_pct"] = float(np.mean(self._samples.cpu))  # 100 = one core busy
            row["server_rss_mb"] = float(np.max(self._samples.rss))
        for column in GPU_METRICS.values():
            values = [s[column] for s in self._samples.gpu if column in s]
            if values:
                row[column] = float(np.mean(values)) if column != "gpu_mem_mb" else float(np.max(values))
        return row


class NoMonitor:
    def start(self) -> None: ...

    def stop(self) -> dict[str, float]:
        return {}
