"""Enums are the backbone: user strings are parsed into them once, at the edge."""

from enum import Enum

from tbench.core.errors import ConfigError


class _ParsedEnum(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() of members
    @classmethod
    def parse(cls, value: "str | _ParsedEnum") -> "_ParsedEnum":
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ConfigError(f"unknown {cls.__name__.lower()} {value!r}; known: {known}") from None


class Format(_ParsedEnum):
    """Serving formats, by the reference guides' mnemonics."""

    TF_SAVEDMODEL = "tf-savedmodel"
    TF_TRT = "tf-trt"
    ONNX = "onnx"
    TRT = "trt"
    TS_TRACE = "ts-trace"
    TS_SCRIPT = "ts-script"
    PT2 = "pt2"  # an AOTInductor package (torch.export + torch._inductor.aoti_compile_and_package)
    ENSEMBLE = "ensemble"  # a Triton ensemble of composing models, each exported in its own format

    @property
    def label(self) -> str:
        """The `model_format` wording of the published results."""
        return _FORMAT_LABELS[self]


_FORMAT_LABELS = {
    Format.TF_SAVEDMODEL: "TensorFlow SavedModel",
    Format.TF_TRT: "TensorFlow SavedModel",
    Format.ONNX: "ONNX",
    Format.TRT: "NVIDIA TensorRT",
    Format.TS_TRACE: "TorchScript",
    Format.TS_SCRIPT: "TorchScript",
    Format.PT2: "PyTorch AOTInductor",
    Format.ENSEMBLE: "NVIDIA Triton Ensemble",
}


class Precision(_ParsedEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class Scenario(_ParsedEnum):
    OFFLINE = "offline"  # static batch grid at concurrency 1, shared memory
    ONLINE = "online"  # concurrency grid at the online batch size (1 unless the guide sends more), dynamic batching
    RATE = "rate"  # open loop: requests at fixed rates (constant or poisson arrivals), batch 1, dynamic batching
