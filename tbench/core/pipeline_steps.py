"""Where a pipeline spends its time at one measured point: an ensemble's steps, or the models a python model calls
(BLS), from Triton's own per-model statistics read at the point's start and end (tbench.triton.monitor reads them).

Per step: its requests per pipeline request, the batch it formed, its queue and compute ms per request, and its
ceiling: the pipeline's rate at which the step's instances would be busy all the time (their count times the
pipeline's inferences over the time they spent executing, from Triton's per-execution batch statistics, so a batch of
8 counts once). At the point's measured throughput a step is busy that throughput over its ceiling; the step with the
lowest ceiling is the busiest and bounds the pipeline's throughput. A python pipeline's own work is its busy time less
its calls' server time (`own_ms`, an estimate); its instances are held while it waits on them, so its ceiling counts
their whole busy time. Pure functions over snapshots: no I/O here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

STEP_COLUMNS = [
    "model",  # the pipeline measured
    "step",  # one model it ran
    "role",
    "scenario",
    "format",
    "batch_size",
    "concurrency",
    "request_rate",
    "instances",
    "requests",  # the step's requests over the point
    "calls_per_request",  # per pipeline request
    "batch",  # inferences per execution: the batch it formed
    "queue_ms",  # per request of the step
    "compute_ms",  # input + infer + output, per request of the step
    "own_ms",  # a python pipeline's compute per request less its calls' server time (an estimate)
    "busy_pct",  # of its instances' time, at the point's measured throughput
    "ceiling_per_s",  # pipeline inferences/s at which this step would be busy all the time
]
STEP = "step"
PIPELINE = "pipeline (its calls included)"  # a python model calling others: its instances are held while they run
# a step busy at least this share of its instances' time is what held the pipeline back; below it, no step was
# saturated: the load offered (or the client, or the CPU the steps share) set the throughput
SATURATED_PCT = 70.0
_STAGES = ("compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class ModelCounters:
    """One model's cumulative statistics (every version summed) at one moment."""

    requests: int = 0  # successful requests
    inferences: int = 0  # batch items
    executions: int = 0
    queue_ns: int = 0  # summed per request
    compute_ns: int = 0  # input + infer + output, summed per request
    busy_ns: int = 0  # input + infer + output, summed per execution (batch statistics)

    def minus(self, before: ModelCounters) -> ModelCounters:
        return ModelCounters(*(getattr(self, f) - getattr(before, f) for f in self.__dataclass_fields__))


def _ns(stats: Mapping, key: str) -> int:
    return int((stats.get(key) or {}).get("ns", 0))


def counters_from_statistics(statistics: Mapping) -> dict[str, ModelCounters]:
    """Triton's statistics reply (`get_inference_statistics(as_json=True)`, every model) -> counters per model name."""
    totals: dict[str, ModelCounters] = {}
    for version in statistics.get("model_stats", []):
        inference = version.get("inference_stats", {})
        busy = sum(_ns(b, stage) for b in version.get("batch_stats", []) for stage in _STAGES)
        found = ModelCounters(
            requests=int((inference.get("success") or {}).get("count", 0)),
            inferences=int(version.get("inference_count", 0)),
            executions=int(version.get("execution_count", 0)),
            queue_ns=_ns(inference, "queue"),
            compute_ns=sum(_ns(inference, stage) for stage in _STAGES),
            busy_ns=busy,
        )
        name = version.get("name", "")
        old = totals.get(name, ModelCounters())
        totals[name] = ModelCounters(*(getattr(old, f) + getattr(found, f) for f in found.__dataclass_fields__))
    return totals


def step_rows(
    pipeline: str,
    before: Mapping[str, ModelCounters],
    after: Mapping[str, ModelCounters],
    instances: Mapping[str, int | None],
) -> list[dict]:
    """One row per model the pipeline ran over the point (a step with no request in it is left out: a model of the
    repository this pipeline did not call). `instances`: each model's instance count, None where it has none of its own
    (an ensemble: its scheduler only passes tensors on). A python pipeline (one with instances) gets a row of its
    own. Busy is left to `busy_at`, which knows the point's throughput."""
    top = after.get(pipeline, ModelCounters()).minus(before.get(pipeline, ModelCounters()))
    if top.requests <= 0:
        return []
    rows: list[dict] = []
    called_ns = 0
    for name in after:
        if name == pipeline:
            continue
        done = after[name].minus(before.get(name, ModelCounters()))
        if done.requests <= 0:
            continue
        called_ns += done.queue_ns + done.compute_ns
        rows.append(_row(name, STEP, done, top, instances.get(name)))
    if instances.get(pipeline) and rows:  # a python model calling others: what it does itself, between the calls
        own_ms = max(top.compute_ns - called_ns, 0) / top.requests / 1e6
        rows.append({**_row(pipeline, PIPELINE, top, top, instances[pipeline]), "own_ms": own_ms})
    return rows


def _row(name, role, done: ModelCounters, top: ModelCounters, instances) -> dict:
    known = instances and done.executions and done.busy_ns > 0
    return {
        "step": name,
        "role": role,
        "instances": instances,
        "requests": done.requests,
        "calls_per_request": done.requests / top.requests,
        "batch": done.inferences / done.executions if done.executions else None,
        "queue_ms": done.queue_ns / done.requests / 1e6,
        "compute_ms": done.compute_ns / done.requests / 1e6,
        "own_ms": None,
        "busy_pct": None,
        "ceiling_per_s": instances * top.inferences / (done.busy_ns / 1e9) if known else None,
    }


def busy_at(rows: list[dict], throughput: float | None) -> list[dict]:
    """The rows with each step's busy share at the point's measured throughput (inferences/s): throughput over its
    ceiling. The ceiling is a cost per inference, so it holds whatever span the statistics covered (perf_analyzer's
    start and warm-up included); the throughput is perf_analyzer's, over its measured windows."""
    if not throughput or throughput != throughput:  # none, or NaN: a point that did not measure
        return rows
    return [{**r, "busy_pct": 100 * throughput / r["ceiling_per_s"] if r["ceiling_per_s"] else None} for r in rows]


@dataclass(frozen=True)
class Bound:
    """What bounded one point's throughput: the busiest step, or none saturated (`step` None)."""

    step: str | None
    busy_pct: float | None
    ceiling_per_s: float | None
    runner_up: str | None = None
    runner_up_pct: float | None = None

    def line(self) -> str:
        if self.busy_pct is None:
            return "undetermined: no step reported how long its instances were busy"
        if self.step is None:
            return (
                f"no step was full: the busiest ({self.runner_up}) was busy {self.runner_up_pct:.0f}% of its"
                f" instances' time, under {SATURATED_PCT:.0f}%: the load offered, the client or the CPU the steps"
                " share set it"
            )
        after = f"; next {self.runner_up} at {self.runner_up_pct:.0f}%" if self.runner_up else ""
        return (
            f"bounded by **{self.step}**: its instances were busy {self.busy_pct:.0f}% of the time, so the pipeline "
            f"could reach about {self.ceiling_per_s:,.0f} infer/s before this step is full{after}"
        )


def bounding_step(rows: pd.DataFrame) -> Bound:
    """The step of one point's rows whose instances were the busiest (SATURATED_PCT or more), else none."""
    known = rows.dropna(subset=["busy_pct"]).sort_values("busy_pct", ascending=False)
    if known.empty:
        return Bound(None, None, None)
    first = known.iloc[0]
    second = known.iloc[1] if len(known) > 1 else None
    if first["busy_pct"] < SATURATED_PCT:
        return Bound(None, float(first["busy_pct"]), None, str(first["step"]), float(first["busy_pct"]))
    return Bound(
        str(first["step"]),
        float(first["busy_pct"]),
        float(first["ceiling_per_s"]),
        str(second["step"]) if second is not None else None,
        float(second["busy_pct"]) if second is not None else None,
    )
