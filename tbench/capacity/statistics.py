"""How many requests a latency percentile needs before a run may say it is met.

The rule is MLPerf Inference's (Reddi et al., "MLPerf Inference Benchmark", ISCA 2020, section "Statistical
confidence"; the LoadGen's minimum query counts come from it): to estimate the p-th percentile within a margin m with
confidence c, a run needs

    n = z^2 * p * (1 - p) / m^2,   z = the standard normal quantile at 1 - (1 - c) / 2

requests (the normal approximation of the binomial count of requests below the percentile). MLPerf's server scenario
uses c = 99% and m = (1 - p) / 20: 262,742 requests for p99 (LoadGen rounds up to 270,336). That is hours on a CPU, so
our default is c = 95% and m = (1 - p) / 2 (1,522 requests for p99): the measured p99 is then the true p98.5..p99.5
with 95% confidence. Both are settings (`confidence`, `margin_fraction`); MLPerf's are `0.99` and `0.05`.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, Field

from tbench.loadgen.perf_analyzer import STABLE_WINDOWS
from tbench.request import Measurement


class PercentileRule(BaseModel):
    """The percentile an SLO bounds, and how sure a measurement of it must be."""

    percentile: Literal[50, 90, 95, 99] = Field(
        99, description="The latency percentile the SLO bounds (perf_analyzer reports p50, p90, p95 and p99)."
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1, description="Confidence that the measured percentile is within the margin (MLPerf: 0.99)."
    )
    margin_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The margin as a fraction of the tail above the percentile (MLPerf: 0.05, i.e. (1-p)/20).",
    )

    @property
    def column(self) -> str:
        """The tidy results' column of this percentile."""
        return f"p{self.percentile}_ms"

    @property
    def tail(self) -> float:
        return 1 - self.percentile / 100

    def requests(self) -> int:
        """The fewest requests whose measured percentile meets the rule."""
        p = self.percentile / 100
        z = NormalDist().inv_cdf(1 - (1 - self.confidence) / 2)
        margin = self.tail * self.margin_fraction
        return math.ceil(z * z * p * (1 - p) / (margin * margin))

    def describe(self) -> str:
        lo = self.percentile - 100 * self.tail * self.margin_fraction
        hi = self.percentile + 100 * self.tail * self.margin_fraction
        return (
            f"p{self.percentile:g} from at least {self.requests():,} requests per load point: with "
            f"{100 * self.confidence:g}% confidence the measured p{self.percentile:g} is the true p{lo:g}..p{hi:g} "
            "(MLPerf Inference's sample-size rule, n = z²·p·(1-p)/m²)"
        )


def percentile_measurement(base: Measurement, rule: PercentileRule) -> Measurement:
    """A measurement whose merged windows (the last 3) hold the requests the rule's percentile needs: windows of at
    least a third of them. Without it a slow model's p99 comes from a few dozen requests: their maximum."""
    per_window = math.ceil(rule.requests() / STABLE_WINDOWS)
    return base.model_copy(update={"min_requests": max(base.min_requests, per_window)})
