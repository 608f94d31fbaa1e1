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

# Every result column with what it is: the column lists below and the docs' results reference
# (docs/gen_reference.py) are read from here.
_METRIC_DESCRIPTIONS = {
    m.column: f"{m.header} ({m.unit}, perf_analyzer's {m.csv_header!r}; {m.direction} is better)" for m in METRICS
}
# The columns of ../shared/reference/published_results.csv (a copy ships as tbench/data/published_results.csv).
_PUBLISHED = {
    "source_file": "Where the row comes from: the perf_analyzer CSV of the point (a guide's file for published rows)",
    "model": "The model adapter's name, or the model file's",
    "model_size": "full (published dimensions), small or a model's preset",
    "scenario": "offline, online or rate",
    "gpu": "The GPU that ran the model, or CPU (a GPU that did not run it is not named)",
    "backend": "The Triton backend that served the model; python (RUNTIME) for the python-backend runtime",
    "model_format": "The served format in the guides' words (ONNX, TorchScript, TensorRT, ...)",
    "backend_accelerator": "The accelerator in the model config (TensorRT, Automatic FP16, ...), if any",
    "precision": "The precision actually served (FP32, FP16, INT8; an ensemble's parts joined by +)",
    "max_batch_size": "The model config's max_batch_size",
    "model_instances": "Instances of the model (instance_group count)",
    "batch_size": "The client's batch size per request",
    "concurrency": "Requests in flight (offline and online points)",
    "sequence_length": "A dynamic dim's measured value where the model has one",
}
# What a run adds per point: the format (our mnemonic; model_format is the guides' wording), how it was measured
# and whether it held.
_MEASUREMENT = {
    "format": "Our name of the served format (onnx, ts-trace, ts-script, tf-savedmodel, trt, tf-trt, ...)",
    "request_rate": "The offered request rate of a rate point, in requests/s",
    "request_distribution": "A rate point's arrivals: poisson or constant",
    "shapes": "The dynamic dims' measured shapes (input_ids=128; ...), `varies` where each request carried its own "
    "sample's; empty where no input has a dynamic dim",
    "input_data": "The given input data by content (sha256:...), or synthetic",
    "status": "ok, unstable (measured, not stable within the windows), behind (a rate point the server did not keep up "
    "with), client_bound (a rate point perf_analyzer could not send on time; the server kept up), undetermined (a rate "
    "point whose windows cannot tell whether it kept up: never read as ok) or error",
    "error": "Why a point is unstable or failed, in one line",
    "attempts": "perf_analyzer calls the point took (a retry has windows twice as long)",
    "measurement_request_count": "Requests per window asked of perf_analyzer in the attempt that counted",
    "window_s": "How long one of the point's measurement windows lasted (its requests at the measured throughput)",
    "window_requests": "Requests per stable window: one more or less at a window's edge is the throughput's resolution",
    "throughput_cv": "The point's own noise: the coefficient of variation of its throughput over the stable windows",
    "latency_cv": "The coefficient of variation of its average latency over the stable windows",
    "delayed_pct": "Of a rate point, the requests perf_analyzer could not send on schedule, in %",
    "arrivals_median_error_us": "Of a bursty or trace rate point, the median absolute difference between the intervals "
    "perf_analyzer sent at and its schedule's, in microseconds (from the exported requests)",
    "arrivals_p99_error_us": "The same difference's 99th percentile, in microseconds",
    "requests_from": "What a rate point's verdict (kept up or not) read: export (perf_analyzer's per-request export), "
    "server trace (Triton's per-request timestamps, for requests too large to export) or windows (neither: the "
    "windows' averages, a weaker test)",
    "stability_percentage": "The stability rule: the largest spread allowed over the last 3 windows, in %",
    "max_trials": "Windows perf_analyzer may try before giving up on the point",
    "shared_memory": "How tensors went to the server: system, cuda or none",
    "protocol": "grpc",
    "measure_seconds": "Wall seconds of the point's perf_analyzer calls",
    "point_index": "When the point ran in the sweep's (shuffled) order",
    "batching": "What the server did with the point's requests: static (offline) or dynamic (the batcher under test)",
    "max_queue_delay_us": "The dynamic batcher's delay the point was served with (0 for static batching)",
    "reused_from": "The run that measured the point when a re-run took it from the point cache (tasks/point_cache.py)",
    "trial": "Which of the run's trials measured the row (--trials: each trial a fresh server process; 1 otherwise)",
}
# What the server did during the point (tasks/monitor.py): Triton's statistics API per request, its largest relative
# difference from perf_analyzer's server breakdown, the server's CPU (100 = one core) and memory, and GPU metrics.
_SERVER = {
    "triton_queue_ms": "Queue time per request from Triton's statistics API, diffed over the point",
    "triton_compute_input_ms": "Compute input per request from Triton's statistics API",
    "triton_compute_infer_ms": "Compute infer per request from Triton's statistics API",
    "triton_compute_output_ms": "Compute output per request from Triton's statistics API",
    "triton_requests": "Requests Triton's statistics counted over the point",
    "triton_busy_ms": "Instance time per request from Triton's batch statistics: each execution's compute (input, "
    "infer, output) counted once, over the requests (the per-request stages charge each request its whole batch's)",
    "stats_max_rel_diff": "The largest relative difference between Triton's statistics and perf_analyzer's breakdown",
    "server_cpu_pct": "The server's processes' CPU over the point (100 = one core)",
    "server_rss_mb": "The server's processes' resident memory, in MB",
    "gpu_util_pct": "Mean utilisation of the serving GPUs from Triton's metrics (empty without a GPU)",
    "gpu_mem_mb": "Memory used on the serving GPUs, summed, in MB (empty without a GPU)",
    "gpu_power_w": "Power of the serving GPUs, summed, in W (empty without a GPU)",
    "gpu_energy_j": "Energy the serving GPUs drew for the point's requests, in J: the energy per request over the span "
    "requests were served (idle start-up and wind-down left out) times the requests Triton counted",
    "gpu_energy_uncertainty_j": "gpu_energy_j's uncertainty, in J: the energy counter's refresh interval at either end "
    "of the span",
    "gpu_energy_span_s": "The span the energy was taken over: the first to the last reading that saw requests served",
    "gpu_joules_per_request": "Energy per request served over that span, in J",
    "triton_hist_requests": "Requests the server's latency histogram counted over the point (empty where the server "
    "exposes none: Triton before the histogram, or started without `--metrics-config histogram_latencies=true`)",
    "triton_hist_mean_ms": "Request to first response per request, in ms: the histogram's sum over its count, diffed "
    "over the point",
    "triton_hist_p50_ms": "The server-side p50 of request to first response, in ms, placed by the histogram's buckets "
    "(interpolated in its bucket; empty where that bucket is more than 2x wide, as Triton's default ones are)",
    "triton_hist_p99_ms": "The server-side p99 the same way, in ms",
}
# A point's status (the `status` column): the vocabulary every reader of results imports
POINT_STATUSES = ("ok", "unstable", "behind", "client_bound", "undetermined", "error")
OK, UNSTABLE, UNDETERMINED = "ok", "unstable", "undetermined"

COLUMN_DESCRIPTIONS = {**_PUBLISHED, **_METRIC_DESCRIPTIONS, **_MEASUREMENT, **_SERVER}
PUBLISHED_COLUMNS = [*_PUBLISHED, *(m.column for m in METRICS)]
MEASUREMENT_COLUMNS = list(_MEASUREMENT)
SERVER_COLUMNS = list(_SERVER)
RESULT_COLUMNS = PUBLISHED_COLUMNS + MEASUREMENT_COLUMNS + SERVER_COLUMNS
