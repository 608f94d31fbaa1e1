"""How a run serves its models, from its request and the machine: the server's options (`server_options`), where each
Triton model runs (`plan_devices`, then `confirm_devices` from the server's log), the config each is served with
(`serving_config`, `accelerator_label`), the shared memory perf_analyzer uses offline (`offline_shared_memory`) and
the format that serves a model on a server that can do what its capabilities say (`serving_format`).
Pure functions: the flows call them, and so do the tests."""

from __future__ import annotations

from pathlib import Path

from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.node.placement import Placement, plan_placement
from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES
from tbench.results.point_cache import PointCache, file_digest, tool_versions
from tbench.triton.capabilities import ServerCapabilities
from tbench.triton.repository import ACCELERATOR_LABELS, RUNTIME_MODEL, ServingConfig
from tbench.triton.serving import ServedOn, confirmed, device_reports, pinned_env, served_on


def server_options(req, hardware=None) -> dict:
    """The mode-specific options a request carries, for make_server; with the hardware, the embedded and local
    servers' view of the GPUs: the run's GPU only (tbench.serving.pinned_env)."""
    options = {
        "local": {"binary": req.tritonserver, "backend_dir": Path(req.backend_dir) if req.backend_dir else None},
        "docker": {
            "image": req.docker_image,
            "gpus": req.gpus,
            "network": req.docker_network,
            "ulimits": req.docker_ulimits,
        },
    }.get(req.server, {})
    if hardware is not None and (gpu_env := pinned_env(req.server, hardware)):
        options["gpu_env"] = gpu_env
    if req.server != "remote":
        options["placement"] = placement_for(req)
    return {k: v for k, v in options.items() if v is not None}


def placement_for(req) -> Placement:
    """The run's CPU sets (tbench.node.placement): a run's request pins unless it says not to; requests without the
    field (a search's, a capacity plan's) are not pinned, as their flows keep the client where it is."""
    return plan_placement(pin=getattr(req, "pin_cpus", False))


TF_FORMATS = (Format.TF_SAVEDMODEL, Format.TF_TRT)


def serving_format(fmt: Format, caps: ServerCapabilities, has_gpu: bool = False) -> tuple[Format, str]:
    """The format that serves a model planned as `fmt` on a server that can do `caps`, and why it differs ("" where
    it does not). A TensorFlow format on a server with neither the tensorflow backend nor TensorFlow in its python
    backend is served as ONNX (tf2onnx), or as a TensorRT engine where the server has that backend and this node a
    GPU to build it (TF-TRT's first); a format no backend of the server can serve is refused in one line, before
    anything is exported."""
    if fmt is Format.ENSEMBLE or caps.serves(fmt):
        return fmt, ""
    if fmt in TF_FORMATS:
        engine = [Format.TRT] if has_gpu and caps.native(Format.TRT) else []
        order = engine + [Format.ONNX] if fmt is Format.TF_TRT else [Format.ONNX] + engine
        for other in order:
            if caps.serves(other):
                by = "its onnxruntime backend" if caps.native(other) else "its python backend (onnxruntime)"
                by = "its tensorrt backend" if other is Format.TRT else by
                return other, (
                    f"planned as {fmt.value}, served as {other.value} by {by}: {caps.label()} can serve "
                    f"{fmt.value} {caps.why_not(fmt)}"
                )
    raise ConfigError(caps.cannot_serve(fmt))


def offline_shared_memory(req, hardware, strings: bool = False) -> str:
    """CUDA shared memory where perf_analyzer and the server share a GPU node (the guides' offline runs on GPU), system
    shared memory on a CPU machine; a remote server shares no memory with us (its offline points say so), and string
    tensors, whose sizes vary per request, go over gRPC."""
    if req.server == "remote" or strings:
        return "none"
    return "cuda" if hardware.has_gpu else "system"


def plan_devices(req, hardware, models: dict[str, tuple[Format, bool]]) -> dict[str, ServedOn]:
    """{Triton model name: where it will run}, from (format, served natively) per model: a python-backend model runs
    on the GPU only where its runtime has CUDA here (tbench.planning.doctor.cuda_runtimes)."""
    from tbench.planning.doctor import cuda_runtimes

    runtimes = {name: None if is_native else PYTHON_BACKEND_RUNTIMES[fmt] for name, (fmt, is_native) in models.items()}
    cuda = cuda_runtimes({r for r in runtimes.values() if r}) if hardware.has_gpu else set()
    return {name: served_on(req.server, hardware, runtime, cuda, req.gpus) for name, runtime in runtimes.items()}


def confirm_devices(devices: dict[str, ServedOn], server, hardware) -> dict[str, ServedOn]:
    """The plan, checked against what the python backend's instances report in the server log (a remote server's
    log is not ours: its plan stands)."""
    log = Path(server.log_path)
    reports = device_reports(log.read_text(errors="replace")) if log.is_file() else {}
    return {name: confirmed(device, reports.get(name, []), hardware) for name, device in devices.items()}


def serving_config(req, hardware, fmt, device: ServedOn, name: str | None = None) -> ServingConfig:
    """`device`: where the model runs (tbench.serving.served_on), which decides its instance kind."""
    return ServingConfig(
        name=name or req.triton_name(fmt),
        accelerator=req.accelerators.get(fmt.value),
        precision=req.precision.value.upper(),
        max_batch_size=req.max_batch_size,
        preferred_batch_sizes=req.preferred_batch_sizes,
        max_queue_delay_us=req.max_queue_delay_us,
        instances=req.model_instances,
        kind=device.kind,
        intra_op_threads=placement_for(req).server_threads(req.model_instances, hardware.cpu_cores),
    )


def accelerator_label(req, hardware, fmt, native: dict, device: ServedOn) -> str:
    """The results' backend_accelerator: what the served config applies (nothing through the python runtime)."""
    applied = fmt in native and serving_config(req, hardware, fmt, device).applied_accelerator(native[fmt])
    return ACCELERATOR_LABELS.get(applied, applied) if applied else ""


def point_cache(req, hardware, server: dict, artifacts, perf_inputs, read: bool = True) -> PointCache:
    """The point cache's context: what decides a point's numbers besides the point (see above);
    `server` is the server's identity (TritonServer.identity: mode, binary, image or address, reported id and
    version)."""
    return PointCache(
        {
            "artifacts": [
                {
                    "source": a.source_hash,
                    "format": a.format.value,
                    "precision": a.precision.value,
                    "io": a.io_spec.model_dump(),
                    **({"exporter": a.exporter} if a.exporter else {}),  # another exporter, another graph
                }
                for a in artifacts
            ],
            "serving": {
                k: getattr(req, k)
                for k in (
                    "max_batch_size",
                    "model_instances",
                    "preferred_batch_sizes",
                    "max_queue_delay_us",
                    "accelerators",
                    "online_batch_size",
                )
            },
            "offline_batching": "static",  # offline points measured before static batching are not these
            "server": server,
            "machine": {
                k: getattr(hardware, k) for k in ("cpu_model", "cpu_cores", "gpus", "gpu_uuids", "driver", "cuda")
            },
            "measurement": req.measurement.model_dump(),
            "inputs": file_digest(perf_inputs.data_file),
            "shapes": perf_inputs.shapes,
            "shared_memory": perf_inputs.shared_memory,
            "tools": tool_versions(),
            "runtime_model": file_digest(RUNTIME_MODEL),  # the python backend's model.py runs every request it serves
        },
        read=read,
    )
