"""From a sustainable rate to instances, money and energy; the price table (shipped and the user's)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tbench.capacity.costs import PRICE_COLUMNS, Plan, load_prices, plan, price_for
from tbench.core.errors import ConfigError
from tbench.team.pools import POOLS

# -- plan ------------------------------------------------------------------------------------------------------------


def test_instances_round_up_with_headroom():
    # 100 x 1.3 / 40 = 3.25 -> 4
    assert plan(40.0, 100.0, 0.3).instances == 4


def test_instances_without_headroom():
    # 100 / 40 = 2.5 -> 3
    assert plan(40.0, 100.0, 0.0).instances == 3


def test_exact_division_does_not_add_an_instance():
    assert plan(40.0, 80.0, 0.0).instances == 2


@pytest.mark.parametrize(
    ("rate", "traffic", "headroom", "expected"),
    [
        (55.0, 100.0, 0.1, 2),  # 110 / 55: 2.0000000000000004 in floating point
        (30.0, 100.0, 0.2, 4),  # 120 / 30: exactly 4
        (10.0, 70.0, 0.3, 10),  # 91 / 10 = 9.1 -> 10 (1 + 0.3 is 1.3000000000000003)
        (0.1, 0.7, 0.0, 7),  # 0.7 / 0.1 = 6.999999999999999
        (3.0, 1.0, 2.0, 1),  # 3 / 3
    ],
)
def test_instances_at_floating_point_boundaries(rate, traffic, headroom, expected):
    assert plan(rate, traffic, headroom).instances == expected


def test_at_least_one_instance():
    assert plan(1000.0, 0.5, 0.2).instances == 1


def test_instances_match_the_formula():
    for rate in (7.0, 13.3, 40.0, 250.0):
        for traffic in (1.0, 99.0, 1234.5):
            for headroom in (0.0, 0.25, 1.0):
                exact = traffic * (1 + headroom) / rate
                got = plan(rate, traffic, headroom).instances
                assert got >= max(1, exact - 1e-9)
                assert got - 1 < max(1, exact)


def test_cost_per_hour_is_instances_times_price():
    p = plan(40.0, 100.0, 0.3, usd_per_hour=2.5)
    assert p.usd_per_hour == 2.5
    assert p.cost_per_hour == pytest.approx(4 * 2.5)


def test_usd_per_million_by_hand():
    # 4 instances x $2.50 = $10/h; 100 req/s x batch 4 x 3600 s = 1,440,000 inferences/h -> $6.944 per million
    p = plan(40.0, 100.0, 0.3, batch_size=4, usd_per_hour=2.5)
    assert p.usd_per_million == pytest.approx(10 / 1.44)
    assert p.usd_per_million == pytest.approx(6.944444, rel=1e-6)


def test_usd_per_million_at_batch_one():
    # 3 instances x $0.526 = $1.578/h over 100 x 3600 = 360,000 inferences -> $4.3833 per million
    p = plan(40.0, 100.0, 0.0, usd_per_hour=0.526)
    assert p.usd_per_million == pytest.approx(1.578 / 0.36)


def test_usd_per_million_is_at_the_traffic_not_the_capacity():
    """Paying for idle headroom: more headroom, same traffic, costs more per inference."""
    lean = plan(40.0, 100.0, 0.0, usd_per_hour=1.0)
    roomy = plan(40.0, 100.0, 1.0, usd_per_hour=1.0)
    assert roomy.instances == 5 and lean.instances == 3
    assert roomy.usd_per_million / lean.usd_per_million == pytest.approx(5 / 3)


def test_joules_per_inference():
    # from the energy counter, when the point has it: it wins over the mean power
    assert plan(40.0, 100.0, 0.3, power_w=200.0, joules_per_inference=4.2).joules_per_inference == 4.2
    assert plan(40.0, 100.0, 0.3, power_w=200.0).joules_per_inference == pytest.approx(5.0)
    assert plan(40.0, 100.0, 0.3, batch_size=8, power_w=200.0).joules_per_inference == pytest.approx(200 / 320)


def test_no_price_gives_no_money():
    p = plan(40.0, 100.0, 0.3)
    assert p.usd_per_hour is None
    assert p.cost_per_hour is None
    assert p.usd_per_million is None
    assert p.instances == 4


@pytest.mark.parametrize("power", [None, 0.0])
def test_no_power_gives_no_energy(power):
    assert plan(40.0, 100.0, 0.3, usd_per_hour=1.0, power_w=power).joules_per_inference is None


def test_plan_keeps_its_inputs():
    p = plan(40.0, 100.0, 0.3, batch_size=2, usd_per_hour=1.5, power_w=300.0)
    assert isinstance(p, Plan)
    assert (p.sustainable_rps, p.traffic_rps, p.headroom) == (40.0, 100.0, 0.3)
    assert Plan.model_validate_json(p.model_dump_json()) == p


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_non_positive_rate_is_a_config_error(rate):
    with pytest.raises(ConfigError, match="positive"):
        plan(rate, 100.0, 0.2, usd_per_hour=1.0)


# -- price table -----------------------------------------------------------------------------------------------------


def test_shipped_table_has_every_pool():
    prices = load_prices()
    assert list(prices.columns) == PRICE_COLUMNS
    assert prices["pool"].is_unique
    for pool in POOLS:
        entry = price_for(prices, pool)
        assert entry is not None, pool
        assert isinstance(entry["usd_per_hour"], float) and entry["usd_per_hour"] > 0, pool
        assert entry["price_date"], pool
        assert pd.Timestamp(entry["price_date"]).year >= 2020, pool  # a date, kept as the text written
        assert isinstance(entry["price_date"], str), pool
        assert isinstance(entry["source"], str) and entry["source"].strip(), pool


def test_shipped_table_has_no_unknown_pools():
    assert set(load_prices()["pool"]) <= set(POOLS)


def test_empty_path_reads_the_shipped_table():
    assert load_prices("").equals(load_prices())


def test_user_table_is_read(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("pool,usd_per_hour,source,price_date\nt4,0.35,my contract,2026-01-31\nmine,1.25,,\n")
    prices = load_prices(path)
    assert len(prices) == 2
    t4 = price_for(prices, "t4")
    assert t4 == {"pool": "t4", "usd_per_hour": 0.35, "source": "my contract", "price_date": "2026-01-31"}
    mine = price_for(prices, "mine")
    assert mine["usd_per_hour"] == 1.25
    assert mine["source"] is None and mine["price_date"] is None  # empty cells are None, not NaN


def test_user_table_as_string_path(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("pool,usd_per_hour\na100,3.0\n")
    assert price_for(load_prices(str(path)), "a100")["usd_per_hour"] == 3.0


def test_user_table_first_row_wins(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("pool,usd_per_hour\nt4,0.5\nt4,0.9\n")
    assert price_for(load_prices(path), "t4")["usd_per_hour"] == 0.5


def test_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(ConfigError, match="not found") as raised:
        load_prices(path)
    assert "nope.csv" in str(raised.value)


def test_table_without_price_column_is_a_config_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("pool,gpu,price\nt4,T4,0.5\n")
    with pytest.raises(ConfigError, match="has no usd_per_hour column") as raised:
        load_prices(path)
    assert "bad.csv" in str(raised.value)


def test_table_without_pool_column_is_a_config_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("name,usd_per_hour\nt4,0.5\n")
    with pytest.raises(ConfigError, match="no pool column"):
        load_prices(path)


def test_price_for_unknown_pool_is_none():
    assert price_for(load_prices(), "tpu-v9") is None
    assert price_for(load_prices(), "") is None


def test_price_for_shipped_pool_feeds_plan():
    t4 = price_for(load_prices(), "t4")
    p = plan(40.0, 100.0, 0.3, usd_per_hour=t4["usd_per_hour"])
    assert p.cost_per_hour == pytest.approx(4 * t4["usd_per_hour"])
    assert math.isfinite(p.usd_per_million)
