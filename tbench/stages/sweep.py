"""Stage 6: perf_analyzer sweeps; each point is one real perf_analyzer call, parsed into one tidy row.

An unstable point is retried with a window twice as long; if it still fails it is kept as a row with
status "unstable" (no numbers), so a sweep never loses the points it did measure.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from tbench.core import progress
from tbench.core.enums import Scenario
from tbench.core.errors import PerfAnalyzerError
from tbench.core.iospec import IoSpec
from tbench.core.layout import RunLayout
from tbench.core.metrics import RESULT_COLUMNS, THROUGHPUT
from tbench.core.pipeline_steps import busy_at
from tbench.core.shape_sets import guessed_shapes_line
from tbench.core.storage import file_sha256
from tbench.core.synthetic import guessed_values_line
from tbench.loadgen.arrivals import arrivals_fidelity
from tbench.loadgen.perf_analyzer import (
    STABLE_WINDOWS,
    UNSTABLE_MARK,
    PerfInputs,
    Point,
    export_fits,
    merged_requests,
    noise_from_log,
    parse_composing,
    parse_perf_csv,
    pass_throughputs,
    perf_argv,
    perf_json_value,
    profile_export_path,
    refused_client_shm,
    window_seconds,
)
from tbench.node import procs, shm, tools
from tbench.request.benchmark import plain_name
from tbench.request.measurement import Measurement
from tbench.stages.rate_verdict import (
    RATE_STABILITY_PCT,
    REQUESTS_FROM,
    measure_again,
    point_requests,
    rate_point_verdict,
    requests_to_decide,
    retry_window_requests,
)
from tbench.stages.shared_memory import release_shared_memory, remove_unregistered_regions
from tbench.stages.warm_up import formed_batch_sizes, warm_up
from tbench.stages.window_progress import windows_told
from tbench.triton.monitor import STEPS_KEY, NoMonitor, cross_check
from tbench.triton.served import serving_instances


def plan_points(
    scenarios: list[Scenario],
    batch_sizes: list[int],
    concurrency: list[int],
    rates: list[float] = (),
    distribution: str = "poisson",
    online_batch_size: int = 1,
) -> list[Point]:
    """Offline: batch grid at concurrency 1. Online: concurrency grid at the online batch size (1 for most models;
    recommenders send thousands of samples per request), the server batches further.
    Rate: open-loop requests at each rate, the online batch size, arrivals constant or poisson (the server batches)."""
    points = []
    for scenario in scenarios:
        if scenario is Scenario.OFFLINE:
            points += [Point(scenario, b, 1) for b in batch_sizes]
        elif scenario is Scenario.ONLINE:
            points += [Point(scenario, online_batch_size, c) for c in concurrency]
        else:
            points += [Point(scenario, online_batch_size, None, r, distribution) for r in rates]
    return points


# JSON input data grows ~10 bytes per value: a few samples, fewer when samples are big (a 224 px image is 150k values),
# more when they are small (a recommender's sample is ~40 values: hundreds of real samples, as its guide sends)
MAX_INPUT_VALUES = 1_000_000
SMALL_SAMPLES_VALUES = 100_000
# the framework model runs the samples to size the outputs: in chunks, and only as many as fit this time budget (a
# speech model's 256 token sequences took 105 s on 2 cores in one call; 8 of them take about 2 s)
OUTPUT_PROBE_CHUNK = 8
OUTPUT_PROBE_BUDGET_S = 5.0


def prepare_inputs(
    adapter,
    module,
    path: Path,
    samples: int | None = None,
    shared_memory: str = "system",
    answer: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> PerfInputs:
    """Samples from the adapter's data (synthetic when it has no dataset) as perf_analyzer JSON, one entry per sample,
    so integer inputs such as token ids stay in range, which perf_analyzer's random data does not. Samples too big
    for JSON (a 4 x 128^3 volume is 8M values) whose inputs are all floats get perf_analyzer's random data instead.
    `answer` runs a chunk of samples to size the outputs: the source model (`module`) unless given (a served model's
    server)."""
    from tbench.core.runtimes import run_source

    if answer is None:
        answer = lambda chunk: run_source(adapter.framework, module, adapter.io_spec(), chunk)  # noqa: E731
    one = adapter.sample_batch(1)
    per_sample = sum(int(np.prod(a.shape)) for a in one.values())
    all_float = all(a.dtype.kind == "f" for a in one.values())
    if samples is None:
        samples = max(4, min(256, SMALL_SAMPLES_VALUES // max(per_sample, 1)))
    count = max(1, min(samples, MAX_INPUT_VALUES // max(per_sample, 1)))
    given = adapter.given_samples
    if given is not None and given.varying:  # the user's samples, each request at its own shape, run one at a time
        picked = given.spread(min(count, given.count))  # spread over the file, not its first samples
        requests = [given.one(i) for i in picked]
        lead = (lambda a: a[None]) if adapter.batching else (lambda a: a)
        chunk_of = lambda start: {name: lead(a) for name, a in requests[start].items()}  # noqa: E731
    elif adapter.batching:  # rows of one batch (padded to the longest where lengths vary); perf_analyzer adds the axis
        batch = adapter.sample_batch(count)
        rows = len(next(iter(batch.values())))
        requests = [{name: a[i] for name, a in batch.items()} for i in range(rows)]
        chunk_of = lambda start: {name: a[start : start + OUTPUT_PROBE_CHUNK] for name, a in batch.items()}  # noqa: E731
    else:  # no batch axis: each sample is a whole request at the model's own shapes, run one at a time
        requests = [b.inputs for b in adapter.batches(count, 1, seed=1234)]
        chunk_of = lambda start: requests[start]  # noqa: E731
    # outputs of the very samples perf_analyzer sends, per sample; the framework runs them in chunks, and a model too
    # slow to run them all within OUTPUT_PROBE_BUDGET_S sends fewer
    n = len(requests)
    per_sample_bytes, done, started = 0, 0, time.perf_counter()
    while done < n:
        chunk = chunk_of(done)
        size = len(next(iter(chunk.values()))) if adapter.batching else 1  # rows of the chunk
        outputs = answer(chunk)
        per_sample_bytes = max(per_sample_bytes, *(v.nbytes // size for v in outputs.values()))
        done += size
        if (time.perf_counter() - started) / done * min(n, done + OUTPUT_PROBE_CHUNK) > OUTPUT_PROBE_BUDGET_S:
            break
    n = done
    data_file = None
    if per_sample <= MAX_INPUT_VALUES or not all_float:
        entries = [{name: perf_json_value(a) for name, a in request.items()} for request in requests[:n]]
        path.write_text(json.dumps({"data": entries}))
        data_file = path
    return PerfInputs(
        data_file=data_file,
        shapes=adapter.input_shapes(),
        batching=adapter.batching,
        varying=tuple(given.distribution()) if given is not None and data_file is not None else (),
        sent=tuple(picked[:n]) if given is not None and given.varying and data_file is not None else (),
        sample_output_bytes=per_sample_bytes,
        shared_memory=shared_memory,
    )


def dynamic_shapes(
    spec: IoSpec, shapes: dict[str, list[int]] | None, varying: dict[str, str] | None = None
) -> list[str]:
    """Each input with a dynamic dim and the shape it was measured at (`input_ids [-1] measured as [16]`), or the
    distribution of the shapes its requests had (`varying`, from the user's samples): a model's speed depends on it
    (an NLP model at 16 tokens looks far faster than at 512), so a report must say it."""
    shapes, varying = shapes or {}, varying or {}

    def measured(name: str) -> str:
        if name in varying:
            return f"each request at its own shape, {varying[name]}"
        return str(shapes[name]) if name in shapes else "the input data gives it"

    return [f"{t.name} {t.shape} measured as {measured(t.name)}" for t in spec.inputs if -1 in t.shape]


@dataclass(frozen=True)
class ShapeSet:
    """One shape set of a run (a --shape sweep has several): perf_analyzer's inputs at it, and its names."""

    tag: str  # in point labels, file names and stage names; "" for a run's only set
    inputs: PerfInputs
    shapes: list[str]  # the dynamic dims as measured (dynamic_shapes)
    label: str | None  # the results' shapes column (tbench.core.measured.shapes_label)


def measured_shape_sets(adapter, module, run_dir: Path, shared_memory: str = "system", answer=None) -> list[ShapeSet]:
    """perf_analyzer's inputs at each of the adapter's shape sets (`measured_inputs`): one set unless the user swept
    shapes, each with its own input data file."""
    from tbench.core.measured import shapes_label
    from tbench.core.shape_sets import shape_tags

    sets = adapter.shape_sets
    measured = []
    for shapes, tag in zip(sets, shape_tags(sets)):
        at = adapter.at_shapes(shapes) if tag else adapter
        path = run_dir / (f"perf_input_{tag}.json" if tag else "perf_input.json")
        inputs, described = measured_inputs(at, module, path, shared_memory, answer, warn=not measured)
        measured.append(ShapeSet(tag, inputs, described, shapes_label(at.io_spec(), inputs.shapes, inputs.varying)))
    return measured


def measured_inputs(
    adapter, module, path: Path, shared_memory: str = "system", answer=None, warn: bool = True
) -> tuple[PerfInputs, list[str]]:
    """perf_analyzer's inputs (`prepare_inputs`) and the shapes they are measured at (`dynamic_shapes`); where only
    some of the user's samples are sent, the terminal says so before the first point (the figures describe those)."""
    inputs = prepare_inputs(adapter, module, path, shared_memory=shared_memory, answer=answer)
    given = adapter.given_samples
    sent = inputs.sent or None  # the samples perf_analyzer is given, where they vary in shape
    shapes = dynamic_shapes(adapter.io_spec(), inputs.shapes, given.distribution(sent) if given is not None else None)
    if sent and len(sent) < given.count:
        progress.warn(f"{len(sent)} of the {given.count} input samples are sent, spread over them: see the report")
    if warn and (guessed := adapter.guessed_shapes):  # a model file's dynamic dims that nobody sized
        progress.warn(guessed_shapes_line(guessed))
    if warn and (chosen := adapter.guessed_values):
        progress.warn(guessed_values_line(chosen))
    return inputs, shapes


def cache_key(point: Point, model: str) -> dict:
    """A point's key in the point cache: the model by its plain name (a remote run's Triton names are its own)."""
    return {
        "model": plain_name(model),
        "scenario": point.scenario.value,
        "batch_size": point.batch_size,
        "concurrency": point.concurrency,
        "rate": point.rate,
        "distribution": point.distribution,
        **({"shapes": point.shapes} if point.shapes else {}),  # without a sweep: the keys of earlier runs
        **({"arrivals": file_sha256(point.intervals)} if point.intervals else {}),  # the schedule, not its path
        **({"samples": file_sha256(point.data_file)} if point.data_file else {}),  # a trace's samples, in order
    }


# the report's line where the server refused client shared memory and the offline points went over gRPC
SHM_REFUSED_NOTE = (
    "the server refused client shared memory (Triton 2.68 on runs without it unless started with "
    "--allow-client-shm=true): the offline points were measured without shared memory, tensors over gRPC"
)


def refused_shared_memory(table: pd.DataFrame, planned: str) -> bool:
    """Whether a sweep planned with shared memory measured offline points without it (the server refused it)."""
    if planned == "none" or table is None or table.empty:
        return False
    return bool(((table["scenario"] == Scenario.OFFLINE.value) & (table["shared_memory"] == "none")).any())


def empty_row() -> dict:
    return {c: np.nan for c in RESULT_COLUMNS}


def measure_point(
    point: Point,
    *,
    model: str,
    grpc_url: str,
    spec: IoSpec,
    m: Measurement,
    layout: RunLayout,
    binary: Path,
    env: dict[str, str],
    inputs: PerfInputs = PerfInputs(),
    monitor=None,
    latency_s: float | None = None,
    expected_rate: float | None = None,
) -> dict:
    """Measure one point, retrying with longer windows; always returns a row (status ok | unstable | error), with
    what the server did during the attempt that counted when a monitor watches it. Windows are sized
    (Measurement.requests_per_window) from the rate the point will run at: a rate point's offered rate, else
    `expected_rate` (requests/s the sweep already saw at a lower concurrency), else the calibrated single-request
    latency `latency_s` at this batch size."""
    monitor = monitor or NoMonitor()
    exported = point.rate is not None and export_fits(spec, point.batch_size, inputs)
    # requests too large to export: the server's own timestamps of them, where it keeps a trace we read
    traced = point.rate is not None and not exported and getattr(monitor, "trace", None) is not None
    measured_rate = expected_rate  # requests/s: what the sweep expects, then what a failed attempt saw
    deciding = None  # requests an undetermined rate point needs for its load to decide it
    row = empty_row()
    row.update(
        scenario=point.scenario.value,
        batch_size=point.batch_size,
        concurrency=point.concurrency,
        request_rate=point.rate,
        request_distribution=point.distribution if point.rate is not None else "",
        stability_percentage=m.stability_percentage,
        max_trials=m.max_trials,
        protocol="grpc",
        shared_memory=inputs.shared_memory if point.scenario is Scenario.OFFLINE else "none",
        measure_seconds=0.0,
    )
    # a point measured again in the same run (a capacity search's repeats of a rate) keeps every measurement's files
    taken = next(
        n
        for n in itertools.count()
        if not layout.perf_csv(model, point.scenario, point.label, n).exists()
        and not layout.perf_log(model, point.scenario, point.label, n).exists()  # a failed call writes no CSV
    )
    for attempt in range(1 + m.retries):
        request_count = m.requests_per_window(latency_s, point.concurrency or 1, attempt, measured_rate, point.rate)
        if point.rate is not None:
            request_count = retry_window_requests(request_count, deciding, point.rate)
        if point.schedule_requests:  # a trace is replayed whole: its windows together hold it at least once
            request_count = max(request_count, math.ceil(point.schedule_requests / STABLE_WINDOWS))
        timeout_s = m.point_timeout_s(request_count, point.rate)
        attempt_m = m
        if point.rate is not None:
            attempt_m = m.model_copy(update={"stability_percentage": RATE_STABILITY_PCT})
            row.update(stability_percentage=RATE_STABILITY_PCT)
        csv_path = layout.perf_csv(model, point.scenario, point.label, taken + attempt)
        export = profile_export_path(csv_path) if exported else None
        argv = perf_argv(binary, model, grpc_url, point, attempt_m, request_count, csv_path, spec, inputs, export)
        log_path = layout.perf_log(model, point.scenario, point.label, taken + attempt)
        with shm.system_regions_held() if row["shared_memory"] == "system" else contextlib.nullcontext():
            monitor.start(trace_requests=traced)
            done = None
            try:
                with windows_told(log_path, point, None if point.rate is not None else attempt_m.stability_percentage):
                    done = procs.run(argv, log_path, timeout_s, env)
            finally:  # an unstable, killed or timed-out perf_analyzer leaves its regions registered
                if row["shared_memory"] != "none":
                    tensors = spec.input_names() + spec.output_names()
                    release_shared_memory(grpc_url, row["shared_memory"], tensors)
                    if row["shared_memory"] == "system" and (done is None or done.returncode != 0):
                        remove_unregistered_regions(tensors)
            observed = monitor.stop()
        row.update(
            attempts=attempt + 1,
            measurement_request_count=request_count,
            measure_seconds=row["measure_seconds"] + done.seconds,
        )
        log = done.log_tail(40)
        failed_in_shm = row["shared_memory"] != "none" and done.returncode != 0
        if failed_in_shm and refused_client_shm(log_path.read_text(errors="replace")):
            # the server refuses client shared memory (Triton 2.68 on, without --allow-client-shm=true): the point is
            # measured over gRPC, the refused attempt's files kept; the report says so in one line (SHM_REFUSED_NOTE)
            return measure_point(
                point,
                model=model,
                grpc_url=grpc_url,
                spec=spec,
                m=m,
                layout=layout,
                binary=binary,
                env=env,
                inputs=replace(inputs, shared_memory="none"),
                monitor=monitor,
                latency_s=latency_s,
                expected_rate=expected_rate,
            )
        if done.returncode == 0 and csv_path.exists():
            try:
                row.update(
                    parse_perf_csv(csv_path),
                    status="ok",
                    error="",
                    source_file=str(csv_path.relative_to(layout.run_dir)),
                )
                if point.intervals:  # perf_analyzer writes a whole number for a schedule: its mean rate is ours
                    row["request_rate"] = point.rate
                full_log = log_path.read_text(errors="replace")
                merged = merged_requests(full_log)
                row["window_requests"] = merged / STABLE_WINDOWS if merged else np.nan
                row["window_s"] = window_seconds(merged, point.batch_size, row[THROUGHPUT.column])
                noise = noise_from_log(full_log)  # kept with the point: a history judges a change against it
                if not noise.assumed:
                    row.update(throughput_cv=noise.throughput_cv, latency_cv=noise.latency_cv)
                row["composing"] = parse_composing(full_log)  # an ensemble's steps; else []
                row.update(observed, stats_max_rel_diff=cross_check({**row, **observed}))
                if point.rate is not None:  # an open-loop point's figures hold only if it carried the load
                    requests = point_requests(export) if exported else monitor.requests
                    row["requests_from"] = REQUESTS_FROM[(exported, requests is not None)]
                    if point.intervals and requests is not None:  # how closely the schedule was kept
                        row.update(arrivals_fidelity(point.intervals, requests))
                    instances = serving_instances(grpc_url, model) if requests is None else None
                    row.update(rate_point_verdict(point, row, merged, full_log, requests, instances))
                    if measure_again(row, attempt, m):
                        measured_rate = point.rate
                        deciding = requests_to_decide(point, row, instances)
                        continue
                return row
            except ValueError:
                pass  # exit 0 with no row: perf_analyzer stopped early on an unstable point
        if done.timed_out:
            row.update(status="error", error=f"perf_analyzer timed out after {timeout_s:.0f} s")
            return row
        if UNSTABLE_MARK in log or done.returncode == 0:
            passes = pass_throughputs(log_path.read_text(errors="replace"))
            measured_rate = float(np.median(passes)) / point.batch_size if passes else measured_rate
            spread = (
                f", throughput spread {100 * (max(passes) - min(passes)) / max(passes):.0f}%"
                if passes and max(passes) > 0
                else ""
            )
            row.update(
                status="unstable",
                error=f"not stable within {m.max_trials} windows of {request_count}+ requests{spread}"
                + attempt_m.unresolved_note(request_count),
            )
            continue
        last = [ln for ln in log.splitlines() if ln.strip()]
        if done.returncode < 0:  # killed from outside: its last log line is not the reason
            row.update(status="error", error=f"perf_analyzer was killed by {signal.Signals(-done.returncode).name}")
        else:
            row.update(status="error", error=last[-1].strip() if last else f"perf_analyzer exited {done.returncode}")
        return row
    return row


def expected_online_rate(point: Point, served: dict[int, dict[int, float]]) -> float | None:
    """Requests/s an online point will serve at least: the most a lower (or equal) concurrency at its batch size
    served earlier in the sweep (`served`: batch -> {concurrency: requests/s}), since more requests in flight never
    serve fewer; None for other points or when none was measured yet."""
    if point.scenario is not Scenario.ONLINE:
        return None
    lower = [r for c, r in served.get(point.batch_size, {}).items() if c <= (point.concurrency or 0)]
    return max(lower, default=None)


def measurement_order(points: list[Point], m: Measurement) -> list[Point]:
    """Shuffled with a fixed seed by default: measured in grid order, a slow drift of the machine (heat, a neighbour's
    load) would line up with batch size or concurrency and tilt the curve; shuffled, it spreads over the grid as
    noise."""
    if m.order == "ascending":
        return list(points)
    order = np.random.default_rng(m.seed).permutation(len(points))
    return [points[i] for i in order]


def run_sweep(
    points: list[Point],
    *,
    model: str,
    grpc_url: str,
    spec: IoSpec,
    m: Measurement,
    layout: RunLayout,
    static: dict,
    on_row: Callable[[pd.DataFrame], None] | None = None,
    stopped_serving: Callable[[], str | None] | None = None,
    inputs: PerfInputs = PerfInputs(),
    on_composing: Callable[[list[dict]], None] | None = None,
    on_steps: Callable[[list[dict]], None] | None = None,
    monitor=None,
    cache=None,
    gpu_env: dict[str, str] | None = None,
    dynamic_max_batch: int = 0,
) -> pd.DataFrame:
    """Measure every point in order; `on_row` gets the table after each point so nothing measured is lost, and
    `on_composing` an ensemble's per composing model rows of the point (perf_analyzer's), `on_steps` a pipeline's
    per step rows from Triton's statistics (a monitor given `steps`: tbench.core.pipeline_steps). With a `cache`
    (tasks.point_cache), points it holds are taken from it and the others are kept in it as soon as they are measured.
    `gpu_env` shows perf_analyzer the server's GPU only (tbench.serving.pinned_env): its CUDA shared memory must be
    there.
    `dynamic_max_batch`: the max batch of the model's dynamic batcher (0: none), whose batches are warmed up too."""
    binary = tools.perf_analyzer_binary()
    env = {**tools.perf_analyzer_env(), **(gpu_env or {})}
    rows: list[dict] = []
    table = pd.DataFrame(columns=RESULT_COLUMNS)
    progress.emit("sweep_start", total=len(points))
    order = measurement_order(points, m)
    reused = {
        i: r for i, p in enumerate(order) if cache is not None and (r := cache.get(cache_key(p, model), layout.run_dir))
    }
    to_measure = [p for i, p in enumerate(order) if i not in reused]
    latency = (
        warm_up(
            grpc_url,
            model,
            spec,
            sorted({p.batch_size for p in to_measure}),
            m.warmup_requests,
            inputs.shapes,
            batching=inputs.batching,
            model_version=inputs.model_version,
            formed=[b for p in to_measure for b in formed_batch_sizes(p.batch_size, dynamic_max_batch, p.concurrency)],
        )
        if to_measure
        else {}
    )
    served: dict[int, dict[int, float]] = {}  # online points measured so far: batch -> {concurrency: requests/s}

    for i, point in enumerate(order):
        steps: list[dict] = []
        if i in reused:
            row = {**empty_row(), **reused[i], "composing": cache.composing(cache_key(point, model))}
        else:
            row = measure_point(
                point,
                model=model,
                grpc_url=grpc_url,
                spec=spec,
                m=m,
                layout=layout,
                binary=binary,
                env=env,
                inputs=inputs,
                monitor=monitor,
                latency_s=latency.get(point.batch_size),
                expected_rate=expected_online_rate(point, served),
            )
            if point.scenario is Scenario.OFFLINE and inputs.shared_memory != row["shared_memory"] == "none":
                inputs = replace(inputs, shared_memory="none")  # refused once: the sweep's next points over gRPC
            steps = row.pop(STEPS_KEY, None) or []  # rows of their own (on_steps), not the point's
            if cache is not None:
                cache.put(cache_key(point, model), row, layout.run_dir, layout.run_id)
        row.update(static, point_index=i)
        if point.scenario is Scenario.ONLINE and row["status"] == "ok":
            served.setdefault(point.batch_size, {})[point.concurrency] = row[THROUGHPUT.column] / point.batch_size
        composing = row.pop("composing", [])
        keys = {k: row[k] for k in ("scenario", "format", "batch_size", "concurrency", "request_rate")}
        if composing and on_composing:
            on_composing(
                [
                    {"model": plain_name(model), **keys, **c, "composing_model": plain_name(c["composing_model"])}
                    for c in composing
                ]
            )
        if steps and on_steps:
            measured = row[THROUGHPUT.column] if row["status"] == "ok" else None
            on_steps([{"model": plain_name(model), **keys, **step} for step in busy_at(steps, measured)])
        rows.append(row)
        table = pd.DataFrame(rows, columns=RESULT_COLUMNS)
        if on_row:
            on_row(table)
        progress.emit("point_done", index=i + 1, total=len(points), row=row)
        if row["status"] == "error" and stopped_serving is not None and (why := stopped_serving()):
            raise PerfAnalyzerError(f"the Triton server {why} during the sweep at {point.describe()}: {row['error']}")
    return table
