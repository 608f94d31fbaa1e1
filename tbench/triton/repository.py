"""Stage 3: a Triton model repository. The model is served natively when the server has the format's backend,
else by the python-backend runtime model (ONNX Runtime / TorchScript inside model.py)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec
from tbench.core.onnx_files import copy_onnx_external_files
from tbench.request.benchmark import PYTHON_BACKEND_RUNTIMES
from tbench.triton.capabilities import ServerCapabilities, as_capabilities
from tbench.triton.config import (
    MODEL_FILENAMES,
    PLATFORMS,
    Accelerator,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfigSpec,
    ensemble_config,
    model_config,
    to_pbtxt,
)

RUNTIME_MODEL = Path(__file__).with_name("python_backend") / "model.py"
OFFLINE_CONFIG = "offline"  # the offline scenario's config, by its name among each model's configs/


@dataclass(frozen=True)
class ServingConfig:
    name: str
    max_batch_size: int
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    instances: int
    kind: str = "KIND_CPU"  # KIND_CPU | KIND_GPU
    intra_op_threads: int = 0  # python-backend runtime threads; 0: the runtime's own default
    accelerator: str | None = (
        None  # a GPU execution accelerator (auto_mixed_precision, tensorrt) for a native GPU model
    )
    precision: str = "FP32"  # the TensorRT accelerator's precision_mode
    # "dynamic": the dynamic batcher under test (online, rate); "static": none, each request runs as sent (offline),
    # so a small batch does not wait max_queue_delay for requests that never come
    batching: str = "dynamic"

    def static(self) -> ServingConfig:
        return replace(self, batching="static")

    @property
    def dynamic_max_batch(self) -> int:
        """The largest batch its dynamic batcher may form; 0 without one."""
        return self.max_batch_size if self.batching == "dynamic" else 0

    @property
    def queue_delay_us(self) -> int:
        """The delay a request may wait for others: the batcher's under dynamic batching, none under static."""
        return self.max_queue_delay_us if self.batching == "dynamic" else 0

    def applied_accelerator(self, native: bool) -> str | None:
        """The accelerator the config carries: native backends on GPU instances only (the python runtime has none)."""
        return self.accelerator if native and self.kind == "KIND_GPU" else None


def serves_natively(fmt: Format, server: ServerCapabilities | set[str]) -> bool:
    """True: the format's own backend (from the release that brought its platform: capabilities.NATIVE_SINCE);
    False: the python-backend runtime model, where the server's python environment has the runtime; neither: one
    line naming the fix. `server`: the server's capabilities, or its backends alone (every python runtime assumed)."""
    caps = as_capabilities(server)
    if caps.native(fmt):
        return True
    if caps.python_runs(fmt):
        return False
    raise ConfigError(caps.cannot_serve(fmt))


# the published results' `backend_accelerator` wording
ACCELERATOR_LABELS = {
    "auto_mixed_precision": "Automatic FP16",
    "tensorrt": "TensorRT",
    "openvino": "OpenVINO",
    "cuda": "CUDA",
}


def backend_label(fmt: Format, native: bool) -> str:
    """The results' `backend` column: the native platform, or the python backend with the runtime inside it."""
    return PLATFORMS[fmt] if native else f"python ({PYTHON_BACKEND_RUNTIMES[fmt]})"


def config_spec(cfg: ServingConfig, artifact: ModelArtifact) -> ModelConfigSpec:
    return ModelConfigSpec(
        name=cfg.name,
        io=artifact.io_spec,
        max_batch_size=cfg.max_batch_size,
        dynamic_batching=DynamicBatching(
            preferred_batch_sizes=cfg.preferred_batch_sizes, max_queue_delay_us=cfg.max_queue_delay_us
        )
        if cfg.max_batch_size > 0 and cfg.batching == "dynamic"
        else None,
        instance_groups=[InstanceGroup(count=cfg.instances, kind=cfg.kind)],
    )


def build_config(cfg: ServingConfig, artifact: ModelArtifact, native: bool = False) -> mc.ModelConfig:
    spec = config_spec(cfg, artifact)
    if native:
        if accelerator := cfg.applied_accelerator(native):
            params = {"precision_mode": cfg.precision} if accelerator == "tensorrt" else {}
            spec.accelerators = [Accelerator(name=accelerator, parameters=params)]
        return model_config(spec, artifact.format)
    spec.parameters = {
        "runtime": PYTHON_BACKEND_RUNTIMES[artifact.format],
        "model_file": Path(artifact.path).name,
        "intra_op_threads": str(cfg.intra_op_threads),
    }
    return model_config(spec)


def _link_or_copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst)
        return
    try:
        os.link(src, dst)  # the same bytes twice in one run folder are not worth a copy
    except OSError:
        shutil.copy2(src, dst)


def write_offline_configs(
    repo_dir: Path, configs: list[tuple[ServingConfig, ModelArtifact, bool]]
) -> dict[str, mc.ModelConfig]:
    """The static-batching configs the offline scenario serves in place of the repository's, each beside its model's
    config.pbtxt as Triton keeps another config (`<name>/configs/offline.pbtxt`, served by a server started with
    `--model-config-name=offline`): {triton name: config}."""
    built = {}
    for cfg, artifact, native in configs:
        built[cfg.name] = build_config(cfg.static(), artifact, native)
        path = repo_dir / cfg.name / "configs" / f"{OFFLINE_CONFIG}.pbtxt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_pbtxt(built[cfg.name]))
    return built


def write_repository(repo_dir: Path, cfg: ServingConfig, artifact: ModelArtifact, native: bool = False) -> Path:
    config = build_config(cfg, artifact, native)
    model_dir = repo_dir / cfg.name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    source = Path(artifact.path)
    if native:
        _link_or_copy(source, version_dir / MODEL_FILENAMES[config.platform])
    else:
        _link_or_copy(source, version_dir / source.name)
        shutil.copy2(RUNTIME_MODEL, version_dir / "model.py")
    copy_onnx_external_files(source, version_dir, _link_or_copy)  # its external data, where the model looks for it
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    return model_dir


def ensemble_steps(parts: list[tuple[str, IoSpec]]) -> list[EnsembleStep]:
    """Steps in order, every tensor keeping its name: a part reads the ensemble's inputs or earlier parts' outputs."""
    return [
        EnsembleStep(
            model_name=name,
            input_map={n: n for n in spec.input_names()},
            output_map={n: n for n in spec.output_names()},
        )
        for name, spec in parts
    ]


def write_ensemble(repo_dir: Path, name: str, max_batch_size: int, io: IoSpec, parts: list[tuple[str, IoSpec]]) -> Path:
    """The ensemble model over composing models already in the repository (an empty version folder, as Triton wants)."""
    config = ensemble_config(name, max_batch_size, io, ensemble_steps(parts))
    model_dir = repo_dir / name
    shutil.rmtree(model_dir, ignore_errors=True)
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    return model_dir
