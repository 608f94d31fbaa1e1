"""A user's model file as an adapter: the io spec is read from the file, inputs are synthetic (in the user's value
ranges) or the user's own samples (--input-data), and "accuracy" is how closely the served model answers like the
file's own runtime (there are no labels)."""

from __future__ import annotations

import copy
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
        from tbench.core.enums import Format
        from tbench.core.model_file import described_model, detect_format, read_model_file
        from tbench.core.onnx_graph import onnx_dim_names
        from tbench.core.shape_sets import shape_sets

        super().__init__(size="file")
        self.path, self.shapes, self.dtypes, self.value_ranges = str(path), shapes, dtypes, value_ranges
        if detect_format(Path(path)) in (Format.TS_SCRIPT, Format.PT2):  # without an io spec, --shape declares inputs
            self.file = read_model_file(Path(path), shapes=shapes, dtypes=dtypes, value_ranges=value_ranges)
            self._shape_sets = [dict(shapes or {})]
        else:  # several shapes per input: a sweep; inputs sharing a named dim take its size together
            self.file = read_model_file(Path(path), dtypes=dtypes)
            names = onnx_dim_names(Path(path), self.file.batching) if self.file.format is Format.ONNX else {}
            self._shape_sets = shape_sets(self.file.io_spec, shapes, names)
            self.shapes = self._shape_sets[0] or shapes
            self.file = described_model(
                self.file.path,
                self.file.format,
                self.file.io_spec,
                self.file.batching,
                self.shapes,
                value_ranges,
                self.file.int_high,
                self.file.table_rows,
            )
        self.batching = self.file.batching
        self.framework = self.file.format.value  # the file is its own source: served as it is, or converted onward
        stem = Path(path).name.split(".")[0] or "model"
        self.name = re.sub(r"[^A-Za-z0-9_-]", "_", stem)

    def build(self) -> Path:
        return Path(self.path)

    @property
    def shape_sets(self) -> list[dict[str, list[int]]]:
        return self._shape_sets

    def at_shapes(self, shapes: dict[str, list[int]]) -> ModelFileAdapter:
        """This model file at one shape set of a sweep: its synthetic data and perf_analyzer's --shape follow."""
        from tbench.core.model_file import described_model

        other = copy.copy(self)
        other.shapes, other._shape_sets = shapes, [shapes]
        other.file = described_model(
            self.file.path,
            self.file.format,
            self.file.io_spec,
            self.file.batching,
            shapes,
            self.value_ranges,
            self.file.int_high,
            self.file.table_rows,
        )
        return other

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

    @property
    def guessed_values(self) -> dict[str, str]:
        """The integer inputs no --value-range or --input-data sets, with the values they are drawn from
        (tbench.core.model_file.chosen_values): ids past a table's rows fail, and a mask's values change the work."""
        from tbench.core.model_file import chosen_values

        return {} if self.given_samples is not None else chosen_values(self.file)

    def use_input_data(self, path: str) -> ModelFileAdapter:
        if self.value_ranges:
            raise ConfigError(
                "--value-range shapes synthetic data, and --input-data replaces it: give one or the other"
            )
        if len(self.shape_sets) > 1:
            raise ConfigError("--input-data gives the samples' own shapes: a --shape sweep measures synthetic data")
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

        if locale := re.search(r"construct locale with name:\s*([\w.@-]+)", error_line):  # not the data: the machine
            return (
                f"{what} failed: its StringNormalizer asks for the locale {locale[1]}, which this machine lacks: "
                f"install it (locale-gen {locale[1]}) or export the model with one it has (skl2onnx: "
                "options={TfidfVectorizer: {'locale': 'C.UTF-8'}})"
            )
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
