"""Stage 3: a Triton model repository, config.pbtxt built through Triton's own schema (model_config_pb2)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from prefect import task
from prefect.cache_policies import NO_CACHE
from tritonclient.grpc import model_config_pb2 as mc

from tbench.artifacts import ModelArtifact
from tbench.errors import ConfigError
from tbench.request import PYTHON_BACKEND_RUNTIMES

RUNTIME_MODEL = Path(__file__).with_name("python_backend") / "model.py"


@dataclass(frozen=True)
class ServingConfig:
    name: str
    max_batch_size: int
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    instances: int
    kind: str = "KIND_CPU"  # KIND_CPU | KIND_GPU
    intra_op_threads: int = 0  # 0: the runtime's own default


def build_config(cfg: ServingConfig, artifact: ModelArtifact) -> mc.ModelConfig:
    """A python-backend model that runs the artifact's runtime inside Triton."""
    spec = artifact.io_spec
    config = mc.ModelConfig(name=cfg.name, backend="python", max_batch_size=cfg.max_batch_size)
    for t in spec.inputs:
        config.input.add(name=t.name, data_type=mc.DataType.Value("TYPE_" + t.triton_dtype), dims=t.shape)
    for t in spec.outputs:
        config.output.add(name=t.name, data_type=mc.DataType.Value("TYPE_" + t.triton_dtype), dims=t.shape)
    if cfg.max_batch_size > 0:
        config.dynamic_batching.preferred_batch_size.extend(cfg.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = cfg.max_queue_delay_us
    config.instance_group.add(count=cfg.instances, kind=mc.ModelInstanceGroup.Kind.Value(cfg.kind))
    params = {
        "runtime": PYTHON_BACKEND_RUNTIMES[artifact.format],
        "model_file": Path(artifact.path).name,
        "intra_op_threads": str(cfg.intra_op_threads),
    }
    for key, value in params.items():
        config.parameters[key].string_value = value
    validate(config)
    return config


def validate(config: mc.ModelConfig) -> None:
    """The checks Triton would fail a load on, caught before a server starts."""
    mbs = config.max_batch_size
    if mbs < 0:
        raise ConfigError(f"max_batch_size must be >= 0, got {mbs}")
    for b in config.dynamic_batching.preferred_batch_size:
        if mbs and b > mbs:
            raise ConfigError(f"preferred batch size {b} is above max_batch_size {mbs}")
    names = [t.name for t in list(config.input) + list(config.output)]
    if len(names) != len(set(names)):
        raise ConfigError(f"duplicate tensor names in {names}")
    for group in config.instance_group:
        if group.count < 1:
            raise ConfigError(f"instance count must be >= 1, got {group.count}")


def to_pbtxt(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse_pbtxt(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # the same bytes twice in one run folder are not worth a copy
    except OSError:
        shutil.copy2(src, dst)


def write_repository(repo_dir: Path, cfg: ServingConfig, artifact: ModelArtifact) -> Path:
    config = build_config(cfg, artifact)
    model_dir = repo_dir / cfg.name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    _link_or_copy(Path(artifact.path), version_dir / Path(artifact.path).name)
    shutil.copy2(RUNTIME_MODEL, version_dir / "model.py")
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    return model_dir


@task(name="repository", cache_policy=NO_CACHE)
def repository_task(repo_dir: Path, cfg: ServingConfig, artifact: ModelArtifact) -> Path:
    return write_repository(repo_dir, cfg, artifact)
