"""Stage 3: a Triton model repository (the Prefect task; the logic is tbench.triton.repository)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench.core.artifacts import ModelArtifact
from tbench.triton.repository import ServingConfig, write_repository


@task(name="repository", cache_policy=NO_CACHE)
def repository_task(repo_dir: Path, cfg: ServingConfig, artifact: ModelArtifact, native: bool) -> Path:
    return write_repository(repo_dir, cfg, artifact, native=native)
