"""How many requests a latency percentile needs before a run may say it is met.

The rule is MLPerf Inference's (Reddi et al., "MLPerf Inference Benchmark", ISCA 2020, section "Statistical
confidence"; the LoadGen's minimum query counts come from it): to estimate the p-th percentile within a margin m with
confidence c, a run needs

    n = z^2 * p * (1 - p) / m^2,   z = the standard normal quantile at 1 - (1 - c) / 2

requests (the normal approximation of the binomial count of requests below the percentile). MLPerf's server scenario
uses c = 99% and m = (1 - p) / 20: 262,742 requests for p99 (LoadGen rounds up to 270,336). That is hours on a CPU, so
our default is c = 95% and m = (1 - p) / 2 (1,522 requests for p99): the measured p99 is then the true p98.5..p99.5
with 95% confidence. Both are settings (`confidence`, `margin_fraction`); MLPerf's are `0.99` and `0.05`.

Where every request's latency is exported (a rate point's perf_analyzer --profile-export-file), the percentile is judged
from them, not the merged windows': a point starts from an empty queue, so the requests sent in its first
`WARMUP_SHARE` of the span are left out (a short run's percentile otherwise reads low near capacity), and so are those
sent within the SLO of its end (one still in flight there is missing from the export, and it is a slow one). The SLO is
met when an upper confidence bound of the percentile is within it: the order statistic of rank
n·p + z·sqrt(n·p·(1-p)) (the binomial count of requests below the true percentile, normal approximation; z one-sided at
the rule's confidence), so a lucky short run does not pass at a rate whose true percentile is over the SLO.

Where no request is exported (an image model's requests are too large), the p99 is the merged windows' figure, and its
standard error comes from what the row holds (`windows_standard_error`): the binomial rank interval of the p99 among the
windows' requests, mapped through the exponential tail that the row's p95..p99 imply (tbench.results.compare's
`p99_standard_error`, the same one a comparison's noise uses); the p99 itself has the warm-up's part added back
(`warmed_up_p99`). Several runs at one rate are pooled on their mean, widened by their spread (`windows_score`).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy.special import expit

from tbench.loadgen.perf_analyzer import STABLE_WINDOWS, RequestLog
from tbench.request.benchmark import Measurement
from tbench.results.compare import p99_standard_error

WARMUP_SHARE = 0.2  # of a rate point's span, from its start: the queue fills from empty


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


def steady_latencies(log: RequestLog, tail_s: float = 0.0, warmup_share: float = WARMUP_SHARE) -> np.ndarray:
    """Latencies (s) of the requests sent after the warm-up share of the span and at least `tail_s` before its end."""
    keep = (log.sent_s >= warmup_share * log.span_s) & (log.sent_s <= log.span_s - tail_s)
    return log.latency_s[keep]


# A rate point's windows start from an empty server (perf_analyzer stops after its first 3), so near saturation, where a
# queue takes long to fill, their p99 reads low: by a third at 90% load over 20 s (benchmarks/calibration_rates.py).
# The p99 judged is the windows' times 1 + WINDOWS_WARMUP x the square of the queue's share (queue over compute time per
# request), which grows with the load as the warm-up's part does and is near 0 at light loads. 0.02 in 300 simulated
# searches: none above the truth by 1%, 0.91 within 0.85 of it (0.01: 0.013 above; 0.04: 0.87 within). Widening the
# error for clustering as well (its variance x4) lowered the within share to 0.87 and kept none above
WINDOWS_WARMUP = 0.02
INFLATION_BLOCKS = 10  # consecutive blocks of requests whose shares above the percentile measure their correlation


def variance_inflation(values: np.ndarray, threshold: float, blocks: int = INFLATION_BLOCKS) -> float:
    """How much more the count of requests above `threshold` varies than a binomial count (at least 1): the latencies
    of a queue are correlated (a busy spell delays many requests in a row, so slow requests come in clusters), and n of
    them hold fewer independent ones. From the spread of that share over `blocks` consecutive blocks (batch means)."""
    above = np.asarray(values) > threshold
    n, share = len(above), float(above.mean()) if len(above) else 0.0
    if n < blocks * 10 or share in (0.0, 1.0):
        return 1.0
    shares = np.array([b.mean() for b in np.array_split(above, blocks)])
    return max(1.0, float(shares.var(ddof=1)) / (share * (1 - share) / (n / blocks)))


def tail_inflation(values: np.ndarray, percentile: float, threshold: float | None = None) -> float:
    """The `variance_inflation` of the requests above `threshold` (the SLO), or above the sample's own percentile where
    that is more: near saturation a short run holds no request over the SLO at all (share 0, no spread to measure) while
    its slow requests come in long clusters, and a count of zero from a few clusters is weak evidence."""
    own = variance_inflation(values, float(np.percentile(values, percentile)))
    return own if threshold is None else max(own, variance_inflation(values, threshold))


def percentile_upper_bound(
    values: np.ndarray, percentile: float, confidence: float, threshold: float | None = None
) -> float | None:
    """An upper `confidence` bound of the `percentile`-th percentile of what `values` (in the order sent) sample: their
    order statistic of rank ceil(n·p + z·sqrt(f·n·p·(1-p))), f the `tail_inflation` (at `threshold`, the SLO the bound
    is compared with); None when n is too small for that rank to exist."""
    n, p = len(values), percentile / 100
    if n == 0:
        return None
    z = NormalDist().inv_cdf(confidence)
    f = tail_inflation(values, percentile, threshold)
    rank = math.ceil(n * p + z * math.sqrt(f * n * p * (1 - p)))
    if rank > n:
        return None
    return float(np.partition(np.asarray(values, dtype=float), rank - 1)[rank - 1])


def exceedance_score(requests: list[int], over: list[int], inflations: list[float], percentile: float) -> float:
    """How far the share of requests over the SLO, pooled over independent measurements at one rate, is from the
    percentile's tail (1% for p99), in standard errors: negative when within the SLO. The variance is the binomial one
    inflated by the measurements' `tail_inflation` (their request-weighted mean), or the spread between the
    measurements where three or more show a larger one (each starts from an empty server: they are independent)."""
    n, a, f = (np.asarray(x, dtype=float) for x in (requests, over, inflations))
    total, q0 = n.sum(), 1 - percentile / 100
    if total == 0:
        return math.inf
    variance = float((f * n).sum() / total) * total * q0 * (1 - q0)
    if len(n) >= 3:
        between = len(n) / (len(n) - 1) * float(((a - n * a.sum() / total) ** 2).sum())
        variance = max(variance, between)
    return float(a.sum() - total * q0) / math.sqrt(variance)


def dose_response_score(
    requests: list[int], over: list[int], inflations: list[float], log_rates: list[float], percentile: float
) -> float | None:
    """The exceedance_score of the rate at log-rate 0, from measurements at it and at neighbouring rates: the share over
    the SLO rises with the rate, slowly where the percentile rises slowly, so runs a few percent either side carry
    almost as much about it as runs at it. The share is fitted as a logistic function of the log rate (a quasi-binomial
    regression, each run weighted by its `tail_inflation`; the slope at least 0: the share never falls as the rate
    rises), and its estimate at the rate compared with the percentile's tail, in standard errors widened by the runs'
    spread about the fit where enough runs show one. None where it cannot be fitted (no request over the SLO)."""
    n, a, f, x = (np.asarray(v, dtype=float) for v in (requests, over, inflations, log_rates))
    if a.sum() == 0 or a.sum() >= n.sum() or len(n) < 2:
        return None
    q0 = 1 - percentile / 100
    fitted = _logistic_fit(np.column_stack([np.ones_like(x), x]), n, a, f)
    if fitted is not None and fitted[0][1] < 0:  # falling with the rate is noise: one share for all, no slope
        fitted = _logistic_fit(np.ones((len(n), 1)), n, a, f)
    if fitted is None:
        return None
    beta, q, covariance = fitted
    dispersion = 1.0
    if len(n) >= len(beta) + 3:
        dispersion = max(1.0, float(((a - n * q) ** 2 / (f * n * q * (1 - q))).sum()) / (len(n) - len(beta)))
    variance = dispersion * float(covariance[0, 0])
    if not (math.isfinite(variance) and variance > 0):  # the fit ran away (all the slow requests in one run)
        return None
    return (float(beta[0]) - math.log(q0 / (1 - q0))) / math.sqrt(variance)


def _logistic_fit(X: np.ndarray, n: np.ndarray, a: np.ndarray, f: np.ndarray):
    """Newton's method on the quasi-likelihood of a[i] of n[i] (variance inflated f[i]) with logit(share) = X @ beta:
    (beta, the fitted shares, beta's covariance before dispersion), or None where it does not converge."""
    share = a.sum() / n.sum()
    beta = np.zeros(X.shape[1])
    beta[0] = math.log(share / (1 - share))
    for _ in range(100):
        q = expit(X @ beta)
        info = X.T @ (X * (n * q * (1 - q) / f)[:, None])
        try:
            step = np.linalg.solve(info, X.T @ ((a - n * q) / f))
        except np.linalg.LinAlgError:
            return None
        beta = beta + step
        if not np.all(np.isfinite(beta)):
            return None
        if np.abs(step).max() < 1e-9:
            break
    else:
        return None
    q = expit(X @ beta)
    try:
        covariance = np.linalg.inv(X.T @ (X * (n * q * (1 - q) / f)[:, None]))
    except np.linalg.LinAlgError:
        return None
    return beta, q, covariance


def windows_standard_error(p95_ms: float | None, p99_ms: float | None, window_requests: float | None) -> float | None:
    """The standard error (ms) of a p99 from perf_analyzer's merged windows (`window_requests` per window): the order
    statistics' rank interval mapped through the tail that p95..p99 imply (p99_standard_error); None where the row
    lacks one of them."""
    relative = p99_standard_error(p95_ms, p99_ms, window_requests)
    return None if math.isnan(relative) else float(p99_ms) * relative


def windows_score(latencies_ms: list[float], errors_ms: list[float], slo_ms: float) -> float:
    """How far the mean of independent runs' windows percentiles at one rate is from the SLO, in standard errors of that
    mean: negative when within it. The error is the runs' own (`windows_standard_error`), or the spread between the
    runs where three or more show a larger one (each starts from an empty server: they are independent)."""
    x, s = np.asarray(latencies_ms, dtype=float), np.asarray(errors_ms, dtype=float)
    k = len(x)
    if k == 0:
        return math.inf
    error = math.sqrt(float((s**2).sum())) / k
    if k >= 3:
        error = max(error, float(x.std(ddof=1)) / math.sqrt(k))
    distance = float(x.mean()) - slo_ms
    if error == 0:  # a tail with no spread (p95 = p99): the estimate alone
        return math.inf if distance > 0 else -math.inf
    return distance / error


def warmed_up_p99(p99_ms: float, queue_ms: float | None, compute_ms: float | None) -> float:
    """The windows' p99 with the warm-up's part added back (WINDOWS_WARMUP); the windows' own where the row has no
    server breakdown (queue and compute time per request)."""
    if not queue_ms or not compute_ms or queue_ms < 0 or compute_ms <= 0:
        return p99_ms
    return p99_ms * (1 + WINDOWS_WARMUP * (queue_ms / compute_ms) ** 2)
