"""Attribution: what differed underneath a series between the runs before a change and the runs after it, read from
their manifests: the server (mode, binary or image, version), the tool and runtime versions, the model's source
digest, the serving configuration, the measurement settings, the worker host and its hardware (CPUs it may use, GPU
UUIDs, driver, CUDA), the CPU that other processes on the host used while the run measured (a noisy neighbour,
the commonest cause of a step on a shared node; tbench.node.host_load), and the machine's own CPU speed (a probe before
each run's sweeps: a host that got slower or faster under the same hardware name; tbench.node.cpu_speed).

A benchmark tool alone sees a step; the manifests say whether it came with a new onnxruntime, a different GPU, one
instance fewer or a busy neighbour. What differed is not proof of cause, so every difference is listed, the ones that
flipped exactly at the change first. Each change is compared over its neighbouring segments only (back to the previous
change, on to the next), so a field that changes again later, or reverts, still names the change it came with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tbench.history.detect import MIN_SIZE
from tbench.results.comparison import MACHINE_MOVED

# manifest paths worth comparing (dotted), and the label a reader knows them by
WATCHED = {
    "environment.server.version": "Triton server version",
    "environment.server.id": "Triton server",
    "environment.server.mode": "server mode",
    "environment.server.binary": "server binary",
    "environment.server.image": "server image",
    "environment.tools": "tool versions",
    "environment.model_digests": "model digest",
    "environment.exporters": "exporter",
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


NONE = "(none)"  # a field a manifest does not have

# other processes' CPU during a run's measured sweeps, in % of one core (tbench.node.host_load): a move of a quarter
# core is far above what an idle node drifts by (a few %) and well below one busy neighbour (100 per busy thread)
OTHER_CPU_MOVED_PCT = 25.0


@dataclass(frozen=True)
class Numeric:
    """A numeric manifest field, and how far its median must move across a change to count."""

    label: str
    moved: float  # in the field's units, or as a share of its level before where `relative`
    words: str  # how to say it: {before}, {after} (divided by `scale`), {run}
    unit: str
    scale: float = 1.0
    relative: bool = False  # a probe's units differ from machine to machine: its move is a share

    def threshold(self, before: float) -> float:
        return self.moved * before if self.relative else self.moved


# numeric manifest paths (dotted)
NUMERIC = {
    "host.other_cpu_pct.mean": Numeric(  # % of one core, said in cores
        "other processes' CPU",
        OTHER_CPU_MOVED_PCT,
        "other processes used {after:.1f} cores from {run}, {before:.1f} before",
        "cores",
        scale=100.0,
    ),
    "host.cpu_speed.best": Numeric(
        "the machine's CPU speed",
        MACHINE_MOVED,  # as a share of its level before: beyond what it spreads by on a steady machine
        "the machine's CPU probe read {after:.1f} M steps/s from {run}, {before:.1f} before",
        "M steps/s",
        relative=True,
    ),
}


@dataclass(frozen=True)
class Difference:
    what: str  # the label (WATCHED), with the sub-key for dicts: "tool versions: onnxruntime"
    before: str
    after: str
    at_change: bool  # the last run before and the first run after differ in it (not only somewhere in the segments)
    words: str = ""  # how to say it where "what: before → after" would not (a numeric field's levels and runs)

    def line(self) -> str:
        return self.words or f"{self.what}: {self.before} → {self.after}"


def flatten(manifest: dict) -> dict[str, str]:
    """The WATCHED values of a manifest as {label: text}; a dict-valued one (tools, digests, measurement) one entry per
    key."""
    values = {}
    for path, label in WATCHED.items():
        value = _get(manifest, path)
        if isinstance(value, dict):
            values.update({f"{label}: {k}": _text(v) for k, v in sorted(value.items())})
        elif value is not None:
            values[label] = _text(value)
    return values


def _get(manifest: dict, path: str):
    value = manifest
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _text(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def differences(before: list[dict], after: list[dict], first_run: int = 0) -> list[Difference]:
    """What differs between the manifests of the runs before a change and after it (each oldest first; pass the
    neighbouring segments, previous change to this one to the next, so that a later change of the same field does not
    hide this one). `first_run`: the position of before[0] in the series, to name runs by their number.

    A value is listed when the runs that confirmed the change (the first `MIN_SIZE` after it) agree on one that the
    runs before never had, or that differs from the one the runs just before agreed on; it may flip up to
    MIN_SIZE runs off the change's index, where a noisy series can put it. A numeric field (NUMERIC) is listed
    when its median moved by its threshold. Those that flipped exactly between the last run before and the first after
    come first."""
    if not before or not after:
        return []
    found = _flipped(before, after) + _moved(before, after, first_run)
    return sorted(found, key=lambda d: (not d.at_change, d.what))


def _flipped(before: list[dict], after: list[dict]) -> list[Difference]:
    runs = [flatten(m) for m in before + after]
    change, confirming = len(before), min(MIN_SIZE, len(after))
    labels = sorted(set().union(*runs))
    found = {}
    # exactly at the change first, then up to min_size runs either side: a noisy series can put the change up to a
    # segment off the run whose manifest flipped (the history calibration saw a reverted runtime found 3 runs early)
    splits = [change + offset for distance in range(MIN_SIZE + 1) for offset in sorted({-distance, distance})]
    for split in (s for s in splits if 0 < s < len(runs)):
        for label in (label for label in labels if label not in found):
            value = _agreed(runs[split : split + confirming], label)
            if value is None or not _new_at(runs, split, label, value, confirming):
                continue
            at_change = runs[change - 1].get(label, NONE) != runs[change].get(label, NONE)
            found[label] = Difference(label, runs[split - 1].get(label, NONE), value, at_change=at_change)
    return list(found.values())


def _agreed(runs: list[dict[str, str]], label: str) -> str | None:
    """The one value the runs have for `label`, or None where they differ."""
    values = {r.get(label, NONE) for r in runs}
    return next(iter(values)) if len(values) == 1 else None


def _new_at(runs: list[dict[str, str]], split: int, label: str, value: str, confirming: int) -> bool:
    """`value` starts at `split`: no run of the segment before had it, or the runs just before agreed on another (a
    revert to a value the segment had earlier, e.g. 1.17 -> 1.18 -> 1.17 with the first change not found)."""
    if value not in {r.get(label, NONE) for r in runs[:split]}:
        return True
    just_before = _agreed(runs[max(0, split - confirming) : split], label)
    return just_before is not None and just_before != value


def _moved(before: list[dict], after: list[dict], first_run: int) -> list[Difference]:
    """A numeric field that moved by its threshold in each of the runs that confirmed the change (the first MIN_SIZE
    from a split, tried at the change and up to MIN_SIZE runs off it, as _flipped does) from the median of the runs
    before the split: not the whole segment after, which a neighbour that left later (no change found there) would
    dilute."""
    found = []
    runs, change = before + after, len(before)
    confirming = min(MIN_SIZE, len(after))
    splits = [change + offset for distance in range(MIN_SIZE + 1) for offset in sorted({-distance, distance})]
    for path, field in NUMERIC.items():
        for split in (s for s in splits if 0 < s < len(runs)):
            # the newest runs, on the night a change placed early is confirmed, may be fewer than a segment
            window = runs[split : split + confirming]
            old, new = _median(runs[:split], path), _values(window, path)
            if old is None or not new or len(new) < len(window) or not _all_moved(old, new, field.threshold(old)):
                continue
            before, after = old / field.scale, float(np.median(new)) / field.scale
            run = f"run {first_run + split + 1}"  # runs are numbered from 1 in the series
            text = field.words.format(before=before, after=after, run=run)
            found.append(
                Difference(
                    field.label,
                    f"{before:.1f} {field.unit}",
                    f"{after:.1f} {field.unit}",
                    split == change,
                    words=text,
                )
            )
            break
    return found


def _values(manifests: list[dict], path: str) -> list[float]:
    return [float(v) for v in (_get(m, path) for m in manifests) if isinstance(v, int | float)]


def _median(manifests: list[dict], path: str) -> float | None:
    values = _values(manifests, path)
    return float(np.median(values)) if values else None


def _all_moved(old: float, new: list[float], threshold: float) -> bool:
    """Every confirming run moved the same way by the threshold (as a flipped field's confirming runs agree)."""
    return all(v - old >= threshold for v in new) or all(old - v >= threshold for v in new)
