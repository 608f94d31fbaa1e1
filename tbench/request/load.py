"""The load a sweep offers (request rates, concurrency values), checked once for every kind of run."""

from __future__ import annotations

from tbench.core.enums import Scenario
from tbench.core.errors import ConfigError


def checked_load(
    scenarios: list[Scenario], rates: list[float] | None, concurrency: list[int]
) -> tuple[list[float], list[int]]:
    """The request rates and concurrency values a sweep runs, sorted, or one line naming the value to fix."""
    rates = sorted(set(rates or []))
    if Scenario.RATE in scenarios and not rates:
        raise ConfigError("the rate scenario needs request rates, e.g. request_rates=[10, 20] (--request-rates 10,20)")
    if any(r <= 0 for r in rates):
        raise ConfigError(f"request rates must be > 0, got {rates}")
    concurrency = sorted(set(concurrency))
    if any(c < 1 for c in concurrency):
        raise ConfigError(f"concurrency values must be >= 1, got {concurrency}")
    return rates, concurrency
