"""BenchmarkRequest: what a user asks for; `resolve()` fills the adapter's profile defaults and validates."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, Field

from tbench.enums import Format, Precision, Scenario
from tbench.errors import ConfigError

PROFILES = ("cpu", "gpu")

# What the embedded python-backend runtime can execute, per serving format.
PYTHON_BACKEND_RUNTIMES = {Format.ONNX: "onnxruntime", Format.TS_TRACE: "torchscript", Format.TS_SCRIPT: "torchscript",
                           Format.TF_SAVEDMODEL: "tensorflow"}


class Measurement(BaseModel):
    """perf_analyzer's stability settings (count_windows mode); an unstable point is retried with a longer window."""

    images_per_window: int = Field(24, ge=1, description="Inferences per measurement window; requests = this / batch size.")
    min_requests: int = Field(4, ge=1, description="Fewest requests in a window (and at least 2 x concurrency).")
    stability_percentage: float = Field(20.0, gt=0, description="Max spread of the last 3 windows' throughput and latency, in %.")
    max_trials: int = Field(5, ge=3, description="Windows perf_analyzer tries before giving up on a point.")
    retries: int = Field(1, ge=0, description="Retries of an unstable point, each with windows twice as long.")
    timeout_s: float = Field(300.0, gt=0, description="Hard limit per perf_analyzer call, in seconds.")
    warmup_requests: int = Field(2, ge=0, description="Requests per batch size sent before a sweep measures anything.")
    order: Literal["shuffled", "ascending"] = Field(
        "shuffled", description="Point order within a sweep: shuffled (seeded) so drift over time does not line up with the grid.")
    seed: int = Field(0, description="Seed of the shuffled order (the order is recorded per point).")

    def requests_per_window(self, batch_size: int, concurrency: int, attempt: int = 0) -> int:
        """Windows of about the same number of inferences whatever the batch, doubled on each retry."""
        base = max(self.min_requests, -(-self.images_per_window // batch_size), 2 * concurrency)
        return base * 2**attempt


# Correctness tolerances (atol, rtol) by precision: reduced precision legitimately moves outputs further.
DEFAULT_TOLERANCES = {Precision.FP32: (1e-3, 1e-3), Precision.FP16: (1e-2, 1e-2), Precision.INT8: (5e-2, 5e-2)}

# A GPU serves thousands of inferences per second: longer windows and the tighter stability perf_analyzer defaults to.
PROFILE_MEASUREMENT = {"cpu": Measurement(), "gpu": Measurement(images_per_window=2048, min_requests=50, stability_percentage=10.0, max_trials=10)}


def adapter_for(req: "BenchmarkRequest | ResolvedRequest"):
    """The model adapter a request names: a registered one, or one over a user's model file."""
    import model_adapters

    if req.model_file:
        from model_adapters.file_model import ModelFileAdapter

        adapter = ModelFileAdapter(req.model_file, req.shapes, req.input_dtypes, req.value_ranges)
    else:
        if req.value_ranges:
            raise ConfigError(f"--value-range shapes a model file's synthetic data; model {req.model!r} makes its own "
                              "(give --input-data PATH or --dataset DIR instead)")
        adapter = model_adapters.get(req.model, req.size, req.checkpoint, req.framework, req.dataset, req.profile, req.model_options)
    if req.input_data:
        if req.dataset:
            raise ConfigError("give --dataset or --input-data, not both")
        adapter.use_input_data(req.input_data)
    return adapter


class BenchmarkRequest(BaseModel):
    model: str = Field("resnet50", description="Registered model adapter name (ignored with model_file).")
    framework: str | None = Field(None, description="The model's implementation: 'pytorch' or 'tensorflow'; the adapter's first by default.")
    model_file: str | None = Field(None, description="Benchmark this ONNX file, TorchScript file or TF SavedModel folder instead of an adapter.")
    shapes: dict[str, list[int]] | None = Field(None, description="model_file: non-batch shape per input, for dynamic dims (or TorchScript).")
    input_dtypes: dict[str, str] | None = Field(None, description="model_file: numpy dtype per input where the file does not say (TorchScript).")
    input_data: str | None = Field(None, description="Samples every stage sends instead of synthetic data: perf_analyzer's JSON "
                                   "input data, an .npz with one array per input or a folder of NAME.npy files (samples on axis 0).")
    value_ranges: dict[str, list[float]] | None = Field(None, description="model_file: [LO, HI] per input for its synthetic "
                                                        "data (integers LO..HI inclusive, floats uniform), e.g. {'token_type_ids': [0, 1]}.")
    size: str | None = Field(None, description="Model size: 'full' (published dimensions), 'small', or the model's presets; the model's default when empty.")
    model_options: dict[str, str | float | int] | None = Field(None, description="Model-specific options, e.g. {'memory_threshold_gb': 16} for dlrm.")
    checkpoint: str | None = Field(None, description="Weights to load; random weights when empty.")
    dataset: str | None = Field(None, description="The dataset folder as the guide's preprocessing leaves it; synthetic data when empty.")
    profile: str | None = Field(None, description="'cpu' (quick, scaled down) or 'gpu' (the guide's grid); auto by hardware.")
    formats: list[str] | None = Field(None, description="Formats to export and check, e.g. ['onnx', 'ts-trace'].")
    serve_formats: list[str] | None = Field(None, description="Formats served by Triton and measured, each as its own model; "
                                            "the first format by default; ['all'] for every exported format.")
    precision: str = Field("fp32", description="Precision of the served model.")
    accelerators: dict[str, str] | None = Field(None, description="GPU execution accelerator per served format where served natively, "
                                                "e.g. {'tf-savedmodel': 'auto_mixed_precision'}; the guide's by default.")
    max_batch_size: int | None = Field(None, ge=1)
    model_instances: int | None = Field(None, ge=1)
    preferred_batch_sizes: list[int] | None = None
    max_queue_delay_us: int | None = Field(None, ge=0)
    batch_sizes: list[int] | None = Field(None, description="Offline scenario batch sizes (concurrency 1).")
    concurrency: list[int] | None = Field(None, description="Online scenario concurrency values.")
    online_batch_size: int | None = Field(None, ge=1, description="Samples per request in the online and rate scenarios; the model's default (1 for most).")
    scenarios: list[str] | None = Field(None, description="offline, online, and rate (open-loop requests at request_rates); the model's guide's by default.")
    request_rates: list[float] | None = Field(None, description="Rate scenario: requests per second, e.g. [10, 20, 40].")
    request_distribution: Literal["constant", "poisson"] = Field("poisson", description="Rate scenario: request arrivals.")
    accuracy_samples: int | None = Field(None, ge=1)
    accuracy_batch_size: int | None = Field(None, ge=1, description="Samples per request of the accuracy stage; the model's default, at most max_batch_size.")
    measurement: Measurement | None = Field(None, description="perf_analyzer stability settings; the profile's by default.")
    output: str = Field(default_factory=lambda: os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"),
                        description="Artifact root: a local folder or any fsspec URL (s3://bucket/prefix); the worker's "
                                    "TBENCH_ARTIFACT_ROOT, else 'runs'.")
    reuse_measurements: bool = Field(False, description="Take points this machine already measured with the same model, "
                                     "configuration, settings and inputs from the point cache instead of measuring them "
                                     "again (an interrupted run resumes; the results' reused_from says which run measured them).")
    baseline: str | None = Field(None, description="A run folder or URL to compare this run with: per-point deltas and a "
                                 "noise-aware regression verdict in the report and the manifest.")
    server: Literal["embedded", "local", "docker", "remote"] = Field(
        default_factory=lambda: os.environ.get("TBENCH_SERVER", "embedded"),
        description="embedded (pytriton's binary), local (tritonserver on PATH), docker (NGC image), remote (by URL); "
                    "the worker's TBENCH_SERVER (the worker image: local), else embedded.")
    server_url: str | None = Field(None, description="remote: 'host:grpc_port,host:http_port' of a server in explicit model control mode.")
    docker_image: str | None = Field(None, description="docker: the Triton image (NGC's 24.10 by default).")
    gpus: str | None = Field(None, description="docker: GPUs for the container: 'all' (the default), '0,1', or 'none'.")
    tritonserver: str | None = Field(None, description="local: the tritonserver binary (the one on PATH by default).")
    backend_dir: str | None = Field(None, description="local: the server's backend directory (/opt/tritonserver/backends).")
    http_port: int | None = Field(None, description="Fixed HTTP port for Triton; a free one by default.")
    grpc_port: int | None = Field(None, description="Fixed gRPC port for Triton; a free one by default.")
    tolerance_atol: float | None = Field(None, description="Correctness: absolute tolerance (plus rtol x max|ref|); by precision.")
    tolerance_rtol: float | None = Field(None, description="Correctness: tolerance relative to the output's max magnitude; by precision.")

    @staticmethod
    def _default_measurement(profile: str, images_per_window: int | None) -> Measurement:
        base = PROFILE_MEASUREMENT[profile]
        return base.model_copy(update={"images_per_window": images_per_window}) if images_per_window else base

    def resolve(self, has_gpu: bool) -> "ResolvedRequest":
        adapter = adapter_for(self)
        adapter.check_resources()
        profile = self.profile or ("gpu" if has_gpu else "cpu")
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
        d = adapter.defaults(profile)
        formats = [Format.parse(f) for f in (self.formats or d.formats)]
        if adapter.is_ensemble:  # served as its composing models, each in its part's format
            serve = [Format.ENSEMBLE]
            if self.serve_formats and [Format.parse(f) for f in self.serve_formats if f != "all"] not in ([], serve):
                raise ConfigError(f"model {adapter.name!r} is served as a Triton ensemble of its parts; serve_formats can only be 'ensemble'")
        elif self.serve_formats and [s.strip().lower() for s in self.serve_formats] == ["all"]:
            serve = list(formats)
        else:
            serve = [Format.parse(f) for f in (self.serve_formats or [formats[0]])]
        if Format.ENSEMBLE in formats or (Format.ENSEMBLE in serve and not adapter.is_ensemble):
            raise ConfigError(f"model {adapter.name!r} is not an ensemble; 'ensemble' is the format of models served as their parts (dlrm, dcnv2)")
        formats += [f for f in serve if f not in formats and f is not Format.ENSEMBLE]
        for fmt in (f for f in serve if f is not Format.ENSEMBLE):
            if self.server == "embedded" and fmt not in PYTHON_BACKEND_RUNTIMES:
                known = ", ".join(f.value for f in PYTHON_BACKEND_RUNTIMES)
                raise ConfigError(f"format {fmt.value!r} cannot be served by the embedded server (python backend); use one of: {known}")
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
        scenarios = [Scenario.parse(s) for s in (self.scenarios or d.scenarios)]
        online_batch = self.online_batch_size or d.online_batch_size
        if online_batch > max_batch and (Scenario.ONLINE in scenarios or Scenario.RATE in scenarios):
            raise ConfigError(f"online batch size {online_batch} is above max_batch_size {max_batch}")
        rates = sorted(set(self.request_rates or []))
        if Scenario.RATE in scenarios and not rates:
            raise ConfigError("the rate scenario needs request rates, e.g. request_rates=[10, 20] (--request-rates 10,20)")
        if any(r <= 0 for r in rates):
            raise ConfigError(f"request rates must be > 0, got {rates}")
        concurrency = sorted(set(self.concurrency or d.online_concurrency))
        if any(c < 1 for c in concurrency):
            raise ConfigError(f"concurrency values must be >= 1, got {concurrency}")
        resolved = dict(
            model=adapter.name,
            size=adapter.size,
            framework=adapter.framework,
            profile=profile,
            formats=formats,
            serve_formats=list(dict.fromkeys(serve)),
            precision=precision,
            accelerators=self.accelerators if self.accelerators is not None else (d.gpu_accelerators if profile == "gpu" else {}),
            scenarios=scenarios,
            online_batch_size=online_batch,
            request_rates=rates,
            max_batch_size=max_batch,
            model_instances=self.model_instances or d.model_instances,
            preferred_batch_sizes=preferred,
            max_queue_delay_us=d.max_queue_delay_us if self.max_queue_delay_us is None else self.max_queue_delay_us,
            batch_sizes=batch_sizes,
            concurrency=concurrency,
            accuracy_samples=self.accuracy_samples or d.accuracy_samples,
            accuracy_batch_size=min(self.accuracy_batch_size or d.accuracy_batch_size, max_batch),
            measurement=self.measurement or self._default_measurement(profile, d.images_per_window),
            tolerance_atol=DEFAULT_TOLERANCES[precision][0] if self.tolerance_atol is None else self.tolerance_atol,
            tolerance_rtol=DEFAULT_TOLERANCES[precision][1] if self.tolerance_rtol is None else self.tolerance_rtol,
        )
        # fields the user gave as they are (ports, output, tolerances...), the resolved ones over them
        return ResolvedRequest(**{**self.model_dump(exclude=set(resolved)), **resolved})


class ResolvedRequest(BaseModel):
    """A request with every default filled in and every value checked: what the stages read."""

    model: str
    size: str
    model_options: dict[str, str | float | int] | None
    framework: str
    model_file: str | None
    shapes: dict[str, list[int]] | None
    input_dtypes: dict[str, str] | None
    input_data: str | None = None
    value_ranges: dict[str, list[float]] | None = None
    checkpoint: str | None
    dataset: str | None
    profile: str
    formats: list[Format]
    serve_formats: list[Format]
    precision: Precision
    accelerators: dict[str, str]
    max_batch_size: int
    model_instances: int
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    batch_sizes: list[int]
    concurrency: list[int]
    online_batch_size: int
    scenarios: list[Scenario]
    request_rates: list[float]
    request_distribution: str
    accuracy_samples: int
    accuracy_batch_size: int
    measurement: Measurement
    output: str
    baseline: str | None
    reuse_measurements: bool
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

    def triton_name(self, fmt: Format) -> str:
        """The Triton model name of a served format: the model's name, suffixed when several formats are served."""
        return self.model if len(self.serve_formats) == 1 else f"{self.model}_{fmt.value.replace('-', '_')}"

    def part_name(self, part: str) -> str:
        """The Triton model name of an ensemble's composing model."""
        return f"{self.model}_{part}"
