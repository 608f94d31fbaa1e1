"""One metric table: the tidy result columns (the published results' names), their perf_analyzer CSV source,
unit, scale, report header, direction and aggregation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    column: str  # tidy column, as in published_results.csv
    csv_header: str | None  # perf_analyzer CSV column it comes from
    header: str  # the reference guides' table header
    unit: str
    scale: float = 1.0  # perf_analyzer unit -> our unit (us -> ms)
    direction: str = "lower"  # which way is better
    aggregation: str = "mean"  # how repeated measurements combine


US_TO_MS = 1e-3

THROUGHPUT = Metric("throughput_infer_per_s", "Inferences/Second", "Inferences/second", "infer/s", 1.0, "higher", "max")
BREAKDOWN = [
    Metric("client_send_ms", "Client Send", "Client Send", "ms", US_TO_MS),
    Metric("network_server_send_recv_ms", "Network+Server Send/Recv", "Network+server Send/recv", "ms", US_TO_MS),
    Metric("server_queue_ms", "Server Queue", "Server Queue", "ms", US_TO_MS),
    Metric("server_compute_input_ms", "Server Compute Input", "Server Compute Input", "ms", US_TO_MS),
    Metric("server_compute_infer_ms", "Server Compute Infer", "Server Compute Infer", "ms", US_TO_MS),
    Metric("server_compute_output_ms", "Server Compute Output", "Server Compute Output", "ms", US_TO_MS),
    Metric("client_recv_ms", "Client Recv", "Client Recv", "ms", US_TO_MS),
]
PERCENTILES = [
    Metric("p50_ms", "p50 latency", "P50 Latency", "ms", US_TO_MS),
    Metric("p90_ms", "p90 latency", "P90 Latency", "ms", US_TO_MS),
    Metric("p95_ms", "p95 latency", "P95 Latency", "ms", US_TO_MS),
    Metric("p99_ms", "p99 latency", "P99 Latency", "ms", US_TO_MS),
]
# perf_analyzer writes it only with --verbose-csv; the guides' average equals the sum of the breakdown
AVG = Metric("avg_ms", "Avg latency", "Avg Latency", "ms", US_TO_MS)

METRICS: list[Metric] = [THROUGHPUT, *BREAKDOWN, *PERCENTILES, AVG]
BY_COLUMN = {m.column: m for m in METRICS}

# The columns of ../shared/reference/published_results.csv (a copy ships as tbench/data/published_results.csv).
PUBLISHED_COLUMNS = [
    "source_file",
    "model",
    "model_size",
    "scenario",
    "gpu",
    "backend",
    "model_format",
    "backend_accelerator",
    "precision",
    "max_batch_size",
    "model_instances",
    "batch_size",
    "concurrency",
    "sequence_length",
    *(m.column for m in METRICS),
]
# What a run adds per point: the format (our mnemonic; model_format is the guides' wording), how it was measured
# and whether it held.
MEASUREMENT_COLUMNS = [
    "format",
    "request_rate",
    "request_distribution",
    "status",
    "error",
    "attempts",
    "measurement_request_count",
    "window_s",  # how long one of the point's measurement windows lasted (its requests at the measured throughput)
    "window_requests",  # requests per stable window: one more or less at a window's edge is the throughput's resolution
    "stability_percentage",
    "max_trials",
    "shared_memory",
    "protocol",
    "measure_seconds",
    "point_index",
    "batching",  # what the server did with the point's requests: static (offline) or dynamic (the batcher under test)
    "max_queue_delay_us",  # the dynamic batcher's delay the point was served with (0 for static batching)
    "reused_from",  # the run that measured the point when a re-run took it from the point cache (tasks/point_cache.py)
]
# What the server did during the point (tasks/monitor.py): Triton's statistics API per request, its largest relative
# difference from perf_analyzer's server breakdown, the server's CPU (100 = one core) and memory, and GPU metrics.
SERVER_COLUMNS = [
    "triton_queue_ms",
    "triton_compute_input_ms",
    "triton_compute_infer_ms",
    "triton_compute_output_ms",
    "triton_requests",
    "stats_max_rel_diff",
    "server_cpu_pct",
    "server_rss_mb",
    "gpu_util_pct",
    "gpu_mem_mb",
    "gpu_power_w",
]
RESULT_COLUMNS = PUBLISHED_COLUMNS + MEASUREMENT_COLUMNS + SERVER_COLUMNS
