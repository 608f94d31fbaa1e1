"""The search's real evaluator: one Triton server in explicit model-control mode for the whole search; per candidate
the model's config is written (instances, max batch, preferred sizes, queue delay), the model is loaded through the
client, measured with one perf_analyzer point at the search's concurrency (online scenario: dynamic batching) by
`tasks.perf.measure_point` (the benchmark's windows, stability and retries), and unloaded. A confirmation round's
re-measurement is the same call again (the configuration loaded anew, measured, unloaded).

A candidate that does not load, or whose point is unstable or fails, is an infeasible observation kept with its
status; a server that died is an error that stops the search (the checkpoint keeps what was measured).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Scenario
from tbench.core.errors import ConfigError, PerfAnalyzerError, ServerStartError
from tbench.core.iospec import IoSpec
from tbench.core.layout import RunLayout, perf_log_for
from tbench.loadgen.perf_analyzer import PerfInputs, Point, noise_from_log
from tbench.node import tools
from tbench.request.benchmark import Measurement
from tbench.search.config_edit import edited_config, to_text
from tbench.search.strategies import (
    Candidate,
    Objective,
    Observation,
)
from tbench.stages.sweep import formed_batch_sizes, measure_point, warm_up
from tbench.triton.remote_server import RemoteServer
from tbench.triton.repository import ServingConfig, write_repository
from tbench.triton.server import TritonServer, config_json, one_line


def _number(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def observation_from_row(candidate: Candidate, row: dict, seconds: float) -> Observation:
    """A perf_analyzer row (tasks.perf) as an observation: numbers only when the point is ok."""
    ok = row.get("status") == "ok"
    return Observation(
        candidate=candidate,
        status=str(row.get("status") or "error"),
        error=str(row.get("error") or ""),
        throughput=_number(row.get("throughput_infer_per_s")) if ok else None,
        p99_ms=_number(row.get("p99_ms")) if ok else None,
        avg_ms=_number(row.get("avg_ms")) if ok else None,
        seconds=seconds,
    )


@dataclass
class ServedVariant:
    """One converted model the search may serve: a `SearchSpace.formats` entry's artifact and how it is served."""

    artifact: ModelArtifact
    native: bool  # the format's own backend (else the python-backend runtime model)

    @property
    def io_spec(self) -> IoSpec:
        return self.artifact.io_spec


@dataclass
class RepositoryVariant:
    """The one model a repository search serves: the user's, its inputs as its config serves them."""

    io_spec: IoSpec
    native: bool = True


@dataclass
class TritonEvaluator:
    """Measures candidates on a started server in explicit model-control mode (see the module docstring)."""

    server: TritonServer
    repository: Path
    name: str  # the Triton model name every candidate is loaded under
    variants: dict[str, ServedVariant]  # SearchSpace.formats entry -> what to serve ('' for the only one)
    concurrency: int
    measurement: Measurement
    work_dir: Path  # perf_analyzer's files go under <work_dir>/<candidate key>/
    inputs: PerfInputs = field(default_factory=PerfInputs)
    online_batch_size: int = 1
    kind: str = "KIND_CPU"
    cpu_cores: int = 1
    load_timeout_s: float = 300.0
    gpu_env: dict[str, str] = field(default_factory=dict)  # perf_analyzer sees the server's GPU only (pinned_env)
    # the load searched per candidate: its best concurrency up to `concurrency` whose p99 holds this budget (None:
    # measured at `concurrency` alone)
    load_budget_ms: float | None = None
    # the load the best candidate measured so far chose: the next candidate's load search starts there
    start_load: int | None = None

    def __post_init__(self):
        self.binary = tools.perf_analyzer_binary()
        self.env = {**tools.perf_analyzer_env(), **self.gpu_env}
        self.evaluations = 0
        self.best_seen = 0.0  # the highest throughput within the load budget measured so far (start_load's)

    def variant(self, candidate: Candidate) -> ServedVariant:
        if candidate.format in self.variants:
            return self.variants[candidate.format]
        if not candidate.format:
            return next(iter(self.variants.values()))
        raise ConfigError(
            f"the search has no converted model for {candidate.format!r}; it has {', '.join(self.variants)}"
        )

    def serving_config(self, candidate: Candidate) -> ServingConfig:
        return ServingConfig(
            name=self.name,
            max_batch_size=candidate.max_batch_size,
            preferred_batch_sizes=list(candidate.preferred_batch_sizes),
            max_queue_delay_us=candidate.queue_delay_us,
            instances=candidate.instances,
            kind=self.kind,
            intra_op_threads=max(1, self.cpu_cores // candidate.instances),
        )

    @property
    def measured_name(self) -> str:
        """The model perf_analyzer measures: the one loaded (a pipeline's step search measures the pipeline)."""
        return self.name

    def write(self, candidate: Candidate) -> Path:
        """The candidate's model folder, its config written (the hook a repository search replaces)."""
        variant = self.variant(candidate)
        return write_repository(self.repository, self.serving_config(candidate), variant.artifact, variant.native)

    def _client(self):
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.server.endpoints.grpc_url)

    def load(self, model_dir: Path) -> None:
        """Load (or reload) the model as the repository now describes it; a remote server gets config and files."""
        client = self._client()
        try:
            if isinstance(self.server, RemoteServer):
                self.server.claim(client, self.name)  # a shared server: never a name it already has
                config, files = RemoteServer.upload(model_dir)
                client.load_model(self.name, config=config, files=files, client_timeout=self.load_timeout_s)
            else:
                client.load_model(self.name, client_timeout=self.load_timeout_s)
        finally:
            client.close()

    def unload(self) -> None:
        """Unload and wait until Triton says the model is gone (its instances and stubs stopped)."""
        from tritonclient.utils import InferenceServerException

        client = self._client()
        try:
            client.unload_model(self.name)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                index = client.get_model_repository_index(as_json=True).get("models", [])
                states = {m.get("state", "") for m in index if m.get("name") == self.name}
                if not states & {"READY", "UNLOADING", "LOADING"}:
                    return
                time.sleep(0.1)
        except InferenceServerException:
            pass  # not loaded: nothing to wait for
        finally:
            client.close()

    def evaluate(self, candidate: Candidate, confirm_round: int = 0, load: int | None = None) -> Observation:
        """Write, load, measure and unload one candidate. A confirmation's re-measurement (`confirm_round` r >= 1) is
        the same call: the configuration is written and loaded again, and its files go to <key>.confirm<r>/; `load`:
        the closed-loop clients it is measured at (the load its first measurement chose), instead of its load
        searched again."""
        from tritonclient.utils import InferenceServerException

        self.evaluations += 1
        started = time.monotonic()

        def failed(status: str, error: str) -> Observation:
            return Observation(candidate=candidate, status=status, error=error, seconds=time.monotonic() - started)

        if max(candidate.max_batch_size, 1) < self.online_batch_size:  # 0: no batch axis, each request one call
            return failed(
                "error", f"max batch {candidate.max_batch_size} is below the request's {self.online_batch_size} samples"
            )
        try:
            variant = self.variant(candidate)
            model_dir = self.write(candidate)
        except ConfigError as err:
            return failed("error", str(err))
        try:
            self.load(model_dir)
        except InferenceServerException as err:
            self.unload()
            if why := self.server.stopped_serving():
                raise ServerStartError(
                    f"the Triton server {why} while loading {candidate.key}: {one_line(err.message() or '')}"
                ) from None
            return failed("error", f"load failed: {one_line(err.message() or str(err))}")
        try:
            folder = candidate.key + (f".confirm{confirm_round}" if confirm_round else "")
            observation = self.measure(candidate, variant, RunLayout(self.work_dir, folder).create(), load)
        finally:
            self.unload()
        if not observation.ok and (why := self.server.stopped_serving()):  # exited, or crashed and hung
            raise PerfAnalyzerError(f"the Triton server {why} while measuring {candidate.key}: {observation.error}")
        return observation.model_copy(update={"seconds": time.monotonic() - started})

    def warmed_latency(self, variant: ServedVariant, formed: Iterable[int] = ()) -> float | None:
        """A freshly loaded candidate, warmed up: its single-request latency (s), which sizes its windows. `formed`:
        the batches its dynamic batcher can form under the load to come (sweep.formed_batch_sizes), warmed too."""
        spec = variant.io_spec
        batch = self.online_batch_size
        grpc_url = self.server.endpoints.grpc_url
        return warm_up(
            grpc_url,
            self.measured_name,
            spec,
            [batch],
            self.measurement.warmup_requests,
            self.inputs.shapes,
            batching=self.inputs.batching,
            formed=formed,
        ).get(batch)

    def measure(
        self, candidate: Candidate, variant: ServedVariant, layout: RunLayout, load: int | None = None
    ) -> Observation:
        """One loaded candidate at the search's closed-loop load: `concurrency` clients, or, with a budget to search
        the load against, its best load (search_load, from the load of the best candidate so far); at `load` clients
        where one is given."""
        if load is not None or self.load_budget_ms is None:
            return self.measure_at(candidate, variant, layout, load or self.concurrency)
        observation = search_load(
            lambda c: self.measure_at(candidate, variant, layout, c),
            load_steps(self.concurrency),
            self._holds,
            self.start_load,
        )
        self.read_back(observation)
        return observation

    def _holds(self, observation: Observation) -> bool:
        # as the selection will judge it: by its windows' noise
        return Objective(p99_budget_ms=self.load_budget_ms).feasible(observation)

    def read_back(self, observation: Observation) -> None:
        """A candidate's measurement, made now or read back from a resumed search's checkpoint: the best within the
        load budget so far sets where the next candidate's load search starts."""
        if self.load_budget_ms is None or not observation.concurrency:
            return
        if self._holds(observation) and observation.throughput > self.best_seen:
            self.best_seen, self.start_load = observation.throughput, observation.concurrency

    def measure_at(self, candidate: Candidate, variant: ServedVariant, layout: RunLayout, concurrency: int):
        """One loaded candidate at `concurrency` closed-loop clients."""
        point = Point(Scenario.ONLINE, self.online_batch_size, concurrency)
        row = measure_point(
            point,
            model=self.measured_name,
            grpc_url=self.server.endpoints.grpc_url,
            spec=variant.io_spec,
            m=self.measurement,
            layout=layout,
            binary=self.binary,
            env=self.env,
            inputs=self.inputs,
            latency_s=self.warmed_latency(
                variant, formed_batch_sizes(self.online_batch_size, candidate.max_batch_size, concurrency)
            ),
        )
        observation = observation_from_row(candidate, row, 0.0).model_copy(update={"concurrency": concurrency})
        log = layout.run_dir / perf_log_for(row["source_file"]) if row.get("source_file") else None
        if observation.ok and log is not None and log.is_file():
            noise = noise_from_log(log.read_text(errors="replace"))
            if not noise.assumed:
                observation = observation.model_copy(
                    update={
                        "throughput_cv": noise.throughput_cv,
                        "latency_cv": noise.latency_cv,
                        "windows": noise.windows,
                    }
                )
        return observation


@dataclass
class RepositoryEvaluator(TritonEvaluator):
    """A search over the user's own config (`--repository DIR --model NAME`): each candidate is the user's config in
    the run folder's copy with only the searched fields edited (search/config_edit.py), loaded with that config sent
    explicitly (the server's first load sent the user's as an override, which Triton would keep otherwise).
    `verbatim`: the user's config as written, unedited: their own row, measured the same way. `pipeline`: the
    ensemble measured through this step (its step's configs edited, the pipeline measured whole)."""

    base: mc.ModelConfig = field(default_factory=mc.ModelConfig)  # the copy's config as the user wrote it
    verbatim: bool = False
    pipeline: str = ""
    # the user's config measured as written before the search (flows.search.measure_users_config): a candidate whose
    # config is that same text is that measurement, not measured twice
    as_written: Observation | None = None
    written: mc.ModelConfig | None = field(default=None, init=False)

    def evaluate(self, candidate: Candidate, confirm_round: int = 0, load: int | None = None) -> Observation:
        if self.as_written is not None and not confirm_round and self.is_as_written(candidate):
            self.evaluations += 1
            return self.as_written.model_copy(update={"candidate": candidate})
        return super().evaluate(candidate, confirm_round, load)

    @property
    def measured_name(self) -> str:
        return self.pipeline or self.name

    def unload(self) -> None:
        """A pipeline's step stays loaded: the next candidate's load replaces it (and Triton reloads the pipeline
        with it); unloaded, the pipeline would stop serving."""
        if not self.pipeline:
            super().unload()

    def threads(self, candidate: Candidate) -> int:
        """Threads per instance: the cores shared among the instances, as the search's own configs have them."""
        return max(1, self.cpu_cores // candidate.instances)

    def candidate_config(self, candidate: Candidate) -> mc.ModelConfig:
        return self.base if self.verbatim else edited_config(self.base, candidate, self.threads(candidate))

    def is_as_written(self, candidate: Candidate) -> bool:
        """The candidate's config is the user's config, the same text: nothing the search edits differs."""
        return self.candidate_config(candidate) == self.base

    def write(self, candidate: Candidate) -> Path:
        model_dir = self.repository / self.name
        path = model_dir / "config.pbtxt"
        self.written = self.candidate_config(candidate)
        path.unlink(missing_ok=True)  # written afresh: never through a link into the user's folder
        path.write_text(to_text(self.written))
        return model_dir

    def load(self, model_dir: Path) -> None:
        client = self._client()
        try:
            client.load_model(self.name, config=config_json(self.written), client_timeout=self.load_timeout_s)
        finally:
            client.close()


SATURATED_GAIN = 0.05  # a load whose throughput grew less than this over the one before: more clients only queue


def load_steps(top: int) -> list[int]:
    """The loads a candidate is tried at, lightest first: powers of two up to `top`, and `top` (as Model Analyzer
    sweeps concurrency)."""
    steps = [2**i for i in range(top.bit_length()) if 2**i < top]
    return [*steps, top]


def search_load(
    measure_at, loads: list[int], holds: Callable[[Observation], bool], start: int | None = None
) -> Observation:
    """A candidate's best load, from `start` (the load the best candidate so far chose; the heaviest by default):
    heavier loads in turn until one no longer `holds` the budget (Objective.feasible: its p99 within the budget by its
    windows' noise, as the selection judges it; a heavier load only lengthens the queue), throughput stops growing
    (SATURATED_GAIN) or a point fails; where `start` does not hold it, lighter loads until one does. Between the
    heaviest load that holds the budget and the lightest that does not, the loads in between are bisected (Model
    Analyzer's binary search of concurrency under a latency budget): the answer is the highest load that holds it,
    not the power of two below. The observation of the highest throughput that holds the budget, else the lightest
    load's (infeasible, kept as measured). Starting heavy skips the light loads that cannot be a candidate's best while
    a heavier one holds the budget."""
    if start is not None and loads[0] < start < loads[-1]:
        loads = sorted({*loads, start})
    first = loads.index(start) if start in loads else len(loads) - 1
    observation = measure_at(loads[first])
    if not observation.ok:
        return observation
    if holds(observation):
        best, over = _heavier_loads(measure_at, loads[first + 1 :], holds, observation)
    elif first == 0:
        return observation
    else:
        best, over = _lighter_load(measure_at, loads[:first], holds, loads[first])
    return _bisected(measure_at, best, over, holds) if over is not None and holds(best) else best


def _heavier_loads(measure_at, loads: list[int], holds, best: Observation) -> tuple[Observation, int | None]:
    """From `best` (a load that holds the budget), heavier ones while they hold it and throughput grows; with the
    load that left the budget (None where none did)."""
    for concurrency in loads:
        observation = measure_at(concurrency)
        if not observation.ok:
            return best, None
        if not holds(observation):
            return best, concurrency
        if observation.throughput < best.throughput * (1 + SATURATED_GAIN):
            return (observation if observation.throughput > best.throughput else best), None
        best = observation
    return best, None


def _lighter_load(measure_at, lighter: list[int], holds, over: int) -> tuple[Observation, int]:
    """The heaviest of the `lighter` loads that holds the budget (measured heaviest first), else the lightest's; with
    the lightest load above it that did not hold it."""
    for concurrency in reversed(lighter):
        observation = measure_at(concurrency)
        if not observation.ok or holds(observation):
            return observation, over
        over = concurrency
    return observation, over


def _bisected(measure_at, best: Observation, over: int, holds) -> Observation:
    """The loads between `best` (holds the budget) and `over` (does not), halved until they meet: a load that holds
    it with more throughput moves `best` up, any other brings `over` down."""
    while over - best.concurrency > 1:
        concurrency = (best.concurrency + over) // 2
        observation = measure_at(concurrency)
        if observation.ok and holds(observation) and observation.throughput > best.throughput:
            best = observation
        else:
            over = concurrency
    return best


def artifact_key(text: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
