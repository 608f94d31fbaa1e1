"""A model someone else serves, as an adapter: its io spec comes from the server's model config, its inputs are
synthetic (in the user's value ranges, at the user's --shape) or the user's own samples (--input-data). There is no
source model: nothing is exported or checked, and the served model itself answers the sample requests."""

from __future__ import annotations

import numpy as np

from model_adapters.base import ModelAdapter, ServingDefaults
from model_adapters.file_model import ModelFileAdapter
from tbench.core.iospec import IoSpec


class ServedModelAdapter(ModelFileAdapter):
    framework = "served"

    def __init__(
        self,
        name: str,
        address: str,
        spec: IoSpec,
        batching: bool,
        shapes: dict[str, list[int]] | None = None,
        value_ranges: dict[str, list[float]] | None = None,
        table_rows: dict[str, int] | None = None,
    ):
        from tbench.core.model_file import described_model
        from tbench.core.shape_sets import shape_sets

        ModelAdapter.__init__(self, size="file")
        self.name, self.path, self.dtypes, self.value_ranges = name, address, None, value_ranges
        self._shape_sets = shape_sets(spec, shapes)  # several shapes per input: a sweep
        self.shapes = self._shape_sets[0] or shapes
        self.file = described_model(address, None, spec, batching, self.shapes, value_ranges, table_rows=table_rows)
        self.batching = batching

    def build(self) -> None:
        return None  # the model is the server's: nothing to build

    def rejected_inputs(self, what: str, error_line: str, inputs: dict[str, np.ndarray]) -> str:
        return ModelAdapter.rejected_inputs(self, what, error_line, inputs)

    def defaults(self, profile: str) -> ServingDefaults:
        raise NotImplementedError("a served model is served as its server has it (tbench.request.served)")

    def reproduce_expr(self) -> str:
        return f"ServedModelAdapter({self.name!r}, {self.path!r}, ...)"
