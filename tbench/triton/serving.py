"""Which device serves a model, so that results name the GPU that ran it and no other.

Decided per Triton model before the server starts (`served_on`), then confirmed from what the python backend's
model.py says it runs on (`DEVICE_MARK` lines in the server's log, `confirmed`):

- embedded, local: the server and perf_analyzer see one GPU, the one the run's device lock holds (`pinned_env`:
  CUDA_VISIBLE_DEVICES = its UUID), so every instance runs there and the lock, the numbers and the label agree. A
  native backend runs on it; the python backend's runtime only where it has CUDA here (onnxruntime's
  CUDAExecutionProvider, torch.cuda, a TensorFlow GPU device). Otherwise the model gets KIND_CPU instances and the
  label "CPU", with a note naming the GPU that was not used.
- docker: the GPUs the container gets (--gpus: all, a list of indices or UUIDs, none).
- remote: the server's hardware is not known here; the label says so rather than naming this machine's GPU.

The CPU label is "CPU", as on a machine without a GPU, so rows measured on a CPU compare with each other; the note and
the report name the CPU model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from pydantic import BaseModel

from tbench.node.hardware import Hardware

CPU_LABEL = "CPU"
REMOTE_LABEL = "unknown (remote server)"
DEVICE_MARK = "TBENCH_DEVICE "  # model.py prints this and a JSON object once per model instance
PINNED_MODES = ("embedded", "local")  # the server is a process of ours: its environment picks its GPU


class ServedOn(BaseModel):
    """Where one Triton model runs: the results' `gpu` label, its instance kind, the GPUs whose metrics are its."""

    label: str
    kind: str = "KIND_CPU"  # the instance group's kind
    gpu_uuids: list[str] = []
    note: str = ""  # why the label is not the node's GPU, when it is not

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpu_uuids)


def serving_gpus(mode: str, hardware: Hardware, docker_gpus: str | None = None) -> list[str]:
    """The UUIDs of the GPUs the server's instances can run on, in this order: the lock's GPU first."""
    if not hardware.has_gpu or mode == "remote":
        return []
    if mode in PINNED_MODES:
        return hardware.gpu_uuids[:1]
    if docker_gpus in (None, "", "all"):
        return list(hardware.gpu_uuids)
    if docker_gpus == "none":
        return []
    wanted = [g.strip() for g in docker_gpus.removeprefix("device=").split(",") if g.strip()]
    return [u for i, u in enumerate(hardware.gpu_uuids) if str(i) in wanted or u in wanted]


def gpu_label(hardware: Hardware, uuids: list[str]) -> str:
    """The GPU's name; "N x name" for a model spread over N GPUs (its numbers are N GPUs')."""
    names = [hardware.gpus[hardware.gpu_uuids.index(u)] for u in uuids if u in hardware.gpu_uuids]
    if not names:
        return CPU_LABEL
    return names[0] if len(names) == 1 else f"{len(names)} x {' + '.join(dict.fromkeys(names))}"


def _not_used(hardware: Hardware, why: str) -> str:
    return f"{why}, on the CPU ({hardware.cpu_model}); the node's GPU {hardware.gpu_label} was not used"


def served_on(
    mode: str,
    hardware: Hardware,
    runtime: str | None,
    cuda_runtimes: Iterable[str] = (),
    docker_gpus: str | None = None,
) -> ServedOn:
    """Where a model will run. `runtime`: None for a native backend, else the python backend's runtime
    (onnxruntime, torchscript, tensorflow); `cuda_runtimes`: those of them that have CUDA in this environment."""
    if mode == "remote":  # KIND_GPU where this node has one, as requested; what the server runs it on is its own
        return ServedOn(
            label=REMOTE_LABEL,
            kind="KIND_GPU" if hardware.has_gpu else "KIND_CPU",
            note="a remote server: its hardware is not known here",
        )
    if not hardware.has_gpu:
        return ServedOn(label=CPU_LABEL)
    uuids = serving_gpus(mode, hardware, docker_gpus)
    if not uuids:
        why = f"the {mode} server has no GPU (--gpus {docker_gpus})"
        return ServedOn(label=CPU_LABEL, note=_not_used(hardware, why))
    if runtime is not None and mode in PINNED_MODES and runtime not in set(cuda_runtimes):
        return ServedOn(
            label=CPU_LABEL,
            note=_not_used(hardware, f"the {mode} server runs {runtime} in its python backend without CUDA"),
        )
    return ServedOn(label=gpu_label(hardware, uuids), kind="KIND_GPU", gpu_uuids=uuids)


def marked_reports(log_text: str, mark: str) -> list[dict]:
    """The JSON objects model.py printed after `mark` in a server log (one per instance), each naming its "model";
    a line that is not one is skipped."""
    reports = []
    for line in log_text.splitlines():
        _, found, rest = line.partition(mark)
        if not found:
            continue
        try:
            report = json.loads(rest)
        except json.JSONDecodeError:
            continue
        if isinstance(report, dict) and "model" in report:
            reports.append(report)
    return reports


def device_reports(log_text: str) -> dict[str, list[dict]]:
    """model.py's DEVICE_MARK lines of a server log: {Triton model name: [one report per instance]}."""
    reports: dict[str, list[dict]] = {}
    for report in marked_reports(log_text, DEVICE_MARK):
        reports.setdefault(str(report["model"]), []).append(report)
    return reports


def confirmed(planned: ServedOn, reports: list[dict], hardware: Hardware) -> ServedOn:
    """The plan, unless an instance reports it runs on the CPU: a model planned on a GPU whose runtime fell back (no
    CUDA in the stub's environment, a provider that failed to load) is labelled with the CPU."""
    on_cpu = [r for r in reports if str(r.get("device", "")).startswith("cpu")]
    if not planned.on_gpu or not on_cpu:
        return planned
    runtime = on_cpu[0].get("runtime", "its runtime")
    why = f"{len(on_cpu)} of {len(reports)} instances report {runtime} running"
    return planned.model_copy(update={"label": CPU_LABEL, "gpu_uuids": [], "note": _not_used(hardware, why)})


def combined(parts: Mapping[str, ServedOn]) -> ServedOn:
    """Several models measured as one (an ensemble's parts): a GPU label only where every part ran on that GPU;
    parts that ran elsewhere are named in the note."""
    values = list(parts.values())
    if not values:
        return ServedOn(label=CPU_LABEL)
    labels = {p.label for p in values}
    uuids = list(dict.fromkeys(u for p in values for u in p.gpu_uuids))
    if len(labels) == 1:
        notes = "; ".join(dict.fromkeys(p.note for p in values if p.note))
        return ServedOn(label=values[0].label, kind=values[0].kind, gpu_uuids=uuids, note=notes)
    elsewhere = [f"{name} on {p.label}" for name, p in parts.items() if not p.on_gpu]
    on_gpu = next(p for p in values if p.on_gpu) if uuids else values[0]
    return ServedOn(
        label=on_gpu.label,
        kind=on_gpu.kind,
        gpu_uuids=uuids,
        note="parts that did not run on the GPU: " + ", ".join(elsewhere),
    )


def pinned_env(mode: str, hardware: Hardware) -> dict[str, str]:
    """The environment that keeps a server of ours (and perf_analyzer, whose CUDA shared memory the server opens) on
    the lock's GPU; nothing for docker (its --gpus decides) and remote modes, or without a GPU."""
    if mode not in PINNED_MODES or not hardware.has_gpu:
        return {}
    return {"CUDA_VISIBLE_DEVICES": hardware.gpu_uuids[0]}
