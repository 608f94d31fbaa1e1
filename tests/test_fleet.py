"""tbench.capacity.fleet: the cheapest packing of models onto nodes, checked against exhaustive search."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from tbench.capacity.fleet import (
    Fleet,
    FleetModel,
    FleetPlan,
    FleetPool,
    Node,
    exhaustive_cost,
    plan_fleet,
    plan_problems,
)
from tbench.core.errors import ConfigError

T4 = FleetPool(name="t4", usd_per_hour=0.5, memory_mb=16_000)
A100 = FleetPool(name="a100", usd_per_hour=3.0, memory_mb=80_000)


def model(name: str, traffic: float, rates: dict[str, float], memory: float = 1_000) -> FleetModel:
    return FleetModel(name=name, traffic_rps=traffic, slo_ms=50, sustainable_rps=rates, memory_mb=memory)


def test_small_models_share_a_node_and_a_large_one_takes_dedicated_nodes():
    """Loads with 20% headroom on a t4: a 0.3, b 0.3, c 0.36 (one node, 0.96); d 2.4 (three dedicated nodes)."""
    fleet = Fleet(
        models=[
            model("a", 100, {"t4": 400}),
            model("b", 50, {"t4": 200}),
            model("c", 30, {"t4": 100}),
            model("d", 600, {"t4": 300, "a100": 1000}),
        ],
        pools=[T4, A100],
    )
    plan = plan_fleet(fleet)
    assert plan.optimal and plan.usd_per_hour == pytest.approx(4 * 0.5)
    shared = [n for n in plan.nodes if n.shared]
    assert len(shared) == 1 and set(shared[0].rates_rps) == {"a", "b", "c"} and shared[0].load == pytest.approx(0.96)
    assert [n.rates_rps for n in plan.nodes if not n.shared] == [{"d": 200.0}] * 3
    assert plan.alone_usd_per_hour == pytest.approx(6 * 0.5)
    # each model pays for its dedicated nodes and its load's share of the node it shares
    assert plan.models["a"].usd_per_hour == pytest.approx(0.5 * 0.3 / 0.96)
    assert sum(c.usd_per_hour for c in plan.models.values()) == pytest.approx(plan.usd_per_hour)
    assert plan.models["d"].usd_per_million == pytest.approx(1.5 / (600 * 3600) * 1e6)
    assert plan_problems(fleet, plan) == [] and exhaustive_cost(fleet) == pytest.approx(plan.usd_per_hour)


def test_memory_keeps_models_apart_that_their_loads_would_put_together():
    fleet = Fleet(models=[model("a", 10, {"t4": 400}, 9_000), model("b", 10, {"t4": 400}, 9_000)], pools=[T4])
    plan = plan_fleet(fleet)
    assert len(plan.nodes) == 2 and not any(n.shared for n in plan.nodes)
    roomy = fleet.model_copy(update={"pools": [T4.model_copy(update={"memory_mb": 20_000})]})
    assert len(plan_fleet(roomy).nodes) == 1


def test_a_dearer_pool_wins_where_it_packs_better():
    """Seven models, each 0.6 of a t4 (no two share one) and 0.1 of an a100: one a100 (3.0) beats seven t4s (3.5)."""
    fleet = Fleet(models=[model(f"m{i}", 60, {"t4": 120, "a100": 720}) for i in range(7)], pools=[T4, A100])
    plan = plan_fleet(fleet)
    assert plan.nodes_per_pool == {"a100": 1} and plan.usd_per_hour == pytest.approx(3.0)
    assert plan.alone_usd_per_hour == pytest.approx(7 * 0.5)


def test_the_solver_finds_the_exhaustive_optimum_on_random_fleets():
    rng = np.random.default_rng(7)
    for _ in range(25):
        pools = [T4, A100, FleetPool(name="l4", usd_per_hour=0.8, memory_mb=24_000)]
        models = []
        for i in range(int(rng.integers(3, 9))):
            base = float(rng.lognormal(5, 1))
            rates = {p.name: base * s * float(rng.lognormal(0, 0.3)) for p, s in zip(pools, (1, 6, 1.9), strict=True)}
            models.append(model(f"m{i}", base * float(rng.uniform(0.05, 2.5)), rates, float(rng.uniform(500, 15_000))))
        fleet = Fleet(models=models, pools=pools)
        plan = plan_fleet(fleet)
        assert plan_problems(fleet, plan) == []
        assert math.isclose(plan.usd_per_hour, exhaustive_cost(fleet), rel_tol=1e-9)
        assert plan.usd_per_hour <= plan.alone_usd_per_hour + 1e-9


def test_a_plan_over_a_nodes_load_or_memory_is_caught():
    fleet = Fleet(models=[model("a", 100, {"t4": 200}), model("b", 100, {"t4": 200})], pools=[T4])
    crowded = FleetPlan(
        nodes=[Node(pool="t4", rates_rps={"a": 100, "b": 100}, load=1.2, shared=True)],
        usd_per_hour=0.5,
        nodes_per_pool={"t4": 1},
        models={},
        alone_usd_per_hour=1.0,
        optimal=True,
        solver_seconds=0.0,
    )
    assert plan_problems(fleet, crowded) == ["node 0 (t4): load 1.200 over 1"]
    short = crowded.model_copy(update={"nodes": [Node(pool="t4", rates_rps={"a": 100}, load=0.6, shared=False)]})
    assert plan_problems(fleet, short) == ["b: 0 of 100 req/s served"]


def test_a_model_that_runs_on_no_pool_is_one_line_naming_the_fix():
    fleet = Fleet(models=[model("big", 10, {"t4": 100}, memory=30_000)], pools=[T4])
    with pytest.raises(ConfigError, match="model 'big' runs on no pool of the fleet") as err:
        plan_fleet(fleet)
    assert "\n" not in str(err.value) and "tbench capacity" in str(err.value)


@pytest.mark.parametrize(
    ("models", "pools", "message"),
    [
        ([model("a", 1, {"v100": 10})], [T4], "names a pool not in the fleet's pools: v100"),
        ([model("a", 1, {"t4": 10}), model("a", 2, {"t4": 10})], [T4], "model names must be unique: a given twice"),
        ([model("a", 1, {"t4": 10})], [T4, T4], "pool names must be unique: t4 given twice"),
        ([], [T4], "at least 1 item"),
    ],
)
def test_a_fleet_that_cannot_be_planned_is_refused_before_planning(models, pools, message):
    with pytest.raises(ValidationError, match=message):
        Fleet(models=models, pools=pools)


def test_a_group_that_failed_its_confirmation_never_shares_a_node_again():
    fleet = Fleet(
        models=[model("a", 100, {"t4": 400}), model("b", 50, {"t4": 200}), model("c", 30, {"t4": 100})],
        pools=[T4, A100],
    )
    assert len(plan_fleet(fleet).nodes) == 1  # all three on one t4
    replanned = plan_fleet(fleet, forbidden=[("t4", frozenset({"a", "b", "c"}))])
    assert all(set(n.rates_rps) != {"a", "b", "c"} for n in replanned.nodes)
    assert replanned.usd_per_hour == pytest.approx(1.0) and plan_problems(fleet, replanned) == []
    # forbidden on a t4 only: an a100 may still hold the three (dearer than two t4s here, so it does not)
    assert replanned.nodes_per_pool == {"t4": 2}


def fleet_file(tmp_path, text: str, name: str = "fleet.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
headroom: 0.1
pools:
  - name: cpu
  - {name: t4, usd_per_hour: 0.5, memory_mb: 16000}
models:
  - {name: a, traffic_rps: 10, slo_ms: 50, sustainable_rps: {cpu: 40, t4: 200}, repository: repo}
  - {name: b, traffic_rps: 5, slo_ms: 80, percentile: 95, sustainable_rps: {t4: 100}}
"""


def test_a_fleet_file_reads_prices_from_the_table_and_repositories_from_its_folder(tmp_path):
    from tbench.capacity.costs import load_prices, price_for
    from tbench.capacity.fleet_file import load_fleet

    (tmp_path / "repo" / "a").mkdir(parents=True)
    fleet = load_fleet(fleet_file(tmp_path, GOOD))
    cpu = next(p for p in fleet.pools if p.name == "cpu")
    assert cpu.usd_per_hour == pytest.approx(float(price_for(load_prices(), "cpu")["usd_per_hour"]))
    assert fleet.models[0].repository == str((tmp_path / "repo").resolve()) and fleet.models[1].percentile == 95
    as_json = fleet_file(tmp_path, fleet.model_dump_json(), "fleet.json")
    assert load_fleet(as_json) == fleet


def test_a_fleet_file_and_its_repositories_travel_through_the_artifact_store(tmp_path, s3_to_stop, monkeypatch):
    """From the Prefect UI the fleet file is an upload's URL (S3 here, moto over HTTP), and so may its models'
    repositories be: the file is fetched and checked; a repository URL is kept, and fetched where its node is
    measured (flows.colocated), as another pool's worker does."""
    from tbench.capacity.fleet_file import load_fleet
    from tbench.core import handover
    from tbench.core.storage import url_to_fs
    from tbench.request.colocated import ColocatedRequest, ModelLoad

    monkeypatch.setenv(handover.CACHE_ENV, str(tmp_path / "worker-cache"))
    url_to_fs("s3://runs")[0].mkdir("runs")
    (tmp_path / "repo" / "a" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "config.pbtxt").write_text('name: "a"\n')
    repo_url = handover.upload(tmp_path / "repo", "s3://runs/team")
    text = GOOD.replace("repository: repo", f"repository: {repo_url}")
    fleet = load_fleet(handover.upload(fleet_file(tmp_path, text), "s3://runs/team"))
    assert fleet.models[0].repository == repo_url
    node = ColocatedRequest(loads=[ModelLoad(model="a", rate=10)], repositories=[repo_url])
    fetched = handover.local_path(node.repositories[0])
    assert fetched.startswith(str(tmp_path / "worker-cache")) and (Path(fetched) / "a" / "config.pbtxt").is_file()
    with pytest.raises(ConfigError, match="fleet file .* not found"):
        load_fleet(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [\n", "is not valid YAML"),
        ("- a\n- b\n", "must hold a mapping with models and pools"),
        (GOOD.replace("name: cpu", "name: tpu"), "pool 'tpu' has no usd_per_hour and the price table has no row"),
        (GOOD.replace("repository: repo", "repository: nowhere"), "model 'a': repository"),
        (GOOD.replace("{name: a,", "{name: resnet,"), "model 'resnet' is not in its repository"),
        (GOOD.replace("traffic_rps: 10", "traffic_rps: -1"), "models.0.traffic_rps: Input should be greater than 0"),
        (GOOD.replace("{t4: 100}", "{v100: 100}"), "names a pool not in the fleet's pools: v100"),
        (GOOD.replace("percentile: 95", "percentile: 97"), "models.1.percentile: Input should be 50, 90, 95 or 99"),
    ],
)
def test_a_fleet_file_with_a_mistake_is_one_line_naming_it(tmp_path, text, message):
    from tbench.capacity.fleet_file import load_fleet

    (tmp_path / "repo" / "a").mkdir(parents=True)
    with pytest.raises(ConfigError, match=message) as err:
        load_fleet(fleet_file(tmp_path, text))
    assert "\n" not in str(err.value)


def test_the_report_says_what_was_measured_and_what_was_planned_around():
    from tbench.capacity.fleet import Confirmation
    from tbench.capacity.fleet_report import fleet_markdown

    fleet = Fleet(
        models=[model("a", 100, {"t4": 400}), model("b", 50, {"t4": 200}), model("c", 30, {"t4": 100})],
        pools=[T4],
    )
    failed = Confirmation(
        pool="t4", models=["a", "b", "c"], rates_rps={}, held=False, reason="c: p99 40 ms > SLO 30 ms", folder="c-1"
    )
    plan = plan_fleet(fleet, forbidden=[failed.key])
    pair = next(n for n in plan.nodes if n.shared)
    held = Confirmation(pool="t4", models=sorted(pair.rates_rps), rates_rps={}, held=True, folder="c-2")
    text = fleet_markdown(fleet, plan, [failed, held], [{}, {}])
    assert "**$1/hour** on 2 x t4, against $1.5/hour with one model per node (33% less)" in text
    assert "Every shared node was measured with its models together" in text
    assert "held, measured together (c-2/)" in text
    assert "- a + b + c on t4: c: p99 40 ms > SLO 30 ms (c-1/)" in text
    assert "**No plan held.**" in fleet_markdown(fleet, None, [failed], [{}])
    interrupted = fleet_markdown(fleet, None, [failed], [{}], stopped="interrupted by Ctrl-C (SIGINT)")
    assert "**No plan**: the run stopped before one was confirmed (interrupted by Ctrl-C (SIGINT))" in interrupted


def test_the_fleet_command_refuses_a_bad_fleet_file_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from tbench.cli import app

    for args, message in [
        (["fleet", str(tmp_path / "none.yaml")], f"error: fleet file {tmp_path / 'none.yaml'} not found"),
        (["fleet", str(fleet_file(tmp_path, "models: []\npools: []\n"))], "error: fleet file"),
        (["fleet", str(fleet_file(tmp_path, GOOD)), "--rounds", "0"], "error: invalid option: rounds"),
    ]:
        result = CliRunner().invoke(app, args)
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(message), result.output
