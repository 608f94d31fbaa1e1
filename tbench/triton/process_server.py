"""The server modes whose tritonserver runs as a process we start: embedded (the nvidia-pytriton wheel's binary),
local (a `tritonserver` on PATH) and docker (the NGC image through `docker run` in the foreground). They share
picking and reserving ports, the launch with its retries on a port taken, the readiness checks against a server
that is not ours, and a stop that reaps the process group and removes the shared memory it mapped.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from abc import abstractmethod
from dataclasses import replace
from pathlib import Path

import psutil
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.errors import ServerStartError
from tbench.node import containers, procs, shm, tools
from tbench.node import ports as loopback
from tbench.node.placement import Placement, cpu_list
from tbench.triton.capabilities import (
    RUNTIME_MODULES,
    ServerCapabilities,
    environment_version,
    every_runtime,
    help_options,
    image_version,
    importable_runtimes,
    is_ngc_image,
    pytriton_server_version,
    runtimes_said,
)
from tbench.triton.monitor import METRICS_INTERVAL_MS
from tbench.triton.server import PortTakenError, ServerEndpoints, TritonServer, one_line
from tbench.triton.trace import TRACE_FILE, RequestTrace, trace_args

NGC_ULIMITS = ("memlock=-1", "stack=67108864")  # NGC's advice for the Triton image
# The newest NGC release whose notes were found documented (docs.nvidia.com, "Triton Inference Server Release 26.10",
# 2026-11): Triton 2.74, without the TensorFlow backend (gone after 25.02) and with client shared memory off unless
# the server runs with --allow-client-shm=true (given: capabilities.launch_args). Older images (24.10, Triton 2.51, the
# release of our perf_analyzer) keep working with --docker-image.
NGC_IMAGE = "nvcr.io/nvidia/tritonserver:26.10-py3"
LOCAL_BACKENDS = Path("/opt/tritonserver/backends")  # where the NGC image and Triton's packages put them
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
CONTAINER_TRACE_DIR = "/tbench-trace"  # where a container writes its requests' trace (tbench.triton.trace)
GROUP_EXIT_S = 5.0  # how long stop() waits for the processes of a killed group to be gone


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
        placement: Placement = Placement(),
    ):
        super().__init__(repository, log_path, start_timeout_s)
        self.placement = placement  # the server's CPU set (tbench.node.placement): its stubs inherit it
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
        self.trace_path: Path | None = None  # where the server writes its requests' trace (a mode that has one)
        self._version: ServerCapabilities | None = None  # what version_info read, once
        self.start_config_name = ""  # --model-config-name: each model's configs/<name>.pbtxt served from the start
        self.start_configs: dict[str, mc.ModelConfig] = {}  # those configs, by model
        self._launched = False  # launch() started the process and start() has not waited for it yet

    def serve_from_start(self, config_name: str, configs: dict[str, mc.ModelConfig]) -> bool:
        # a Triton before 24.05 exits on the flag; a server started with no model loads each when asked
        if self.model_control != "all" or not self.version_info().config_name_flag:
            return False
        self.start_config_name, self.start_configs = config_name, dict(configs)
        return True

    def _pick_ports(self) -> dict[str, int]:
        chosen = {**self.chosen_ports, "metrics": None}
        return {name: port or loopback.free_port() for name, port in chosen.items()}

    @property
    def shm_prefix(self) -> str:
        """The python backend's shared memory regions are named after the server, so they are found once it is gone: a
        stub that exited with its server (killed, or failing at start) maps nothing that could tell them."""
        return f"{self.instance_id}-shm-"

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
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--model-control-mode=explicit",
            *(["--load-model=*"] if self.model_control == "all" else []),
            *([f"--model-config-name={self.start_config_name}"] if self.start_config_name else []),
            "--exit-on-error=true",
            "--strict-readiness=true",
            "--log-verbose=0",
            *self.version_info().launch_args(),  # the flags its version has: client shm, latency histogram
        ]

    def version_info(self) -> ServerCapabilities:
        """The server's version (and the options its --help lists, where read) without starting it, read once: what
        decides the flags it is started with."""
        if self._version is None:
            self._version = replace(self.read_version(), mode=self.mode)
        return self._version

    def read_version(self) -> ServerCapabilities:
        return ServerCapabilities(version=None, source="unknown")

    def python_runtimes(self) -> frozenset[str]:
        """The runtimes its python backend's environment can import."""
        return every_runtime()

    def read_capabilities(self) -> ServerCapabilities:
        return replace(self.version_info(), backends=frozenset(self.backends()), python_runtimes=self.python_runtimes())

    @abstractmethod
    def argv(self) -> list[str]: ...

    def launch_argv(self) -> list[str]:
        """The command as started: on the placement's server CPUs."""
        return self.placement.wrap(self.argv())

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    START_TRIES = 3  # a port taken between our pick and the server's bind: fresh ports, another start

    def launch(self) -> None:
        """Start the process and return at once: its models load while the run does other work (the correctness
        check), and start() then waits for them. Stopped like a started one; a second launch is refused."""
        if self.alive():  # a second start would orphan the first server (and its stubs and shared memory)
            raise ServerStartError(f"this {self.mode} tritonserver is already running ({self._running_as()})")
        self.overridden = dict(self.start_configs)  # what a fresh process serves (a trial's restart too)
        self._launched = True
        self._launch_process()

    def _launch_process(self) -> None:
        self._before_launch()
        self.proc = procs.start(
            self.launch_argv(),
            self.log_path,
            env=self.env(),
            container=self._container_record(),
            scratch=self._scratch(),
            shm_prefix=self.shm_prefix,
        )

    def start(self) -> ServerEndpoints:
        """Launch the server (unless launch() did) and wait until it and its models are ready."""
        if not self._launched:
            self.launch()
        self._launched = False
        tries = 1
        while True:
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
                self._launch_process()
            except BaseException:
                self.stop()
                raise

    def _before_launch(self) -> None:
        """What a server mode prepares before each launch (stop() undoes it): a trace file of its own."""
        self.trace_path = Path(tempfile.mkdtemp(prefix="tbench-trace-")) / TRACE_FILE

    def _scratch(self) -> list[Path]:
        """The temporary folders of this launch, for a reaper to remove if the run is killed."""
        return [self.trace_path.parent] if self.trace_path else []

    def _remove_trace(self) -> None:
        if self.trace_path is not None:
            shutil.rmtree(self.trace_path.parent, ignore_errors=True)
            self.trace_path = None

    def _is_ours(self, metadata: dict) -> bool:
        """A port taken between our pick and our server's bind: another server on our HTTP port answers ready for
        models of the same names, and Triton binds its metrics port last, after HTTP answers. Ours then exits, and
        its failure is what start() reports. So ready means: the server on our HTTP port reports our id, and our
        processes listen on every port (where this host may see their sockets)."""
        if metadata.get("name") != self.instance_id:
            return False
        wanted = self.listen_ports()
        if not wanted:
            return True
        processes = self._server_processes()
        if not processes:  # it exited after it answered (a taken metrics port), or this host cannot see them
            return self._processes_hidden()
        listening: set[int] = set()
        for process in processes:
            try:
                listening |= {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            except psutil.AccessDenied:  # a container's root processes, seen by a user: the id alone
                return True
            except psutil.Error:
                pass
        return wanted <= listening

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

    def request_trace(self, model: str) -> RequestTrace | None:
        """None where the server's tracer crashes under load (ServerCapabilities.traces_safely): its rate points are
        then judged from their windows, as where no trace file is at hand."""
        if not self.trace_path or not self.capabilities().traces_safely:
            return None
        return RequestTrace(self.endpoints.http_url, model, self.trace_path)

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

    def _processes_hidden(self) -> bool:
        """Whether the server runs where this host cannot see its processes (none seen is then no evidence)."""
        return False

    def _terminate(self, timeout_s: float, stubs: list[psutil.Process]) -> None:
        """SIGTERM, then wait for the server to exit, or for its `stubs` to be gone where it had any: Triton only looks
        at its unloaded models once a second before it exits (1-2 s of every stop, some hundred stops in the tests),
        and once the stubs have exited their models are unloaded and nothing is left for it to clean up (stop() reaps
        the server and removes the shared memory its processes mapped)."""
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            if stubs and not any(_running(p) for p in stubs):
                return
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM lets Triton unload models and stop its stubs; the group kill reaps whatever did not exit; the shared
        memory this server's processes mapped (perf_analyzer's registered regions, which a killed perf_analyzer leaves
        behind) and its python backend's regions (by name: a server that exits while it starts, or is killed, leaves
        them) are removed."""
        self._launched = False
        if self.proc is None:
            self._remove_trace()
            return
        regions = shm.mapped_regions(self._server_processes())
        started = [p for p in self._group() if p.pid != self.proc.pid]  # its stubs, orphaned or not
        if self.proc.poll() is None:
            self._terminate(timeout_s, started)
        procs.kill_group(self.proc)
        self.proc.wait()
        # a killed stub is gone a moment after the signal, not at once (seen on a busy machine): the caller is told
        # the server stopped only when nothing it started runs
        deadline = time.monotonic() + GROUP_EXIT_S
        while any(_running(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.02)
        self._remove_leftovers()
        procs.forget(self.proc)
        self.proc = None
        shm.remove(regions | shm.named(self.shm_prefix))  # Triton removes its own on a clean exit only
        self._remove_trace()


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

    def read_version(self) -> ServerCapabilities:
        """The wheel holds no file that names its server's version: the nvidia-pytriton release names it."""
        try:
            wheel = importlib.metadata.version("nvidia-pytriton")
        except importlib.metadata.PackageNotFoundError:
            return ServerCapabilities(version=None, source="unknown (no nvidia-pytriton)")
        version = pytriton_server_version(wheel)
        return ServerCapabilities(version=version, source=f"nvidia-pytriton {wheel}" + ("" if version else ": unknown"))

    def python_runtimes(self) -> frozenset[str]:
        return importable_runtimes()  # its stub runs this venv's Python (env: PATH)

    def where(self) -> dict:
        return {"binary": str(tools.pytriton_server_dir() / "bin" / "tritonserver")}

    def _before_launch(self) -> None:
        """A private backend directory: the python backend with this Python's stub."""
        server_dir = tools.pytriton_server_dir()
        super()._before_launch()
        self._work_dir = Path(tempfile.mkdtemp(prefix="tbench-triton-"))
        backends = self._work_dir / "backends"
        shutil.copytree(server_dir / "backends", backends)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.exists():
            raise ServerStartError(f"the embedded server has no python backend stub for Python {version}")
        shutil.copy2(stub, backends / "python" / stub.name)

    def _scratch(self) -> list[Path]:
        return [*super()._scratch(), *([self._work_dir] if self._work_dir else [])]

    def argv(self) -> list[str]:
        server_dir = tools.pytriton_server_dir()
        return [
            str(server_dir / "bin" / "tritonserver"),
            *self.server_args(str(self.repository), str(self._work_dir / "backends")),
            f"--cache-directory={server_dir / 'caches'}",
            *(trace_args(self.trace_path) if self.trace_path else []),
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

    def read_version(self) -> ServerCapabilities:
        """Without starting it: the version NGC's images set in the environment (the server on PATH inside one), and
        the options its --help lists (whether it knows --allow-client-shm)."""
        version, source = environment_version(dict(os.environ))
        options: frozenset[str] = frozenset()
        if Path(self.binary).is_file():
            try:
                done = subprocess.run(
                    [self.binary, "--help"], capture_output=True, text=True, timeout=30, env=self.env()
                )
                options = help_options(done.stdout + done.stderr)
            except (OSError, subprocess.TimeoutExpired):
                pass
        return ServerCapabilities(version=version, source=source, options=options)

    def python_runtimes(self) -> frozenset[str]:
        return importable_runtimes()  # its stub runs on this machine, with the Python on PATH

    def where(self) -> dict:
        return {"binary": self.binary, "backend_dir": str(self.backend_dir)}

    def argv(self) -> list[str]:
        args = self.server_args(str(self.repository), str(self.backend_dir))
        return [self.binary, *args, *(trace_args(self.trace_path) if self.trace_path else [])]

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

    def launch_argv(self) -> list[str]:
        return self.argv()

    def processes(self) -> list[psutil.Process]:
        """The container's processes as this host sees them (for CPU and memory readings)."""
        return containers.processes(self.docker, self.container) if self.alive() else []

    def where(self) -> dict:
        return {"image": self.image, "gpus": self.gpus}  # the GPUs the container sees decide its numbers too

    def argv(self) -> list[str]:
        argv = [self.docker, "run", "--rm", "--name", self.container, "--ipc=host"]
        if self.placement.pinned:  # the container's processes on the server's CPUs (taskset would pin the CLI only)
            argv += ["--cpuset-cpus", cpu_list(self.placement.server)]
        for limit in self.ulimits:
            argv += ["--ulimit", limit]
        if self.gpus and self.gpus != "none":  # with GPUs, offline points use CUDA shared memory
            argv += ["--pid=host", "--gpus", self.gpus if self.gpus == "all" else f'"device={self.gpus}"']
        mount, traced = self._trace_mount()
        models = ["-v", f"{self.repository.resolve()}:/models:ro"]
        if self.network == "host":
            argv += ["--network=host", *mount, *models, self.image, "tritonserver"]
            return argv + self.server_args("/models", None) + traced
        for name, container_port in CONTAINER_PORTS.items():
            argv += ["-p", f"127.0.0.1:{self.ports[name]}:{container_port}"]
        argv += [*mount, *models, self.image, "tritonserver"]
        # inside its own network namespace the server listens on Triton's default ports; -p maps them to ours
        return argv + self.server_args("/models", None, address="0.0.0.0", ports=CONTAINER_PORTS) + traced

    def _before_launch(self) -> None:
        host = os.environ.get("DOCKER_HOST", "")
        if not host or host.startswith("unix://"):  # the trace is a file of this host's, the container's mount of it
            super()._before_launch()
            self.trace_path.parent.chmod(0o777)  # whatever user the image runs as writes it

    def _trace_mount(self) -> tuple[list[str], list[str]]:
        """docker's and tritonserver's options for the trace file (none without one)."""
        if self.trace_path is None:
            return [], []
        inside = Path(CONTAINER_TRACE_DIR) / TRACE_FILE
        return ["-v", f"{self.trace_path.parent}:{CONTAINER_TRACE_DIR}"], trace_args(inside)

    def listen_ports(self) -> set[int]:
        # on a bridge, the server listens in a namespace of its own, and docker fails the run on a port it cannot bind
        return set(self.ports.values()) if self.network == "host" else set()

    def _running_as(self) -> str:
        return f"container {self.container}"

    def _container_record(self) -> dict:
        return {"docker": self.docker, "name": self.container, "host": os.environ.get("DOCKER_HOST")}

    def _server_processes(self) -> list[psutil.Process]:
        return containers.processes(self.docker, self.container)

    def _processes_hidden(self) -> bool:
        # a daemon in another pid namespace reports a pid that is not ours; an exited container reports none: a
        # server that answered ready and then exited (its metrics port taken, CI saw it) is not taken for started
        pid = containers.main_pid(self.docker, self.container)
        return pid is not None and not psutil.pid_exists(pid)

    def _remove_leftovers(self) -> None:
        """A container whose client was killed, or that ignored `docker stop`, is removed too."""
        containers.remove(self.docker, self.container)

    def inspect(self) -> str | None:
        """`docker image inspect` of the image (JSON), None where it is not here or no daemon answers."""
        try:
            done = subprocess.run(
                [self.docker, "image", "inspect", self.image], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    def read_version(self) -> ServerCapabilities:
        """The image's own word (its env), else the release its tag names."""
        version, source = image_version(self.image, self.inspect())
        return ServerCapabilities(version=version, source=source, where=self.image)

    def side_log(self, name: str) -> Path:
        """Where a docker call beside the server's (listing its backends, probing its runtimes) logs: beside the
        server's log, or in the temporary folder where the server logs nowhere (a check before the run: /dev/null)."""
        if self.log_path.parent == Path("/dev"):
            return Path(tempfile.gettempdir()) / f"tbench-docker-{name}-{os.getpid()}.log"
        return self.log_path.with_suffix(f".{name}.log")

    def runtimes_argv(self) -> list[str]:
        """The image's python3 saying which runtimes' modules it finds (the python backend's stub runs with it)."""
        probe = (
            f"import importlib.util as u; print(*[r for r, m in {dict(RUNTIME_MODULES)!r}.items() if u.find_spec(m)])"
        )
        return [self.docker, "run", "--rm", "--entrypoint", "python3", self.image, "-c", probe]

    def python_runtimes(self) -> frozenset[str]:
        """Read from the image itself, as its backends are; where it cannot say (no python3 in it), NGC's python
        backend is taken to have no framework in its environment and another image every runtime."""
        said = procs.run(self.runtimes_argv(), self.side_log("runtimes"), timeout=600)
        if said.returncode == 0:
            return runtimes_said(said.output_lines())
        return frozenset() if is_ngc_image(self.image) else every_runtime()

    def backends_argv(self) -> list[str]:
        return [self.docker, "run", "--rm", "--entrypoint", "ls", self.image, str(LOCAL_BACKENDS)]

    def backends(self) -> set[str]:
        """Listed from the image itself (its backend directory), not assumed."""
        listed = procs.run(self.backends_argv(), self.side_log("backends"), timeout=600)
        if listed.returncode != 0:
            raise ServerStartError(
                f"docker mode: cannot list the backends of {self.image}: {one_line(listed.log_tail(3))}"
            )
        return set(listed.output_lines())

    def stop_argv(self, timeout_s: float) -> list[str]:
        return [self.docker, "stop", "-t", str(int(timeout_s)), self.container]

    def _terminate(self, timeout_s: float, stubs: list[psutil.Process]) -> None:
        procs.run(self.stop_argv(timeout_s), self.log_path.with_suffix(".stop.log"), timeout=timeout_s + 30)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
