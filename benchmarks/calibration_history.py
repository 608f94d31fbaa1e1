"""The history's verdict against a known truth: simulated nightly series with planted regressions, replayed night by
night through the project's own decision (tbench.history.analysis.judge_series and History.news / verdict, what
`tbench history` and the nightly history stage take), counting the alerts each planted change gets.

Each series is one metric of one point (throughput, or p99 latency) over `NIGHTS` nights, with the noise of
benchmarks/change_detection.py (`simulate`: a night-to-night CV drawn from our repeated runs, window CVs from real
perf_analyzer logs), plus outlier nights (each night, with probability OUTLIER_NIGHT_P, 10-25% off either way, as a
night with a noisy neighbour or a slow start), which delay confirmation. Each night's run has a manifest: the
onnxruntime version, and the CPU other processes used during the run (host.other_cpu_pct, tbench.node.host_load).

Planted cases (a regression of 7, 10 or 20% at a night drawn so that at least 3 nights follow):
- runtime: onnxruntime 1.17.0 -> 1.18.0 at the step;
- runtime_bumped_later: the same, then 1.19.0 some nights later with no effect (finding 6: erased the cause);
- runtime_reverted: the same, then back to 1.17.0 and the old level (a second, improving change; finding 6);
- neighbour: other processes go from ~0.1 to 1.2-1.9 cores at the step and stay;
- neighbour_leaves: the same, and the neighbour leaves later, the level back;
- none: no change (false alerts), other processes' CPU jittering as on an idle node.

Measured (shares over planted regressions that the detector confirmed on some night):
- alerted_share: alerted exactly once, on the night that first confirmed it, with the verdict's exit code 1 that night;
- never_alerted, alerted_twice_or_more; late_confirmed (4+ runs after the step) and how those fared;
- false_alerts_per_100_series_nights: alerts about no planted regression (the detector's change placed within 3
  nights of the step on some night, or linked to one that was: _replay), over every series-night;
- attribution_correct: on the last night (after any later bump or revert), the regression's finding names the flipped
  field with its old and new value (runtime cases) or other processes' CPU rising (neighbour cases), over the changes
  the last night still finds (confirmed_then_lost_by_last_night: those it dropped, a detector matter);
  attribution_correct_at_alert: the same on the alert night; neighbour_named: the neighbour cases alone;
- recent_runs_3_never_alerted: what the rule before (a change is news while its start is among the newest 3 runs)
  would have missed, for comparison.

Lost points (tbench.history.lost): a point served (ok) for several nights, then, from a night drawn so that at least
3 follow, behind, error, unstable, undetermined, client-bound or absent (not measured while the sweep's other point
is) to the last night, replayed night by night from the night before the loss through
tbench.history.analysis.judge_points (what `analyse` runs on the stored points):
- lost_point_never_exit_0: the night that lost it exits 1 or 2, never 0;
- lost_point_exit_as_rule: 1 where the point now fails its rule (behind, error), 2 where its status cannot say;
- lost_point_alerted_once: told exactly once, on the night that lost it, not on the nights it stays lost;
- lost_point_named: that night's summary line names the point, its status and its error text;
- lost_point_alerts_before_the_loss: alerts about the point on the night before the loss, when it was served.

Usage: .venv/bin/python benchmarks/calibration_history.py [--seed 0] [--scale 1.0]   (prints the JSON; writes nothing)
`calibrate()` is what benchmarks/calibration.py imports.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # standalone: the repository's tbench
sys.path.insert(0, str(Path(__file__).resolve().parent))  # change_detection and provenance, as siblings

from change_detection import measured_noise, simulate  # noqa: E402

from tbench.core.metrics import OK, POINT_STATUSES, RESULT_COLUMNS  # noqa: E402
from tbench.history import attribute, detect  # noqa: E402
from tbench.history.analysis import EXIT_CODES, MIN_RUNS, History, judge_points, judge_series  # noqa: E402
from tbench.history.lost import ABSENT, FAILED, LostPoint  # noqa: E402
from tbench.history.series import METRICS, Series, point_name  # noqa: E402

NIGHTS = 24  # night-by-night replay costs ~nights^2 detections: long enough for a 13-run confirmation lag
STEPS = (0.07, 0.10, 0.20)
CASES = ("runtime", "runtime_bumped_later", "runtime_reverted", "neighbour", "neighbour_leaves")
SERIES_PER_CASE = 100  # at scale 1; and as many without a change
OUTLIER_NIGHT_P = 0.04
IDLE_OTHER_CPU = (0.0, 15.0)  # % of one core: an idle node's own daemons
NEIGHBOUR_OTHER_CPU = (120.0, 190.0)  # one or two busy processes beside the run
RUNTIMES = ("1.17.0", "1.18.0", "1.19.0")
METRIC = {"throughput": METRICS[0], "latency": METRICS[2]}  # throughput, p99 latency
ONNXRUNTIME = "tool versions: onnxruntime"
OTHER_CPU = attribute.NUMERIC["host.other_cpu_pct.mean"].label
DATES = pd.date_range("2026-11-01", periods=NIGHTS, freq="D", tz="UTC")
LOST_STATUSES = (*(s for s in POINT_STATUSES if s != OK), ABSENT)
LOST_PER_STATUS = 5  # sweeps per status at scale 1: each night's judgement reads every point (~0.1 s)
LOST_ERROR = "the lost point's error text"


@dataclass
class Planted:
    case: str
    kind: str
    step: float
    at: int  # the first night after the step
    later: int | None  # the night of the later bump, revert or the neighbour leaving
    values: np.ndarray
    noise: np.ndarray
    manifests: list[dict]
    alerts: list[int] = field(default_factory=list)  # nights whose news held this change
    confirmed_on: int | None = None  # the first night a confirmed finding matched it
    confirmed_index: int | None = None  # where that night's finding put it
    exit_on_confirming_night: int | None = None
    named_at_alert: bool = False
    found_at_end: bool = False  # the last night's judgement still has it (the detector may drop a confirmed change)
    named_at_end: bool = False
    named_else_at_end: bool = False  # the finding also named a field other than the planted one (spurious)
    revert_named: bool | None = None  # runtime_reverted: the revert's own finding names 1.18.0 -> 1.17.0


def _manifest(runtime: str, other_cpu: float) -> dict:
    return {
        "environment": {"tools": {"onnxruntime": runtime}},
        "hardware": {"hostname": "worker-1", "cpu_cores": 2},
        "host": {"other_cpu_pct": {"mean": round(other_cpu, 1), "max": round(other_cpu * 1.2, 1)}},
    }


def _plant(rng, case: str, kind: str, step: float, noise: dict) -> Planted:
    values, reported, _, _ = simulate(rng, kind, noise, NIGHTS, 0.0)
    hit = rng.random(NIGHTS) < OUTLIER_NIGHT_P
    values[hit] *= 1 + rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(0.10, 0.25, hit.sum())
    other = rng.uniform(*IDLE_OTHER_CPU, NIGHTS)
    runtime = np.array([RUNTIMES[0]] * NIGHTS, dtype=object)
    at = later = None
    if case != "none":
        worse = 1 - step if kind == "throughput" else 1 + step
        later_room = case in ("runtime_bumped_later", "runtime_reverted", "neighbour_leaves")
        # the step with 3+ nights after it, and a later event 6+ nights after the step with 3+ nights after it
        at = int(rng.integers(detect.MIN_SIZE, NIGHTS - 3 - (6 if later_room else 0) + 1))
        later = int(rng.integers(at + 6, NIGHTS - 3 + 1)) if later_room else None
        end = later if case in ("runtime_reverted", "neighbour_leaves") else NIGHTS
        values[at:end] *= worse
        if case.startswith("runtime"):
            runtime[at:] = RUNTIMES[1]
            if later is not None:
                runtime[later:] = RUNTIMES[2] if case == "runtime_bumped_later" else RUNTIMES[0]
        else:
            other[at:end] = rng.uniform(*NEIGHBOUR_OTHER_CPU, end - at)
    manifests = [_manifest(r, o) for r, o in zip(runtime, other)]
    return Planted(case, kind, step, at if at is not None else -1, later, values, reported, manifests)


def _series(p: Planted, number: int) -> tuple[Series, dict[str, dict]]:
    """The whole series as the history builds it (tbench.history.series), and its runs' manifests."""
    run_ids = [f"s{number}-night{n:02d}" for n in range(NIGHTS)]
    runs = pd.DataFrame({"run_id": run_ids, "started_at": DATES, "value": p.values, "noise": p.noise})
    key = {"model": "sim", "model_size": "small", "gpu": "CPU", "format": "onnx", "precision": "fp32"}
    series = Series(key=key | {"scenario": "online", "concurrency": number}, metric=METRIC[p.kind], runs=runs)
    return series, dict(zip(run_ids, p.manifests))


def _matches(p: Planted, change: detect.Change) -> bool:
    # about the planted step: placed within one segment (min_size nights) of it; the detector may first place a change
    # up to a segment late and move it later (judge() then keeps it as the same change, told once)
    return p.at >= 0 and abs(change.index - p.at) <= detect.MIN_SIZE


def _names_cause(p: Planted, finding) -> bool:
    if p.case.startswith("runtime"):
        return any(d.what == ONNXRUNTIME and (d.before, d.after) == RUNTIMES[:2] for d in finding.differences)
    cores = [
        (float(d.before.split()[0]), float(d.after.split()[0])) for d in finding.differences if d.what == OTHER_CPU
    ]
    return any(after > before for before, after in cores)


def _chains(nights: list[list]) -> list[list[int]]:
    """Each night's confirmed regressions labelled by the change they are, as the detector links one night's changes
    to the night before's (detect._same_change: the same way, moved by at most a segment; each paired once)."""
    labels: list[list[int]] = []
    fresh = 0
    for n, findings in enumerate(nights):
        before = list(zip(nights[n - 1], labels[n - 1])) if n else []
        mine = []
        for f in findings:
            near = [(abs(g.change.index - f.change.index), label) for g, label in before if _same(f, g)]
            if near:
                label = min(near)[1]
                before = [(g, lb) for g, lb in before if lb != label]
            else:
                label, fresh = fresh, fresh + 1
            mine.append(label)
        labels.append(mine)
    return labels


def _same(f, g) -> bool:
    return detect._same_change(f.change, g.change, detect.MIN_SIZE)


def _replay(p: Planted, number: int) -> int:
    """Every night judged as the nightly stage judges it; returns the false alerts (news about no planted change).

    A change is the planted one when the detector places it within a segment of the step on some night. In a noisy
    series it may first place it further and move it there on later nights, and judge() keeps it as the same change,
    told once: so the nights' changes are linked as the detector links them (_chains), and a change linked to one
    placed at the step is the planted change on every night, its news included."""
    whole, manifests = _series(p, number)
    nights, news, exits = [], [], []
    for night in range(1, NIGHTS + 1):
        series = Series(key=whole.key, metric=whole.metric, runs=whole.runs.iloc[:night])  # as stored by that night
        history = History(root="simulated", series=[series], runs=night)
        history.findings = judge_series(series, manifests)
        nights.append([f for f in history.findings if f.regression and not f.candidate])
        news.append(history.news(series.runs["run_id"].iloc[-1]))
        exits.append(EXIT_CODES[history.verdict])
    labels = _chains(nights)
    planted = {lb for fs, ls in zip(nights, labels) for f, lb in zip(fs, ls) if _matches(p, f.change)}

    def is_planted(n: int, finding) -> bool:
        return any(f is finding and lb in planted for f, lb in zip(nights[n], labels[n]))

    false_alerts = 0
    for n in range(NIGHTS):
        for finding in news[n]:
            if is_planted(n, finding):
                p.alerts.append(n + 1)
                p.named_at_alert |= _names_cause(p, finding)
            else:
                false_alerts += 1
        confirming = [f for f in nights[n] if is_planted(n, f)]
        if p.confirmed_on is None and confirming:
            p.confirmed_on, p.confirmed_index = n + 1, confirming[0].change.index
            p.exit_on_confirming_night = exits[n]
    for finding in history.findings:  # the last night: after any later bump, revert or the neighbour leaving
        if finding.candidate:
            continue
        if finding.regression and is_planted(NIGHTS - 1, finding):
            p.found_at_end = True
            p.named_at_end |= _names_cause(p, finding)
            planted_field = ONNXRUNTIME if p.case.startswith("runtime") else OTHER_CPU
            p.named_else_at_end |= any(d.what != planted_field for d in finding.differences)
        elif p.case == "runtime_reverted" and abs(finding.change.index - p.later) < detect.MIN_SIZE:
            p.revert_named = any(
                d.what == ONNXRUNTIME and (d.before, d.after) == (RUNTIMES[1], RUNTIMES[0]) for d in finding.differences
            )
    return false_alerts


def _share(items: list, test) -> float | None:
    return round(sum(1 for x in items if test(x)) / len(items), 4) if items else None


def _exactly_once(p: Planted) -> bool:
    return p.alerts == [p.confirmed_on] and p.exit_on_confirming_night == 1


def _sim_key(concurrency: int) -> dict:
    return {
        "model": "sim", "model_size": "small", "gpu": "CPU", "format": "onnx", "precision": "fp32",
        "scenario": "online", "batch_size": 1, "concurrency": concurrency, "request_rate": None,
        "request_distribution": None, "shapes": None, "input_data": None,
    }  # fmt: skip


def _lost_points_frame(rng, status: str, lost_from: int, noise: dict) -> pd.DataFrame:
    """The stored points of one sweep over NIGHTS nights: the point at concurrency 1, served until `lost_from` and then
    `status` (ABSENT: not measured), and one at concurrency 2 served every night, with our runs' noise."""
    rows = []
    for concurrency in (1, 2):
        values, reported, _, _ = simulate(rng, "throughput", noise, NIGHTS, 0.0, outliers=True)
        for night in range(NIGHTS):
            now = status if concurrency == 1 and night >= lost_from else OK
            if now == ABSENT:
                continue
            row = dict.fromkeys(RESULT_COLUMNS, np.nan)
            row.update(
                _sim_key(concurrency), status=now, error=None if now == OK else LOST_ERROR,
                throughput_infer_per_s=values[night] if now == OK else np.nan, p50_ms=4000 / values[night],
                p99_ms=6000 / values[night], throughput_cv=reported[night], latency_cv=reported[night],
                run_id=f"night{night:02d}", started_at=DATES[night],
            )  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


def lost_points(rng, noise: dict, per_status: int) -> dict:
    """Each status a served point can be lost to, replayed night by night (module docstring)."""
    outcomes: dict[str, list[dict]] = {status: [] for status in LOST_STATUSES}
    alerts_before = 0
    for status in LOST_STATUSES:
        for _ in range(per_status):
            lost_from = int(rng.integers(2, NIGHTS - 3))  # served 2+ nights, lost for 4+
            points = _lost_points_frame(rng, status, lost_from, noise)
            alerted, exit_code, summary = [], None, ""
            for night in range(lost_from, NIGHTS + 1):  # the night before the loss, the loss and the nights after
                stored = points[points["started_at"] < DATES[night - 1] + pd.Timedelta(hours=1)]
                history = judge_points(stored, {}, root="simulated")
                news = history.news(f"night{night - 1:02d}")
                told = [a for a in news if isinstance(a, LostPoint) and a.key["concurrency"] == 1]
                if told and night - 1 < lost_from:
                    alerts_before += 1
                alerted += [night - 1] * len(told)
                if night - 1 == lost_from:
                    exit_code, summary = EXIT_CODES[history.verdict], history.summary()
            named = point_name(_sim_key(1)) in summary and f"lost, {status} in run" in summary
            outcomes[status].append(
                {
                    "never_exit_0": exit_code != 0,
                    "exit_as_rule": exit_code == (1 if status in FAILED else 2),
                    "alerted_once": alerted == [lost_from],
                    "named": named and (status == ABSENT or LOST_ERROR in summary),
                }
            )
    every = [o for found in outcomes.values() for o in found]
    return {
        "lost_point_never_exit_0": _share(every, lambda o: o["never_exit_0"]),
        "lost_point_exit_as_rule": _share(every, lambda o: o["exit_as_rule"]),
        "lost_point_alerted_once": _share(every, lambda o: o["alerted_once"]),
        "lost_point_named": _share(every, lambda o: o["named"]),
        "lost_point_alerts_before_the_loss": alerts_before,
        "lost_point_alerted_once_by_status": {s: _share(o, lambda o: o["alerted_once"]) for s, o in outcomes.items()},
        "lost_points": len(every),
    }


def calibrate(seed: int = 0, scale: float = 1.0) -> dict:
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    noise = measured_noise(None)
    per_case = max(1, round(SERIES_PER_CASE * scale))
    planted, false_alerts, series_nights = [], Counter(), Counter()
    number = 0
    for case in (*CASES, "none"):
        for i in range(per_case):
            kind = ("throughput", "latency")[i % 2]
            p = _plant(rng, case, kind, STEPS[(i // 2) % len(STEPS)], noise)
            without = "without_change" if case == "none" else "with_change"
            false_alerts[without] += _replay(p, number)
            series_nights[without] += NIGHTS
            number += 1
            if case != "none":
                planted.append(p)
    confirmed = [p for p in planted if p.confirmed_on is not None]
    late = [p for p in confirmed if p.confirmed_on - p.at > 3]  # nights counted from 1: confirmed_on - at runs after
    lags = Counter(p.confirmed_on - p.at for p in confirmed)
    kept = [p for p in confirmed if p.found_at_end]  # attribution is judged where the last night still has the change
    neighbours = [p for p in kept if p.case.startswith("neighbour")]
    reverts = [p for p in confirmed if p.revert_named is not None]
    lost_started = time.monotonic()
    lost = lost_points(rng, noise, max(1, round(LOST_PER_STATUS * scale)))
    lost_seconds = round(time.monotonic() - lost_started, 1)
    history = {
        "alerted_share": _share(confirmed, _exactly_once),
        "never_alerted": _share(confirmed, lambda p: not p.alerts),
        "alerted_twice_or_more": _share(confirmed, lambda p: len(p.alerts) >= 2),
        "alerted_on_confirming_run_with_exit_1": _share(
            confirmed, lambda p: p.confirmed_on in p.alerts and p.exit_on_confirming_night == 1
        ),
        "false_alerts_per_100_series_nights": round(100 * false_alerts.total() / series_nights.total(), 4),
        "false_alerts_per_100_series_nights_without_change": round(
            100 * false_alerts["without_change"] / series_nights["without_change"], 4
        ),
        "false_alerts": dict(false_alerts),
        "attribution_correct": _share(kept, lambda p: p.named_at_end),
        "attribution_correct_at_alert": _share([p for p in confirmed if p.alerts], lambda p: p.named_at_alert),
        "attribution_correct_by_case": {
            case: _share([p for p in kept if p.case == case], lambda p: p.named_at_end) for case in CASES
        },
        "attribution_named_an_unchanged_field": _share(kept, lambda p: p.named_else_at_end),
        "revert_attributed": _share(reverts, lambda p: p.revert_named),
        "neighbour_named": _share(neighbours, lambda p: p.named_at_end),
        "neighbour_named_at_alert": _share(
            [p for p in confirmed if p.case.startswith("neighbour") and p.alerts], lambda p: p.named_at_alert
        ),
        "confirmed_share": _share(planted, lambda p: p.confirmed_on is not None),
        "confirmed_then_lost_by_last_night": _share(confirmed, lambda p: not p.found_at_end),
        "planted": len(planted),
        "confirmed": len(confirmed),
        "late_confirmed": len(late),
        "late_confirmed_alerted_share": _share(late, _exactly_once),
        "confirmation_lag_runs": {str(k): v for k, v in sorted(lags.items())},
        # the rule before: news while the change's index is among the newest 3 runs, on the night that confirms it
        "recent_runs_3_never_alerted": _share(confirmed, lambda p: p.confirmed_index < p.confirmed_on - 3),
        **lost,
    }
    return {
        "rules": {"history": history},
        "conditions": {
            "history": {
                "steps": list(STEPS),
                "cases": [*CASES, "none"],
                "series_per_case": per_case,
                "series": number,
                "nights_per_series": NIGHTS,
                "metrics": ["throughput", "p99 latency"],
                "noise": "benchmarks/change_detection.py simulate(): night-to-night CV "
                f"{sorted({s['cv_pct'] for k in ('throughput', 'latency') for s in noise['run_to_run_cv_pct'][k]})} %"
                f", window CVs {noise['window_cv_pct']} %",
                "outlier_nights": f"each night with p={OUTLIER_NIGHT_P}, 10-25% off either way",
                "other_cpu_pct": {"idle": list(IDLE_OTHER_CPU), "neighbour": list(NEIGHBOUR_OTHER_CPU)},
                "step_night": f"uniform in [{detect.MIN_SIZE}, {NIGHTS} - 3] (- 6 where a later event follows)",
                "match": "a finding placed within min_size = 3 nights of the planted step",
                "lost_points": f"{max(1, round(LOST_PER_STATUS * scale))} sweeps per status {list(LOST_STATUSES)}: "
                f"a point served from night 1, lost from a night in [2, {NIGHTS} - 4] to the last, beside one served "
                f"every night ({lost_seconds} s)",
                "seed": seed,
                "scale": scale,
                "seconds": round(time.monotonic() - started, 1),
            }
        },
        "parameters": {
            "history": {
                "module": "tbench.history.analysis.judge_series (tbench.history.detect.judge)",
                "min_size": detect.MIN_SIZE,
                "min_runs_to_judge": MIN_RUNS,
                "alpha": detect.ALPHA,
                "min_effect": detect.MIN_EFFECT,
                "noise_factor": detect.NOISE_FACTOR,
                "penalty": detect.PENALTY,
                "outlier_z": detect.OUTLIER_Z,
                "candidate_z": detect.CANDIDATE_Z,
                "news_rule": "newly confirmed by the series' newest run (RECENT_RUNS=3 before)",
                "reconfirm_lookback_runs": detect.RECONFIRM_LOOKBACK,
                "other_cpu_moved_pct": attribute.OTHER_CPU_MOVED_PCT,
                "exit_codes": EXIT_CODES,
                "lost_point_fails": list(FAILED),
                "lost_point_module": "tbench.history.lost (tbench.history.analysis.judge_points)",
            }
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    print(json.dumps(calibrate(args.seed, args.scale), indent=1))


if __name__ == "__main__":
    main()
