"""A user's model file as an adapter: the io spec is read from the file, inputs are synthetic, and "accuracy" is
how closely the served model answers like the file's own runtime (there are no labels)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from tbench.errors import ConfigError
from tbench.iospec import IoSpec


class ModelFileAdapter(ModelAdapter):
    metric_name = None  # no labels: the accuracy stage compares outputs only
    sizes = ("file",)

    def __init__(self, path: str, shapes: dict[str, list[int]] | None = None, dtypes: dict[str, str] | None = None):
        from tbench.model_file import read_model_file

        super().__init__(size="file")
        self.path, self.shapes, self.dtypes = str(path), shapes, dtypes
        self.file = read_model_file(Path(path), shapes=shapes, dtypes=dtypes)
        if not self.file.batching:
            raise ConfigError(f"{path}: the first dimension of its inputs and outputs is not dynamic; tbench measures models "
                              "with a batch axis (export the model with a dynamic first dimension)")
        self.framework = self.file.format.value  # the file is its own source: served as it is, or converted onward
        stem = Path(path).name.split(".")[0] or "model"
        self.name = re.sub(r"[^A-Za-z0-9_-]", "_", stem)

    def build(self) -> Path:
        return Path(self.path)

    def io_spec(self) -> IoSpec:
        return self.file.io_spec

    def input_shapes(self) -> dict[str, list[int]]:
        return self.file.input_shapes

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        from tbench.model_file import synthetic_inputs

        for i, start in enumerate(range(0, n_samples, batch_size)):
            yield Batch(inputs=synthetic_inputs(self.file, min(batch_size, n_samples - start), seed=seed + i))

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError("a model file has no predictions to score; its outputs are compared instead")

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        raise NotImplementedError("a model file has no labels")

    def defaults(self, profile: str) -> ServingDefaults:
        if profile == "gpu":
            return ServingDefaults(max_batch_size=64, model_instances=2, preferred_batch_sizes=[32, 64], max_queue_delay_us=1000,
                                   offline_batch_sizes=[1, 2, 4, 8, 16, 32, 64], online_concurrency=list(range(8, 129, 8)),
                                   accuracy_samples=256, formats=[self.framework])
        return ServingDefaults(max_batch_size=8, model_instances=1, preferred_batch_sizes=[4, 8], max_queue_delay_us=2000,
                               offline_batch_sizes=[1, 2, 4, 8], online_concurrency=[1, 2, 4, 8], accuracy_samples=32,
                               formats=[self.framework])

    def reproduce_expr(self) -> str:
        return f"ModelFileAdapter({self.path!r}, {self.shapes!r}, {self.dtypes!r})"
