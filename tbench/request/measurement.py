"""How perf_analyzer measures a point: the measurement settings, a user's overrides of single ones, and each
profile's defaults."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Measurement(BaseModel):
    """How perf_analyzer measures a point (count_windows mode), sized by time rather than by a fixed request count.

    The rule: before a sweep, timed warm-up requests give each batch size's single-request latency L (calibration).
    A window then asks for max(min_requests, 2 x concurrency, ceil(window_s x R)) requests, R being the rate the point
    will run at: a rate point's offered rate, an online point's at least what a lower concurrency served earlier in the
    sweep, else 1 / L. perf_analyzer's count_windows mode closes a window at the first whole second by which it has
    that many. So a fast model gets windows of about max(1 s, window_s) holding thousands of requests, a slow one
    windows of a few requests (seconds each). One request more or less at a window's edge moves its throughput by 1/N,
    so a closed-loop window also holds at least `resolving_requests` (200 / stability_percentage: one request stays
    within half the band) unless that would last longer than `max_window_s`; then it holds what fits, and should the
    point not settle, its error says the windows could not resolve the band. perf_analyzer measures windows until the
    last 3 agree within `stability_percentage` (at most `max_trials`); each point records how long its windows lasted
    (`window_s`). An unstable point is measured again with windows sized from the throughput its failed attempt saw,
    twice as long; a slow point's windows, held at the floor, stay as they were (its retry is another `max_trials`
    windows, not windows of twice the seconds)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a misspelt or retired setting is an error

    window_s: float = Field(2.0, gt=0, description="Target duration of one measurement window, in seconds.")
    # perf_analyzer's throughput counts the requests that end inside a window: one request more or less at a window's
    # edge is 1/N of it, so a slow model's windows need enough requests for the figure to resolve a few percent
    min_requests: int = Field(16, ge=1, description="Fewest requests in a window (and at least 2 x concurrency).")
    stability_percentage: float = Field(
        10.0, gt=0, description="Max spread of the last 3 windows' throughput and latency, in %."
    )
    max_window_s: float = Field(
        20.0,
        gt=0,
        description="Longest a window may last to hold the requests the stability rule needs; a slower point's "
        "windows hold what fits.",
    )
    max_trials: int = Field(10, ge=3, description="Windows perf_analyzer tries before giving up on a point.")
    retries: int = Field(
        1, ge=0, description="Retries of an unstable point, each with windows twice as long (a slow point's: as long)."
    )
    timeout_s: float = Field(300.0, gt=0, description="Hard limit per perf_analyzer call, in seconds.")
    warmup_requests: int = Field(
        2,
        ge=0,
        description="Untimed requests per batch size before a sweep measures anything "
        "(timed calibration requests follow them).",
    )
    order: Literal["shuffled", "ascending"] = Field(
        "shuffled",
        description="Point order within a sweep: shuffled (seeded) so drift over time does not line up with the grid.",
    )
    seed: int = Field(0, description="Seed of the shuffled order (the order is recorded per point).")

    def requests_per_window(
        self,
        latency_s: float | None,
        concurrency: int,
        attempt: int = 0,
        measured_rate: float | None = None,
        offered_rate: float | None = None,
    ) -> int:
        """Requests per window for a point: `window_s` worth at the rate it will run at -- an open-loop point's offered
        rate, else the calibrated single-request latency's (or, on a retry, the rate the failed attempt measured) --,
        never fewer than min_requests or 2 x concurrency, nor, for a closed-loop point, than the stability rule
        resolves (as many of those as fit in max_window_s); retries double the target duration and the cap."""
        floor = max(self.min_requests, 2 * concurrency)
        rate = offered_rate or measured_rate or (1 / latency_s if latency_s else None)
        if not offered_rate:  # an open-loop point is judged by its own verdict, not by the windows' band
            fitting = math.floor(self.max_window_s * 2**attempt * rate) if rate else self.resolving_requests()
            floor = max(floor, min(self.resolving_requests(), fitting))
        if rate:
            return max(floor, math.ceil(self.window_s * 2**attempt * rate))
        return floor * 2**attempt

    def resolving_requests(self) -> int:
        """Requests a window needs so that one request at its edge moves its throughput by at most half the band."""
        return math.ceil(200 / self.stability_percentage)

    def unresolved_note(self, request_count: int) -> str:
        """What an unstable point's error adds when max_window_s left its windows fewer requests than the band
        resolves: the resolution they had, and the two settings that would give it."""
        if request_count >= self.resolving_requests():
            return ""
        return (
            f"; a window of {request_count} requests resolves {100 / request_count:.0f}%, over half the "
            f"{self.stability_percentage:g}% band: raise measurement.max_window_s ({self.max_window_s:g} s) or "
            "--stability"
        )

    def point_timeout_s(self, request_count: int, offered_rate: float | None) -> float:
        """The limit of one perf_analyzer call: `timeout_s`, or, for an open-loop point whose windows cannot fit in it
        (few requests per second, many requests per window), room for all `max_trials` windows at the offered rate
        and half as much again."""
        if not offered_rate:
            return self.timeout_s
        return max(self.timeout_s, 1.5 * self.max_trials * request_count / offered_rate + 30)


class MeasurementOverrides(BaseModel):
    """Single measurement fields a user sets; the profile's (and the model's) settings hold for the rest."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    window_s: float | None = Field(None, gt=0, description="Target duration of one measurement window, in seconds.")
    min_requests: int | None = Field(None, ge=1, description="Fewest requests in a window.")
    stability_percentage: float | None = Field(
        None, gt=0, description="Max spread of the last 3 windows, in % (10 by default)."
    )
    max_window_s: float | None = Field(
        None, gt=0, description="Longest a window may last to hold the requests the stability rule needs."
    )
    max_trials: int | None = Field(None, ge=3, description="Windows perf_analyzer tries before giving up on a point.")
    retries: int | None = Field(None, ge=0, description="Retries of an unstable point.")
    timeout_s: float | None = Field(None, gt=0, description="Hard limit per perf_analyzer call, in seconds.")
    warmup_requests: int | None = Field(None, ge=0, description="Untimed warm-up requests per batch size.")
    order: Literal["shuffled", "ascending"] | None = Field(None, description="Point order within a sweep.")
    seed: int | None = Field(None, description="Seed of the shuffled order.")

    @model_validator(mode="before")
    @classmethod
    def _from_measurement(cls, value):
        """A full Measurement given here overrides only the fields that were set on it."""
        return value.model_dump(exclude_unset=True) if isinstance(value, Measurement) else value

    def apply(self, base: Measurement) -> Measurement:
        return base.model_copy(update=self.model_dump(exclude_none=True))


# A GPU node serves thousands of requests a second: at least 50 in each window.
PROFILE_MEASUREMENT = {"cpu": Measurement(), "gpu": Measurement(min_requests=50)}
