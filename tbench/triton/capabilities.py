"""What a Triton server can do, read once per run: its version and its backends, and from them the flags and formats the
plan may use. NGC releases are monthly and Triton's minor version counts them (24.10 is 2.51, 26.04 is 2.68), so an
image tag names a version as well as the server's own metadata does.

Each server mode reads its own (TritonServer.capabilities): the embedded server from the nvidia-pytriton wheel, a local
one from its environment and `--help`, a docker image from `docker image inspect` (else its tag), a remote server from
its metadata. The plan (tbench.planning) decides from them, before anything is exported, which format serves each
model and through which backend; the process modes decide which flags the server is started with."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field

# NGC release (YY.MM) -> Triton version: one minor version a month from 21.02 (2.7.0; 24.10 shipped 2.51.0); 25.07 was a
# patch release (2.59.1) and no container, so 25.08 shipped 2.60.0 (server tags v2.59.1, v2.60.0; no 25.07 notes)
_NGC_ANCHORS = ((21, 2, 7), (25, 8, 60))  # (year, month, minor) from which on the count holds
_NO_RELEASE = {(25, 7)}

# Releases that changed what a run may ask of the server (the Triton version each arrived in)
CLIENT_SHM_FLAG = (2, 68)  # 26.04: --allow-client-shm, off by default; without it client shared memory is refused
LATENCY_HISTOGRAM = (2, 65)  # 26.01: --metrics-config histogram_latencies=true, a latency histogram per model
CONFIG_NAME_FLAG = (2, 46)  # 24.05: --model-config-name, each model's configs/<name>.pbtxt served for its config.pbtxt
TORCH_AOTI = (2, 67)  # 26.03: the PyTorch backend's `torch_aoti` platform (an AOTInductor model.pt2)
TF_BACKEND_LAST = (2, 55)  # 25.02: the last NGC release whose image ships the TensorFlow backend
# 25.04: a traced request's release no longer frees its trace's mutex under that lock (server PR #8144); before it, the
# embedded 2.51 crashed (Signal 11 in TraceRelease) at most traced rate points over gRPC, at 300 req/s too
SAFE_TRACING = (2, 57)

# A format's native backend counts only from the release that brought its platform (keyed by Format value)
NATIVE_SINCE: dict[str, tuple[int, int]] = {"pt2": TORCH_AOTI}


# The server the nvidia-pytriton wheel bundles, by wheel version (its CHANGELOG's "embedded in wheel" line)
PYTRITON_SERVERS = {"0.7.0": "2.51.0"}

# NGC's Triton images: their python backend's environment holds no framework (no numpy-based runtime, no TensorFlow)
NGC_REPOSITORY = "nvcr.io/nvidia/tritonserver"

# The python backend's runtimes (tbench.request.benchmark.PYTHON_BACKEND_RUNTIMES' values) -> the module each imports
RUNTIME_MODULES = {"onnxruntime": "onnxruntime", "torchscript": "torch", "tensorflow": "tensorflow", "aoti": "torch"}


def ngc_release_version(release: str) -> str | None:
    """'26.04' -> '2.68.0'; None for a tag that is not a YY.MM release from 21.02 on (nor 25.07, which had none)."""
    m = re.fullmatch(r"(\d{2})\.(\d{2})", release)
    if not m:
        return None
    year, month = int(m.group(1)), int(m.group(2))
    if not 1 <= month <= 12 or (year, month) in _NO_RELEASE:
        return None
    anchors = [a for a in _NGC_ANCHORS if (year, month) >= a[:2]]
    if not anchors:
        return None
    y0, m0, minor0 = anchors[-1]
    return f"2.{minor0 + (year - y0) * 12 + (month - m0)}.0"


def image_release(image: str) -> str | None:
    """The NGC release an image tag names ('nvcr.io/nvidia/tritonserver:26.04-py3' -> '26.04'), else None."""
    m = re.search(r":(\d{2}\.\d{2})(?:-|$)", image)
    return m.group(1) if m else None


def parse_version(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_ngc_image(image: str) -> bool:
    return image.split("@")[0].rsplit(":", 1)[0] == NGC_REPOSITORY


def image_version(image: str, inspect_json: str | None = None) -> tuple[str | None, str]:
    """An image's Triton version and where it was read: `docker image inspect`'s env (NGC's images set
    TRITON_SERVER_VERSION and NVIDIA_TRITON_SERVER_VERSION, the release), else the release its tag names."""
    env: dict[str, str] = {}
    try:
        inspected = json.loads(inspect_json) if inspect_json else []
        config = (inspected[0] if isinstance(inspected, list) and inspected else {}).get("Config") or {}
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    except (ValueError, AttributeError, TypeError):
        pass
    if parse_version(env.get("TRITON_SERVER_VERSION")):
        return env["TRITON_SERVER_VERSION"], "image env TRITON_SERVER_VERSION"
    release = (env.get("NVIDIA_TRITON_SERVER_VERSION") or "").strip()
    if version := ngc_release_version(release[:5]):
        return version, f"image env NVIDIA_TRITON_SERVER_VERSION ({release})"
    if (release := image_release(image)) and (version := ngc_release_version(release)):
        return version, f"image tag ({release})"
    return None, "unknown (the image names no Triton version)"


def environment_version(env: dict[str, str]) -> tuple[str | None, str]:
    """A local server's version from the environment NGC's images set (the server on PATH inside one)."""
    if parse_version(env.get("TRITON_SERVER_VERSION")):
        return env["TRITON_SERVER_VERSION"], "env TRITON_SERVER_VERSION"
    release = (env.get("NVIDIA_TRITON_SERVER_VERSION") or "").strip()
    if version := ngc_release_version(release[:5]):
        return version, f"env NVIDIA_TRITON_SERVER_VERSION ({release})"
    return None, "unknown"


def help_options(help_text: str) -> frozenset[str]:
    """The long options a `tritonserver --help` lists ('allow-client-shm', 'metrics-config', ...)."""
    return frozenset(re.findall(r"--([a-z][a-z0-9-]+)", help_text))


def pytriton_server_version(wheel_version: str | None) -> str | None:
    return PYTRITON_SERVERS.get(wheel_version or "")


def importable_runtimes(find_spec=importlib.util.find_spec) -> frozenset[str]:
    """The python backend's runtimes whose framework this Python finds (the embedded server's stub runs it)."""
    from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES

    found = set()
    for runtime in set(PYTHON_BACKEND_RUNTIMES.values()):
        try:
            if find_spec(RUNTIME_MODULES.get(runtime, runtime)) is not None:
                found.add(runtime)
        except (ImportError, ValueError):
            pass
    return frozenset(found)


def runtimes_said(output: list[str]) -> frozenset[str]:
    """The runtimes a probe of an image's python3 printed (DockerServer.runtimes_argv): the words of its last line
    that name a runtime."""
    return frozenset(output[-1].split()) & frozenset(RUNTIME_MODULES) if output else frozenset()


def every_runtime() -> frozenset[str]:
    from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES

    return frozenset(PYTHON_BACKEND_RUNTIMES.values())


@dataclass(frozen=True)
class ServerCapabilities:
    """`version`: Triton's, as the server reports it or its image names it (None: unknown); `backends`: the backend
    directories it has; `python_runtimes`: the runtimes its python backend's environment can import (the embedded
    server's is ours; NGC's has no framework in it); `options`: the long options its `--help` lists (empty: not
    read); `mode` and `where`: which server, for the messages."""

    version: str | None
    backends: frozenset[str] = field(default_factory=frozenset)
    python_runtimes: frozenset[str] = field(default_factory=frozenset)
    source: str = ""  # where the version was read: "metadata", "image tag", "image env", "nvidia-pytriton", ...
    options: frozenset[str] = field(default_factory=frozenset)
    mode: str = ""
    where: str = ""

    def at_least(self, release: tuple[int, int]) -> bool | None:
        """None where the version is unknown: the caller decides what unknown means for its flag."""
        parsed = parse_version(self.version)
        return None if parsed is None else parsed >= release

    def _knows(self, option: str, release: tuple[int, int]) -> bool:
        return option in self.options if self.options else bool(self.at_least(release))

    @property
    def client_shm_flag(self) -> bool:
        """A server we launch must be given --allow-client-shm=true (only versions that know the flag accept it)."""
        return self._knows("allow-client-shm", CLIENT_SHM_FLAG)

    @property
    def config_name_flag(self) -> bool:
        """A server we launch can serve another config than config.pbtxt from its start (--model-config-name)."""
        return self._knows("model-config-name", CONFIG_NAME_FLAG)

    @property
    def latency_histogram(self) -> bool:
        return bool(self.at_least(LATENCY_HISTOGRAM))

    @property
    def after_tf_backend(self) -> bool:
        """A release after the last NGC image with the TensorFlow backend (25.02)."""
        return bool(self.at_least((TF_BACKEND_LAST[0], TF_BACKEND_LAST[1] + 1)))

    @property
    def traces_safely(self) -> bool:
        """Its trace API can be turned on under load (tbench.triton.trace): known to be a release with the fix."""
        return bool(self.at_least(SAFE_TRACING))

    @property
    def torch_aoti(self) -> bool:
        """The PyTorch backend serves `platform: "torch_aoti"` (model.pt2)."""
        return "pytorch" in self.backends and bool(self.at_least(TORCH_AOTI))

    def launch_args(self) -> list[str]:
        """The tritonserver options a server we launch gets from its version: never one its version lacks (an
        unknown option makes tritonserver exit)."""
        return [
            *(["--allow-client-shm=true"] if self.client_shm_flag else []),
            *(["--metrics-config=histogram_latencies=true"] if self.latency_histogram else []),
        ]

    def backend_of(self, fmt) -> str | None:
        """The backend directory that serves `fmt` natively (None: no native platform)."""
        from tbench.triton.config import BACKEND_DIRS, PLATFORMS

        platform = PLATFORMS.get(fmt)
        return BACKEND_DIRS.get(platform) if platform else None

    def native(self, fmt) -> bool:
        """Whether the format's own backend is here, from the release that brought its platform."""
        backend = self.backend_of(fmt)
        if backend is None or backend not in self.backends:
            return False
        since = NATIVE_SINCE.get(fmt.value)
        return since is None or bool(self.at_least(since))

    def python_runs(self, fmt) -> bool:
        """Whether the python backend is here and its environment has the format's runtime."""
        from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES

        runtime = PYTHON_BACKEND_RUNTIMES.get(fmt)
        return runtime is not None and "python" in self.backends and runtime in self.python_runtimes

    def serves(self, fmt) -> bool:
        return self.native(fmt) or self.python_runs(fmt)

    def servable(self) -> list:
        """Every format this server can serve, natively or through the python backend."""
        from tbench.core.enums import Format

        return [f for f in Format if f is not Format.ENSEMBLE and self.serves(f)]

    def label(self) -> str:
        """'Triton 2.74.0 (image tag (26.10))', or 'a Triton of unknown version'."""
        return f"Triton {self.version} ({self.source})" if self.version else "a Triton of unknown version"

    def why_not(self, fmt) -> str:
        """Why this server cannot serve `fmt`: 'neither natively (...) nor through the python backend (...)'."""
        from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES

        backend = self.backend_of(fmt)
        if backend is None:
            natively = f"{fmt.value} has no Triton platform"
        elif backend in self.backends and fmt.value in NATIVE_SINCE:
            natively = f"its {backend} backend serves it from Triton {'.'.join(map(str, NATIVE_SINCE[fmt.value]))} on"
        else:
            natively = f"no {backend} backend"
            if backend == "tensorflow" and self.after_tf_backend:
                natively += ": NGC's images have none after 25.02"
        runtime = PYTHON_BACKEND_RUNTIMES.get(fmt)
        if "python" not in self.backends:
            python = "there is none"
        elif runtime is None:
            python = f"it has no runtime for {fmt.value}"
        else:
            python = f"its environment has no {RUNTIME_MODULES.get(runtime, runtime)}"
        return f"neither natively ({natively}) nor through the python backend ({python})"

    def fix(self, fmt) -> str:
        """Where a server that serves `fmt` is found, by mode."""
        backend = self.backend_of(fmt) or "python"
        return {
            "docker": f"--docker-image IMAGE with the {backend} backend",
            "local": f"a tritonserver with the {backend} backend (--tritonserver, --backend-dir)",
            "remote": f"a remote server with the {backend} backend",
            "embedded": f"--server docker or local with the {backend} backend",
        }.get(self.mode, f"a server with the {backend} backend")

    def cannot_serve(self, fmt) -> str:
        """One line: why `fmt` cannot be served here, and the alternatives."""
        others = [f.value for f in self.servable() if f is not fmt]
        server = " ".join(filter(None, ("the", self.mode, "server", self.where)))
        return f"{server} ({self.label()}) can serve {fmt.value} {self.why_not(fmt)}; use {self.fix(fmt)}" + (
            f", or --formats {' / '.join(others)}" if others else ""
        )

    def manifest(self) -> dict:
        return {
            "version": self.version,
            "source": self.source,
            "backends": sorted(self.backends),
            "python_runtimes": sorted(self.python_runtimes),
            "client_shm_flag": self.client_shm_flag,
            "latency_histogram": self.latency_histogram,
        }


def as_capabilities(server) -> ServerCapabilities:
    """A ServerCapabilities as it is, or one from a set of backends alone (its version unknown, its python backend
    taken to run every runtime: what tbench assumed before it read versions)."""
    if isinstance(server, ServerCapabilities):
        return server
    return ServerCapabilities(version=None, backends=frozenset(server), python_runtimes=every_runtime())
