"""A fleet file (YAML or JSON): the models, each with its traffic, SLO, the rate one node of each pool sustains for it
alone (a capacity plan's answer) and the repository that holds it; the pools, each priced from the price table
unless the file prices it. Every mistake is one line naming the field and the fix.

    headroom: 0.2
    pools:
      - name: cpu             # usd_per_hour from the price table (tbench/data/prices.csv, or --prices)
      - name: a100
        memory_mb: 40000
    models:
      - name: resnet50
        traffic_rps: 120
        slo_ms: 50
        sustainable_rps: {cpu: 40, a100: 900}
        repository: runs/resnet50-.../model_repository
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from tbench.capacity.costs import load_prices, price_for
from tbench.capacity.fleet import Fleet
from tbench.core.errors import ConfigError, validation_line
from tbench.core.storage import is_remote


def load_fleet(path: str | Path, prices: str | None = None) -> Fleet:
    """The fleet in `path` (or an upload's URL, fetched); a pool without usd_per_hour takes the price table's; a
    model's repository is relative to the file's folder, or an upload's URL (kept as it is: fetched where a node is
    measured)."""
    from tbench.core.handover import local_path

    path = Path(local_path(str(path)) or "").expanduser()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"fleet file {path} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"fleet file {path} cannot be read: {err}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0]
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise ConfigError(f"fleet file {path} is not valid {kind}: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"fleet file {path} must hold a mapping with models and pools (see `tbench fleet --help`)")
    table = None
    for pool in data.get("pools") or []:
        if isinstance(pool, dict) and pool.get("name") and pool.get("usd_per_hour") is None:
            table = load_prices(prices) if table is None else table
            row = price_for(table, str(pool["name"]))
            if row is None:
                raise ConfigError(
                    f"fleet file {path}: pool {pool['name']!r} has no usd_per_hour and the price table has no row for "
                    "it: give its usd_per_hour in the file, or add it to the table (--prices)"
                )
            pool["usd_per_hour"] = float(row["usd_per_hour"])
    for model in data.get("models") or []:
        if isinstance(model, dict) and isinstance(model.get("repository"), str) and not is_remote(model["repository"]):
            repo = (path.parent / model["repository"]).expanduser()
            if not repo.is_dir():
                raise ConfigError(f"fleet file {path}: model {model.get('name')!r}: repository {repo} is not a folder")
            if model.get("name") and not (repo / str(model["name"])).is_dir():  # a server serves a model by its folder
                raise ConfigError(
                    f"fleet file {path}: model {model['name']!r} is not in its repository {repo} (no folder of that "
                    "name): name the model as its folder is named, or give the repository that holds it"
                )
            model["repository"] = str(repo.resolve())
    try:
        return Fleet.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"fleet file {path}: {validation_line(err)}") from None
