"""The io spec that export, the Triton config and perf_analyzer all read."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

# numpy dtype name -> Triton dtype (model_config_pb2.DataType name without the TYPE_ prefix)
_TRITON_DTYPES = {
    "float32": "FP32",
    "float16": "FP16",
    "float64": "FP64",
    "int64": "INT64",
    "int32": "INT32",
    "int16": "INT16",
    "int8": "INT8",
    "uint64": "UINT64",
    "uint32": "UINT32",
    "uint16": "UINT16",
    "uint8": "UINT8",
    "bool": "BOOL",
    "object": "BYTES",  # strings (Triton's TYPE_STRING): numpy object arrays of str, as tritonclient sends them
}


class TensorSpec(BaseModel):
    name: str
    dtype: str  # numpy dtype name
    shape: list[int]  # without the batch axis; -1 marks a dynamic dimension

    @property
    def triton_dtype(self) -> str:
        return _TRITON_DTYPES[self.dtype]

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)


class IoSpec(BaseModel):
    """Inputs and outputs of a model whose axis 0 is the (dynamic) batch axis."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batch_axis: int = 0

    @property
    def has_strings(self) -> bool:
        """Whether a tensor is a string (BYTES) one: their sizes vary per request."""
        return any(t.np_dtype.kind == "O" for t in [*self.inputs, *self.outputs])

    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]
