"""Values that flow between stages (serializable, so Prefect can persist them)."""

from __future__ import annotations

from pydantic import BaseModel

from tbench.enums import Format, Precision
from tbench.iospec import IoSpec


class ModelArtifact(BaseModel):
    format: Format
    precision: Precision
    path: str
    io_spec: IoSpec
    source_hash: str
    seconds: float
    cached: bool = False  # every conversion step came from the conversion cache


class OutputError(BaseModel):
    output: str
    max_abs_err: float
    max_rel_err: float  # max |a - b| / max |ref|: stable where single reference values are near zero
    tolerance: float
    passed: bool


class CorrectnessResult(BaseModel):
    format: Format
    batch_size: int
    outputs: list[OutputError]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


class AccuracyResult(BaseModel):
    metric: str
    samples: int
    framework: float
    triton: float
    difference: float  # triton - framework
    agreement: float  # fraction of samples whose prediction is the same both ways
