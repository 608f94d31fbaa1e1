"""BenchmarkRequest: what a user asks for; `resolve()` fills the adapter's profile defaults and validates."""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tbench.core.enums import Format, Precision, Scenario
from tbench.core.errors import ConfigError
from tbench.core.precision import GPU_BUILT, check_precision
from tbench.request.adapter import adapter_for, adapter_notes  # noqa: F401  (flows.benchmark reads both from here)
from tbench.request.load import arrival_load, check_trace, checked_load
from tbench.request.measurement import PROFILE_MEASUREMENT, Measurement, MeasurementOverrides
from tbench.request.server_options import check_server_options
from tbench.request.trt_profiles import (
    DEFAULT_CALIBRATION_SAMPLES,
    check_calibration_samples,
    check_trt_shapes,
    opt_batch_size,
)

PROFILES = ("cpu", "gpu")

# What the embedded python-backend runtime can execute, per serving format.
PYTHON_BACKEND_RUNTIMES = {
    Format.ONNX: "onnxruntime",
    Format.TS_TRACE: "torchscript",
    Format.TS_SCRIPT: "torchscript",
    Format.PT2: "aoti",  # the package loaded by torch._inductor.aoti_load_package
    Format.TF_SAVEDMODEL: "tensorflow",
}

# A remote server is shared: a run loads its models there under names of its own (plain name + this suffix), so it
# can neither replace nor unload someone else's model of the same name.
RUN_SUFFIX = re.compile(r"__tb[0-9a-f]{8}$")


def run_suffix() -> str:
    return f"__tb{uuid.uuid4().hex[:8]}"


def plain_name(name: str) -> str:
    """A Triton model name without a run's suffix: what results and reports show."""
    return RUN_SUFFIX.sub("", name)


# Correctness tolerances (atol, rtol) by precision: reduced precision legitimately moves outputs further.
DEFAULT_TOLERANCES = {Precision.FP32: (1e-3, 1e-3), Precision.FP16: (1e-2, 1e-2), Precision.INT8: (5e-2, 5e-2)}


def has_credentials(url: str) -> bool:
    """True when a URL (or each of a comma-separated list of host:port, as server_url is) holds user:password@."""
    for part in url.split(","):
        authority = part.split("://", 1)[1] if "://" in part else part
        userinfo, at, _ = authority.split("/", 1)[0].rpartition("@")
        if at and ":" in userinfo:
            return True
    return False


MAX_TRIALS = 50  # --trials: server processes per point


class SessionRound(BaseModel):
    """A run's place in an A/B session (`tbench run --against`): the baseline's and the candidate's runs measured
    round by round, back to back, so that a drift of the machine hits both alike and `tbench compare` can pair them."""

    id: str
    side: Literal["baseline", "candidate"]
    round: int = Field(ge=1)


class BenchmarkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a misspelt field is an error, not ignored

    model: str = Field("resnet50", description="Registered model adapter name (ignored with model_file).")
    framework: str | None = Field(
        None, description="The model's implementation: 'pytorch' or 'tensorflow'; the adapter's first by default."
    )
    model_file: str | None = Field(
        None, description="Benchmark this ONNX file, TorchScript file or TF SavedModel folder instead of an adapter."
    )
    shapes: dict[str, list[int]] | None = Field(
        None, description="model_file: non-batch shape per input, for dynamic dims (or TorchScript)."
    )
    input_dtypes: dict[str, str] | None = Field(
        None, description="model_file: numpy dtype per input where the file does not say (TorchScript)."
    )
    input_data: str | None = Field(
        None,
        description="Samples every stage sends instead of synthetic data: perf_analyzer's JSON "
        "input data, an .npz with one array per input or a folder of NAME.npy files (samples on axis 0).",
    )
    value_ranges: dict[str, list[float]] | None = Field(
        None,
        description="model_file: [LO, HI] per input for its synthetic "
        "data (integers LO..HI inclusive, floats uniform), e.g. {'token_type_ids': [0, 1]}.",
    )
    size: str | None = Field(
        None,
        description="Model size: 'full' (published dimensions), 'small', or the model's presets; "
        "the model's default when empty.",
    )
    model_options: dict[str, str | float | int] | None = Field(
        None, description="Model-specific options, e.g. {'memory_threshold_gb': 16} for dlrm."
    )
    checkpoint: str | None = Field(None, description="Weights to load; random weights when empty.")
    dataset: str | None = Field(
        None, description="The dataset folder as the guide's preprocessing leaves it; synthetic data when empty."
    )
    profile: str | None = Field(
        None, description="'cpu' (quick, scaled down) or 'gpu' (the guide's grid); auto by hardware."
    )
    formats: list[str] | None = Field(None, description="Formats to export and check, e.g. ['onnx', 'ts-trace'].")
    serve_formats: list[str] | None = Field(
        None,
        description="Formats served by Triton and measured, each as its own model; "
        "the first format by default; ['all'] for every exported format.",
    )
    precision: str = Field("fp32", description="Precision of the served model.")
    accelerators: dict[str, str] | None = Field(
        None,
        description="GPU execution accelerator per served format where served natively, "
        "e.g. {'tf-savedmodel': 'auto_mixed_precision'}; the guide's by default.",
    )
    max_batch_size: int | None = Field(None, ge=1)
    model_instances: int | None = Field(None, ge=1)
    preferred_batch_sizes: list[int] | None = None
    max_queue_delay_us: int | None = Field(None, ge=0)
    batch_sizes: list[int] | None = Field(None, description="Offline scenario batch sizes (concurrency 1).")
    concurrency: list[int] | None = Field(None, description="Online scenario concurrency values.")
    online_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per request in the online and rate scenarios; the model's default (1 for most).",
    )
    scenarios: list[str] | None = Field(
        None,
        description="offline, online, and rate (open-loop requests at request_rates); the model's guide's by default.",
    )
    request_rates: list[float] | None = Field(
        None, description="Rate scenario: requests per second, e.g. [10, 20, 40]."
    )
    request_distribution: Literal["constant", "poisson", "gamma"] = Field(
        "poisson", description="Rate scenario: request arrivals (gamma: bursty, its intervals' CV the burstiness)."
    )
    burstiness: float = Field(
        2.0, gt=0, le=20, description="gamma arrivals: the CV of the intervals (1: Poisson; above 1, bursts and lulls)."
    )
    trace: str | None = Field(
        None,
        description="Rate scenario: replay this trace of request timestamps (a CSV with a timestamp column in "
        "seconds, JSONL of {timestamp}, or one per line), or a rate schedule 'ramp:RATE:SECONDS,RATE:SECONDS,...' "
        "(Poisson at each rate for its seconds), through perf_analyzer's custom intervals, at each trace_speeds.",
    )
    trace_speeds: list[float] | None = Field(
        None, description="trace: the speed-ups it is replayed at ([1.0] by default; 2.0 sends it twice as fast)."
    )
    accuracy_samples: int | None = Field(None, ge=1)
    accuracy_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per request of the accuracy stage; the model's default, at most max_batch_size.",
    )
    measurement: MeasurementOverrides | None = Field(
        None,
        description="perf_analyzer measurement settings to change; "
        "the profile's and the model's hold for every field not given.",
    )
    trials: int = Field(
        1,
        ge=1,
        le=MAX_TRIALS,
        description="Each point measured in this many separate server processes (a fresh server per trial); the "
        "spread between trials is the run-to-run noise that `tbench compare` and the history judge by. 1: one "
        "trial, the run-to-run spread unknown.",
    )
    session: SessionRound | None = Field(
        None, description="Set by `tbench run --against`: this run's side and round in its A/B session."
    )
    direct: bool = Field(
        False,
        description="Also run each exported model directly in its own runtime, in tbench's process (ONNX Runtime, "
        "TorchScript, an AOTInductor package; the served device and threads) at the offline batch sizes: the "
        "framework's own ceiling, reported beside each offline point as Triton / direct (direct.csv).",
    )
    pin_cpus: bool = Field(
        True,
        description="Place the server and perf_analyzer on disjoint CPU sets where the node has enough cores, and "
        "fix the runtimes' thread counts; the placement is recorded in the manifest.",
    )
    output: str = Field(
        default_factory=lambda: os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"),
        description="Artifact root: a local folder or any fsspec URL (s3://bucket/prefix); the worker's "
        "TBENCH_ARTIFACT_ROOT, else 'runs'.",
    )
    reuse_measurements: bool = Field(
        False,
        description="Take points this machine already measured with the same model, "
        "configuration, settings and inputs from the point cache instead of measuring them "
        "again (an interrupted run resumes; the results' reused_from says which run measured them).",
    )
    baseline: str | None = Field(
        None,
        description="A run folder or URL to compare this run with: per-point deltas and a "
        "noise-aware regression verdict in the report and the manifest.",
    )
    server: Literal["embedded", "local", "docker", "remote"] = Field(
        default_factory=lambda: os.environ.get("TBENCH_SERVER", "embedded"),
        description="embedded (pytriton's binary), local (tritonserver on PATH), docker (NGC image), remote (by URL); "
        "the worker's TBENCH_SERVER (the worker image: local), else embedded.",
    )
    server_url: str | None = Field(
        None,
        description="remote: 'host:grpc_port,host:http_port' of a server in explicit model control mode; with "
        "served_model, of the server that serves it (any model control mode).",
    )
    served_model: str | None = Field(
        None,
        description="Measure this model where a running server (server_url) serves it, NAME or NAME:VERSION: its "
        "inputs and batching read from the server, nothing exported, loaded or changed.",
    )
    repository: str | None = Field(
        None,
        description="Measure a model of this Triton model repository (<model>/config.pbtxt and version folders), "
        "served from a copy on tbench's own server with its config as written; the folder is never changed.",
    )
    repository_model: str | None = Field(
        None,
        description="repository: the model to measure, NAME or NAME:VERSION (by default the newest version its "
        "version policy serves), with every model its ensemble steps name.",
    )
    docker_image: str | None = Field(None, description="docker: the Triton image (NGC's 24.10 by default).")
    gpus: str | None = Field(None, description="docker: GPUs for the container: 'all' (the default), '0,1', or 'none'.")
    docker_network: Literal["host", "bridge"] = Field(
        "host",
        description="docker: host (the guides' --network=host; the server listens on 127.0.0.1 only) or bridge "
        "(Triton's ports published on 127.0.0.1 only, through docker's proxy).",
    )
    docker_ulimits: list[str] | None = Field(
        None,
        description="docker: the container's ulimits as docker takes them (NAME=SOFT[:HARD]); NGC's advice "
        "(memlock=-1, stack=67108864) by default; an empty list sets none (for a daemon that may not "
        "raise them).",
    )
    tritonserver: str | None = Field(None, description="local: the tritonserver binary (the one on PATH by default).")
    backend_dir: str | None = Field(
        None, description="local: the server's backend directory (/opt/tritonserver/backends)."
    )
    http_port: int | None = Field(
        None, ge=1, le=65535, description="Fixed HTTP port for Triton; a free one by default."
    )
    grpc_port: int | None = Field(
        None, ge=1, le=65535, description="Fixed gRPC port for Triton; a free one by default."
    )
    tolerance_atol: float | None = Field(
        None, ge=0, description="Correctness: absolute tolerance (plus rtol x max|ref|); by precision."
    )
    tolerance_rtol: float | None = Field(
        None, ge=0, description="Correctness: tolerance relative to the output's max magnitude; by precision."
    )
    trt_shapes: dict[str, list[list[int]]] | None = Field(
        None,
        description="TensorRT's optimisation profile for inputs with dynamic non-batch dims: the non-batch MIN, "
        "OPT and MAX shapes per input (static dims as the io spec has them), e.g. "
        "{'input_ids': [[16], [128], [512]]}; a dynamic dim is pinned to the sample's size "
        "otherwise.",
    )
    calibration_samples: int | None = Field(
        None,
        ge=1,
        description="INT8 (trt, tf-trt): samples of the model's data (--input-data or --dataset when "
        "given, else synthetic) calibrated on, in batches of the profile's opt batch (the "
        "largest offline batch size <= max_batch_size/2); the remainder short of a batch is "
        f"dropped; {DEFAULT_CALIBRATION_SAMPLES}, or one batch where that is larger, by "
        "default.",
    )

    @field_validator("output", "baseline", "server_url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        # these land in request.json, the manifest and Prefect's parameters; credentials come from the environment
        # or TBENCH_STORAGE_BLOCK (tbench.storage). The message does not repeat the value.
        if value and has_credentials(value):
            raise ValueError(
                "a URL with a user:password@ part; give credentials through the environment "
                "(AWS_ACCESS_KEY_ID...) or TBENCH_STORAGE_BLOCK, never in a URL that is written down"
            )
        return value

    def _measurement(self, profile: str, model_settings: dict) -> Measurement:
        """The profile's settings, then the model's (a slow model's shorter windows), then each field the user set."""
        base = PROFILE_MEASUREMENT[profile].model_copy(update=model_settings)
        return self.measurement.apply(base) if self.measurement else base

    def _check_engine_options(
        self, adapter, formats: list[Format], precision: Precision, batch_sizes: list[int], max_batch: int
    ) -> None:
        """trt_shapes against the io spec, and a calibration set of at least one batch, where TensorRT builds."""
        parts = [Format.parse(f) for fs in adapter.part_formats().values() for f in fs]
        builds = any(f in GPU_BUILT for f in [*formats, *parts])
        if self.trt_shapes:
            if adapter.is_ensemble:
                raise ConfigError(
                    f"--trt-shape: model {adapter.name!r} is an ensemble; its parts' TensorRT profiles "
                    "take their samples' shapes"
                )
            if not builds:
                raise ConfigError(
                    "--trt-shape shapes TensorRT's optimisation profile; this run builds no trt or tf-trt model"
                )
            check_trt_shapes(adapter.io_spec(), self.trt_shapes)
        if self.calibration_samples and builds and precision is Precision.INT8:
            check_calibration_samples(self.calibration_samples, opt_batch_size(batch_sizes, max_batch))

    def _check_unbatched(self, adapter) -> None:
        """A model without a batch axis is served with max_batch_size 0: each request is one call at the model's own
        shapes, so the options that batch are refused, each in one line."""
        why = (
            f"model {adapter.name!r} has no batch axis (the first dim of its tensors is fixed), so Triton serves it "
            "with max_batch_size 0 and each request is the model's own batch"
        )
        given = {
            "--max-batch-size": self.max_batch_size,
            "--preferred-batch-sizes": self.preferred_batch_sizes,
            "--queue-delay-us": self.max_queue_delay_us,
            "--accuracy-batch-size": self.accuracy_batch_size not in (None, 1) and self.accuracy_batch_size,
        }
        for flag, value in given.items():
            if value:
                raise ConfigError(f"{flag}: {why}; drop {flag}")
        if self.batch_sizes and set(self.batch_sizes) != {1}:
            raise ConfigError(f"--batch-sizes: {why}; the offline scenario measures batch 1 only: drop --batch-sizes")
        if (self.online_batch_size or 1) != 1:
            raise ConfigError(f"--online-batch-size: {why}; drop --online-batch-size")

    def _check_varying(self, given, batch_sizes: list[int]) -> list[int]:
        """Samples of varying shapes go one per request, each at its own shape: perf_analyzer batches only samples of
        one shape, so the offline scenario measures batch 1, and a batch the user asks for is refused."""
        name, spread = next(iter(given.distribution().items()))
        why = (
            f"the samples of {name} in {given.path} vary in shape ({spread}): each request carries one sample at its "
            "own shape, as perf_analyzer cannot batch samples of different shapes"
        )
        if self.batch_sizes and set(self.batch_sizes) != {1}:
            raise ConfigError(f"--batch-sizes: {why}; drop --batch-sizes, or give samples padded to one length")
        if (self.online_batch_size or 1) != 1:
            raise ConfigError(f"--online-batch-size: {why}; drop --online-batch-size")
        return [1]

    def resolve(self, has_gpu: bool) -> ResolvedRequest:
        check_server_options(self)
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
                raise ConfigError(
                    f"model {adapter.name!r} is served as a Triton ensemble of its parts; "
                    "serve_formats can only be 'ensemble'"
                )
        elif self.serve_formats and [s.strip().lower() for s in self.serve_formats] == ["all"]:
            serve = list(formats)
        else:
            serve = [Format.parse(f) for f in (self.serve_formats or [formats[0]])]
        if Format.ENSEMBLE in formats or (Format.ENSEMBLE in serve and not adapter.is_ensemble):
            raise ConfigError(
                f"model {adapter.name!r} is not an ensemble; "
                "'ensemble' is the format of models served as their parts (dlrm, dcnv2)"
            )
        formats += [f for f in serve if f not in formats and f is not Format.ENSEMBLE]
        for fmt in (f for f in serve if f is not Format.ENSEMBLE):
            if self.server == "embedded" and fmt not in PYTHON_BACKEND_RUNTIMES:
                known = ", ".join(f.value for f in PYTHON_BACKEND_RUNTIMES)
                raise ConfigError(
                    f"format {fmt.value!r} cannot be served by the embedded server (python backend); "
                    f"use one of: {known}"
                )
        precision = Precision.parse(self.precision)  # what each format can carry: tbench/core/precision.py
        accelerators = check_precision(
            precision,
            serve,
            self.accelerators if self.accelerators is not None else (d.gpu_accelerators if profile == "gpu" else {}),
            has_gpu=has_gpu,
            server=self.server,
            parts=adapter.part_formats(),
        )
        if not adapter.batching:
            self._check_unbatched(adapter)
        max_batch = self.max_batch_size or d.max_batch_size
        batch_sizes = sorted(set(self.batch_sizes or d.offline_batch_sizes))
        if adapter.given_samples is not None and adapter.given_samples.varying:
            batch_sizes = self._check_varying(adapter.given_samples, batch_sizes)
        preferred = sorted(set(self.preferred_batch_sizes or [b for b in d.preferred_batch_sizes if b <= max_batch]))
        for label, values in (("batch size", batch_sizes), ("preferred batch size", preferred)):
            too_big = [b for b in values if b > max(max_batch, 1)]  # max_batch_size 0: one request, batch 1
            if too_big:
                raise ConfigError(f"{label} {too_big[0]} is above max_batch_size {max_batch}")
            if any(b < 1 for b in values):
                raise ConfigError(f"{label}s must be >= 1, got {values}")
        self._check_engine_options(adapter, formats, precision, batch_sizes, max_batch)
        scenarios = [Scenario.parse(s) for s in (self.scenarios or d.scenarios)]
        online_batch = self.online_batch_size or d.online_batch_size
        if online_batch > max(max_batch, 1) and (Scenario.ONLINE in scenarios or Scenario.RATE in scenarios):
            raise ConfigError(f"online batch size {online_batch} is above max_batch_size {max_batch}")
        scenarios, rate_list, distribution = arrival_load(
            scenarios, self.request_rates, self.request_distribution, self.trace, self.trace_speeds
        )
        rates, concurrency = checked_load(scenarios, rate_list, self.concurrency or d.online_concurrency)
        if self.trace:
            check_trace(self.trace, adapter.given_samples, online_batch, max_batch)
        resolved = dict(
            model=adapter.name,
            size=adapter.size,
            framework=adapter.framework,
            profile=profile,
            formats=formats,
            serve_formats=list(dict.fromkeys(serve)),
            precision=precision,
            accelerators=accelerators,
            scenarios=scenarios,
            online_batch_size=online_batch,
            request_rates=rates,
            request_distribution=distribution,
            max_batch_size=max_batch,
            model_instances=self.model_instances or d.model_instances,
            preferred_batch_sizes=preferred,
            max_queue_delay_us=d.max_queue_delay_us if self.max_queue_delay_us is None else self.max_queue_delay_us,
            batch_sizes=batch_sizes,
            concurrency=concurrency,
            accuracy_samples=self.accuracy_samples or d.accuracy_samples,
            accuracy_batch_size=min(self.accuracy_batch_size or d.accuracy_batch_size, max(max_batch, 1)),
            measurement=self._measurement(profile, d.measurement),
            tolerance_atol=DEFAULT_TOLERANCES[precision][0] if self.tolerance_atol is None else self.tolerance_atol,
            tolerance_rtol=DEFAULT_TOLERANCES[precision][1] if self.tolerance_rtol is None else self.tolerance_rtol,
            triton_suffix=run_suffix() if self.server == "remote" else "",  # private servers keep plain names
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
    burstiness: float = 2.0
    trace: str | None = None
    trace_speeds: list[float] | None = None
    accuracy_samples: int
    accuracy_batch_size: int
    measurement: Measurement
    trials: int = 1
    session: SessionRound | None = None
    direct: bool = False
    pin_cpus: bool = True
    output: str
    baseline: str | None
    reuse_measurements: bool
    server: str
    server_url: str | None
    docker_image: str | None
    gpus: str | None
    docker_network: str = "host"
    docker_ulimits: list[str] | None = None
    tritonserver: str | None
    backend_dir: str | None
    http_port: int | None
    grpc_port: int | None
    tolerance_atol: float
    tolerance_rtol: float
    trt_shapes: dict[str, list[list[int]]] | None = None
    calibration_samples: int | None = None  # None: trt_profiles.default_calibration_samples of the build's opt batch
    triton_suffix: str = ""  # remote mode: ends every Triton model name of the run (run_suffix); "" elsewhere

    def triton_name(self, fmt: Format) -> str:
        """The Triton model name of a served format: the model's name, suffixed when several formats are served."""
        name = self.model if len(self.serve_formats) == 1 else f"{self.model}_{fmt.value.replace('-', '_')}"
        return name + self.triton_suffix

    def part_name(self, part: str) -> str:
        """The Triton model name of an ensemble's composing model."""
        return f"{self.model}_{part}{self.triton_suffix}"


def request_from_argv(argv: list[str]) -> BenchmarkRequest:
    """`[MODEL] [field=value ...]`, values as JSON where they parse: size=small batch_sizes=[1,4]"""
    fields = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            key, value = "model", arg
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            fields[key] = value
    return BenchmarkRequest(**fields)
