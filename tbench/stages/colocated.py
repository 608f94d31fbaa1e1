"""Several models on one server, each under its own load (tbench.request.colocated), measured alone and together.

Together, one perf_analyzer per model starts at the same moment. Their measurements end at different times (each
ends once its windows are stable), so a model whose measurement has ended keeps offering its load (a companion
perf_analyzer, unmeasured) until every model's has: every measured window then had every other model's load on the
server. Each row is measure_point's own, so the rate points carry the same kept-up verdict as a sweep's; together,
the server's trace is not read (it is one file for all models), so a rate point whose requests are too large to
export is judged from its windows (the `requests_from` column says so)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tbench.core.enums import Scenario
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec
from tbench.core.layout import RunLayout
from tbench.loadgen.perf_analyzer import PerfInputs, Point, perf_argv
from tbench.node import procs
from tbench.request.benchmark import Measurement
from tbench.request.colocated import ModelLoad
from tbench.stages.sweep import measure_point
from tbench.triton.monitor import PointMonitor

ALONE, TOGETHER = "alone", "together"  # the `colocation` column
TOGETHER_DIR = "together"  # the together points' perf files, beside the alone ones (perf/, logs/)
COMPANION_WINDOW_S = 60.0  # a companion's windows: long enough that it rarely ends (and restarts) before the others


@dataclass
class Placed:
    """One model on the server with its load, its io spec, perf_analyzer's inputs and its warm-up latency."""

    load: ModelLoad
    spec: IoSpec
    inputs: PerfInputs
    latency_s: float | None = None

    @property
    def name(self) -> str:
        return self.load.name

    @property
    def point(self) -> Point:
        if self.load.rate is not None:
            return Point(Scenario.RATE, self.load.batch, None, round(self.load.rate, 3), "poisson")
        return Point(Scenario.ONLINE, self.load.batch, self.load.concurrency)


@dataclass
class Colocation:
    """What every measurement on the server shares."""

    server: object  # a started TritonServer: endpoints, processes, request_trace
    binary: Path
    env: dict[str, str]
    m: Measurement
    layout: RunLayout
    gpu_uuids: tuple[str, ...] = ()

    def monitor(self, name: str, traced: bool) -> PointMonitor:
        ep = self.server.endpoints
        trace = self.server.request_trace(name) if traced else None
        return PointMonitor(ep.grpc_url, name, self.server.processes, ep.metrics_url, self.gpu_uuids, trace=trace)

    def measure(self, placed: Placed, layout: RunLayout, traced: bool) -> dict:
        return measure_point(
            placed.point,
            model=placed.name,
            grpc_url=self.server.endpoints.grpc_url,
            spec=placed.spec,
            m=self.m,
            layout=layout,
            binary=self.binary,
            env=self.env,
            inputs=placed.inputs,
            monitor=self.monitor(placed.name, traced),
            latency_s=placed.latency_s,
        )


def merged_repository(repositories: list[Path], into: Path, only: set[str] | None = None) -> list[str]:
    """One model repository holding every model of `repositories` (`only` those named, where given), as links to
    their folders; returns the models' names. Two models of one name are a ConfigError: the server could serve only
    one of them."""
    into.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for repo in repositories:
        for model in sorted(p for p in Path(repo).expanduser().resolve().iterdir() if p.is_dir()):
            if not ((model / "config.pbtxt").is_file() or any(v.name.isdigit() for v in model.iterdir())):
                continue  # not a model: a model folder holds its config or numbered versions
            if only is not None and model.name not in only:
                continue
            if model.name in found:
                raise ConfigError(
                    f"model {model.name} is in two repositories ({found[model.name].parent} and {repo}): "
                    "rename one of them so that the server can serve both"
                )
            found[model.name] = model
            (into / model.name).symlink_to(model, target_is_directory=True)
    if not found:
        raise ConfigError(f"no model in {', '.join(map(str, repositories))} (a model folder holds config.pbtxt)")
    return sorted(found)


def measure_alone(placed: list[Placed], colo: Colocation, on_row) -> list[dict]:
    """Each model alone on the server at its load, one after the other."""
    rows = []
    for p in placed:
        row = colo.measure(p, colo.layout, traced=True) | labels(p, ALONE, [])
        rows.append(row)
        on_row(row)
    return rows


def measure_together(placed: list[Placed], colo: Colocation, on_row) -> list[dict]:
    """Every model at its load at once (see the module's docstring); Ctrl-C stops every perf_analyzer at once."""
    layout = RunLayout(colo.layout.run_dir, TOGETHER_DIR)  # together/perf/, together/logs/
    layout.perf_dir.mkdir(parents=True, exist_ok=True)
    ended = threading.Event()
    remaining = [len(placed)]
    lock = threading.Lock()
    names = [p.name for p in placed]

    def one(p: Placed) -> dict:
        try:
            row = colo.measure(p, layout, traced=False)
        finally:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    ended.set()
        keep_loading(p, colo, layout, ended)
        row = row | labels(p, TOGETHER, [n for n in names if n != p.name])
        if isinstance(row.get("source_file"), str):  # relative to the run folder, as the alone points' are
            row["source_file"] = f"{TOGETHER_DIR}/{row['source_file']}"
        return row

    pool = ThreadPoolExecutor(len(placed), thread_name_prefix="tbench-colocated")
    futures = [pool.submit(one, p) for p in placed]
    try:
        rows = []
        for future in futures:
            rows.append(future.result())
            on_row(rows[-1])
        return rows
    except BaseException:  # Ctrl-C: the threads wait on perf_analyzers that would run their windows out
        ended.set()
        procs.kill_own_children("perf_analyzer")
        raise
    finally:
        pool.shutdown(wait=True)


def keep_loading(p: Placed, colo: Colocation, layout: RunLayout, ended: threading.Event) -> None:
    """Offer `p`'s load, unmeasured, until `ended` is set (every model's measurement is over)."""
    rate = p.load.rate or 0.0
    count = max(100, int(rate * COMPANION_WINDOW_S)) if rate else 10**6
    csv = layout.perf_dir / f"{p.name}_companion.csv"
    argv = perf_argv(colo.binary, p.name, colo.server.endpoints.grpc_url, p.point, colo.m, count, csv, p.spec, p.inputs)
    while not ended.is_set():
        proc = procs.start(argv, layout.logs_dir / "perf_analyzer" / f"{p.name}_companion.log", colo.env)
        try:
            while not ended.wait(0.2) and proc.poll() is None:
                pass
        finally:
            procs.stop(proc, timeout_s=2)


def labels(p: Placed, colocation: str, others: list[str]) -> dict:
    load = p.load
    return {
        "model": p.name,
        "model_version": load.version,
        "colocation": colocation,
        "colocated_with": ",".join(others),
        "slo_ms": load.slo_ms,
        "slo_percentile": load.percentile,
    }
