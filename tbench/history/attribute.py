"""Attribution: what differed underneath a series between the runs before a change and the runs after it, read from
their manifests: the server (mode, binary or image, version), the tool and runtime versions, the model's source
digest, the serving configuration, the measurement settings, the worker host and its hardware (CPUs it may use, GPU
UUIDs, driver, CUDA).

A benchmark tool alone sees a step; the manifests say whether it came with a new onnxruntime, a different GPU or one
instance fewer. What differed is not proof of cause, so every difference is listed, the ones that flipped exactly at
the change first.
"""

from __future__ import annotations

from dataclasses import dataclass

# manifest paths worth comparing (dotted), and the label a reader knows them by
WATCHED = {
    "environment.server.version": "Triton server version",
    "environment.server.id": "Triton server",
    "environment.server.mode": "server mode",
    "environment.server.binary": "server binary",
    "environment.server.image": "server image",
    "environment.tools": "tool versions",
    "environment.model_digests": "model digest",
    "request.model_instances": "model instances",
    "request.max_batch_size": "max batch size",
    "request.max_queue_delay_us": "queue delay (us)",
    "request.preferred_batch_sizes": "preferred batch sizes",
    "request.precision": "precision",
    "request.measurement": "measurement settings",
    "request.docker_image": "docker image",
    "hardware.hostname": "worker host",
    "hardware.cpu_model": "CPU",
    "hardware.cpu_cores": "CPUs the worker may use",
    "hardware.gpus": "GPUs",
    "hardware.gpu_uuids": "GPU UUIDs",
    "hardware.driver": "driver",
    "hardware.cuda": "CUDA",
}


@dataclass(frozen=True)
class Difference:
    what: str  # the label (WATCHED), with the sub-key for dicts: "tool versions: onnxruntime"
    before: str
    after: str
    at_change: bool  # the last run before and the first run after differ in it (not only somewhere in the segments)

    def line(self) -> str:
        return f"{self.what}: {self.before} → {self.after}"


def flatten(manifest: dict) -> dict[str, str]:
    """The WATCHED values of a manifest as {label: text}; a dict-valued one (tools, digests, measurement) one entry per
    key."""
    values = {}
    for path, label in WATCHED.items():
        value = manifest
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, dict):
            values.update({f"{label}: {k}": _text(v) for k, v in sorted(value.items())})
        elif value is not None:
            values[label] = _text(value)
    return values


def _text(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def differences(before: list[dict], after: list[dict]) -> list[Difference]:
    """What differs between the manifests of the runs before a change and after it (each oldest first): a value is
    listed when the runs after it agree on one the runs before never had. Those that flipped exactly between the last
    run before and the first after come first."""
    if not before or not after:
        return []
    flat_before, flat_after = [flatten(m) for m in before], [flatten(m) for m in after]
    found = []
    for label in sorted(set().union(*flat_before, *flat_after)):
        seen_before = {f.get(label, "(none)") for f in flat_before}
        seen_after = {f.get(label, "(none)") for f in flat_after}
        if len(seen_after) == 1 and not seen_after & seen_before:
            last, first = flat_before[-1].get(label, "(none)"), flat_after[0].get(label, "(none)")
            found.append(Difference(label, last, first, at_change=last != first))
    return sorted(found, key=lambda d: (not d.at_change, d.what))
