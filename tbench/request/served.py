"""A request to measure a model someone else serves (`--served-model NAME[:VERSION]` with `--server-url`): which of a
BenchmarkRequest's fields apply (the others shape an export or a served config, which such a run does not make, and are
refused in one line), and the sweep it resolves to once the server has said how the model batches."""

from __future__ import annotations

from pydantic import BaseModel

from tbench.core.enums import Scenario
from tbench.core.errors import ConfigError
from tbench.request.benchmark import PROFILE_MEASUREMENT, PROFILES, BenchmarkRequest, Measurement
from tbench.request.load import arrival_load, checked_load
from tbench.request.server_options import cli_name

# fields that export a model or write its Triton config: the server already has the model as it serves it
# the options of a server tbench starts (a served model's server is someone else's; a repository's is ours)
SERVER_START_FIELDS = (
    "docker_image",
    "gpus",
    "docker_ulimits",
    "tritonserver",
    "backend_dir",
    "http_port",
    "grpc_port",
)
NOT_FOR_SERVED = (
    "model",
    "model_file",
    "framework",
    "size",
    "model_options",
    "checkpoint",
    "dataset",
    "formats",
    "serve_formats",
    "precision",
    "accelerators",
    "input_dtypes",
    "max_batch_size",
    "model_instances",
    "preferred_batch_sizes",
    "max_queue_delay_us",
    "accuracy_samples",
    "accuracy_batch_size",
    "tolerance_atol",
    "tolerance_rtol",
    "trt_shapes",
    "calibration_samples",
    *SERVER_START_FIELDS,
)
# the defaults a served model is swept with, by profile (the node's: a GPU node sweeps wider)
SERVED_BATCH_SIZES = {"cpu": [1, 2, 4, 8], "gpu": [1, 2, 4, 8, 16, 32, 64]}
SERVED_CONCURRENCY = {"cpu": [1, 2, 4, 8], "gpu": [1, 2, 4, 8, 16, 32, 64]}


def check_served(request: BenchmarkRequest) -> BenchmarkRequest:
    """The request as a served model's run reads it (the remote server it names), or one line naming the option that
    does not apply."""
    given = request.model_fields_set
    for field in NOT_FOR_SERVED:
        if field in given and getattr(request, field) not in (None, "fp32" if field == "precision" else None):
            raise ConfigError(
                f"{cli_name(field)} does not apply to --served-model: the server already serves the model as it is "
                "(nothing is exported, converted or configured)"
            )
    if request.server in ("local", "docker"):  # modes that start a server of tbench's own
        raise ConfigError(
            f"--served-model measures a model on a running server (--server-url): --server {request.server} starts one"
        )
    if not request.server_url:
        raise ConfigError("--served-model needs the server's address: --server-url HOST:GRPC_PORT[,HOST:HTTP_PORT]")
    return request.model_copy(update={"server": "remote"})


class ServedSweep(BaseModel):
    """What a served model's run measures, every default filled in."""

    profile: str
    scenarios: list[Scenario]
    batch_sizes: list[int]
    concurrency: list[int]
    online_batch_size: int
    request_rates: list[float]
    request_distribution: str
    measurement: Measurement


def resolve_served(request: BenchmarkRequest, max_batch_size: int, has_gpu: bool) -> ServedSweep:
    """The sweep for a model whose server batches up to `max_batch_size` (0: no batch axis, each request whole)."""
    profile = request.profile or ("gpu" if has_gpu else "cpu")
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    largest = max(max_batch_size, 1)
    batch_sizes = sorted(set(request.batch_sizes or [b for b in SERVED_BATCH_SIZES[profile] if b <= largest]))
    online_batch = request.online_batch_size or 1
    for label, values in (("batch size", batch_sizes), ("online batch size", [online_batch])):
        if too_big := [b for b in values if b > largest]:
            raise ConfigError(f"{label} {too_big[0]} is above the served model's max_batch_size {max_batch_size}")
        if any(b < 1 for b in values):
            raise ConfigError(f"{label}s must be >= 1, got {values}")
    scenarios = [Scenario.parse(s) for s in (request.scenarios or ["offline", "online"])]
    scenarios, rate_list, distribution = arrival_load(
        scenarios, request.request_rates, request.request_distribution, request.trace, request.trace_speeds
    )
    rates, concurrency = checked_load(scenarios, rate_list, request.concurrency or SERVED_CONCURRENCY[profile])
    base = PROFILE_MEASUREMENT[profile]
    return ServedSweep(
        profile=profile,
        scenarios=scenarios,
        batch_sizes=batch_sizes,
        concurrency=concurrency,
        online_batch_size=online_batch,
        request_rates=rates,
        request_distribution=distribution,
        measurement=request.measurement.apply(base) if request.measurement else base,
    )
