"""A fleet plan: which models share a node, and how many nodes of which pool serve them all within their SLOs, at the
least cost per hour.

Each model comes with its traffic and, per pool, the rate one node sustains for it alone within its SLO (a capacity
plan's answer). On a pool, a model's **load** is its traffic with the headroom over that rate: 0.3 is 30% of a node.
A model is served either
- **shared**: whole on one node, beside other models, their loads summing to at most `share_limit` and their memory
  within the node's; or
- **dedicated**: alone on ceil(load) nodes of one pool, its traffic split evenly over them (today's one-model plan).
The loads of models on one node add up as the node's time is shared between them. That is an approximation (a model's
latency also depends on what it queues behind), which is why a packing is confirmed by measuring it.

The cheapest plan is a small integer program (scipy's milp, HiGHS): a binary per model and pool for dedicated nodes,
and per shared node a binary per model it may hold. Each shared node is opened by its lowest-numbered model (which
removes the nodes' symmetry), so the program has about pools x models^2 / 2 binaries. `exhaustive_cost` finds the
same optimum by dynamic programming over every partition of the models (3^n steps: a check for up to ~12 models).
"""

from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.optimize import Bounds, LinearConstraint, milp

from tbench.core.errors import ConfigError

SHARE_LIMIT = 1.0  # the sum of the loads a shared node may carry
SOLVER_SECONDS = 60.0  # HiGHS stops there with the best plan found, and says it is not proven optimal
EPS = 1e-9


class FleetPool(BaseModel):
    """A kind of node: its price and its device memory."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    usd_per_hour: float = Field(gt=0)
    memory_mb: float | None = Field(None, gt=0, description="Device memory per node; None: not a limit.")


class FleetModel(BaseModel):
    """One model of the fleet: its traffic, its SLO, and what one node of each pool sustains for it alone."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    traffic_rps: float = Field(gt=0)
    slo_ms: float = Field(gt=0)
    percentile: Literal[50, 90, 95, 99] = Field(99, description="The latency percentile the SLO bounds.")
    batch_size: int = Field(1, ge=1, description="Inferences per request (for the cost per million inferences).")
    sustainable_rps: dict[str, float] = Field(
        description="Per pool: the rate one node sustains for this model alone within its SLO (tbench capacity)."
    )
    memory_mb: float = Field(0.0, ge=0, description="Device memory the model takes on a node, all instances.")
    repository: str | None = Field(
        None, description="A Triton model repository holding the model (by `name`): a packing is confirmed from it."
    )


class Fleet(BaseModel):
    """The models and the pools to plan them on."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    models: list[FleetModel] = Field(min_length=1)
    pools: list[FleetPool] = Field(min_length=1)
    headroom: float = Field(0.2, ge=0, le=10, description="Spare capacity above each model's traffic.")
    share_limit: float = Field(SHARE_LIMIT, gt=0, le=1, description="The most load one shared node carries.")

    @model_validator(mode="after")
    def _names(self) -> Fleet:
        for kind, names in (("model", [m.name for m in self.models]), ("pool", [p.name for p in self.pools])):
            if len(set(names)) < len(names):
                twice = sorted({n for n in names if names.count(n) > 1})
                raise ValueError(f"{kind} names must be unique: {', '.join(twice)} given twice")
        known = {p.name for p in self.pools}
        for m in self.models:
            if unknown := sorted(set(m.sustainable_rps) - known):
                raise ValueError(f"model {m.name!r} names a pool not in the fleet's pools: {', '.join(unknown)}")
        return self

    def load(self, model: FleetModel, pool: FleetPool) -> float | None:
        """The share of one node of `pool` that `model`'s traffic takes, or None where it cannot run there (no rate
        measured, or more memory than a node has)."""
        rate = model.sustainable_rps.get(pool.name)
        if not rate or rate <= 0 or (pool.memory_mb is not None and model.memory_mb > pool.memory_mb):
            return None
        return model.traffic_rps * (1 + self.headroom) / rate

    def dedicated_nodes(self, model: FleetModel, pool: FleetPool) -> int | None:
        load = self.load(model, pool)
        return None if load is None else max(1, math.ceil(load - EPS))


class Node(BaseModel):
    """One node of the plan and what it serves."""

    pool: str
    rates_rps: dict[str, float] = Field(description="Per model: the traffic this node serves (requests/s).")
    load: float = Field(description="The sum of the models' loads on this node (1 = a node's sustainable rate).")
    memory_mb: float = 0.0
    shared: bool = Field(description="True: several models share it.")


class ModelCost(BaseModel):
    """One model's part of the plan's cost: its dedicated nodes, and its load's share of the nodes it shares."""

    nodes: list[int] = Field(description="Indices into the plan's nodes.")
    usd_per_hour: float
    usd_per_million: float = Field(description="At its traffic, per million inferences (requests x batch).")


class Confirmation(BaseModel):
    """A shared node's models measured together at their planned rates (with the headroom) on a node of its pool."""

    pool: str
    models: list[str]
    rates_rps: dict[str, float] = Field(description="The rates measured: each model's planned rate with the headroom.")
    held: bool | None = Field(description="Every model kept up within its SLO; None: not measured (why in reason).")
    reason: str = ""
    folder: str = Field("", description="The measurement's folder in the run folder.")
    points: dict[str, dict] = Field({}, description="Per model: status, SLO verdict, percentile, throughput.")

    @property
    def key(self) -> tuple[str, frozenset[str]]:
        return self.pool, frozenset(self.models)


class FleetPlan(BaseModel):
    """The cheapest assignment found, beside one model per node, with what it rests on."""

    nodes: list[Node]
    usd_per_hour: float
    nodes_per_pool: dict[str, int]
    models: dict[str, ModelCost]
    alone_usd_per_hour: float = Field(description="One model per node: each on its cheapest pool's dedicated nodes.")
    optimal: bool = Field(description="The solver proved no plan is cheaper (else it stopped at its time limit).")
    solver_seconds: float
    message: str = ""


def _alone_cost(fleet: Fleet) -> tuple[float, dict[str, tuple[FleetPool, int]]]:
    """One model per node: each model on the pool where its dedicated nodes cost least."""
    total, choice = 0.0, {}
    for m in fleet.models:
        options = [(p.usd_per_hour * n, p, n) for p in fleet.pools if (n := fleet.dedicated_nodes(m, p)) is not None]
        if not options:
            raise ConfigError(
                f"model {m.name!r} runs on no pool of the fleet (no sustainable rate within its SLO, or more memory "
                f"than a node has): measure its capacity on a pool (tbench capacity) or add a pool it fits"
            )
        cost, pool, n = min(options, key=lambda o: o[0])
        total += cost
        choice[m.name] = (pool, n)
    return total, choice


def plan_fleet(
    fleet: Fleet, time_limit_s: float = SOLVER_SECONDS, forbidden: list[tuple[str, frozenset[str]]] = ()
) -> FleetPlan:
    """The cheapest plan (see the module's docstring). `forbidden`: (pool, models) that must not share a node of the
    pool, all of them together (a packing whose measurement failed its confirmation; with more models beside them it
    would not hold either). Raises ConfigError where a model runs on no pool."""
    alone, _ = _alone_cost(fleet)
    models, pools = fleet.models, fleet.pools
    loads = [[fleet.load(m, p) for p in pools] for m in models]
    columns: list[tuple] = []  # ("d", model, pool) or ("z", model, opener, pool)
    costs: list[float] = []
    for i, m in enumerate(models):
        for k, p in enumerate(pools):
            if (n := fleet.dedicated_nodes(m, p)) is not None:
                columns.append(("d", i, k))
                costs.append(n * p.usd_per_hour)
    fits = [[load is not None and load <= fleet.share_limit + EPS for load in row] for row in loads]
    slots = [(j, k) for j in range(len(models)) for k in range(len(pools)) if fits[j][k]]
    for j, k in slots:
        for i in range(j, len(models)):
            if fits[i][k]:
                columns.append(("z", i, j, k))
                costs.append(pools[k].usd_per_hour if i == j else 0.0)  # the node is paid for by its opener
    index = {c: n for n, c in enumerate(columns)}
    rows, lower, upper = [], [], []

    def row(entries: dict[int, float], lo: float, hi: float) -> None:
        a = np.zeros(len(columns))
        for col, value in entries.items():
            a[col] = value
        rows.append(a)
        lower.append(lo)
        upper.append(hi)

    for i in range(len(models)):  # each model served exactly once: dedicated, or on one shared node
        row({n: 1.0 for n, c in enumerate(columns) if c[1] == i}, 1.0, 1.0)
    for j, k in slots:  # a shared node carries what it can, and only once its opener is on it
        opener = index[("z", j, j, k)]
        members = [(index[("z", i, j, k)], i) for i in range(j + 1, len(models)) if fits[i][k]]
        row({opener: loads[j][k] - fleet.share_limit} | {n: loads[i][k] for n, i in members}, -np.inf, 0.0)
        if pools[k].memory_mb is not None:
            memory = {n: models[i].memory_mb for n, i in members}
            row({opener: models[j].memory_mb - pools[k].memory_mb} | memory, -np.inf, 0.0)
        for n, _ in members:
            row({n: 1.0, opener: -1.0}, -np.inf, 0.0)
        for pool, group in forbidden:  # at most all but one of the group on this node
            on_node = {index[("z", i, j, k)] for i in range(j, len(models)) if fits[i][k] and models[i].name in group}
            if pools[k].name == pool and len(on_node) == len(group) > 1:
                row(dict.fromkeys(on_node, 1.0), -np.inf, len(group) - 1.0)
    started = time.monotonic()
    result = milp(
        np.array(costs),
        constraints=LinearConstraint(np.array(rows), lower, upper),
        integrality=np.ones(len(columns)),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit_s},
    )
    seconds = time.monotonic() - started
    if result.x is None:  # every model runs on some pool, so one-model-per-node is always a solution
        raise ConfigError(f"the fleet plan's solver found no plan: {result.message}")
    chosen = [c for c, x in zip(columns, result.x, strict=True) if x > 0.5]
    return _plan(fleet, chosen, loads, alone, optimal=result.status == 0, seconds=seconds, message=result.message)


def _plan(fleet: Fleet, chosen: list[tuple], loads, alone: float, optimal: bool, seconds: float, message: str):
    models, pools = fleet.models, fleet.pools
    nodes: list[Node] = []
    owners: dict[str, list[int]] = {m.name: [] for m in models}
    hourly: dict[str, float] = {m.name: 0.0 for m in models}
    for _, i, k in (c for c in chosen if c[0] == "d"):
        m, p = models[i], pools[k]
        n = fleet.dedicated_nodes(m, p) or 1
        for _ in range(n):
            owners[m.name].append(len(nodes))
            nodes.append(
                Node(
                    pool=p.name,
                    rates_rps={m.name: m.traffic_rps / n},
                    load=loads[i][k] / n,
                    memory_mb=m.memory_mb,
                    shared=False,
                )
            )
        hourly[m.name] += n * p.usd_per_hour
    shared: dict[tuple[int, int], list[int]] = {}
    for _, i, j, k in (c for c in chosen if c[0] == "z"):
        shared.setdefault((j, k), []).append(i)
    for (_, k), members in sorted(shared.items()):
        p, load = pools[k], sum(loads[i][k] for i in members)
        for i in members:
            owners[models[i].name].append(len(nodes))
            hourly[models[i].name] += p.usd_per_hour * loads[i][k] / load  # the node's price by load share
        nodes.append(
            Node(
                pool=p.name,
                rates_rps={models[i].name: models[i].traffic_rps for i in members},
                load=load,
                memory_mb=sum(models[i].memory_mb for i in members),
                shared=len(members) > 1,
            )
        )
    per_pool = {p.name: sum(1 for n in nodes if n.pool == p.name) for p in pools}
    costs = {
        m.name: ModelCost(
            nodes=owners[m.name],
            usd_per_hour=hourly[m.name],
            usd_per_million=hourly[m.name] / (m.traffic_rps * m.batch_size * 3600) * 1e6,
        )
        for m in models
    }
    price = {p.name: p.usd_per_hour for p in pools}
    return FleetPlan(
        nodes=nodes,
        usd_per_hour=sum(price[n.pool] for n in nodes),
        nodes_per_pool={k: v for k, v in per_pool.items() if v},
        models=costs,
        alone_usd_per_hour=alone,
        optimal=optimal,
        solver_seconds=round(seconds, 3),
        message=message,
    )


def plan_problems(fleet: Fleet, plan: FleetPlan) -> list[str]:
    """What is wrong with a plan, checked from its nodes alone (empty when it serves every model's traffic within
    every node's load and memory): the calibration's independent check of the solver's answer."""
    problems = []
    pools = {p.name: p for p in fleet.pools}
    served = {m.name: 0.0 for m in fleet.models}
    by_name = {m.name: m for m in fleet.models}
    for n, node in enumerate(plan.nodes):
        pool = pools[node.pool]
        load = 0.0
        for name, rate in node.rates_rps.items():
            served[name] += rate
            full = fleet.load(by_name[name], pool)
            if full is None:
                problems.append(f"node {n}: {name} cannot run on {pool.name}")
                continue
            load += full * rate / by_name[name].traffic_rps
        limit = fleet.share_limit if len(node.rates_rps) > 1 else 1.0
        if load > limit + 1e-6:
            problems.append(f"node {n} ({pool.name}): load {load:.3f} over {limit:g}")
        memory = sum(by_name[name].memory_mb for name in node.rates_rps)
        if pool.memory_mb is not None and memory > pool.memory_mb + 1e-6:
            problems.append(f"node {n} ({pool.name}): {memory:g} MB of models on {pool.memory_mb:g} MB")
    for name, rate in served.items():
        if not math.isclose(rate, by_name[name].traffic_rps, rel_tol=1e-6):
            problems.append(f"{name}: {rate:g} of {by_name[name].traffic_rps:g} req/s served")
    return problems


def exhaustive_cost(fleet: Fleet) -> float:
    """The least cost per hour over every partition of the models into groups, each group on one node of its
    cheapest pool where it fits, a model alone also on its dedicated nodes: the optimum, by dynamic programming over
    subsets (3^n steps; for checking plan_fleet on fleets of up to ~12 models)."""
    models, pools, count = fleet.models, fleet.pools, len(fleet.models)
    full = 1 << count
    group = np.full(full, np.inf)
    for p in pools:
        load, memory = np.zeros(full), np.zeros(full)
        for i, m in enumerate(models):
            one = fleet.load(m, p)
            bit = 1 << i
            load[bit : 2 * bit] = load[:bit] + (np.inf if one is None else one)  # the subsets whose top bit is i
            memory[bit : 2 * bit] = memory[:bit] + m.memory_mb
        fits = load <= fleet.share_limit + EPS
        if p.memory_mb is not None:
            fits &= memory <= p.memory_mb + EPS
        group[fits] = np.minimum(group[fits], p.usd_per_hour)
    group[0] = 0.0
    for i, m in enumerate(models):  # alone, a model may also take several dedicated nodes
        costs = [p.usd_per_hour * n for p in pools if (n := fleet.dedicated_nodes(m, p)) is not None]
        group[1 << i] = min([group[1 << i], *costs])
    group, best = group.tolist(), [0.0] * full  # lists: the loop below indexes them ~3^n / 2 times
    for mask in range(1, full):
        low = mask & -mask
        rest = mask ^ low
        sub, value = rest, math.inf
        while True:  # every group holding the lowest model, with any subset of the others
            value = min(value, group[sub | low] + best[rest ^ sub])
            if sub == 0:
                break
            sub = (sub - 1) & rest
        best[mask] = value
    return best[full - 1]
