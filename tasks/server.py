"""Stage 4: the embedded Triton server (the binary bundled in the nvidia-pytriton wheel)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench import procs, tools
from tbench.errors import ServerStartError

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def load_errors(log_text: str) -> str:
    """The lines of a Triton log that say why a model did not load."""
    lines = [ln for ln in log_text.splitlines() if re.match(r"^E\d{4}", ln) or "failed to load" in ln or "Error" in ln]
    return "\n".join(lines[-8:])


@dataclass
class ServerEndpoints:
    http_url: str
    grpc_url: str
    metrics_url: str


class EmbeddedServer:
    """Start, ready-check, stop; nothing left behind (stub processes, /dev/shm regions, work dir)."""

    def __init__(self, repository: Path, log_path: Path, http_port: int | None = None, grpc_port: int | None = None,
                 start_timeout_s: float = 180.0):
        self.repository = repository
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        for port in (http_port, grpc_port):
            if port is not None and port_in_use(port):
                raise ServerStartError(f"port {port} on 127.0.0.1 is already in use; pick another or leave it unset for a free one")
        self.ports = {"http": http_port or free_port(), "grpc": grpc_port or free_port(), "metrics": free_port()}
        self.proc: subprocess.Popen | None = None
        self._work_dir: Path | None = None

    @property
    def endpoints(self) -> ServerEndpoints:
        return ServerEndpoints(http_url=f"127.0.0.1:{self.ports['http']}", grpc_url=f"127.0.0.1:{self.ports['grpc']}",
                               metrics_url=f"http://127.0.0.1:{self.ports['metrics']}/metrics")

    def _prepare_backends(self) -> Path:
        """A private backend dir: the python backend plus the stub built for this interpreter."""
        server_dir = tools.pytriton_server_dir()
        self._work_dir = Path(tempfile.mkdtemp(prefix="tbench-triton-"))
        backends = self._work_dir / "backends"
        shutil.copytree(server_dir / "backends", backends)
        stub = server_dir / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub"
        if not stub.exists():
            raise ServerStartError(f"the embedded server has no python backend stub for Python {sys.version_info.major}.{sys.version_info.minor}")
        shutil.copy2(stub, backends / "python" / stub.name)
        return backends

    def argv(self, backends: Path) -> list[str]:
        server_dir = tools.pytriton_server_dir()
        return [
            str(server_dir / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--cache-directory={server_dir / 'caches'}",
            "--allow-gpu-metrics=false",
            "--http-address=127.0.0.1", f"--http-port={self.ports['http']}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.ports['grpc']}",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.ports['metrics']}",
            "--exit-on-error=true", "--strict-readiness=true", "--log-verbose=0",
        ]

    def env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)  # so the stub's interpreter finds the venv's packages
        return {**os.environ, "PATH": venv_bin + ":" + os.environ.get("PATH", ""),
                "LD_LIBRARY_PATH": tools.library_path(tools.python_libdir(), tools.pytriton_libs_dir())}

    def start(self) -> ServerEndpoints:
        backends = self._prepare_backends()
        self.proc = procs.start(self.argv(backends), self.log_path, env=self.env())
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.endpoints

    def _wait_ready(self) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.endpoints.http_url)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    self._raise_failed(f"tritonserver exited with code {self.proc.returncode} while loading models")
                try:
                    if client.is_server_ready():
                        return
                except Exception:  # not listening yet
                    pass
                time.sleep(0.25)
            self._raise_failed(f"tritonserver was not ready within {self.start_timeout_s:.0f} s")
        finally:
            client.close()

    def _raise_failed(self, what: str) -> None:
        time.sleep(0.2)  # let the last log lines land
        excerpt = load_errors(procs.tail(self.log_path, 200)) or procs.tail(self.log_path, 5)
        one_line = " | ".join(ln.strip() for ln in excerpt.splitlines() if ln.strip())
        raise ServerStartError(f"{what} (log: {self.log_path}): {one_line}")

    def _group(self) -> list[psutil.Process]:
        """The server and every process it started (stubs stay in its process group, orphaned or not)."""
        members = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == self.proc.pid:
                    members.append(p)
            except (ProcessLookupError, psutil.Error):
                pass
        return members

    @staticmethod
    def _mapped_shm(processes: list[psutil.Process]) -> set[Path]:
        regions = set()
        for p in processes:
            try:
                regions |= {Path(m.path) for m in p.memory_maps() if Path(m.path).name.startswith(SHM_PREFIX)}
            except psutil.Error:
                pass
        return regions

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM lets Triton unload models and stop its stubs; the group kill reaps whatever did not exit;
        the python backend's shared-memory regions that this server's processes mapped are removed."""
        regions: set[Path] = set()
        if self.proc is not None:
            regions = self._mapped_shm(self._group())
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    pass
            procs.kill_group(self.proc)
            self.proc.wait()
            self.proc = None
        for region in regions:  # Triton removes them on a clean exit; a killed stub leaves them behind
            region.unlink(missing_ok=True)
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "EmbeddedServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@task(name="server", cache_policy=NO_CACHE)
def server_task(repository: Path, log_path: Path, http_port: int | None, grpc_port: int | None) -> EmbeddedServer:
    server = EmbeddedServer(repository, log_path, http_port=http_port, grpc_port=grpc_port)
    server.start()
    return server
