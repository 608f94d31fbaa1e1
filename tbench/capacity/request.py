"""What a capacity plan is asked for (`CapacityRequest`, the capacity flow's second parameter): pure pydantic, so
the CLI validates it before a run starts and the Prefect UI shows it as a form."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tbench.capacity.rate_search import MAX_POINTS, REPEATS, TOLERANCE
from tbench.capacity.statistics import PercentileRule
from tbench.search.request import SearchRequest, StrategyName
from tbench.search.strategies import Objective, SearchSpace
from tbench.team.pools import unknown_pools


def capacity_space() -> SearchSpace:
    """A small grid by default: each candidate costs a whole rate search (several minutes on a CPU)."""
    return SearchSpace(instances=[1, 2], max_batch_sizes=[1, 8], preferred=["none"], queue_delays_us=[500])


class CapacityRequest(BaseModel):
    """The SLO, the traffic, and where to plan; the model, formats and server come from the BenchmarkRequest."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a misspelt field is an error, not ignored

    slo_ms: float = Field(50.0, gt=0, description="The latency SLO in ms, on the percentile (p99 by default).")
    traffic_rps: float = Field(100.0, gt=0, description="The traffic to serve, in requests per second.")
    headroom: float = Field(0.2, ge=0, le=10, description="Spare capacity above the traffic (0.2: 20%).")
    rule: PercentileRule = Field(
        default_factory=PercentileRule, description="The SLO's percentile, and how many requests measure it."
    )
    space: SearchSpace = Field(
        default_factory=capacity_space, description="The configurations to try, each by its sustainable rate."
    )
    strategy: StrategyName = Field("exhaustive", description="exhaustive: every configuration; smart: a budget.")
    budget_fraction: float = Field(1.0, gt=0, le=1, description="smart: the largest share of the grid measured.")
    tolerance: float = Field(
        TOLERANCE, gt=0.01, le=1, description="The rate search stops when passing and failing rates are this close."
    )
    max_points: int = Field(
        MAX_POINTS, ge=1, le=200, description="Most measurements per configuration (1: judge one rate once)."
    )
    repeats: int = Field(
        REPEATS, ge=1, le=20, description="Most measurements of one rate, pooled, before it counts as not holding."
    )
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="Longest one configuration's rate search may measure (minutes): no measurement starts after it, "
        "and the answer is what had passed by then. None: no limit (a noisy machine can take `repeats` runs per rate).",
    )
    start_rps: float | None = Field(
        None, gt=0, description="First rate tried (requests/s); half the warm-up latency's capacity by default."
    )
    trace: str | None = Field(
        None,
        description="Plan on this trace of request timestamps (as a run's trace): each rate replays it sped up to "
        "that mean rate, and the answer is the highest speed-up whose percentile holds.",
    )
    burstiness: float | None = Field(
        None,
        gt=0,
        le=20,
        description="Plan on bursty arrivals: gamma intervals at each rate whose coefficient of variation is this "
        "(1 is Poisson, above 1 bursts and lulls). Not with a trace.",
    )
    pools: list[str] = Field(
        [],
        description="Pools to plan for, each run by its capacity deployment (as the matrix does); none: this machine.",
    )
    pool: str | None = Field(
        None, description="This machine's pool in the price table; from the worker's pool or its GPU by default."
    )
    prices: str | None = Field(
        None, description="Price table CSV (pool, usd_per_hour, ...); the shipped one by default."
    )
    child_timeout_s: float = Field(6 * 3600, gt=0, description="pools: the longest a pool's run may take.")

    @field_validator("trace")
    @classmethod
    def _readable_trace(cls, trace: str | None) -> str | None:
        if trace:
            from tbench.core.request_trace import load_schedule

            load_schedule(trace)  # a trace with a mistake fails here, in one line
        return trace

    @model_validator(mode="after")
    def _one_arrival_process(self) -> CapacityRequest:
        if self.trace and self.burstiness is not None:
            raise ValueError("a trace sets its own arrivals: give --trace or --burstiness, not both")
        return self

    @field_validator("pools")
    @classmethod
    def _known_pools(cls, pools: list[str]) -> list[str]:
        if error := unknown_pools(pools):
            raise ValueError(error)
        return list(dict.fromkeys(pools))

    @property
    def max_seconds(self) -> float | None:
        """`max_minutes` as the rate search takes it."""
        return self.max_minutes * 60 if self.max_minutes else None

    def trace_rate(self) -> float | None:
        """The trace's mean rate (its speed 1), where the plan is on a trace: where the search starts."""
        if not self.trace:
            return None
        from tbench.core.request_trace import load_schedule

        return load_schedule(self.trace).mean_rate

    def search(self) -> SearchRequest:
        """The configuration search this plan runs: the best sustainable rate with the percentile within the SLO."""
        return SearchRequest(
            space=self.space,
            objective=Objective(goal="max_throughput", p99_budget_ms=self.slo_ms),
            strategy=self.strategy,
            budget_fraction=self.budget_fraction,
        )


class FleetRequest(BaseModel):
    """A fleet plan: the fleet file, and how its packings are confirmed (each shared node of this machine's pool
    measured with its models together at their planned rates)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    fleet: str = Field(description="The fleet file (YAML or JSON): models, their traffic, SLOs and rates, and pools.")
    prices: str | None = Field(None, description="Price table CSV for pools the fleet file does not price.")
    confirm: bool = Field(True, description="Measure each shared node of this machine's pool before reporting it.")
    fan_out: bool = Field(
        False,
        description="Measure each shared node of another pool through that pool's colocated deployment (needs the "
        "Prefect server; its repositories are uploaded to the artifact root as model files are).",
    )
    child_timeout_s: float = Field(3 * 3600, gt=0, description="fan_out: the longest a node's measurement may take.")
    rounds: int = Field(
        4, ge=1, le=20, description="Plans tried at most: a packing that fails its measurement is planned around."
    )
    pool: str | None = Field(None, description="This machine's pool; from the worker's pool or its GPU by default.")
    server: Literal["embedded", "local", "docker"] = Field(
        default_factory=lambda: os.environ.get("TBENCH_SERVER", "embedded"),
        description="The server mode that serves a node's models for its confirmation.",
    )
    window_s: float | None = Field(None, gt=0, description="perf_analyzer's window, in seconds, for confirmations.")
    output: str = Field(
        default_factory=lambda: os.environ.get("TBENCH_ARTIFACT_ROOT", "runs"),
        description="Artifact root: a local folder or any fsspec URL.",
    )
    http_port: int | None = Field(None, ge=1, le=65535)
    grpc_port: int | None = Field(None, ge=1, le=65535)
