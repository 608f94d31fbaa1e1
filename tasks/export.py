"""Stage 1: export and convert the model to each format (the Prefect task; the logic is tbench.stages.export)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from model_adapters.base import ModelAdapter
from tbench.core.artifacts import ModelArtifact
from tbench.core.enums import Format
from tbench.core.runtimes import source_digest
from tbench.stages.converters.registry import ConversionOptions
from tbench.stages.export import export_model


@task(name="export", cache_policy=NO_CACHE)
def export_task(
    adapter: ModelAdapter, module, formats: list[Format], out_dir: Path, options: ConversionOptions | None = None
) -> list[ModelArtifact]:
    digest = source_digest(adapter.framework, module)
    return [export_model(adapter, module, fmt, out_dir, digest, options) for fmt in formats]
