"""A request to measure several models on one server, each under its own load, alone and together
(`tbench colocate`): which models, which load each, which server (a running one by URL, or this machine's server on
the given model repositories), and the percentile each model's latency is read at."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tbench.core.errors import ConfigError, validation_line
from tbench.request.benchmark import Measurement, MeasurementOverrides

LOAD_SYNTAX = "NAME[:VERSION]@rate=R or NAME[:VERSION]@concurrency=C, then ,batch=B ,slo_ms=S (e.g. resnet50@rate=40)"


class ModelLoad(BaseModel):
    """One model's load: open-loop Poisson requests at a rate, or a number of requests in flight."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(min_length=1, description="The model's name on the server, NAME or NAME:VERSION.")
    rate: float | None = Field(None, gt=0, description="Poisson requests per second.")
    concurrency: int | None = Field(None, ge=1, description="Requests in flight (closed loop).")
    batch: int = Field(1, ge=1, description="Samples per request.")
    slo_ms: float | None = Field(None, gt=0, description="The latency the percentile must stay within, if any.")
    percentile: Literal[50, 90, 95, 99] | None = Field(None, description="The SLO's percentile; the request's if none.")

    @model_validator(mode="after")
    def _one_load(self) -> ModelLoad:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError(f"{self.model}: give a rate or a concurrency, one of them")
        return self

    @property
    def name(self) -> str:
        return self.model.partition(":")[0]

    @property
    def version(self) -> str:
        return self.model.partition(":")[2]

    @property
    def label(self) -> str:
        load = f"{self.rate:g}/s" if self.rate is not None else f"concurrency {self.concurrency}"
        return f"{self.name} at {load}" + (f", batch {self.batch}" if self.batch > 1 else "")


def parse_load(text: str) -> ModelLoad:
    """`resnet50@rate=40,batch=2,slo_ms=100` -> ModelLoad; a malformed one is a ConfigError naming the syntax."""
    name, at, options = text.strip().partition("@")
    fields: dict[str, str] = {"model": name.strip()}
    for part in filter(None, (p.strip() for p in options.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not value.strip():
            raise ConfigError(f"--load {text!r}: {part!r} is not KEY=VALUE; the syntax is {LOAD_SYNTAX}")
        fields[key.strip()] = value.strip()
    if not at or len(fields) == 1:
        raise ConfigError(f"--load {text!r} names no load; the syntax is {LOAD_SYNTAX}")
    try:
        return ModelLoad.model_validate(fields)
    except ValidationError as err:
        raise ConfigError(f"--load {text!r}: {validation_line(err)}; the syntax is {LOAD_SYNTAX}") from None


class ColocatedRequest(BaseModel):
    """Several models on one server, each under its load: measured alone, then all together over the same span."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    loads: list[ModelLoad] = Field(min_length=1, description="Each model and its load.")
    server_url: str | None = Field(
        None, description="A running server that serves the models, 'host:grpc_port,host:http_port'."
    )
    repositories: list[str] = Field(
        [], description="Model repositories to serve together on this machine's server (their models merged)."
    )
    server: Literal["embedded", "local", "docker", "remote"] = Field(
        default_factory=lambda: os.environ.get("TBENCH_SERVER", "embedded"),
        description="With repositories: the server mode that serves them (remote with server_url).",
    )
    only_loaded: bool = Field(
        False, description="Serve only the models given a load (else every model of the repositories)."
    )
    alone: bool = Field(True, description="Measure each model alone first, for the interference.")
    percentile: Literal[50, 90, 95, 99] = Field(99, description="The latency percentile reported and held to slo_ms.")
    measurement: MeasurementOverrides | None = Field(None, description="perf_analyzer measurement settings to change.")
    output: str = Field(
        default_factory=lambda: os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"),
        description="Artifact root: a local folder or any fsspec URL.",
    )
    http_port: int | None = Field(None, ge=1, le=65535)
    grpc_port: int | None = Field(None, ge=1, le=65535)

    @field_validator("repositories")
    @classmethod
    def _folders(cls, repositories: list[str]) -> list[str]:
        from tbench.core.storage import is_remote

        for repo in repositories:  # an upload's URL (another pool's fleet node) is checked as it is fetched
            if not is_remote(repo) and not Path(repo).expanduser().is_dir():
                raise ValueError(f"{repo} is not a folder (a Triton model repository)")
        return repositories

    @model_validator(mode="after")
    def _where(self) -> ColocatedRequest:
        if bool(self.server_url) == bool(self.repositories):
            raise ValueError("give the server that serves the models (server_url) or their repositories, one of them")
        if self.server_url:
            self.server = "remote"
        elif self.server == "remote":
            raise ValueError("the remote server mode takes server_url; repositories are served on this machine")
        names = [load.name for load in self.loads]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"each model takes one load: {', '.join(twice)} given more than once")
        return self

    def resolved_measurement(self) -> Measurement:
        return self.measurement.apply(Measurement()) if self.measurement else Measurement()

    def strictest_percentile(self) -> int:
        """The highest percentile a load is read at: every point is measured long enough for it (a fleet's loads at
        p90 need about a tenth of the requests p99 needs, so sizing them by the request's p99 measured 10x longer)."""
        return max(load.percentile or self.percentile for load in self.loads)
