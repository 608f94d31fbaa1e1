"""BenchmarkRequest: what a user asks for; `resolve()` fills the adapter's profile defaults and validates."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tbench.enums import Format, Precision, Scenario
from tbench.errors import ConfigError

PROFILES = ("cpu", "gpu")

# What the embedded python-backend runtime can execute, per serving format.
PYTHON_BACKEND_RUNTIMES = {Format.ONNX: "onnxruntime", Format.TS_TRACE: "torchscript", Format.TS_SCRIPT: "torchscript"}


class Measurement(BaseModel):
    """perf_analyzer's stability settings (count_windows mode); an unstable point is retried with a longer window."""

    images_per_window: int = Field(24, ge=1, description="Inferences per measurement window; requests = this / batch size.")
    min_requests: int = Field(4, ge=1, description="Fewest requests in a window (and at least 2 x concurrency).")
    stability_percentage: float = Field(20.0, gt=0, description="Max spread of the last 3 windows' throughput and latency, in %.")
    max_trials: int = Field(5, ge=3, description="Windows perf_analyzer tries before giving up on a point.")
    retries: int = Field(1, ge=0, description="Retries of an unstable point, each with windows twice as long.")
    timeout_s: float = Field(300.0, gt=0, description="Hard limit per perf_analyzer call, in seconds.")

    def requests_per_window(self, batch_size: int, concurrency: int, attempt: int = 0) -> int:
        """Windows of about the same number of inferences whatever the batch, doubled on each retry."""
        base = max(self.min_requests, -(-self.images_per_window // batch_size), 2 * concurrency)
        return base * 2**attempt


# A GPU serves thousands of inferences per second: longer windows and the tighter stability perf_analyzer defaults to.
PROFILE_MEASUREMENT = {"cpu": Measurement(), "gpu": Measurement(images_per_window=2048, min_requests=50, stability_percentage=10.0, max_trials=10)}


class BenchmarkRequest(BaseModel):
    model: str = Field("resnet50", description="Registered model adapter name.")
    size: str = Field("full", description="Model size: 'full' (published dimensions) or 'small'.")
    checkpoint: str | None = Field(None, description="Weights to load; random weights when empty.")
    profile: str | None = Field(None, description="'cpu' (quick, scaled down) or 'gpu' (the guide's grid); auto by hardware.")
    formats: list[str] | None = Field(None, description="Formats to export and check, e.g. ['onnx', 'ts-trace'].")
    serve_format: str | None = Field(None, description="Format served by Triton and measured; the first format by default.")
    precision: str = Field("fp32", description="Precision of the served model.")
    max_batch_size: int | None = Field(None, ge=1)
    model_instances: int | None = Field(None, ge=1)
    preferred_batch_sizes: list[int] | None = None
    max_queue_delay_us: int | None = Field(None, ge=0)
    batch_sizes: list[int] | None = Field(None, description="Offline scenario batch sizes (concurrency 1).")
    concurrency: list[int] | None = Field(None, description="Online scenario concurrency values (batch 1).")
    scenarios: list[str] = Field(default_factory=lambda: ["offline", "online"])
    accuracy_samples: int | None = Field(None, ge=1)
    measurement: Measurement | None = Field(None, description="perf_analyzer stability settings; the profile's by default.")
    output: str = Field("runs", description="Artifact root: a local folder or any fsspec URL.")
    server: Literal["embedded", "local", "docker", "remote"] = Field(
        "embedded", description="embedded (pytriton's binary), local (tritonserver on PATH), docker (NGC image), remote (by URL).")
    server_url: str | None = Field(None, description="remote: 'host:grpc_port,host:http_port' of a server in explicit model control mode.")
    docker_image: str | None = Field(None, description="docker: the Triton image (NGC's 24.10 by default).")
    gpus: str | None = Field(None, description="docker: GPUs for the container: 'all' (the default), '0,1', or 'none'.")
    tritonserver: str | None = Field(None, description="local: the tritonserver binary (the one on PATH by default).")
    backend_dir: str | None = Field(None, description="local: the server's backend directory (/opt/tritonserver/backends).")
    http_port: int | None = Field(None, description="Fixed HTTP port for Triton; a free one by default.")
    grpc_port: int | None = Field(None, description="Fixed gRPC port for Triton; a free one by default.")
    tolerance_atol: float = Field(1e-3, description="Correctness: absolute tolerance (plus rtol x max|ref|).")
    tolerance_rtol: float = Field(1e-3, description="Correctness: tolerance relative to the output's max magnitude.")

    def resolve(self, has_gpu: bool) -> "ResolvedRequest":
        import model_adapters

        adapter = model_adapters.get(self.model, self.size, self.checkpoint)
        profile = self.profile or ("gpu" if has_gpu else "cpu")
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
        d = adapter.defaults(profile)
        formats = [Format.parse(f) for f in (self.formats or d.formats)]
        serve = Format.parse(self.serve_format) if self.serve_format else formats[0]
        if serve not in formats:
            formats.append(serve)
        if self.server == "embedded" and serve not in PYTHON_BACKEND_RUNTIMES:
            known = ", ".join(f.value for f in PYTHON_BACKEND_RUNTIMES)
            raise ConfigError(f"format {serve.value!r} cannot be served by the embedded server (python backend); use one of: {known}")
        precision = Precision.parse(self.precision)
        if precision is not Precision.FP32 and not has_gpu and self.server in ("embedded", "local"):
            raise ConfigError(f"precision {precision.value} needs a GPU; this machine has none (use fp32)")
        max_batch = self.max_batch_size or d.max_batch_size
        batch_sizes = sorted(set(self.batch_sizes or d.offline_batch_sizes))
        preferred = sorted(set(self.preferred_batch_sizes or [b for b in d.preferred_batch_sizes if b <= max_batch]))
        for label, values in (("batch size", batch_sizes), ("preferred batch size", preferred)):
            too_big = [b for b in values if b > max_batch]
            if too_big:
                raise ConfigError(f"{label} {too_big[0]} is above max_batch_size {max_batch}")
            if any(b < 1 for b in values):
                raise ConfigError(f"{label}s must be >= 1, got {values}")
        concurrency = sorted(set(self.concurrency or d.online_concurrency))
        if any(c < 1 for c in concurrency):
            raise ConfigError(f"concurrency values must be >= 1, got {concurrency}")
        resolved = dict(
            profile=profile,
            formats=formats,
            serve_format=serve,
            precision=precision,
            scenarios=[Scenario.parse(s) for s in self.scenarios],
            max_batch_size=max_batch,
            model_instances=self.model_instances or d.model_instances,
            preferred_batch_sizes=preferred,
            max_queue_delay_us=d.max_queue_delay_us if self.max_queue_delay_us is None else self.max_queue_delay_us,
            batch_sizes=batch_sizes,
            concurrency=concurrency,
            accuracy_samples=self.accuracy_samples or d.accuracy_samples,
            measurement=self.measurement or PROFILE_MEASUREMENT[profile],
        )
        # fields the user gave as they are (ports, output, tolerances...), the resolved ones over them
        return ResolvedRequest(**{**self.model_dump(exclude=set(resolved)), **resolved})


class ResolvedRequest(BaseModel):
    """A request with every default filled in and every value checked: what the stages read."""

    model: str
    size: str
    checkpoint: str | None
    profile: str
    formats: list[Format]
    serve_format: Format
    precision: Precision
    max_batch_size: int
    model_instances: int
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    batch_sizes: list[int]
    concurrency: list[int]
    scenarios: list[Scenario]
    accuracy_samples: int
    measurement: Measurement
    output: str
    server: str
    server_url: str | None
    docker_image: str | None
    gpus: str | None
    tritonserver: str | None
    backend_dir: str | None
    http_port: int | None
    grpc_port: int | None
    tolerance_atol: float
    tolerance_rtol: float
