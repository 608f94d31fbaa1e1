"""What a comparison of two runs says, in the project's words: the keys points match on, the verdicts, the exit codes,
and the `Comparison` itself (the rule that makes one is tbench.results.compare; its words and pictures are
tbench.results.compare_report)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tbench.core.metrics import AVG, THROUGHPUT

MATCH_KEYS = [
    "model",
    "model_size",
    "format",
    "scenario",
    "precision",
    "gpu",
    "batch_size",
    "concurrency",
    "request_rate",
    "request_distribution",
    "shapes",  # runs at 16 and at 512 tokens are not one point
    "input_data",
]
# labels recorded since the calibration issue: where one run has none (stored before them), the other keys match
RECENT_KEYS = ("shapes", "input_data")
NUMERIC_KEYS = {"batch_size", "concurrency", "request_rate"}
P99 = "p99_ms"
AVG_MS = AVG.column
TPUT = THROUGHPUT.column

REGRESSION, IMPROVEMENT, NO_CHANGE, NOT_COMPARABLE = (
    "regression",
    "improvement",
    "no significant change",
    "not comparable",
)
SLOWER, FASTER, WITHIN = "slower", "faster", "within noise"
HIGHER_LATENCY, LOWER_LATENCY = "higher latency", "lower latency"
LATENCY_MOVES = (HIGHER_LATENCY, LOWER_LATENCY)
UNDETERMINED = "undetermined"  # a metric's change (or a whole comparison) that its data cannot decide
EXIT_CODES = {NO_CHANGE: 0, IMPROVEMENT: 0, REGRESSION: 1, NOT_COMPARABLE: 2, UNDETERMINED: 2}
# the CPU probe's change between two runs beyond which the machine itself moved, said as a message and never weighed in
# the verdict: on a steady machine two runs' probes differed by up to 17.51%, 9 of 102 pairs beyond this
# (benchmarks/results/cpu_probe.json, tbench.node.cpu_speed)
MACHINE_MOVED = 0.10
HOST_BUSY_PCT = 10.0  # other processes' mean CPU (100 = one core) over a run's sweeps beyond which it had a neighbour
MIN_P99_REQUESTS = 150  # below this, the requests beyond a p99 are one or two: the p99 is the sample's largest
P99_Z = 1.0  # the rank interval's half-width, in binomial standard deviations: ± one standard error


def too_few_p99_requests(points: pd.DataFrame) -> pd.Series:
    """Which judged points' p99 rests on too few requests to decide, an unknown count included."""
    return points["p99_requests"].isna() | (points["p99_requests"] < MIN_P99_REQUESTS)


def _missing(v) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    try:
        return bool(isinstance(v, float) and math.isnan(v)) or (isinstance(v, np.floating) and np.isnan(v))
    except TypeError:
        return False


@dataclass
class Comparison:
    baseline: str  # sources, as given
    candidate: str
    min_effect: float
    k: float
    verdict: str  # regression | improvement | no significant change | not comparable | undetermined
    summary: str  # one line
    points: pd.DataFrame  # matched ok points: values, deltas, noise, thresholds, verdicts
    unmatched: pd.DataFrame  # points not compared, and why (plus duplicated points: compared=True, the last row used)
    best: pd.DataFrame = field(default_factory=pd.DataFrame)  # per format x scenario: the best-throughput point
    reason: str = ""  # why not comparable, or undetermined
    spread: str = ""  # the run-to-run spread judged by, and where it came from (tbench.results.run_noise)
    min_effect_p99: float | None = None  # the p99's own smallest effect (a tail moves more); None: min_effect

    @property
    def effects(self) -> dict[str, float]:
        """The smallest effect that can count, per metric."""
        p99 = self.min_effect if self.min_effect_p99 is None else self.min_effect_p99
        return {TPUT: self.min_effect, AVG_MS: self.min_effect, P99: p99}

    @property
    def slower(self) -> pd.DataFrame:
        return self.points[self.points["throughput_verdict"] == SLOWER]

    @property
    def faster(self) -> pd.DataFrame:
        return self.points[self.points["throughput_verdict"] == FASTER]

    @property
    def lost(self) -> pd.DataFrame:
        """Points ok in the baseline that the candidate measured but not ok, or did not measure at all."""
        if self.unmatched.empty:
            return self.unmatched
        return self.unmatched.loc[self.unmatched["lost"].astype(bool)]


POINT_COLUMNS = [
    *MATCH_KEYS,
    "baseline_throughput",
    "candidate_throughput",
    "throughput_delta",
    "throughput_noise",
    "throughput_threshold",
    "throughput_verdict",
    "baseline_p99_ms",
    "candidate_p99_ms",
    "p99_delta",
    "p99_noise",
    "p99_threshold",
    "p99_verdict",  # undetermined where either side's p99 rests on fewer than MIN_P99_REQUESTS requests
    "p99_requests",  # the fewer of the two sides' (NaN when not recorded)
    "baseline_avg_ms",
    "candidate_avg_ms",
    "avg_delta",
    "avg_verdict",
    "latency_noise",
    "latency_threshold",
    "latency_verdict",  # of p99 and mean together: higher if either rose, lower if both fell
    "noise_assumed",
    "trials",  # the baseline's / the candidate's trials of the point ("1/1": one each)
    "verdict",
    "best",  # the baseline's best-throughput point of its format x scenario
]
# lost: ok in the baseline, not ok (or absent) in the candidate; measured: the candidate has a row for it
UNMATCHED_COLUMNS = [
    *MATCH_KEYS,
    "baseline_status",
    "candidate_status",
    "reason",
    "compared",
    "lost",
    "measured",
    "best",
    "baseline_throughput",
]
