"""Stage 4: a Triton server behind one interface, in four launch modes.

- embedded: the binary bundled in the nvidia-pytriton wheel (python backend only; on a GPU node its runtimes run on
  the run's GPU where they have CUDA: tbench/serving.py);
- local: a `tritonserver` on PATH (e.g. inside the NGC Triton container GPU workers run);
Embedded and local servers see only the run's GPU (`gpu_env`, tbench.serving.pinned_env).
- docker: the NGC Triton image through the docker CLI, with GPUs, host ports, shm size and the repository mounted;
- remote: an already running server by URL; models are uploaded and loaded through the client (explicit model
  control), so the server needs no access to our files.
Each checks health and model readiness with a timeout, keeps its log with the run, stops cleanly, and fails with
one line quoting the log's errors.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from abc import ABC, abstractmethod
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.errors import ServerStartError
from tbench.core.registry import Registry
from tbench.node import containers, procs, shm, tools
from tbench.node import ports as loopback
from tbench.request.benchmark import run_suffix
from tbench.triton.config import parse_pbtxt
from tbench.triton.monitor import METRICS_INTERVAL_MS

NGC_ULIMITS = ("memlock=-1", "stack=67108864")  # NGC's advice for the Triton image
NGC_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"  # Triton 2.51, the release of our perf_analyzer
LOCAL_BACKENDS = Path("/opt/tritonserver/backends")  # where the NGC image and Triton's packages put them
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
# Triton's words for a port it could not bind ("Socket '127.0.0.1:8001' already in use"), and docker's
PORT_TAKEN = re.compile(r"already in use|port is already allocated", re.IGNORECASE)


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

    def __init__(self, repository: Path, log_path: Path, start_timeout_s: float = 180.0):
        self.repository = repository
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s

    @property
    @abstractmethod
    def endpoints(self) -> ServerEndpoints: ...

    @abstractmethod
    def start(self) -> ServerEndpoints: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def backends(self) -> set[str]:
        """The backends this server can load, read from the server's backend directory."""

    def models(self) -> list[str]:
        return sorted(p.parent.name for p in self.repository.glob("*/config.pbtxt"))

    def processes(self) -> list[psutil.Process]:
        """The server's processes on this machine, for CPU and memory per point; none where it runs elsewhere."""
        return []

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
        the new version in once it is ready; an ensemble that uses the model is reloaded with it."""
        from tritonclient.utils import InferenceServerException

        client = self._client()
        try:
            client.load_model(name, **self._load_args(name, config), client_timeout=self.start_timeout_s)
        except InferenceServerException as err:
            raise ServerStartError(
                f"{self.mode} Triton could not load {name}"
                f"{' with its offline config' if config is not None else ''}: {one_line(err.message() or '')}"
            ) from None
        finally:
            client.close()

    def _load_args(self, name: str, config: mc.ModelConfig | None) -> dict:
        return {"config": config_json(config)} if config is not None else {}

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
                if not self._still_starting():
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

    def _still_starting(self) -> bool:
        """Whether the server is up, asked on every look while it starts."""
        return self.alive()

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


class ProcessServer(TritonServer):
    """A tritonserver process we start (embedded, local) or a `docker run` in the foreground (docker)."""

    gpu_metrics = True  # Triton's DCGM metrics (per GPU, by UUID); the embedded server asks for them on a GPU only

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        http_port: int | None = None,
        grpc_port: int | None = None,
        start_timeout_s: float = 180.0,
        model_control: str = "all",
    ):
        super().__init__(repository, log_path, start_timeout_s)
        # "all": every model of the repository loaded at start; "explicit": none (loaded through the client). Both
        # run Triton in explicit model-control mode, so a model can be reloaded with another config (offline points).
        self.model_control = model_control
        for port in (http_port, grpc_port):
            if port is not None and loopback.port_in_use(port):
                raise ServerStartError(
                    f"port {port} on 127.0.0.1 is already in use; pick another or leave it unset for a free one"
                )
        self.chosen_ports = {"http": http_port, "grpc": grpc_port}
        self.ports = self._pick_ports()
        weakref.finalize(self, _release_all, self.ports)  # the reservations last as long as this object
        # Triton's --id, one per object: the server answering on our ports must report it (see _is_ours)
        self.instance_id = f"tbench-{uuid.uuid4().hex[:12]}"
        self.proc: subprocess.Popen | None = None
        self.seen_regions: set[Path] = set()  # shared memory the server's processes mapped while it started

    def _pick_ports(self) -> dict[str, int]:
        chosen = {**self.chosen_ports, "metrics": None}
        return {name: port or loopback.free_port() for name, port in chosen.items()}

    @property
    def endpoints(self) -> ServerEndpoints:
        return ServerEndpoints(
            http_url=f"127.0.0.1:{self.ports['http']}",
            grpc_url=f"127.0.0.1:{self.ports['grpc']}",
            metrics_url=f"http://127.0.0.1:{self.ports['metrics']}/metrics",
        )

    def server_args(
        self, repository: str, backend_dir: str | None, address: str = "127.0.0.1", ports: dict[str, int] | None = None
    ) -> list[str]:
        """The tritonserver options every process mode shares."""
        ports = ports or self.ports
        args = [f"--model-repository={repository}"]
        if backend_dir:
            args.append(f"--backend-directory={backend_dir}")
        return args + [
            f"--id={self.instance_id}",
            f"--allow-gpu-metrics={str(self.gpu_metrics).lower()}",
            f"--http-address={address}",
            f"--http-port={ports['http']}",
            f"--grpc-address={address}",
            f"--grpc-port={ports['grpc']}",
            f"--metrics-address={address}",
            f"--metrics-port={ports['metrics']}",
            f"--metrics-interval-ms={METRICS_INTERVAL_MS}",  # the energy counter's resolution (triton/monitor.py)
            "--model-control-mode=explicit",
            *(["--load-model=*"] if self.model_control == "all" else []),
            "--exit-on-error=true",
            "--strict-readiness=true",
            "--log-verbose=0",
        ]

    @abstractmethod
    def argv(self) -> list[str]: ...

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    START_TRIES = 3  # a port taken between our pick and the server's bind: fresh ports, another start

    def start(self) -> ServerEndpoints:
        if self.alive():  # a second start would orphan the first server (and its stubs and shared memory)
            raise ServerStartError(f"this {self.mode} tritonserver is already running ({self._running_as()})")
        tries = 1
        while True:
            self._before_launch()
            self.proc = procs.start(self.argv(), self.log_path, env=self.env(), container=self._container_record())
            try:
                self._wait_ready(f"{self.mode} tritonserver")
                return self.endpoints
            except PortTakenError:
                self.stop()
                if tries == self.START_TRIES or all(self.chosen_ports.values()):
                    raise
                tries += 1
                _release_all(self.ports)
                self.ports.update(self._pick_ports())  # in place: the finalizer releases what it holds at the end
            except BaseException:
                self.stop()
                raise

    def _before_launch(self) -> None:
        """What a server mode prepares before each launch (stop() undoes it)."""

    def _still_starting(self) -> bool:
        # A server that exits while it starts (a port taken, a model that fails with --exit-on-error) does not
        # remove the python backend's regions: stop() removes every region its processes were seen to map.
        alive = self.alive()
        if alive:
            self.seen_regions |= shm.mapped_regions(self._server_processes())
        return alive

    def _is_ours(self, metadata: dict) -> bool:
        """A port taken between our pick and our server's bind: another server on our HTTP port answers ready for
        models of the same names, and Triton binds its metrics port last, after HTTP answers. Ours then exits, and
        its failure is what start() reports. So ready means: the server on our HTTP port reports our id, and our
        processes listen on every port (where this host may see their sockets)."""
        if metadata.get("name") != self.instance_id:
            return False
        wanted = self.listen_ports()
        processes = self._server_processes() if wanted else []
        listening: set[int] = set()
        for process in processes:
            try:
                listening |= {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            except psutil.AccessDenied:  # a container's root processes, seen by a user: the id alone
                return True
            except psutil.Error:
                pass
        return not processes or wanted <= listening  # none seen: a daemon whose processes this host cannot see

    def listen_ports(self) -> set[int]:
        """The ports to find the server's processes listening on, in this host's network namespace."""
        return set(self.ports.values())

    def identity(self) -> dict:
        # the id we gave it names this start, not the server: two starts of one server measure the same
        return {**super().identity(), "id": "triton"}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def processes(self) -> list[psutil.Process]:
        return self._group() if self.alive() else []

    def _group(self) -> list[psutil.Process]:
        """The server and every process it started (stubs stay in its process group, orphaned or not)."""
        return shm.group_members(self.proc.pid)

    # What differs for a server in a container (DockerServer): how it is named, recorded, found and removed
    def _running_as(self) -> str:
        return f"pid {self.proc.pid}"

    def _container_record(self) -> dict | None:
        return None

    def _server_processes(self) -> list[psutil.Process]:
        return self._group()

    def _remove_leftovers(self) -> None:
        pass

    def _terminate(self, timeout_s: float) -> None:
        """SIGTERM, then wait for the server to exit, or for its stubs to be gone where it had any: Triton only looks
        at its unloaded models once a second before it exits (1-2 s of every stop, some hundred stops in the tests),
        and once the stubs have exited their models are unloaded and nothing is left for it to clean up (stop() reaps
        the server and removes the shared memory its processes mapped)."""
        stubs = [p for p in self._group() if p.pid != self.proc.pid]
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            if stubs and not any(_running(p) for p in stubs):
                return
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM lets Triton unload models and stop its stubs; the group kill reaps whatever did not exit; the shared
        memory this server's processes mapped (the python backend's, and perf_analyzer's registered regions, which a
        killed perf_analyzer leaves behind) is removed."""
        if self.proc is None:
            return
        regions = shm.mapped_regions(self._server_processes()) | self.seen_regions
        self.seen_regions = set()
        if self.proc.poll() is None:
            self._terminate(timeout_s)
        procs.kill_group(self.proc)
        self.proc.wait()
        self._remove_leftovers()
        procs.forget(self.proc)
        self.proc = None
        shm.remove(regions)  # Triton removes its own on a clean exit; killed processes leave theirs behind


def _release_all(ports: dict[str, int]) -> None:
    for port in ports.values():
        loopback.release(port)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def backends_in(backend_dir: Path) -> set[str]:
    """Subdirectories of a backend directory that hold a backend library."""
    if not backend_dir.is_dir():
        return set()
    return {d.name for d in backend_dir.iterdir() if d.is_dir() and any(d.glob("libtriton_*.so"))}


class EmbeddedServer(ProcessServer):
    """The tritonserver bundled in the nvidia-pytriton wheel, with a private backend dir holding this Python's stub."""

    mode = "embedded"

    def __init__(self, *args, gpu_env: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._work_dir: Path | None = None
        self.gpu_env = dict(gpu_env or {})  # CUDA_VISIBLE_DEVICES: the run's GPU; none on a CPU machine
        self.gpu_metrics = bool(self.gpu_env)  # off without a GPU: DCGM would only log that it found none

    def backends(self) -> set[str]:
        return backends_in(tools.pytriton_server_dir() / "backends")

    def where(self) -> dict:
        return {"binary": str(tools.pytriton_server_dir() / "bin" / "tritonserver")}

    def _before_launch(self) -> None:
        """A private backend directory: the python backend with this Python's stub."""
        server_dir = tools.pytriton_server_dir()
        self._work_dir = Path(tempfile.mkdtemp(prefix="tbench-triton-"))
        backends = self._work_dir / "backends"
        shutil.copytree(server_dir / "backends", backends)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.exists():
            raise ServerStartError(f"the embedded server has no python backend stub for Python {version}")
        shutil.copy2(stub, backends / "python" / stub.name)

    def argv(self) -> list[str]:
        server_dir = tools.pytriton_server_dir()
        return [
            str(server_dir / "bin" / "tritonserver"),
            *self.server_args(str(self.repository), str(self._work_dir / "backends")),
            f"--cache-directory={server_dir / 'caches'}",
        ]

    def env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)  # so the stub's interpreter finds the venv's packages
        return {
            **os.environ,
            **self.gpu_env,
            "PATH": venv_bin + ":" + os.environ.get("PATH", ""),
            "LD_LIBRARY_PATH": tools.library_path(tools.python_libdir(), tools.pytriton_libs_dir()),
        }

    def stop(self, timeout_s: float = 30.0) -> None:
        super().stop(timeout_s)
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None


class LocalServer(ProcessServer):
    """A tritonserver installed on this machine (on PATH, or a given path) with its own backend directory."""

    mode = "local"

    def __init__(
        self,
        *args,
        binary: str | None = None,
        backend_dir: Path | None = None,
        gpu_env: dict[str, str] | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.gpu_env = dict(gpu_env or {})  # CUDA_VISIBLE_DEVICES: the run's GPU
        found = binary or shutil.which("tritonserver")
        if not found:
            raise ServerStartError(
                "local mode: no tritonserver on PATH (run inside the NGC Triton image, or use --server embedded)"
            )
        self.binary = found
        self.backend_dir = backend_dir or LOCAL_BACKENDS

    def backends(self) -> set[str]:
        return backends_in(self.backend_dir)

    def where(self) -> dict:
        return {"binary": self.binary, "backend_dir": str(self.backend_dir)}

    def argv(self) -> list[str]:
        return [self.binary, *self.server_args(str(self.repository), str(self.backend_dir))]

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.gpu_env}


class DockerServer(ProcessServer):
    """The NGC Triton image through the docker CLI; `docker run` stays in the foreground so its output is the log.

    The container shares this host's IPC namespace (`--ipc=host`): perf_analyzer's system shared memory regions are
    in this host's /dev/shm, and the server must open them by name. CUDA shared memory needs `--pid=host` as well
    (CUDA IPC handles name the exporting process), given whenever the container gets GPUs. Networking: `host` (the
    reference guides' choice: no proxy between perf_analyzer and the server, which listens on 127.0.0.1 only) or
    `bridge` (Triton's ports published on 127.0.0.1 only). The container is removed on every exit path: a normal
    stop, a failed start, and, when the CLI was killed, by the next run's orphan reaper (procs records the container's
    name)."""

    mode = "docker"

    def __init__(
        self,
        *args,
        image: str = NGC_IMAGE,
        gpus: str | None = "all",
        network: str = "host",
        ulimits: list[str] | tuple[str, ...] = NGC_ULIMITS,
        docker: str = "docker",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if network not in ("host", "bridge"):
            raise ServerStartError(f"docker mode: unknown network {network!r}; use host or bridge")
        self.image, self.gpus, self.network, self.ulimits, self.docker = image, gpus, network, list(ulimits), docker
        self.container = f"tbench-triton-{uuid.uuid4().hex[:8]}"

    def processes(self) -> list[psutil.Process]:
        """The container's processes as this host sees them (for CPU and memory readings)."""
        return containers.processes(self.docker, self.container) if self.alive() else []

    def where(self) -> dict:
        return {"image": self.image, "gpus": self.gpus}  # the GPUs the container sees decide its numbers too

    def argv(self) -> list[str]:
        argv = [self.docker, "run", "--rm", "--name", self.container, "--ipc=host"]
        for limit in self.ulimits:
            argv += ["--ulimit", limit]
        if self.gpus and self.gpus != "none":  # with GPUs, offline points use CUDA shared memory
            argv += ["--pid=host", "--gpus", self.gpus if self.gpus == "all" else f'"device={self.gpus}"']
        if self.network == "host":
            argv += ["--network=host", "-v", f"{self.repository.resolve()}:/models:ro", self.image, "tritonserver"]
            return argv + self.server_args("/models", None)
        for name, container_port in CONTAINER_PORTS.items():
            argv += ["-p", f"127.0.0.1:{self.ports[name]}:{container_port}"]
        argv += ["-v", f"{self.repository.resolve()}:/models:ro", self.image, "tritonserver"]
        # inside its own network namespace the server listens on Triton's default ports; -p maps them to ours
        return argv + self.server_args("/models", None, address="0.0.0.0", ports=CONTAINER_PORTS)

    def listen_ports(self) -> set[int]:
        # on a bridge, the server listens in a namespace of its own, and docker fails the run on a port it cannot bind
        return set(self.ports.values()) if self.network == "host" else set()

    def _running_as(self) -> str:
        return f"container {self.container}"

    def _container_record(self) -> dict:
        return {"docker": self.docker, "name": self.container, "host": os.environ.get("DOCKER_HOST")}

    def _server_processes(self) -> list[psutil.Process]:
        return containers.processes(self.docker, self.container)

    def _remove_leftovers(self) -> None:
        """A container whose client was killed, or that ignored `docker stop`, is removed too."""
        containers.remove(self.docker, self.container)

    def backends_argv(self) -> list[str]:
        return [self.docker, "run", "--rm", "--entrypoint", "ls", self.image, str(LOCAL_BACKENDS)]

    def backends(self) -> set[str]:
        """Listed from the image itself (its backend directory), not assumed."""
        listed = procs.run(self.backends_argv(), self.log_path.with_suffix(".backends.log"), timeout=600)
        if listed.returncode != 0:
            raise ServerStartError(
                f"docker mode: cannot list the backends of {self.image}: {one_line(listed.log_tail(3))}"
            )
        # the log starts with the "$ argv" line procs.run writes; the rest is ls's output
        return {ln.strip() for ln in listed.log_path.read_text().splitlines() if ln.strip() and not ln.startswith("$ ")}

    def stop_argv(self, timeout_s: float) -> list[str]:
        return [self.docker, "stop", "-t", str(int(timeout_s)), self.container]

    def _terminate(self, timeout_s: float) -> None:
        procs.run(self.stop_argv(timeout_s), self.log_path.with_suffix(".stop.log"), timeout=timeout_s + 30)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class RemoteServer(TritonServer):
    """A server someone else runs, with --model-control-mode=explicit: each model in our repository is uploaded
    (config + files) and loaded through the client, and unloaded at stop. The server's own log is not ours to keep;
    the load errors it returns are what the error quotes.

    The server is shared: a run's models carry names of its own (BenchmarkRequest's triton_suffix), a name the
    server already has is refused rather than replaced, and only what this object loaded is reloaded or unloaded."""

    mode = "remote"

    # Triton has no API that lists backends: each is probed by loading a tiny model that uses it. A missing backend
    # fails with this message; any other outcome (loaded, or a bad model file) means the backend is there.
    PROBED = ("python", "onnxruntime", "pytorch", "tensorflow", "tensorrt", "openvino")
    MISSING_BACKEND = "unable to find backend library"
    # each under the backend's default file name, so the repository poll gets as far as the backend
    _PROBE_FILES = {
        "python": ("model.py", b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"),
        "onnxruntime": ("model.onnx", b"probe"),
        "pytorch": ("model.pt", b"probe"),
        "tensorflow": ("model.savedmodel/saved_model.pb", b"probe"),
        "tensorrt": ("model.plan", b"probe"),
        "openvino": ("model.xml", b"probe"),
    }

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        http_url: str,
        grpc_url: str,
        start_timeout_s: float = 180.0,
        backends: set[str] | None = None,
    ):
        super().__init__(repository, log_path, start_timeout_s)
        self._endpoints = ServerEndpoints(http_url=http_url, grpc_url=grpc_url, metrics_url="")
        self._backends = set(backends) if backends else None
        self.loaded: list[str] = []

    @property
    def endpoints(self) -> ServerEndpoints:
        return self._endpoints

    def where(self) -> dict:
        return {"url": self.endpoints.grpc_url}  # where models are loaded and measured

    def taken(self, client, name: str) -> bool:
        """Whether the server has a model of this name: loaded (by anyone), or in its own repository."""
        index = client.get_model_repository_index(as_json=True).get("models", [])
        return any(m.get("name") == name for m in index) or client.is_model_ready(name)

    def claim(self, client, name: str) -> None:
        """Make `name` ours to load (and unload at stop), refusing one the server already has."""
        if name in self.loaded:
            return
        if self.taken(client, name):
            self._refuse([name])
        self.loaded.append(name)

    def _refuse(self, names: list[str]) -> None:
        raise ServerStartError(
            f"remote Triton at {self.endpoints.grpc_url} already has a model named "
            f"{', '.join(names)}; tbench loads only names of its own and replaces nothing"
        )

    def alive(self) -> bool:
        try:
            client = self._client()
            try:
                return client.is_server_live()
            finally:
                client.close()
        except Exception:
            return False

    def backends(self) -> set[str]:
        """The backends the user named, else those the server proves it has (probed once)."""
        if self._backends is None:
            self._backends = self.probe_backends()
        return self._backends

    def probe_backends(self) -> set[str]:
        from tritonclient.utils import InferenceServerException

        found = set()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        client = self._client()
        try:
            with self.log_path.open("a") as log:
                for backend in self.PROBED:
                    name = f"tbench_probe_{backend}{run_suffix()}"
                    if self.taken(client, name):
                        continue  # not ours to load or unload (a unique name: does not happen)
                    filename, content = self._PROBE_FILES[backend]
                    config = json.dumps(
                        {
                            "backend": backend,
                            "max_batch_size": 0,
                            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
                        }
                    )
                    try:
                        client.load_model(name, config=config, files={f"file:1/{filename}": content}, client_timeout=60)
                        outcome = "loaded"
                    except InferenceServerException as err:
                        outcome = one_line(err.message() or "")
                        if "not allowed" in outcome or "failed to connect" in outcome.lower():
                            raise
                    if self.MISSING_BACKEND not in outcome:
                        found.add(backend)
                    log.write(
                        f"backend probe {backend} as {name}: "
                        f"{'present' if backend in found else 'missing'} ({outcome})\n"
                    )
                    try:
                        client.unload_model(name)
                    except InferenceServerException:
                        pass
        except InferenceServerException as err:
            raise ServerStartError(
                f"cannot ask the remote Triton at {self.endpoints.grpc_url} what it can serve "
                f"(it must run with --model-control-mode=explicit): {one_line(err.message() or '')}"
            ) from None
        finally:
            client.close()
        return found

    def load(self, name: str, config: mc.ModelConfig | None = None) -> None:
        if name not in self.loaded:  # e.g. an offline reload: only a model this run loaded
            raise ServerStartError(
                f"remote Triton: {name} was not loaded by this run; tbench reloads only its own models"
            )
        super().load(name, config)

    def _load_args(self, name: str, config: mc.ModelConfig | None) -> dict:
        """A remote server has none of our files: they travel with every load, with the override or our config."""
        own, files = self.upload(self.repository / name)
        return {"config": config_json(config) if config is not None else own, "files": files}

    @staticmethod
    def upload(model_dir: Path) -> tuple[str, dict[str, bytes]]:
        """A model directory as load_model's config JSON and `file:` overrides."""
        config = config_json(parse_pbtxt((model_dir / "config.pbtxt").read_text()))
        files = {
            f"file:{p.relative_to(model_dir).as_posix()}": p.read_bytes()
            for p in sorted(model_dir.rglob("*"))
            if p.is_file() and p.name != "config.pbtxt" and "__pycache__" not in p.parts
        }
        return config, files

    def start(self) -> ServerEndpoints:
        from tritonclient.utils import InferenceServerException

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("a")
        client = self._client()
        try:
            if not self.alive():
                raise ServerStartError(f"remote Triton at {self.endpoints.grpc_url} is not live")
            log.write(f"server metadata: {json.dumps(client.get_server_metadata(as_json=True))}\n")
            names = self.load_order()
            if taken := [n for n in names if self.taken(client, n)]:  # checked before the first load: nothing to undo
                self._refuse(taken)
            for name in names:
                self.loaded.append(name)  # ours from here: a load that times out is still unloaded at stop
                config, files = self.upload(self.repository / name)
                try:
                    client.load_model(name, config=config, files=files, client_timeout=self.start_timeout_s)
                except InferenceServerException as err:
                    log.write(f"load {name}: {err.message()}\n")
                    raise ServerStartError(
                        f"remote Triton could not load {name}: {one_line(err.message() or '')} (log: {self.log_path})"
                    ) from None
                log.write(f"loaded {name}\n")
        except BaseException:
            with suppress(ServerStartError):  # unload what this run loaded so far; the first error is the one to tell
                self.stop()
            raise
        finally:
            log.close()
            client.close()
        return self.endpoints

    def load_order(self) -> list[str]:
        """The repository's models, an ensemble after the models it composes (its steps must be there first)."""

        def is_ensemble(name: str) -> bool:
            return parse_pbtxt((self.repository / name / "config.pbtxt").read_text()).platform == "ensemble"

        return sorted(self.models(), key=is_ensemble)

    def stop(self) -> None:
        """Unload what this run loaded, ensembles first (the reverse of the load order), and nothing else."""
        from tritonclient.utils import InferenceServerException

        if not self.loaded:
            return
        failed = []
        client = self._client()
        try:
            for name in reversed(self.loaded):
                try:
                    client.unload_model(name)
                except InferenceServerException as err:  # one that fails must not keep the others loaded
                    failed.append(f"{name} ({one_line(err.message() or '')})")
        finally:
            self.loaded = []
            client.close()
        if failed:
            raise ServerStartError(f"remote Triton at {self.endpoints.grpc_url} could not unload {', '.join(failed)}")


def config_json(config: mc.ModelConfig) -> str:
    """A model config as the JSON Triton's load API takes."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


@contextmanager
def configs_loaded(server: TritonServer, configs: dict[str, mc.ModelConfig]):
    """Serve models with other configs for a while (the offline scenario's static batching), then with the
    repository's own again. A body that fails ends the run, whose server is stopped next: nothing is reloaded then
    (an interrupted run must not wait for a model load)."""
    for name, config in configs.items():
        server.load(name, config)
    yield
    for name in configs:
        server.load(name)


# The servers by mode: remote is built from its URL, the others from their ports and options.
SERVER_MODES: Registry[str, type[TritonServer]] = Registry("server mode")
for _server in (EmbeddedServer, LocalServer, DockerServer, RemoteServer):
    SERVER_MODES.register(_server.mode, _server)


def make_server(
    mode: str,
    repository: Path,
    log_path: Path,
    *,
    http_port: int | None = None,
    grpc_port: int | None = None,
    url: str | None = None,
    backends: set[str] | None = None,
    **options,
) -> TritonServer:
    if mode not in SERVER_MODES:
        raise ServerStartError(f"unknown server mode {mode!r}; known: {', '.join(SERVER_MODES.names())}")
    if mode == "remote":
        if not url:
            raise ServerStartError("remote mode needs the server's address: --server-url HOST:GRPC_PORT,HOST:HTTP_PORT")
        grpc_url, _, http_url = url.partition(",")
        return RemoteServer(repository, log_path, http_url=http_url or grpc_url, grpc_url=grpc_url, backends=backends)
    return SERVER_MODES.get(mode)(repository, log_path, http_port=http_port, grpc_port=grpc_port, **options)
