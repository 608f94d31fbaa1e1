"""The run plan: what one benchmark run exports, where each Triton model is served and with which config, and how its
results are labelled, decided once from the request and the hardware; and, once the server has said which backends it
has, from what was exported. The benchmark flow's stages each take a piece of it (`RunPlan`, then `Serving`, then one
`MeasuredModel` per sweep) and none goes back to the request to derive a label or a config again. Pure: the decisions
themselves are tbench.planning.plan's functions, unit-tested there and here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from model_adapters.ensemble import part_adapters
from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format, Scenario
from tbench.core.iospec import IoSpec
from tbench.core.measured import input_data_label, shapes_label
from tbench.core.precision import results_precision
from tbench.loadgen.arrivals import with_intervals
from tbench.loadgen.perf_analyzer import PerfInputs, Point
from tbench.node.hardware import Hardware
from tbench.node.placement import Placement
from tbench.planning.plan import (
    accelerator_label,
    confirm_devices,
    offline_shared_memory,
    placement_for,
    plan_devices,
    point_cache,
    server_options,
    serving_config,
    serving_format,
)
from tbench.request.benchmark import ResolvedRequest, plain_name
from tbench.results.point_cache import PointCache
from tbench.stages.converters.registry import ConversionOptions
from tbench.stages.sweep import plan_points
from tbench.triton.capabilities import ServerCapabilities
from tbench.triton.repository import ServingConfig, backend_label, serves_natively
from tbench.triton.serving import ServedOn, combined, pinned_env


@dataclass(frozen=True)
class PartExport:
    """One composing model of an ensemble to export: its adapter, its formats (the first is served) and its folder."""

    adapter: Any
    formats: list[Format]
    out_dir: Path


@dataclass(frozen=True)
class Exported:
    """What the export stage made: the model, its artifact per format, and an ensemble's composing models' artifacts
    (each part's first format is the one served)."""

    module: Any
    artifacts: list[ModelArtifact]
    parts: list[PartExport] = field(default_factory=list)
    part_artifacts: list[list[ModelArtifact]] = field(default_factory=list)

    @property
    def every_artifact(self) -> list[ModelArtifact]:
        return self.artifacts + [a for arts in self.part_artifacts for a in arts]


def _first_buildable(formats: list[Format], caps: ServerCapabilities, has_gpu: bool) -> tuple[Format, str]:
    """An ensemble part's first listed format, unless it is a TensorRT engine (the guides' dense part on a GPU) that
    this node has no GPU to build or the server no tensorrt backend to serve: then the next one listed, and why."""
    first = formats[0]
    if first is not Format.TRT or len(formats) == 1 or (has_gpu and caps.native(Format.TRT)):
        return first, ""
    lacking = (
        "this node has no GPU to build a TensorRT engine on"
        if not has_gpu
        else f"{caps.label()} has no tensorrt backend"
    )
    return formats[1], f"planned as {first.value}, served as {formats[1].value}: {lacking}"


@dataclass(frozen=True)
class RunPlan:
    """What a run does on this machine, from its resolved request and the hardware; once the server has said what it
    can do (`on_server`), the formats each model is served in (`req` re-planned) and why any differs (`replanned`)."""

    req: ResolvedRequest
    hardware: Hardware
    capabilities: ServerCapabilities | None = None
    replanned: dict[str, str] = field(
        default_factory=dict
    )  # served format -> why it is not the one the request planned
    replanned_parts: dict[str, str] = field(default_factory=dict)  # ensemble part -> why its served format changed
    part_formats: dict[str, list[Format]] = field(default_factory=dict)  # an ensemble's parts, re-planned

    def on_server(self, caps: ServerCapabilities, part_formats: dict[str, list[str]] | None = None) -> RunPlan:
        """The plan for a server that can do `caps`, decided before anything is exported: each served format (and
        each ensemble part's served one, `part_formats`: the adapter's) the server cannot serve re-planned
        (tbench.planning.plan.serving_format), or refused in one line."""
        req, has_gpu = self.req, self.hardware.has_gpu
        serve, replanned, replanned_parts = [], {}, {}
        for fmt in req.serve_formats:
            served_as, why = serving_format(fmt, caps, has_gpu)
            serve.append(served_as)
            if why:
                replanned[served_as.value] = why
        parts = {}
        for part, listed in (part_formats or {}).items():
            formats = [Format.parse(f) for f in listed]
            first, skipped = _first_buildable(formats, caps, has_gpu)
            served_as, why = serving_format(first, caps, has_gpu)
            why = "; ".join(w for w in (skipped, why) if w)
            parts[part] = [served_as, *(f for f in formats if f is not served_as)]
            if why:
                replanned_parts[part] = why
        gone = {f.value for f in req.serve_formats if f not in serve}
        update = {
            "serve_formats": list(dict.fromkeys(serve)),
            "formats": list(dict.fromkeys([*req.formats, *(f for f in serve if f is not Format.ENSEMBLE)])),
            "accelerators": {k: v for k, v in req.accelerators.items() if k not in gone},
        }
        return replace(
            self,
            req=req.model_copy(update=update),
            capabilities=caps,
            replanned=replanned,
            replanned_parts=replanned_parts,
            part_formats=parts,
        )

    @property
    def conversion(self) -> ConversionOptions:
        return ConversionOptions.for_run(self.req)

    def parts(self, adapter, module, models_dir: Path) -> list[PartExport]:
        """An ensemble's composing models, each exported in its own formats (as re-planned for the server) into its
        own folder; none otherwise."""
        if not adapter.is_ensemble:
            return []
        return [
            PartExport(
                p,
                self.part_formats.get(p.part.name) or [Format.parse(f) for f in p.part.formats],
                models_dir / p.part.name,
            )
            for p in part_adapters(adapter, module)
        ]

    @property
    def tolerances(self) -> tuple[float, float]:
        """(atol, rtol): how far a converted or served model's outputs may be from the source model's."""
        return self.req.tolerance_atol, self.req.tolerance_rtol

    @property
    def placement(self) -> Placement:
        """The server's and the client's CPU sets (tbench.node.placement)."""
        return placement_for(self.req)

    @property
    def server_options(self) -> dict:
        """make_server's options for the request's mode (tbench.planning.plan.server_options)."""
        return server_options(self.req, self.hardware)

    def shared_memory(self, spec: IoSpec) -> str:
        """The shared memory perf_analyzer's offline points use for a model of this io spec."""
        return offline_shared_memory(self.req, self.hardware, spec.has_strings)

    @property
    def gpu_env(self) -> dict[str, str]:
        """perf_analyzer's view of the GPUs: the server's GPU only (its CUDA memory is there)."""
        return pinned_env(self.req.server, self.hardware)

    def points(self, scenario: Scenario, arrivals: Path | None = None, samples=None) -> list[Point]:
        """The scenario's points; bursty or trace arrivals get their intervals files, written in `arrivals` (and a
        trace with a sample per request its input data, from `samples`: the run's --input-data)."""
        req = self.req
        points = plan_points(
            [scenario],
            req.batch_sizes,
            req.concurrency,
            req.request_rates,
            req.request_distribution,
            req.online_batch_size,
        )
        if arrivals is None:
            return points
        return with_intervals(points, req.trace, req.burstiness, req.measurement.seed, arrivals, samples)

    def one_device(self, models: dict[str, tuple[Format, bool]]) -> ServedOn:
        """Where models that take turns under one config run (a search's variants, per name: (format, served
        natively)): one instance kind for all, the GPU only where every one of them runs there."""
        return combined(plan_devices(self.req, self.hardware, models))

    def serving(self, exported: Exported, backends: ServerCapabilities | set[str] | None = None) -> Serving:
        """Where each Triton model will run and how, on a server that can do `backends` (its capabilities, by default
        those `on_server` planned for; a set of backends alone assumes every python runtime): a format without its
        own backend is served through the python-backend runtime."""
        req = self.req
        server = self.capabilities if backends is None else backends
        served = [a for fmt in req.serve_formats for a in exported.artifacts if a.format is fmt]
        composing = [
            (req.part_name(p.adapter.part.name), arts[0]) for p, arts in zip(exported.parts, exported.part_artifacts)
        ]
        native = {a.format: serves_natively(a.format, server) for a in served + [a for _, a in composing]}
        models = {req.triton_name(a.format): a for a in served} | dict(composing)
        devices = plan_devices(req, self.hardware, {name: (a.format, native[a.format]) for name, a in models.items()})
        return Serving(self, served, composing, native, models, devices)


@dataclass(frozen=True)
class MeasuredModel:
    """What one format's sweeps measure: a served format, or the ensemble over its composing models."""

    format: Format
    name: str  # the Triton model perf_analyzer calls
    spec: IoSpec
    behind: list[str]  # the Triton models that serve it: itself, or an ensemble's composing models
    device: ServedOn  # where those run: the results name no GPU they did not use
    labels: dict  # the results' static columns
    online: ServingConfig  # its config in the online scenarios (offline: its static-batching twin)

    @property
    def steps(self) -> list[str]:
        """The models a pipeline runs, read at each point (an ensemble's composing models); none for one model."""
        return [name for name in self.behind if name != self.name]

    def batching(self, scenario: Scenario) -> dict:
        served_as = self.online.static() if scenario is Scenario.OFFLINE else self.online
        return {"batching": served_as.batching, "max_queue_delay_us": served_as.queue_delay_us}


@dataclass(frozen=True)
class Serving:
    """Each Triton model the run loads: its artifact, whether its format's own backend serves it, and where it runs
    (planned; `confirmed` once the server has loaded it)."""

    plan: RunPlan
    served: list[ModelArtifact]  # the served formats' artifacts
    composing: list[tuple[str, ModelArtifact]]  # an ensemble's composing models: (Triton name, served artifact)
    native: dict[Format, bool]
    models: dict[str, ModelArtifact]  # Triton name -> artifact, composing models included
    devices: dict[str, ServedOn]

    @property
    def served_by(self) -> dict[str, str]:
        """Per served format (and the ensemble): the backend that serves it, in words."""
        by = {a.format.value: backend_label(a.format, self.native[a.format]) for a in self.served}
        if self.composing:
            by[Format.ENSEMBLE.value] = "ensemble of " + ", ".join(
                f"{plain_name(name)} ({backend_label(a.format, self.native[a.format])})" for name, a in self.composing
            )
        return by

    @property
    def served_by_why(self) -> dict[str, str]:
        """`served_by` with the reason where the plan re-planned a format for this server (the report's and the
        manifest's wording; the results' `backend` column keeps the backend alone)."""
        why = self.plan.replanned
        by = {fmt: label + (f"; {why[fmt]}" if fmt in why else "") for fmt, label in self.served_by.items()}
        parts = [f"{part}: {w}" for part, w in self.plan.replanned_parts.items()]
        if parts and Format.ENSEMBLE.value in by:
            by[Format.ENSEMBLE.value] += "; " + "; ".join(parts)
        return by

    @property
    def configs(self) -> list[tuple[ServingConfig, ModelArtifact, bool]]:
        """What each Triton model is served with: (config, artifact, native); an ensemble's batching is its parts'."""
        req, hardware = self.plan.req, self.plan.hardware
        return [
            (serving_config(req, hardware, a.format, self.devices[name], name), a, self.native[a.format])
            for name, a in self.models.items()
        ]

    @property
    def model_digests(self) -> dict[str, str]:
        return {a.format.value: a.source_hash for a in self.served + [a for _, a in self.composing]}

    def confirmed(self, server) -> Serving:
        """The plan checked against what the server's instances report in its log."""
        return replace(self, devices=confirm_devices(self.devices, server, self.plan.hardware))

    def point_cache(self, identity: dict, inputs: PerfInputs, read: bool = True) -> PointCache:
        artifacts = self.served + [a for _, a in self.composing]
        return point_cache(self.plan.req, self.plan.hardware, identity, artifacts, inputs, read)

    def measured(self, spec: IoSpec, inputs: PerfInputs, given_samples) -> list[MeasuredModel]:
        """What perf_analyzer measures: each served format, or the ensemble over its composing models (`spec`: the
        whole model's io spec), each with the results' static labels."""
        req, hardware = self.plan.req, self.plan.hardware
        by_format = {a.format: self.devices[name] for name, a in self.models.items()}
        served_by = self.served_by
        whats = [(a.format, a.io_spec, [a]) for a in self.served]
        if self.composing:
            whats.append((Format.ENSEMBLE, spec, [a for _, a in self.composing]))
        measured = []
        for fmt, io_spec, artifacts in whats:
            name = req.triton_name(fmt)
            behind = [n for n, _ in self.composing] if fmt is Format.ENSEMBLE else [name]
            device = combined({plain_name(n): self.devices[n] for n in behind})
            model_format = (
                fmt.label
                if fmt is not Format.ENSEMBLE
                else f"{fmt.label} ({' + '.join(a.format.label for a in artifacts)})"
            )
            labels = {
                "model": req.model,
                "model_size": req.size,
                "gpu": device.label,
                "format": fmt.value,
                "backend": served_by[fmt.value],
                "model_format": model_format,
                "backend_accelerator": accelerator_label(req, hardware, fmt, self.native, device),
                "precision": results_precision(  # what ran (tbench/core/precision.py), not what was asked
                    artifacts,
                    req.precision,
                    lambda f: accelerator_label(req, hardware, f, self.native, by_format[f]),
                ),
                "max_batch_size": req.max_batch_size,
                "model_instances": req.model_instances,
                "shapes": shapes_label(spec, inputs.shapes, inputs.varying),
                "input_data": input_data_label(given_samples),
            }
            online = serving_config(req, hardware, fmt, device)
            measured.append(MeasuredModel(fmt, name, io_spec, behind, device, labels, online))
        return measured
