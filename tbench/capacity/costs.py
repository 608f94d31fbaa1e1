"""From a sustainable rate to an answer in money: instances for a traffic, price per hour from an editable price table,
cost per million inferences, and energy per inference where the GPU's power was read."""

from __future__ import annotations

import math
from importlib.resources import files
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from tbench.core.errors import ConfigError

PRICE_COLUMNS = ["pool", "gpu", "usd_per_hour", "provider", "instance", "region", "price_date", "source", "note"]
SHIPPED_PRICES = "data/prices.csv"  # inside the tbench package


def load_prices(path: str | Path | None = None) -> pd.DataFrame:
    """The price table: the user's file, else the one that ships with tbench (tbench/data/prices.csv)."""
    source = Path(path) if path else files("tbench") / SHIPPED_PRICES
    try:
        table = pd.read_csv(source, dtype={"pool": str, "price_date": str})
    except FileNotFoundError:
        raise ConfigError(f"price table {source} not found") from None
    except (OSError, ValueError) as err:  # a folder, an empty or unreadable file
        raise ConfigError(f"price table {source} cannot be read: {err}") from None
    missing = [c for c in ("pool", "usd_per_hour") if c not in table.columns]
    if missing:
        raise ConfigError(f"price table {source} has no {', '.join(missing)} column (columns: {PRICE_COLUMNS})")
    return table


def price_for(prices: pd.DataFrame, pool: str) -> dict | None:
    """The price table's row for a pool (usd_per_hour and where it came from), or None when it has none."""
    rows = prices[prices["pool"] == pool]
    if rows.empty:
        return None
    row = rows.iloc[0].to_dict()
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


class Plan(BaseModel):
    """What one configuration on one pool costs to serve the traffic within the SLO."""

    sustainable_rps: float = Field(description="Requests per second one instance sustains within the SLO.")
    traffic_rps: float
    headroom: float
    instances: int = Field(description="Instances to serve the traffic with the headroom.")
    usd_per_hour: float | None = None
    cost_per_hour: float | None = None
    usd_per_million: float | None = Field(None, description="At the traffic, with the instances it needs.")
    joules_per_inference: float | None = None


def plan(
    sustainable_rps: float,
    traffic_rps: float,
    headroom: float,
    batch_size: int = 1,
    usd_per_hour: float | None = None,
    power_w: float | None = None,
    joules_per_inference: float | None = None,
) -> Plan:
    """Instances = ceil(traffic x (1 + headroom) / sustainable rate); cost per million inferences at the traffic
    = instances x price per hour / (traffic x batch x 3600) x 1e6; energy per inference = the GPUs' energy counter's
    difference over the sustainable rate's point / the inferences served in it (without the counter, the mean power /
    the inferences per second)."""
    if sustainable_rps <= 0:
        raise ConfigError("a sustainable rate must be positive to plan instances for it")
    instances = max(1, math.ceil(traffic_rps * (1 + headroom) / sustainable_rps - 1e-9))
    cost = None if usd_per_hour is None else instances * usd_per_hour
    per_million = None if cost is None else cost / (traffic_rps * batch_size * 3600) * 1e6
    joules = joules_per_inference
    if joules is None and power_w:  # no energy counter: the mean power over the inferences it served per second
        joules = power_w / (sustainable_rps * batch_size)
    return Plan(
        sustainable_rps=sustainable_rps,
        traffic_rps=traffic_rps,
        headroom=headroom,
        instances=instances,
        usd_per_hour=usd_per_hour,
        cost_per_hour=cost,
        usd_per_million=per_million,
        joules_per_inference=joules,
    )
