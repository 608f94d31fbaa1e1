"""A fleet plan (`tbench fleet FLEET.yaml`): the cheapest packing of the fleet's models onto nodes
(tbench.capacity.fleet), each shared node of this machine's pool confirmed by measuring its models together at their
planned rates (flows.colocated's measurement), and a packing that fails planned around, until a plan holds: wiring
only."""

from __future__ import annotations

import contextlib

import pandas as pd
from prefect import flow

from flows.colocated import measure_colocated
from flows.lifecycle import finish_run, run_lifecycle
from tasks.matrix_runs import matrix_run
from tbench.capacity.fleet import Confirmation, Fleet, FleetPlan, Node, plan_fleet
from tbench.capacity.fleet_file import load_fleet
from tbench.capacity.fleet_report import FLEET_JSON, FLEET_MD, fleet_markdown
from tbench.capacity.rate_search import PASSING
from tbench.capacity.request import FleetRequest
from tbench.core import handover
from tbench.core.errors import ConfigError
from tbench.core.layout import RunLayout
from tbench.core.storage import url_to_fs
from tbench.node import hardware as hw
from tbench.node.device_lock import device_lock
from tbench.request.benchmark import MeasurementOverrides
from tbench.request.colocated import ColocatedRequest, ModelLoad
from tbench.results.html_report import write_html_report
from tbench.stages.colocated import TOGETHER
from tbench.stages.tracker import RunTracker
from tbench.team.matrix_runs import children_cancelled_on_interrupt
from tbench.team.pools import pool_of


@flow(name="triton-fleet")
def fleet_flow(request: FleetRequest) -> str:
    """Plan, confirm, plan around what failed; returns the URL of the run folder (fleet.md has the plan)."""
    hardware = hw.detect()
    fleet = load_fleet(request.fleet, request.prices)
    here = request.pool or pool_of(hardware)
    # the device lock only while a node is measured here: a node fanned out to a pool whose worker is this machine
    # would otherwise wait for the lock this run holds while it waits for that node
    with run_lifecycle(request, hardware, "fleet", request.model_dump(mode="json"), lock=False) as tracker:
        return _plan(request, fleet, here, hardware, tracker)


def _plan(request: FleetRequest, fleet: Fleet, here: str | None, hardware, tracker: RunTracker) -> str:
    confirmations: dict[tuple, Confirmation] = {}
    rows: list[dict] = []
    plan: FleetPlan | None = None
    rounds: list[dict] = []
    error = None
    try:
        for n in range(1, request.rounds + 1):
            forbidden = [key for key, c in confirmations.items() if c.held is False]
            with tracker.stage(f"plan-{n}"):
                plan = plan_fleet(fleet, forbidden=forbidden)
            rounds.append({"usd_per_hour": plan.usd_per_hour, "planned_around": [sorted(g) for _, g in forbidden]})
            for node in plan.nodes:
                key = (node.pool, frozenset(node.rates_rps))
                if node.shared and key not in confirmations:
                    folder = f"confirm-{len(confirmations) + 1}"
                    confirmations[key] = confirm(request, fleet, node, here, hardware, tracker, folder, rows)
            if all(confirmations[(node.pool, frozenset(node.rates_rps))].held is not False for node in shared(plan)):
                break
        else:
            plan = None  # every round's plan had a packing that failed: none is reported
    except BaseException as err:  # interrupted or failed before a plan held: none is reported
        error, plan = err, None
        raise
    finally:
        url = _finish(tracker, request, fleet, plan, list(confirmations.values()), rounds, hardware, error)
    if plan is None:
        raise ConfigError(
            f"no plan held: each of the {request.rounds} plans tried had a packing whose measurement failed (more "
            f"--rounds, or a lower share_limit in the fleet file); the run folder is {url}"
        )
    return url


def shared(plan: FleetPlan) -> list[Node]:
    return [n for n in plan.nodes if n.shared]


def confirm(
    request: FleetRequest,
    fleet: Fleet,
    node: Node,
    here: str | None,
    hardware,
    tracker: RunTracker,
    folder: str,
    rows: list[dict],
) -> Confirmation:
    """The node's models served together on this machine at their planned rates with the headroom: held when every
    one kept up and met its SLO (as a capacity plan judges a rate)."""
    models = {m.name: m for m in fleet.models}
    rates = {name: rate * (1 + fleet.headroom) for name, rate in node.rates_rps.items()}
    base = Confirmation(pool=node.pool, models=sorted(rates), rates_rps=rates, held=None)
    if not request.confirm:
        return base.model_copy(update={"reason": "not measured (--no-confirm)"})
    if node.pool != here and not request.fan_out:
        where = f"this machine's pool is {here}" if here else "this machine has no pool"
        how = f"run `tbench fleet` on a {node.pool} node, or fan out to its pool (--fan-out)"
        return base.model_copy(update={"reason": f"not measured: {where}; {how}"})
    lacking = sorted(name for name in rates if not models[name].repository)
    if lacking:
        return base.model_copy(update={"reason": f"not measured: no repository for {', '.join(lacking)}"})
    colocated = ColocatedRequest(
        loads=[
            ModelLoad(
                model=name,
                rate=rate,
                batch=models[name].batch_size,
                slo_ms=models[name].slo_ms,
                percentile=models[name].percentile,
            )
            for name, rate in rates.items()
        ],
        repositories=sorted({models[name].repository for name in rates}),
        only_loaded=True,
        server=request.server,
        alone=False,
        measurement=MeasurementOverrides(window_s=request.window_s) if request.window_s else None,
        output=request.output,
        http_port=request.http_port,
        grpc_port=request.grpc_port,
    )
    measured: list[dict] = []

    def keep(row: dict) -> None:
        measured.append(row | {"node": folder})
        rows.append(measured[-1])
        tracker.save_points("fleet", pd.DataFrame(rows))

    if node.pool != here:  # fanned out: its pool's colocated deployment measures it
        with tracker.stage(f"{folder}-{node.pool}"), children_cancelled_on_interrupt():
            child = on_pool(request, colocated, node.pool)
        if child.get("state") != "COMPLETED" or not child.get("run_url"):
            why = child.get("reason") or ("its folder was not found" if child.get("run_url") is None else "")
            reason = f"its run on {node.pool} ended {child.get('state')}: {why or 'no reason given'}"
            return base.model_copy(update={"held": False, "reason": reason, "folder": child.get("run_url") or ""})
        for row in child_rows(child["run_url"]):
            keep(row)
        folder = child["run_url"]
    else:
        with contextlib.ExitStack() as held:
            with tracker.stage(f"{folder}-device-lock"):
                held.enter_context(device_lock(hardware, tracker.layout.run_id))
            layout = RunLayout(tracker.layout.run_dir, folder)
            measure_colocated(colocated, hardware, tracker, layout, keep, prefix=f"{folder}-")
    together = [r for r in measured if r.get("colocation") == TOGETHER]
    failing = [r for r in together if r.get("slo") not in PASSING]
    points = {
        r["model"]: {
            "status": r.get("status"),
            "slo": r.get("slo"),
            "slo_reason": r.get("slo_reason"),
            "latency_ms": r.get("slo_latency_ms"),
            "throughput_infer_per_s": r.get("throughput_infer_per_s"),
        }
        for r in together
    }
    reason = "; ".join(f"{r['model']}: {r.get('slo_reason') or r.get('error') or r.get('status')}" for r in failing)
    held = len(together) == len(rates) and not failing
    return base.model_copy(update={"held": held, "reason": reason, "folder": folder, "points": points})


def on_pool(request: FleetRequest, colocated: ColocatedRequest, pool: str) -> dict:
    """The node measured by `pool`'s colocated deployment, its repositories handed over (uploaded to a shared
    artifact root, as a submitted model file is): the child run's row (state, reason, run_url)."""
    repositories = [handover.hand_over_path(repo, request.output) for repo in colocated.repositories]
    # the server mode and ports are the worker's own (its environment's defaults)
    request_fields = colocated.model_dump(mode="json", exclude={"server", "http_port", "grpc_port"})
    parameters = {"request": request_fields | {"repositories": repositories}}
    names = "+".join(load.name for load in colocated.loads)
    return matrix_run(pool, names, None, "-", parameters, 600, request.child_timeout_s, flow="colocated")


def child_rows(run_url: str) -> list[dict]:
    """The rows a fanned-out node's run stored (its results.csv)."""
    fs, path = url_to_fs(f"{run_url.rstrip('/')}/results.csv")
    with fs.open(path, "r") as f:
        return pd.read_csv(f).to_dict("records")


def _finish(tracker, request, fleet, plan, confirmations, rounds, hardware, error) -> str:
    layout = tracker.layout
    manifest = {
        "request": request.model_dump(mode="json"),
        "hardware": hardware.model_dump(),
        "local_dir": str(layout.run_dir),
    }

    def report() -> None:
        with tracker.stage("report"):
            record = {
                "fleet": fleet.model_dump(mode="json"),
                "plan": plan.model_dump(mode="json") if plan else None,
                "confirmations": [c.model_dump(mode="json") for c in confirmations],
                "rounds": rounds,
            }
            tracker.save_json(layout.run_dir / FLEET_JSON, record)
            stopped = "" if error is None else tracker.error or str(error)
            (layout.run_dir / FLEET_MD).write_text(fleet_markdown(fleet, plan, confirmations, rounds, stopped))
            write_html_report(layout.run_dir / FLEET_MD, layout.run_dir / "fleet.html")
            manifest["summary"] = {
                "fleet": FLEET_MD,
                "usd_per_hour": plan.usd_per_hour if plan else None,
                "alone_usd_per_hour": plan.alone_usd_per_hour if plan else None,
            }

    return finish_run(tracker, error, manifest, server=None, output=request.output, report=report)
