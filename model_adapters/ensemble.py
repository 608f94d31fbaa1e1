"""One composing model of an ensemble seen as a model adapter, so the export and correctness stages treat it like
any other model: its inputs are the whole model's samples run through the parts before it, in the framework."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from model_adapters.base import Batch, ModelAdapter, ModelPart, ServingDefaults
from tbench.core.iospec import IoSpec


class PartAdapter(ModelAdapter):
    metric_name = None  # a part's outputs are intermediate tensors: it is checked against the framework only

    def __init__(self, whole: ModelAdapter, parts: list[ModelPart], index: int):
        # no super().__init__: size, options and data belong to the whole model
        self.whole, self.parts_before, self.part = whole, parts[:index], parts[index]
        self.name = f"{whole.name}_{self.part.name}"
        self.framework = whole.framework
        self.size, self.checkpoint, self.data_dir = whole.size, whole.checkpoint, whole.data_dir
        self.model_options, self.profile = whole.model_options, whole.profile

    def build(self):
        return self.part.module

    def io_spec(self) -> IoSpec:
        return self.part.io_spec

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        from tbench.core.runtimes import run_source

        for batch in self.whole.batches(n_samples, batch_size, seed):
            tensors = dict(batch.inputs)
            for earlier in self.parts_before:
                tensors.update(run_source(self.framework, earlier.module, earlier.io_spec, tensors))
            yield Batch(inputs={t.name: tensors[t.name] for t in self.part.io_spec.inputs})

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError("a composing model has no predictions of its own")

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        raise NotImplementedError("a composing model has no metric of its own")

    def defaults(self, profile: str) -> ServingDefaults:
        return self.whole.defaults(profile)

    def reproduce_expr(self) -> str:
        index = len(self.parts_before)
        return f"model_adapters.ensemble.part_adapter({self.whole.reproduce_expr()}, {index})"


def part_adapters(whole: ModelAdapter, module) -> list[PartAdapter]:
    parts = whole.parts(module)
    return [PartAdapter(whole, parts, i) for i in range(len(parts))]


def part_adapter(whole: ModelAdapter, index: int) -> PartAdapter:
    """For the reproduce scripts: the whole model rebuilt, then one of its parts."""
    return part_adapters(whole, whole.build())[index]
