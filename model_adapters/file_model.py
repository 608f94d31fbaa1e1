"""A user's model file as an adapter: the io spec is read from the file, inputs are synthetic (in the user's value
ranges) or the user's own samples (--input-data), and "accuracy" is how closely the served model answers like the
file's own runtime (there are no labels)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec


class ModelFileAdapter(ModelAdapter):
    metric_name = None  # no labels: the accuracy stage compares outputs only
    sizes = ("file",)

    def __init__(
        self,
        path: str,
        shapes: dict[str, list[int]] | None = None,
        dtypes: dict[str, str] | None = None,
        value_ranges: dict[str, list[float]] | None = None,
    ):
        from tbench.core.model_file import read_model_file

        super().__init__(size="file")
        self.path, self.shapes, self.dtypes, self.value_ranges = str(path), shapes, dtypes, value_ranges
        self.file = read_model_file(Path(path), shapes=shapes, dtypes=dtypes, value_ranges=value_ranges)
        self.batching = self.file.batching
        self.framework = self.file.format.value  # the file is its own source: served as it is, or converted onward
        stem = Path(path).name.split(".")[0] or "model"
        self.name = re.sub(r"[^A-Za-z0-9_-]", "_", stem)

    def build(self) -> Path:
        return Path(self.path)

    def io_spec(self) -> IoSpec:
        return self.file.io_spec

    def input_shapes(self) -> dict[str, list[int]]:
        return self.given_samples.shapes() if self.given_samples is not None else self.file.input_shapes

    @property
    def guessed_shapes(self) -> dict[str, list[int]]:
        """The inputs whose dynamic dims neither --shape nor --input-data set, at the shape they are measured (each such
        dim at tbench.core.model_file.DEFAULT_DYNAMIC_DIM): a model's speed depends on it, so the run says so."""
        if self.given_samples is not None:
            return {}
        given = self.shapes or {}
        return {
            t.name: self.file.input_shapes[t.name]
            for t in self.io_spec().inputs
            if -1 in t.shape and t.name not in given
        }

    def use_input_data(self, path: str) -> ModelFileAdapter:
        if self.value_ranges:
            raise ConfigError(
                "--value-range shapes synthetic data, and --input-data replaces it: give one or the other"
            )
        super().use_input_data(path)
        given = self.given_samples.shapes()
        for name, dims in (self.shapes or {}).items():
            if len(dims) != len(given[name]) or any(d not in (-1, g) for d, g in zip(dims, given[name])):
                raise ConfigError(
                    f"--shape {name}:{','.join(map(str, dims))} contradicts --input-data {path}, whose "
                    f"samples of {name} have shape {','.join(map(str, given[name]))}"
                )
        return self

    def rejected_inputs(self, what: str, error_line: str, inputs: dict[str, np.ndarray]) -> str:
        """Synthetic inputs: the integer inputs the model fails on (found by re-running it with each one zeroed) and
        the options that fix their range."""
        from tbench.core.model_file import RANGE_FLAG, describe_range

        if self.given_samples is not None:
            return super().rejected_inputs(what, error_line, inputs)
        suspects = self._suspects(inputs)
        line = f"{what} failed on synthetic inputs: {error_line}"
        if not suspects:
            return f"{line}; give your own samples with --input-data PATH"
        ints = {t.name: t for t in self.file.io_spec.inputs}
        listed = ", ".join(f"{n} ({describe_range(self.file, ints[n])})" for n in suspects)
        flag = f"--value-range {suspects[0]}:LO,HI" if len(suspects) == 1 else RANGE_FLAG
        return f"{line}; the synthetic integers of {listed} may be out of range: give {flag} or --input-data PATH"

    def _suspects(self, inputs: dict[str, np.ndarray]) -> list[str]:
        """The integer inputs whose synthetic values the model rejects: with every integer input zeroed the model runs,
        and with one of them restored it fails again. When that cannot tell, every integer input not ranged by the
        user."""
        from tbench.core.model_file import run_model_file

        ints = [t.name for t in self.file.io_spec.inputs if t.np_dtype.kind in "iu"]

        def runs(feed: dict[str, np.ndarray]) -> bool:
            try:
                run_model_file(self.file, feed)
                return True
            except Exception:
                return False

        zeroed = {**inputs, **{n: np.zeros_like(inputs[n]) for n in ints}}
        if ints and runs(zeroed):
            found = [n for n in ints if not runs({**zeroed, n: inputs[n]})]
            if found:
                return found
        return [n for n in ints if n not in self.file.value_ranges]

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        from tbench.core.model_file import synthetic_inputs

        for i, start in enumerate(range(0, n_samples, batch_size)):
            yield Batch(inputs=synthetic_inputs(self.file, min(batch_size, n_samples - start), seed=seed + i))

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError("a model file has no predictions to score; its outputs are compared instead")

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        raise NotImplementedError("a model file has no labels")

    def defaults(self, profile: str) -> ServingDefaults:
        if not self.batching:  # each request is the model's own batch: nothing to batch, sweep or prefer
            return ServingDefaults(
                max_batch_size=0,
                model_instances=2 if profile == "gpu" else 1,
                preferred_batch_sizes=[],
                max_queue_delay_us=0,
                offline_batch_sizes=[1],
                online_concurrency=list(range(8, 129, 8)) if profile == "gpu" else [1, 2, 4, 8],
                accuracy_samples=64 if profile == "gpu" else 16,
                accuracy_batch_size=1,
                formats=[self.framework],
            )
        if profile == "gpu":
            return ServingDefaults(
                max_batch_size=64,
                model_instances=2,
                preferred_batch_sizes=[32, 64],
                max_queue_delay_us=1000,
                offline_batch_sizes=[1, 2, 4, 8, 16, 32, 64],
                online_concurrency=list(range(8, 129, 8)),
                accuracy_samples=256,
                formats=[self.framework],
            )
        return ServingDefaults(
            max_batch_size=8,
            model_instances=1,
            preferred_batch_sizes=[4, 8],
            max_queue_delay_us=2000,
            offline_batch_sizes=[1, 2, 4, 8],
            online_concurrency=[1, 2, 4, 8],
            accuracy_samples=32,
            formats=[self.framework],
        )

    def reproduce_expr(self) -> str:
        ranges = f", value_ranges={self.value_ranges!r}" if self.value_ranges else ""
        given = f".use_input_data({self.given_samples.path!r})" if self.given_samples is not None else ""
        return f"ModelFileAdapter({self.path!r}, {self.shapes!r}, {self.dtypes!r}{ranges}){given}"
