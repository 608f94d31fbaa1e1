"""Stage 4: a Triton server behind one interface, in four launch modes.

- embedded: the binary bundled in the nvidia-pytriton wheel (python backend only; on a GPU node its runtimes run on
  the run's GPU where they have CUDA: tbench/triton/serving.py);
- local: a `tritonserver` on PATH (e.g. inside the NGC Triton container GPU workers run);
Embedded and local servers see only the run's GPU (`gpu_env`, tbench.serving.pinned_env).
- docker: the NGC Triton image through the docker CLI, with GPUs, host ports, shm size and the repository mounted;
- remote: an already running server by URL; models are uploaded and loaded through the client (explicit model
  control), so the server needs no access to our files.
Each checks health and model readiness with a timeout, keeps its log with the run, stops cleanly, and fails with
one line quoting the log's errors. What a server can do (its version, backends and python runtimes:
tbench/triton/capabilities.py) is read once per run by `capabilities()`, each mode its own way, before anything is
exported: the plan picks each model's format from it, and a server we launch gets the flags its version has.

This module holds what every mode shares: the interface (`TritonServer`), its endpoints, the start-failure helpers
and the config overrides (`configs_to_load`, `load_all`). The modes live beside it, so the interface imports none of
them: embedded, local and docker in triton/process_server.py, remote in triton/remote_server.py, and the choice
between them (`make_server`) in triton/server_modes.py.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.errors import ServerStartError
from tbench.node import procs
from tbench.triton.capabilities import ServerCapabilities, as_capabilities
from tbench.triton.loads import log_offset, wait_released

# gRPC calls have no deadline unless given one, and a server that crashed mid-run (FATAL_SIGNAL) keeps its ports open
# while it goes down: every call beside a measurement (statistics, shared memory regions) gets
# CALL_TIMEOUT_S, an inference INFER_TIMEOUT_S (a full-size model's batch on a CPU takes seconds, never minutes)
CALL_TIMEOUT_S = 30.0
INFER_TIMEOUT_S = 300.0
# Triton traps SIGSEGV and SIGABRT: it prints this line, then its stack, then dumps core, its ports open until it is
# gone (SIGINT and SIGTERM, 2 and 15, print the same line: a stop, not a crash)
FATAL_SIGNAL = re.compile(r"Signal \((6|11)\) received\.")
FATAL_LOG_TAIL_BYTES = 1 << 20
# Triton's words for a port it could not bind ("Socket '127.0.0.1:8001' already in use"), and docker's
PORT_TAKEN = re.compile(r"already in use|port is already allocated", re.IGNORECASE)


def fatal_signal(log_path: Path) -> str | None:
    """The line of a server log's tail that says the server received a fatal signal, if there is one."""
    if not log_path.is_file():
        return None
    with log_path.open("rb") as log:
        log.seek(max(0, log_path.stat().st_size - FATAL_LOG_TAIL_BYTES))
        found = FATAL_SIGNAL.search(log.read().decode(errors="replace"))
    return found.group(0) if found else None


class PortTakenError(ServerStartError):
    """Another process took a port between our pick and the server's bind."""


def load_errors(log_text: str) -> str:
    """The lines of a Triton log that say why a model did not load."""
    lines = [ln for ln in log_text.splitlines() if re.match(r"^E\d{4}", ln) or "failed to load" in ln or "Error" in ln]
    return "\n".join(lines[-8:])


def one_line(text: str) -> str:
    return " | ".join(ln.strip() for ln in text.splitlines() if ln.strip())


@dataclass
class ServerEndpoints:
    http_url: str
    grpc_url: str
    metrics_url: str


class TritonServer(ABC):
    """What the pipeline needs of a server, whatever launched it."""

    mode: str

    logs_itself = True  # log_path is the server's own output (releases are read there); False: ours about it

    def __init__(self, repository: Path, log_path: Path, start_timeout_s: float = 180.0):
        self.repository = repository
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self._capabilities: ServerCapabilities | None = None
        # the models served now with a config other than the repository's config.pbtxt (the offline scenario's), by name
        self.overridden: dict[str, mc.ModelConfig] = {}

    def serve_from_start(self, config_name: str, configs: dict[str, mc.ModelConfig]) -> bool:
        """Serve `configs` (each its model's configs/<config_name>.pbtxt in the repository) from every start of this
        server on, in place of the models' config.pbtxt: the first sweep that wants them reloads nothing (a python
        model's reload costs seconds, DLRM's 8). False where this mode cannot: the sweep reloads them."""
        return False

    @property
    @abstractmethod
    def endpoints(self) -> ServerEndpoints: ...

    @abstractmethod
    def start(self) -> ServerEndpoints: ...

    def launch(self) -> None:
        """Begin a start that start() finishes, where a mode can (a process it starts loads its models meanwhile);
        by default nothing: start() does it all."""
        return None

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def alive(self) -> bool: ...

    def stopped_serving(self) -> str | None:
        """Why the server no longer serves, in the words of an error line: 'crashed (Signal (11) received. in its
        log)' or 'exited'; None while it serves: alive and not going down after a fatal signal (FATAL_SIGNAL), as a
        crashed server can take long to exit."""
        signal = fatal_signal(self.log_path) if self.logs_itself else None
        if signal:
            return f"crashed ({signal} in its log, {self.log_path})"
        return None if self.alive() else "exited"

    @abstractmethod
    def backends(self) -> set[str]:
        """The backends this server can load, read from the server's backend directory."""

    def capabilities(self) -> ServerCapabilities:
        """What this server can do (tbench.triton.capabilities): its version, backends and python runtimes, read once
        per run (before anything is exported: the plan picks each model's format from them)."""
        if self._capabilities is None:
            self._capabilities = self.read_capabilities()
        return self._capabilities

    def read_capabilities(self) -> ServerCapabilities:
        """A mode's own reading; by default its backends alone (version unknown, every python runtime assumed)."""
        return replace(as_capabilities(self.backends()), mode=self.mode)

    def models(self) -> list[str]:
        return sorted(p.parent.name for p in self.repository.glob("*/config.pbtxt"))

    def processes(self) -> list[psutil.Process]:
        """The server's processes on this machine, for CPU and memory per point; none where it runs elsewhere."""
        return []

    def request_trace(self, model: str):
        """A RequestTrace of the model's requests (tbench.triton.trace) where this server writes a trace file this
        host reads; None elsewhere."""
        return None

    def where(self) -> dict:
        """Which server this is, as configured: its binary, image or address."""
        return {}

    def identity(self) -> dict:
        """Which server measured (mode, binary/image/address, and the id and version it reports), so points measured
        on one server are not taken for another's. Asks a started server."""
        client = self._client()
        try:
            reported = client.get_server_metadata(as_json=True)
        finally:
            client.close()
        return {"mode": self.mode, **self.where(), "id": reported.get("name"), "version": reported.get("version")}

    def load(self, name: str, config: mc.ModelConfig | None = None) -> None:
        """(Re)load a model of the repository, with `config` in place of its config.pbtxt when given (Triton's load
        API with a config override): how the offline scenario serves the model with static batching. Triton swaps
        the new version in once it is ready; an ensemble that uses the model is reloaded with it. The version it
        replaced is released in the background: waited for in the log of a server tbench started (triton/loads.py)."""
        from tritonclient.utils import InferenceServerException

        offset = log_offset(self.log_path) if self.logs_itself else None
        client = self._client()
        try:
            replacing = self._ready(client, name)  # a first load replaces nothing: no release to wait for
            client.load_model(name, **self._load_args(name, config), client_timeout=self.start_timeout_s)
        except InferenceServerException as err:
            raise ServerStartError(
                f"{self.mode} Triton could not load {name}"
                f"{' with its offline config' if config is not None else ''}: {one_line(err.message() or '')}"
            ) from None
        finally:
            client.close()
        if config is None:
            self.overridden.pop(name, None)
        else:
            self.overridden[name] = config
        if replacing:
            wait_released(self.log_path, name, offset)  # before anything is measured on it

    def confirm(self, configs: dict[str, mc.ModelConfig | None]) -> None:
        """Read back that each model is served with its batching as `configs` want it (None: the repository's own)
        before anything is measured on it: a config Triton dropped would measure the other scenario's batching."""
        client = self._client()
        try:
            for name, config in configs.items():
                wanted = config if config is not None else self.own_config(name)
                served = _batching(client.get_model_config(name, client_timeout=30).config)
                if served != (asked := _batching(wanted)):
                    raise ServerStartError(
                        f"{self.mode} Triton serves {name} with {served}; its "
                        f"{'offline' if config is not None else 'own'} config asks for {asked} (log: {self.log_path})"
                    )
        finally:
            client.close()

    @staticmethod
    def _ready(client, name: str) -> bool:
        from tritonclient.utils import InferenceServerException

        try:
            return bool(client.is_model_ready(name))
        except InferenceServerException:
            return False

    def _load_args(self, name: str, config: mc.ModelConfig | None) -> dict:
        """Always a config: Triton keeps a load's config override through a later load without one, so the
        repository's own is sent back explicitly (without it, the online scenario after the offline one ran with the
        offline's static config, no dynamic batcher)."""
        return {"config": config_json(config if config is not None else self.own_config(name))}

    def own_config(self, name: str) -> mc.ModelConfig:
        """A model's config as the repository has it."""
        from tbench.triton.config import parse_pbtxt

        return parse_pbtxt((self.repository / name / "config.pbtxt").read_text())

    def _client(self):
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.endpoints.grpc_url)

    def _wait_ready(self, what: str) -> None:
        """Poll until the server and every model in the repository are ready, or fail with the log's errors.
        In explicit model-control mode the server starts with no model loaded: only the server is waited for."""
        import tritonclient.http as httpclient

        expected = [] if getattr(self, "model_control", "all") == "explicit" else self.models()
        client = httpclient.InferenceServerClient(self.endpoints.http_url)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if not self.alive():
                    self._raise_failed(f"{what} exited while loading models")
                try:
                    if (
                        client.is_server_ready()
                        and all(client.is_model_ready(m) for m in expected)
                        and self._is_ours(client.get_server_metadata())
                    ):
                        return
                except Exception:  # not listening yet
                    pass
                time.sleep(0.25)
            self._raise_failed(f"{what} was not ready within {self.start_timeout_s:.0f} s")
        finally:
            client.close()

    def _is_ours(self, metadata: dict) -> bool:
        """Whether the server that answers ready is the one this object started or addresses."""
        return True

    def _raise_failed(self, what: str) -> None:
        time.sleep(0.2)  # let the last log lines land
        excerpt = load_errors(procs.tail(self.log_path, 200)) or procs.tail(self.log_path, 5)
        error = PortTakenError if PORT_TAKEN.search(excerpt) else ServerStartError
        raise error(f"{what} (log: {self.log_path}): {one_line(excerpt)}")

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _batching(config: mc.ModelConfig) -> str:
    """'dynamic batching, max_batch_size 8': what tells the offline scenario's config from the online one's."""
    kind = "dynamic" if config.HasField("dynamic_batching") else "static"
    return f"{kind} batching, max_batch_size {config.max_batch_size}"


def config_json(config: mc.ModelConfig) -> str:
    """A model config as the JSON Triton's load API takes."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


def configs_to_load(server: TritonServer, configs: dict[str, mc.ModelConfig | None]) -> dict:
    """The models among `configs` (each with the config wanted; None: the repository's own) that the server serves
    with another config now: a sweep asks for what it needs and nothing is given back after it, so the offline
    scenario's configs stay until a later sweep wants the models' own (a python-backend model's reload costs seconds,
    an ensemble's TensorFlow step 8), and a run whose last sweep is offline reloads nothing before its server stops."""
    return {name: config for name, config in configs.items() if server.overridden.get(name) != config}


def load_all(server: TritonServer, configs: dict[str, mc.ModelConfig | None]) -> None:
    """(Re)load several models at once, each with its config (None: the repository's own): an ensemble's composing
    models load side by side and Triton reloads the ensemble with them (DLRM's two steps: 8 s, not 11). Never the
    ensemble itself: Triton 2.51 reloads the steps of an ensemble it is asked to load from their files when those were
    written lately, dropping their overrides. An interrupted wait leaves the loads that have not begun undone."""
    if len(configs) < 2:
        for name, config in configs.items():
            server.load(name, config)
        return
    pool = ThreadPoolExecutor(len(configs), thread_name_prefix="tbench-load")
    try:
        for done in [pool.submit(server.load, name, config) for name, config in configs.items()]:
            done.result()  # the first failure, as a serial load would raise it
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
