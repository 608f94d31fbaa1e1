"""`tbench doctor`: what this node can export, serve and measure; and what a run needs of it (`missing_for`).

Each check is a small function returning a `Check`; what they read of the machine goes through a few seams
(`_import`, `_run`, `_which`, `_hardware`) that the tests replace. `report_for(request)` runs only the checks a
request depends on, so preflight stays quick; `full_report()` runs all of them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from tbench.core.enums import Format
from tbench.core.errors import BenchError, one_line
from tbench.core.precision import GPU_BUILT
from tbench.node import hardware as hw
from tbench.triton.capabilities import RUNTIME_MODULES, pytriton_server_version

PYTRITON = "pip install nvidia-pytriton==0.7.0 (a dependency of this project's node extra: `pip install -e '.[node]'`)"
WORKER_IMAGE = "the worker image (infra/worker.Dockerfile)"
# the python backend's runtimes (tbench.request.benchmark.PYTHON_BACKEND_RUNTIMES) -> the framework whose CUDA they use
RUNTIME_FRAMEWORKS = RUNTIME_MODULES


class Check(BaseModel):
    area: Literal["export", "serve", "measure"]
    name: str  # "onnx -> trt", "embedded", "perf_analyzer", "CUDA in torch"...
    ok: bool | None  # None: nothing to check on this node (a remote server)
    detail: str = ""  # versions and paths, or why not
    hint: str = ""  # where to get what is missing
    data: dict = {}  # the same, for machines: tool versions, backends, GPUs


class NodeReport(BaseModel):
    host: str
    checks: list[Check]

    def get(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)


# --- seams: what the checks read of the machine ---


def _import(module: str):
    return importlib.import_module(module)


def _which(name: str) -> str | None:
    return shutil.which(name)


def _run(argv: list[str], timeout: float = 20, env: dict | None = None) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)}: no answer within {timeout:.0f} s"
    return done.returncode, (done.stdout + done.stderr).strip()


@lru_cache(maxsize=1)
def _hardware() -> hw.Hardware:
    return hw.detect()


# --- export ---


def tool(name: str) -> dict:
    """One converter tool: importable here (the import itself, not just an installed wheel) and its version."""
    try:
        module = _import(name)
    except Exception as err:  # a wheel whose libraries are missing raises OSError or RuntimeError, not ImportError
        return {"name": name, "ok": False, "version": None, "error": one_line(f"{type(err).__name__}: {err}", 160)}
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return {"name": name, "ok": True, "version": str(version), "error": ""}


def tf_tensorrt_build() -> tuple[bool, str]:
    """TF-TRT needs a TensorFlow built with TensorRT (NGC's TensorFlow images), not only a tensorrt wheel beside it."""
    try:
        info = _import("tensorflow").sysconfig.get_build_info()
    except Exception as err:
        return False, one_line(str(err), 120)
    return bool(info.get("is_tensorrt_build")), f"is_tensorrt_build={bool(info.get('is_tensorrt_build'))}"


def converter_check(conv) -> Check:
    """A registered converter (tasks.export.Converter): every tool it names importable; GPU-built formats also need a
    GPU, and TF-TRT a TensorFlow built with TensorRT."""
    tools = [tool(t) for t in conv.tools]
    missing = [t for t in tools if not t["ok"]]
    why = [f"{t['name']} is not importable ({t['error']})" for t in missing]
    if conv.target in GPU_BUILT and not missing and not _hardware().has_gpu:
        why.append("its engines are built on a GPU; nvidia-smi finds none")
    if conv.target is Format.TF_TRT and not missing:
        built, detail = tf_tensorrt_build()
        if not built:
            why.append(f"this TensorFlow is not built with TensorRT ({detail})")
    versions = ", ".join(f"{t['name']} {t['version']}" for t in tools if t["ok"])
    return Check(
        area="export",
        name=f"{conv.source} -> {conv.target.value}",
        ok=not why,
        detail="; ".join(why) or versions,
        hint=conv.where if why else "",
        data={"source": conv.source, "target": conv.target.value, "tools": tools},
    )


def export_checks(converters: Iterable | None = None) -> list[Check]:
    from tbench.stages.converters.registry import REGISTRY

    return [converter_check(c) for c in (REGISTRY.values() if converters is None else converters)]


# --- serve ---


def embedded_check() -> Check:
    from tbench.node import tools
    from tbench.triton.process_server import backends_in

    try:
        server_dir = tools.pytriton_server_dir()
    except BenchError as err:
        return Check(area="serve", name="embedded", ok=False, detail=str(err), hint=PYTRITON)
    backends = sorted(backends_in(server_dir / "backends"))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = (server_dir / "python_backend_stubs" / version / "triton_python_backend_stub").exists()
    why = ([] if "python" in backends else ["no python backend"]) + ([] if stub else [f"no python {version} stub"])
    binary = server_dir / "bin" / "tritonserver"
    wheel = importlib.metadata.version("nvidia-pytriton")
    detail = (
        f"{binary} (nvidia-pytriton {wheel}, Triton {pytriton_server_version(wheel) or 'unknown'}); "
        f"backends: {', '.join(backends) or 'none'}; python {version} stub: {'yes' if stub else 'no'}"
    )
    return Check(
        area="serve",
        name="embedded",
        ok=not why,
        detail="; ".join(why) or detail,
        hint=PYTRITON if why else "",
        data={"binary": str(binary), "backends": backends, "stub": stub},
    )


def local_check(binary: str | None = None, backend_dir: str | None = None) -> Check:
    from tbench.triton.process_server import LOCAL_BACKENDS, backends_in

    found = _which(binary or "tritonserver") or (binary if binary and Path(binary).is_file() else None)
    folder = Path(backend_dir) if backend_dir else LOCAL_BACKENDS
    backends = sorted(backends_in(folder))
    version = os.environ.get("TRITON_SERVER_VERSION")  # set in NGC's Triton images
    if not found:
        return Check(
            area="serve",
            name="local",
            ok=False,
            detail=f"no {binary or 'tritonserver'} on PATH",
            hint=f"run inside {WORKER_IMAGE} or NGC's Triton image, or use --server embedded",
        )
    if not backends:
        return Check(
            area="serve",
            name="local",
            ok=False,
            detail=f"{found}: no backends in {folder}",
            hint="give the server's backend directory (backend_dir)",
            data={"binary": found},
        )
    detail = f"{found}{f' (Triton {version})' if version else ''}; backends in {folder}: {', '.join(backends)}"
    return Check(
        area="serve",
        name="local",
        ok=True,
        detail=detail,
        data={"binary": found, "backend_dir": str(folder), "backends": backends, "version": version},
    )


def docker_check(image: str | None = None) -> Check:
    from tbench.triton.process_server import NGC_IMAGE

    image = image or NGC_IMAGE
    if not _which("docker"):
        return Check(
            area="serve",
            name="docker",
            ok=False,
            detail="no docker CLI on PATH",
            hint="install Docker Engine and the NVIDIA Container Toolkit (GPU nodes)",
        )
    rc, out = _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=15)
    if rc != 0:
        return Check(
            area="serve",
            name="docker",
            ok=False,
            detail=f"the Docker daemon is not reachable: {one_line(out, 160)}",
            hint="start dockerd, or give this user access to its socket (the docker group)",
        )
    present = _run(["docker", "image", "inspect", "--format", "{{.Id}}", image], timeout=15)[0] == 0
    detail = f"daemon {out.splitlines()[-1] if out else '?'}; {image}: {'present' if present else 'not pulled yet'}"
    return Check(
        area="serve",
        name="docker",
        ok=True,
        detail=detail,
        hint="" if present else f"docker pull {image} (the first docker run pulls it otherwise)",
        data={"daemon": out, "image": image, "image_present": present},
    )


def docker_image_check(image: str | None = None) -> Check:
    """What the docker mode's image (the default where none is given) implies for a run, from the Triton release its
    tag names: whether TensorFlow models keep their backend, and the client shared memory flag it is started with.
    Nothing to pass or fail (ok None): what a run re-plans is said here before it does."""
    from tbench.triton.capabilities import ServerCapabilities, image_version, is_ngc_image
    from tbench.triton.process_server import NGC_IMAGE

    image = image or NGC_IMAGE
    which = "default image" if image == NGC_IMAGE else "image"
    version, source = image_version(image)
    caps = ServerCapabilities(version, source=source)
    if version is None:
        detail = f"{which} {image}: its tag names no Triton release; a run reads its version from the image"
        return Check(area="serve", name="docker image", ok=None, detail=detail, data={"image": image})
    said = [f"Triton {version} ({source})"]
    if caps.after_tf_backend:
        said.append("no TensorFlow backend (TensorFlow models are served as ONNX, or TensorRT on a GPU)")
    else:
        said.append("TensorFlow backend (NGC <= 25.02)")
    if is_ngc_image(image):
        said.append("no framework in its python backend")
    if caps.client_shm_flag:
        said.append("started with --allow-client-shm=true (client shared memory is off without it)")
    return Check(
        area="serve",
        name="docker image",
        ok=None,
        detail=f"{which} {image}: " + "; ".join(said),
        hint=""
        if image != NGC_IMAGE
        else "another release: --docker-image (e.g. nvcr.io/nvidia/tritonserver:24.10-py3)",
        data={"image": image, **caps.manifest()},
    )


def remote_check() -> Check:
    return Check(
        area="serve",
        name="remote",
        ok=None,
        detail="nothing to check here: the server is elsewhere",
        hint="give its address: --server-url HOST:GRPC_PORT,HOST:HTTP_PORT",
    )


def server_check(mode: str, request=None) -> Check:
    if mode == "embedded":
        return embedded_check()
    if mode == "local":
        return local_check(getattr(request, "tritonserver", None), getattr(request, "backend_dir", None))
    if mode == "docker":
        return docker_check(getattr(request, "docker_image", None))
    return remote_check()


# --- measure ---


def perf_analyzer_check() -> Check:
    from tbench.node import tools

    try:
        binary, env = tools.perf_analyzer_binary(), tools.perf_analyzer_env()
    except BenchError as err:
        return Check(
            area="measure",
            name="perf_analyzer",
            ok=False,
            detail=str(err),
            hint="pip install tritonclient[all]==2.51.0 (a dependency of this project)",
        )
    rc, out = _run([str(binary), "--version"], env=env)
    version = out.splitlines()[0] if rc == 0 and out else f"--version failed: {one_line(out, 120)}"
    return Check(
        area="measure",
        name="perf_analyzer",
        ok=rc == 0,
        detail=f"{binary}: {version}",
        data={"binary": str(binary), "version": version if rc == 0 else None},
    )


def gpus_check() -> Check:
    machine = _hardware()
    if not machine.has_gpu:
        how = "no nvidia-smi on PATH" if not _which("nvidia-smi") else "nvidia-smi lists no GPU"
        return Check(
            area="measure",
            name="GPUs",
            ok=False,
            detail=f"none: {how}",
            hint="a GPU node with the NVIDIA driver (and, in containers, the NVIDIA Container Toolkit)",
        )
    listed = ", ".join(f"{n} ({u})" for n, u in zip(machine.gpus, machine.gpu_uuids))
    return Check(
        area="measure",
        name="GPUs",
        ok=True,
        detail=f"{listed}; driver {machine.driver}, CUDA {machine.cuda}",
        data={"gpus": machine.gpus, "uuids": machine.gpu_uuids, "driver": machine.driver, "cuda": machine.cuda},
    )


def links_dcgm(binary: Path) -> bool:
    """Triton's GPU metrics come from DCGM: the server binary must link it and find it."""
    rc, out = _run(["ldd", str(binary)])
    lines = [ln for ln in out.splitlines() if "libdcgm" in ln]
    return rc == 0 and bool(lines) and not any("not found" in ln for ln in lines)


def gpu_metrics_check() -> Check:
    """Per-GPU metrics need a GPU and a server built with DCGM (the embedded one and NGC's images are)."""
    from tbench.node import tools

    if not _hardware().has_gpu:
        return Check(area="measure", name="GPU metrics", ok=False, detail="no GPU to measure")
    servers = {}
    with_embedded = _safe(tools.pytriton_server_dir)
    if with_embedded:
        servers["embedded"] = links_dcgm(with_embedded / "bin" / "tritonserver")
    if local := _which("tritonserver"):
        servers["local"] = links_dcgm(Path(local))
    detail = ", ".join(f"{k}: {'links DCGM' if v else 'no DCGM'}" for k, v in servers.items()) or "no tritonserver here"
    return Check(area="measure", name="GPU metrics", ok=any(servers.values()), detail=detail, data=servers)


def _safe(fn):
    try:
        return fn()
    except BenchError:
        return None


def cuda_check(framework: str) -> Check:
    """Whether a framework runs on the GPU here: torch.cuda, onnxruntime's CUDA provider, TensorFlow's GPU devices."""
    name = f"CUDA in {framework}"
    try:
        module = _import(framework)
    except Exception as err:
        return Check(area="measure", name=name, ok=False, detail=f"not importable: {one_line(str(err), 120)}")
    version = getattr(module, "__version__", "?")
    has_gpu = _hardware().has_gpu
    if framework == "torch":
        built = module.version.cuda
        ok = bool(built) and module.cuda.is_available()
        detail = f"torch {version}, " + (
            f"CUDA {built}, {module.cuda.device_count()} devices"
            if ok
            else "built without CUDA"
            if not built
            else "no CUDA device visible"
        )
        hint = "" if ok else "a CUDA build of torch (pytorch.org's cu12x wheels, or NGC's PyTorch image)"
    elif framework == "onnxruntime":
        providers = module.get_available_providers()
        ok = has_gpu and "CUDAExecutionProvider" in providers
        detail = f"onnxruntime {version}, providers: {', '.join(providers)}"
        hint = "" if ok else "pip install onnxruntime-gpu (in place of onnxruntime) on a GPU node"
    else:
        devices = module.config.list_physical_devices("GPU")
        ok = bool(devices)
        detail = f"tensorflow {version}, {len(devices)} GPU devices"
        hint = "" if ok else "a GPU build of TensorFlow (NGC's TensorFlow image: its TF-TRT too)"
    return Check(area="measure", name=name, ok=ok, detail=detail, hint=hint, data={"version": version})


def cuda_runtimes(runtimes: Iterable[str]) -> set[str]:
    """Of the python backend's runtimes (onnxruntime, torchscript, tensorflow), those that run on CUDA here."""
    return {r for r in runtimes if r in RUNTIME_FRAMEWORKS and cuda_check(RUNTIME_FRAMEWORKS[r]).ok}


def measure_checks() -> list[Check]:
    return [
        perf_analyzer_check(),
        gpus_check(),
        gpu_metrics_check(),
        *(cuda_check(f) for f in dict.fromkeys(RUNTIME_FRAMEWORKS.values())),
    ]


def full_report() -> NodeReport:
    servers = [server_check(m) for m in ("embedded", "local", "docker", "remote")]
    servers.insert(3, docker_image_check())  # the default image and what it implies, beside the docker check
    checks = export_checks() + servers + measure_checks()
    return NodeReport(host=socket.gethostname(), checks=checks)


# --- what the worker image must hold (checked when it is built, where there is no GPU) ---

IMAGE_BACKENDS = ("onnxruntime", "python", "pytorch", "tensorflow", "tensorrt")  # what the gpu profile serves natively


def system_tensorrt() -> str | None:
    """The TensorRT of the image (Triton's tensorrt backend links it): the version in libnvinfer.so.10's file name."""
    rc, out = _run(["ldconfig", "-p"])
    for line in out.splitlines() if rc == 0 else []:
        if line.strip().startswith("libnvinfer.so.") and "=>" in line:
            name = Path(os.path.realpath(line.split("=>")[1].strip())).name  # libnvinfer.so.10.5.0
            return name.removeprefix("libnvinfer.so.") if name.count(".") >= 4 else None
    return None


def image_problems(report: NodeReport) -> list[str]:
    """What the GPU worker image lacks, from a report taken in it: CUDA builds of the runtimes, TensorRT's Python
    package at the image's TensorRT version, the local server and its backends, perf_analyzer."""
    problems = []
    trt = next((t for c in report.checks if c.name == "onnx -> trt" for t in c.data.get("tools", [])), None)
    if not trt or not trt["ok"]:
        problems.append(f"tensorrt is not importable ({trt['error'] if trt else 'no onnx -> trt converter'})")
    elif (image := system_tensorrt()) and not image.startswith(trt["version"]):
        problems.append(
            f"tensorrt {trt['version']} (pip) differs from the image's TensorRT {image}: engines it builds "
            "would not load in Triton's tensorrt backend"
        )
    builds = {
        "torch": lambda m: bool(m.version.cuda),
        "onnxruntime": lambda m: "CUDAExecutionProvider" in m.get_available_providers(),
        "tensorflow": lambda m: m.test.is_built_with_cuda(),
    }
    for name, has_cuda in builds.items():
        try:
            if not has_cuda(_import(name)):
                problems.append(f"{name} is a build without CUDA")
        except Exception as err:
            problems.append(f"{name}: {one_line(str(err), 120)}")
    local = report.get("local")
    missing = sorted(set(IMAGE_BACKENDS) - set(local.data.get("backends", []))) if local and local.ok else []
    if not local or not local.ok:
        problems.append(f"local server: {local.detail if local else 'not checked'}")
    elif missing:
        problems.append(f"local server: no {', '.join(missing)} backend")
    for name in ("perf_analyzer", "embedded"):
        if (check := report.get(name)) and not check.ok:
            problems.append(f"{name}: {check.detail}")
    return problems


# --- what a run needs ---


def _formats(request) -> list[Format]:
    """Every format the run exports: the request's, and an ensemble's parts' (each part is exported in all its own)."""
    listed = list(getattr(request, "formats", None) or []) + list(getattr(request, "serve_formats", None) or [])
    parsed = [Format.parse(f) for f in listed if str(getattr(f, "value", f)).lower() != "all"]
    if Format.ENSEMBLE in parsed:
        parsed += _part_formats(request)
    return [f for f in dict.fromkeys(parsed) if f is not Format.ENSEMBLE]


def _part_formats(request) -> list[Format]:
    from tbench.request.benchmark import adapter_for

    try:
        parts = adapter_for(request).part_formats()
    except BenchError:  # an unknown model: resolve() says so
        return []
    return [Format.parse(f) for formats in parts.values() for f in formats]


def _steps(request, fmt: Format) -> tuple[list, bool]:
    """The converters that make `fmt` from the request's framework, and whether that framework is known (without it:
    every converter to the format, any one of which may be the one used). A format's own precision step is left out:
    its tools are those that made the format."""
    from tbench.stages.converters.registry import REGISTRY
    from tbench.stages.export import plan

    framework = getattr(request, "framework", None)
    if framework == fmt.value:  # a model file served as it is: nothing to convert
        return [], True
    if framework:
        try:
            return plan(framework, fmt), True
        except BenchError:
            return [], True
    return [c for (source, target), c in REGISTRY.items() if target is fmt and source != fmt.value], False


def needs_gpu(request) -> bool:
    """A server on this machine with the gpu profile, or a format whose engines are built on a GPU."""
    local = getattr(request, "server", "embedded") != "remote"
    return (local and getattr(request, "profile", None) == "gpu") or any(f in GPU_BUILT for f in _formats(request))


def report_for(request) -> NodeReport:
    """The checks a request depends on, and no others (preflight runs this on every run)."""
    steps = {id(c): c for fmt in _formats(request) for c in _steps(request, fmt)[0]}
    checks = export_checks(steps.values()) + [server_check(request.server, request)]
    if needs_gpu(request):
        checks.append(gpus_check())
    return NodeReport(host=socket.gethostname(), checks=checks)


def missing_for(request, report: NodeReport) -> list[str]:
    """What the request needs that the report says this node lacks, each as 'what: why; where to get it'. Checks the
    report does not hold are not held against the request."""
    missing = []
    for fmt in _formats(request):
        steps, known = _steps(request, fmt)
        checked = [c for conv in steps if (c := report.get(f"{conv.source} -> {conv.target.value}")) is not None]
        failed = [c for c in checked if c.ok is False]
        if failed and (known or len(failed) == len(checked)):  # unknown framework: refused when no way is open
            missing.append(
                f"{fmt.value}: {failed[0].name} cannot run here: {failed[0].detail}"
                + (f"; {failed[0].hint}" if failed[0].hint else "")
            )
    server = report.get(request.server)
    binary_given = request.server == "local" and getattr(request, "tritonserver", None)
    if server is not None and server.ok is False and not binary_given:  # a given binary: preflight checks it
        missing.append(f"--server {request.server}: {server.detail}" + (f"; {server.hint}" if server.hint else ""))
    gpus = report.get("GPUs")
    profile = getattr(request, "profile", None)
    if gpus is not None and gpus.ok is False and request.server != "remote" and profile == "gpu":
        missing.append(
            f"the gpu profile needs a GPU, and this node has {gpus.detail}; use --profile cpu, or run on a GPU node"
        )
    return missing
