"""A candidate configuration judged by its sustainable rate under the SLO: the configuration search's evaluator at
open-loop (Poisson) rates instead of a fixed concurrency. Each candidate's rate search is written beside its
perf_analyzer files (`<candidate>/sustainable_rate.json`), so a report, or a resumed search, reads it back."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tbench.capacity.rate_search import (
    MAX_POINTS,
    REPEATS,
    TOLERANCE,
    RatePoint,
    SustainableRate,
    find_sustainable_rate,
    judge,
)
from tbench.capacity.statistics import WARMUP_SHARE, PercentileRule, percentile_measurement
from tbench.core import progress
from tbench.core.enums import Scenario
from tbench.core.errors import PerfAnalyzerError
from tbench.core.layout import RunLayout
from tbench.loadgen.arrivals import with_intervals
from tbench.loadgen.perf_analyzer import STABLE_WINDOWS, Point, RequestLog, profile_export_path, read_profile_export
from tbench.request.benchmark import Measurement
from tbench.search.evaluate import RepositoryEvaluator, ServedVariant, TritonEvaluator
from tbench.search.strategies import Candidate, Observation
from tbench.stages.sweep import formed_batch_sizes, measure_point
from tbench.triton.monitor import PointMonitor

RATE_SEARCH_JSON = "sustainable_rate.json"


def rate_measurement(base: Measurement, rule: PercentileRule) -> Measurement:
    """The measurement of one rate point: windows (its first 3, every request exported) holding the requests the
    percentile needs once the warm-up share of the span is left out, and no retry: a rate that does not settle is a
    rate the system does not sustain."""
    m = percentile_measurement(base, rule)
    per_window = math.ceil(rule.requests() / (1 - WARMUP_SHARE) / STABLE_WINDOWS)
    return m.model_copy(update={"retries": 0, "min_requests": max(m.min_requests, per_window)})


def start_rate(latency_s: float | None, instances: int, given: float | None = None) -> float:
    """Where the bracketing starts: the user's rate, else half of what the instances could serve back to back at the
    warm-up latency (an open-loop queue needs slack below that)."""
    if given:
        return given
    if not latency_s or latency_s <= 0:
        return 1.0
    return max(0.1, 0.5 * instances / latency_s)


def measure_rate(
    rate: float,
    batch_size: int,
    *,
    slo_ms: float,
    rule: PercentileRule,
    arrivals: Callable[[Point], Point] | None = None,
    **measure,
) -> RatePoint:
    """One Poisson rate point measured (`tbench.stages.sweep.measure_point`, which checks it kept up with the load) and
    judged against the SLO; `measure` are measure_point's keyword arguments (model, grpc_url, spec, m, layout, ...).
    `arrivals` (plan_arrivals): the point's requests sent on another schedule of the same mean rate."""
    point = Point(Scenario.RATE, batch_size, None, round(rate, 3), "poisson")
    point = arrivals(point) if arrivals else point
    row = measure_point(point, **measure)
    requests = exported_requests(measure["layout"], row)
    return judge(point.rate, point.batch_size, row, slo_ms, rule, requests, replayed=point.distribution == "trace")


def plan_arrivals(cap, folder: Path, samples=None, seed: int = 0) -> Callable[[Point], Point] | None:
    """How a capacity plan's rate points arrive, when not Poisson: on a trace, each rate point replays it sped up to
    the point's rate (its mean rate at that speed-up), so the sustainable rate found is the trace's mean rate at the
    highest speed-up that holds (a trace with a sample per request sends them from `samples`, the run's
    --input-data); bursty, each rate point sends gamma intervals of the burstiness at its rate."""
    if cap.trace:
        trace = cap.trace
        return lambda point: with_intervals([replace(point, distribution="trace")], trace, 1.0, 0, folder, samples)[0]
    if cap.burstiness is not None:
        burstiness = cap.burstiness
        return lambda point: with_intervals([replace(point, distribution="gamma")], None, burstiness, seed, folder)[0]
    return None


def rate_fields(cap, arrivals_dir: Path, samples=None, seed: int = 0) -> dict:
    """A capacity plan's settings as a RateEvaluator's fields (its rate search, SLO and arrivals), whichever model the
    evaluator serves: a model tbench exported or one of the user's repository."""
    return dict(
        slo_ms=cap.slo_ms,
        rule=cap.rule,
        tolerance=cap.tolerance,
        max_points=cap.max_points,
        repeats=cap.repeats,
        max_seconds=cap.max_seconds,
        start_rps=cap.start_rps or cap.trace_rate(),
        on_point=emit_rate_point,
        arrivals=plan_arrivals(cap, arrivals_dir, samples, seed),
    )


def exported_requests(layout: RunLayout, row: dict) -> RequestLog | None:
    """The requests a measured rate point's perf_analyzer exported (beside its CSV, `source_file`); None without."""
    source = row.get("source_file")
    if not source or not isinstance(source, str):
        return None
    return read_profile_export(profile_export_path(layout.run_dir / source))


def emit_rate_point(candidate: Candidate, point: RatePoint) -> None:
    """Each rate point as it is measured, for the CLI's progress and the log."""
    progress.emit(
        "rate_point",
        key=candidate.key,
        rate=point.rate,
        status=point.status,
        latency_ms=point.latency_ms,
        reason=point.reason,
    )


def rate_search_path(work_dir: Path, candidate: Candidate) -> Path:
    return work_dir / candidate.key / RATE_SEARCH_JSON


def load_rate_search(work_dir: Path, candidate: Candidate) -> SustainableRate | None:
    path = rate_search_path(work_dir, candidate)
    return SustainableRate.model_validate_json(path.read_text()) if path.exists() else None


@dataclass
class RateEvaluator(TritonEvaluator):
    """TritonEvaluator whose measurement of a loaded candidate is a sustainable-rate search under the SLO."""

    slo_ms: float = 0.0
    rule: PercentileRule = field(default_factory=PercentileRule)
    tolerance: float = TOLERANCE
    max_points: int = MAX_POINTS
    repeats: int = REPEATS
    max_seconds: float | None = None  # one candidate's rate search: no measurement starts after it
    start_rps: float | None = None
    on_point: Callable[[Candidate, RatePoint], None] | None = None
    gpu_uuids: tuple[str, ...] = ()  # the serving GPUs: their power gives the energy per inference
    arrivals: Callable[[Point], Point] | None = None  # a trace's or bursty schedule at each rate (plan_arrivals)

    def measure(
        self, candidate: Candidate, variant: ServedVariant, layout: RunLayout, load: int | None = None
    ) -> Observation:
        """The candidate's sustainable rate under the SLO (`load`, a closed-loop one, does not apply)."""
        batch = self.online_batch_size
        latency = self.warmed_latency(variant, formed_batch_sizes(batch, candidate.max_batch_size))
        m = rate_measurement(self.measurement, self.rule)

        def at(rate: float) -> RatePoint:
            point = measure_at(rate)
            if point.status == "error" and (why := self.server.stopped_serving()):  # no lower rate would do better
                raise PerfAnalyzerError(
                    f"the Triton server {why} while measuring {candidate.key} at {rate:g} req/s: {point.reason}; "
                    f"the rates measured before it are in {rate_search_path(self.work_dir, candidate)}"
                )
            return point

        def measure_at(rate: float) -> RatePoint:
            monitor = PointMonitor(
                self.server.endpoints.grpc_url,
                self.measured_name,
                self.server.processes,
                self.server.endpoints.metrics_url,
                gpu_uuids=self.gpu_uuids,
                trace=self.server.request_trace(self.measured_name),
            )
            return measure_rate(
                rate,
                batch,
                model=self.measured_name,  # a pipeline's step: the pipeline
                grpc_url=self.server.endpoints.grpc_url,
                spec=variant.io_spec,
                m=m,
                layout=layout,
                binary=self.binary,
                env=self.env,
                slo_ms=self.slo_ms,
                rule=self.rule,
                inputs=self.inputs,
                latency_s=latency,
                monitor=monitor,
                arrivals=self.arrivals,
            )

        path = rate_search_path(self.work_dir, candidate)
        so_far = SustainableRate(stopped="not finished (interrupted or failed): the points measured so far")

        def measured(point: RatePoint) -> None:  # each point is kept as it is measured, whatever comes next
            so_far.points.append(point)
            path.write_text(json.dumps(so_far.model_dump(mode="json"), indent=2))
            if self.on_point:
                self.on_point(candidate, point)

        found = find_sustainable_rate(
            at,
            start_rate(latency, candidate.instances, self.start_rps),
            tolerance=self.tolerance,
            max_points=self.max_points,
            rule=self.rule,
            repeats=self.repeats,
            max_seconds=self.max_seconds,
            on_point=measured,
        )
        path.write_text(json.dumps(found.model_dump(mode="json"), indent=2))
        best = found.at_rate
        if best is None:
            return Observation(candidate=candidate, status="over_slo", error=f"no rate met the SLO: {found.stopped}")
        # ranked on what a plan counts on (min(offered, served) x batch), not the served throughput: a candidate that
        # served 104 at 100 offered plans with 100; the "p99_ms" field holds the rule's percentile (rule.column)
        sustained = found.sustained_rps * batch if found.sustained_rps is not None else best.throughput
        return Observation(candidate=candidate, throughput=sustained, p99_ms=best.latency_ms, avg_ms=None)


@dataclass
class RepositoryRateEvaluator(RepositoryEvaluator, RateEvaluator):
    """A capacity plan over the user's own config (`tbench capacity --repository DIR --model NAME`): each candidate
    the user's config with the searched fields edited (RepositoryEvaluator), judged by its sustainable rate under the
    SLO (RateEvaluator); an ensemble's step is judged by the pipeline's rate."""
