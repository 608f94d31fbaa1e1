"""The fleet plan's packing against the optimum: on simulated fleets of known per-model capacities (6-12 models, 2-3
GPU kinds with their prices and memory), the cost of tbench's plan (tbench.capacity.fleet.plan_fleet, an integer
program) against the least cost found by exhaustive search over every partition of the models (exhaustive_cost), each
plan checked from its nodes alone (plan_problems: every model's traffic served, no node over its load or memory).

Then, unless --simulated-only, a real fleet of three models planned and confirmed on this machine, and the
interference of two of them on one server (benchmarks/fleet_real.py: 15-25 minutes).

Usage: .venv/bin/python benchmarks/fleet.py [--fleets 500] [--seed 0] [--simulated-only]
Writes benchmarks/results/fleet.json: `optimal_share` (plans that cost the optimum), `infeasible_plans` (plans with a
problem), the saving over one model per node, the solver's time, the conditions tried, and `real_fleet` and
`interference`.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from provenance import RESULTS, recorded

from tbench.capacity.fleet import Fleet, FleetModel, FleetPool, exhaustive_cost, plan_fleet, plan_problems

# GPU kinds: price per hour, device memory, speed relative to the first (rough public figures; only ratios matter)
KINDS = {
    "t4": (0.53, 16_000, 1.0),
    "l4": (0.80, 24_000, 1.9),
    "a10g": (1.01, 24_000, 2.3),
    "a100": (3.40, 80_000, 6.0),
}
MODELS = (6, 12)  # models per fleet, both ends included
LOAD_RANGE = (0.03, 3.0)  # a model's traffic over one node of the first kind: log-uniform (some need several nodes)
AFFINITY_SD = 0.3  # log sd of a model's speed on a kind beyond the kind's own speed (a model that suits a GPU)
MISSING = 0.1  # the share of (model, kind) pairs without a measured rate
MEMORY_MB = (4_000, 1.0)  # lognormal median and log sd of a model's memory on the device


def simulated_fleet(rng: np.random.Generator) -> Fleet:
    kinds = [str(k) for k in rng.choice(list(KINDS), size=int(rng.integers(2, 4)), replace=False)]
    pools = [FleetPool(name=k, usd_per_hour=KINDS[k][0], memory_mb=KINDS[k][1]) for k in kinds]
    models = []
    for i in range(int(rng.integers(MODELS[0], MODELS[1] + 1))):
        base = float(rng.lognormal(math.log(200), 1.0))  # req/s on the first kind's node
        rates = {
            k: base * KINDS[k][2] / KINDS[kinds[0]][2] * float(rng.lognormal(0, AFFINITY_SD))
            for k in kinds
            if rng.random() >= MISSING
        }
        load = math.exp(rng.uniform(*np.log(LOAD_RANGE)))
        memory = float(rng.lognormal(math.log(MEMORY_MB[0]), MEMORY_MB[1]))
        if not any(memory <= KINDS[k][1] for k in rates):  # every model runs somewhere: on the largest kind
            largest = max(kinds, key=lambda k: KINDS[k][1])
            rates.setdefault(largest, base * KINDS[largest][2] / KINDS[kinds[0]][2])
            memory = min(memory, 0.9 * KINDS[largest][1])
        models.append(
            FleetModel(
                name=f"m{i}",
                traffic_rps=load * base,
                slo_ms=100,
                sustainable_rps=rates,
                memory_mb=memory,
            )
        )
    return Fleet(models=models, pools=pools)


def real(record) -> None:
    """The real fleet and the interference (benchmarks/fleet_real.py), saved as each part ends."""
    import fleet_real

    record.model_sizes += ["tiny image model (ONNX file)", "resnet50 small", "sleeper 10 ms"]
    work = Path(tempfile.mkdtemp(prefix="tbench-fleet-bench-"))
    repos = fleet_real.repositories(work)
    record["sustainable_rates"] = rates = fleet_real.sustainable_rates(repos, work)
    record.save()
    record["interference"] = fleet_real.interference(repos, rates, work)
    record.save()
    record["real_fleet"] = fleet_real.real_fleet(repos, rates, work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulated-only", action="store_true", help="Leave out the real fleet and interference.")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    with recorded(RESULTS / "fleet.json", model_sizes=["simulated fleets of known capacities"]) as record:
        optimal, infeasible, proven, savings, seconds, exhaustive_s, sizes, nodes, unplannable = ([] for _ in range(9))
        for _ in range(args.fleets):
            fleet = simulated_fleet(rng)
            try:
                plan = plan_fleet(fleet)
            except Exception as err:  # a model no pool can run: the fleet has no plan (counted, never silent)
                unplannable.append(str(err))
                continue
            started = time.monotonic()
            best = exhaustive_cost(fleet)
            exhaustive_s.append(time.monotonic() - started)
            optimal.append(math.isclose(plan.usd_per_hour, best, rel_tol=1e-6))
            infeasible.append(bool(plan_problems(fleet, plan)))
            proven.append(plan.optimal)
            savings.append(1 - plan.usd_per_hour / plan.alone_usd_per_hour)
            seconds.append(plan.solver_seconds)
            sizes.append(len(fleet.models))
            nodes.append(len(plan.nodes))
        record.update(
            fleets=len(optimal),
            optimal_share=float(np.mean(optimal)),
            infeasible_plans=int(np.sum(infeasible)),
            proven_optimal_share=float(np.mean(proven)),
            unplannable_fleets=len(unplannable),
            saving_over_one_model_per_node={
                "median": round(float(np.median(savings)), 3),
                "p10": round(float(np.percentile(savings, 10)), 3),
                "p90": round(float(np.percentile(savings, 90)), 3),
            },
            solver_seconds={"median": round(float(np.median(seconds)), 3), "max": round(float(np.max(seconds)), 3)},
            exhaustive_seconds={"median": round(float(np.median(exhaustive_s)), 3), "max": round(max(exhaustive_s), 3)},
            nodes_per_plan={"median": float(np.median(nodes)), "max": int(np.max(nodes))},
            conditions={
                "seed": args.seed,
                "models_per_fleet": list(MODELS),
                "kinds": {k: {"usd_per_hour": v[0], "memory_mb": v[1], "speed": v[2]} for k, v in KINDS.items()},
                "kinds_per_fleet": [2, 3],
                "load_range": list(LOAD_RANGE),
                "affinity_log_sd": AFFINITY_SD,
                "missing_rate_share": MISSING,
                "memory_mb_lognormal": list(MEMORY_MB),
                "models_seen": {"min": int(min(sizes)), "max": int(max(sizes))},
            },
        )
        if not args.simulated_only:
            real(record)
        print(
            f"fleets {len(optimal)}: optimal {record['optimal_share']:.3f}, infeasible {record['infeasible_plans']}, "
            f"saving median {record['saving_over_one_model_per_node']['median']:.1%}, "
            f"solver median {record['solver_seconds']['median']} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
