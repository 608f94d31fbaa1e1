"""The fleet plan's report (fleet.md): the plan's cost beside one model per node, its nodes with what each serves and
whether the packing was measured to hold, each model's cost, and the packings that failed and were planned around."""

from __future__ import annotations

from tbench.capacity.fleet import Confirmation, Fleet, FleetPlan

FLEET_MD = "fleet.md"
FLEET_JSON = "fleet_plan.json"


def _held(c: Confirmation | None) -> str:
    if c is None:
        return "alone (its capacity plan)"
    if c.held is None:
        return c.reason
    verdict = "held" if c.held else "FAILED"
    return f"{verdict}, measured together ({c.folder}/)" + (f": {c.reason}" if c.reason else "")


def fleet_markdown(
    fleet: Fleet, plan: FleetPlan | None, confirmations: list[Confirmation], rounds: list[dict], stopped: str = ""
) -> str:
    """`stopped`: why the run ended before a plan held (an interrupt, an error); no plan is then reported."""
    by_key = {c.key: c for c in confirmations}
    lines = [f"# Fleet plan: {len(fleet.models)} models on {', '.join(p.name for p in fleet.pools)}", ""]
    if stopped:
        lines += [f"**No plan**: the run stopped before one was confirmed ({stopped}).", ""]
    elif plan is None:
        lines += [
            f"**No plan held.** Each of the {len(rounds)} plans tried had a shared node whose models, measured "
            "together at their planned rates, did not all keep their SLO; see the packings below.",
            "",
        ]
    if plan is not None:
        unconfirmed = [n for n in plan.nodes if n.shared and by_key[(n.pool, frozenset(n.rates_rps))].held is None]
        saving = 1 - plan.usd_per_hour / plan.alone_usd_per_hour if plan.alone_usd_per_hour else 0.0
        pools = ", ".join(f"{count} x {pool}" for pool, count in plan.nodes_per_pool.items())
        lines += [
            f"**${plan.usd_per_hour:.4g}/hour** on {pools}, against ${plan.alone_usd_per_hour:.4g}/hour with one model "
            f"per node ({saving:.0%} less). "
            + ("The solver proved it the cheapest plan." if plan.optimal else f"Not proven optimal: {plan.message}."),
            "",
            (
                f"{len(unconfirmed)} shared node(s) not measured here: the plan holds for them only as far as the "
                "models' loads add up (see each node)."
                if unconfirmed
                else "Every shared node was measured with its models together at their planned rates, with the "
                f"headroom ({fleet.headroom:.0%}), and held."
            ),
            "",
            "| node | pool | serves (requests/s) | load | memory MB | packing |",
            "|---:|---|---|---:|---:|---|",
        ]
        for i, node in enumerate(plan.nodes):
            serves = ", ".join(f"{name} {rate:.4g}" for name, rate in node.rates_rps.items())
            c = by_key.get((node.pool, frozenset(node.rates_rps))) if node.shared else None
            lines.append(f"| {i} | {node.pool} | {serves} | {node.load:.2f} | {node.memory_mb:.0f} | {_held(c)} |")
        lines += ["", "| model | traffic req/s | SLO | nodes | $/hour | $ per 1M inferences |"]
        lines += ["|---|---:|---|---|---:|---:|"]
        for m in fleet.models:
            cost = plan.models[m.name]
            lines.append(
                f"| {m.name} | {m.traffic_rps:g} | p{m.percentile} ≤ {m.slo_ms:g} ms | "
                f"{', '.join(map(str, cost.nodes))} | {cost.usd_per_hour:.4g} | {cost.usd_per_million:.4g} |"
            )
    failed = [c for c in confirmations if c.held is False]
    if failed:
        lines += ["", "## Packings that failed their measurement (planned around)", ""]
        lines += [f"- {' + '.join(c.models)} on {c.pool}: {c.reason} ({c.folder}/)" for c in failed]
    lines += [
        "",
        "A model's load on a pool is its traffic with the headroom over the rate one node of the pool sustains for it "
        "alone within its SLO; a shared node carries loads summing to at most "
        f"{fleet.share_limit:g}. Each model's cost is its dedicated nodes and its load's share of a shared node.",
    ]
    return "\n".join(lines) + "\n"
