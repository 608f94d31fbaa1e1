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


def arrival_load(
    scenarios: list[Scenario],
    rates: list[float] | None,
    distribution: str,
    trace: str | None,
    speeds: list[float] | None,
) -> tuple[list[Scenario], list[float] | None, str]:
    """The scenarios, rates and arrivals a sweep runs: a trace's rates are its mean rate at each speed-up (the rate
    scenario added for it); otherwise the request's own."""
    if not trace:
        if speeds:
            raise ConfigError("--trace-speed speeds up a trace: give --trace FILE")
        return scenarios, rates, distribution
    from tbench.core.request_trace import load_schedule

    if rates:
        raise ConfigError("a trace sets its own rates: give --trace-speed, not --request-rates")
    speeds = speeds or [1.0]
    if any(s <= 0 for s in speeds):
        raise ConfigError(f"trace speeds must be > 0, got {speeds}")
    mean = load_schedule(trace).mean_rate
    with_rate = scenarios if Scenario.RATE in scenarios else [*scenarios, Scenario.RATE]
    return with_rate, [mean * s for s in speeds], "trace"


def check_trace(trace: str, samples, online_batch: int, max_batch: int) -> None:
    """A trace's own batch size (its batch_size column; else the online batch) within the model's, and its samples
    (a sample column) among those given: one line each, before anything runs."""
    from tbench.core.request_trace import load_schedule

    schedule = load_schedule(trace)
    batch = schedule.batch_size or online_batch
    if batch > max(max_batch, 1):
        raise ConfigError(f"trace {schedule.source} sends batch size {batch}, above max_batch_size {max_batch}")
    schedule.check_samples(samples, batch)
