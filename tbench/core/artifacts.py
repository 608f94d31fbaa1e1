"""Values that flow between stages (serializable, so Prefect can persist them)."""

from __future__ import annotations

from pydantic import BaseModel

from tbench.core.enums import Format, Precision
from tbench.core.iospec import IoSpec


class ModelArtifact(BaseModel):
    format: Format
    precision: Precision
    path: str
    io_spec: IoSpec
    source_hash: str
    seconds: float
    cached: bool = False  # every conversion step came from the conversion cache
    # the exporter that made the file where a step names one: PyTorch -> ONNX says "dynamo" (torch.export's) or
    # "legacy (fallback: <why torch.export did not take the model>)"; None for the other steps and for given files
    exporter: str | None = None


class OutputError(BaseModel):
    output: str
    max_abs_err: float
    max_rel_err: float  # max |a - b| / max |ref|: stable where single reference values are near zero
    tolerance: float
    passed: bool


class CorrectnessResult(BaseModel):
    format: Format
    batch_size: int
    model: str | None = None  # the composing model of an ensemble it checks; None: the whole model
    outputs: list[OutputError]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


class AccuracyResult(BaseModel):
    """One served format through Triton against the source model on the same samples."""

    format: Format | None = None
    samples: int
    outputs: list[OutputError] = []  # served outputs vs the source's, worst batch per output
    metric: str | None = None  # the adapter's metric, when its data has labels
    framework: float | None = None
    triton: float | None = None
    difference: float | None = None  # triton - framework
    agreement: float | None = (
        None  # fraction of samples whose prediction is the same both ways (scores: within tolerance)
    )

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)
