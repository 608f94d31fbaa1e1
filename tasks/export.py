"""Stage 1: export the framework model to ONNX and TorchScript, recording the io spec."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from model_adapters.base import ModelAdapter
from tbench.artifacts import ModelArtifact
from tbench.enums import Format, Precision
from tbench.errors import ConversionError

ONNX_OPSET = 17
FILE_NAMES = {Format.ONNX: "model.onnx", Format.TS_TRACE: "model.pt", Format.TS_SCRIPT: "model.pt"}


def state_hash(module) -> str:
    """Content hash of the weights, so artifacts say exactly what they came from."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _export_onnx(module, example, spec, path: Path) -> None:
    import torch

    dynamic = {t.name: {0: "batch"} for t in spec.inputs + spec.outputs}
    torch.onnx.export(
        module, example, str(path), input_names=spec.input_names(), output_names=spec.output_names(),
        dynamic_axes=dynamic, opset_version=ONNX_OPSET, dynamo=False,
    )


def _export_ts_trace(module, example, spec, path: Path) -> None:
    import torch

    torch.jit.trace(module, example, check_trace=False).save(str(path))


def _export_ts_script(module, example, spec, path: Path) -> None:
    import torch

    torch.jit.script(module).save(str(path))


EXPORTERS = {Format.ONNX: _export_onnx, Format.TS_TRACE: _export_ts_trace, Format.TS_SCRIPT: _export_ts_script}


def export_model(adapter: ModelAdapter, module, fmt: Format, out_dir: Path, source_hash: str) -> ModelArtifact:
    import torch

    if fmt not in EXPORTERS:
        known = ", ".join(f.value for f in EXPORTERS)
        raise ConversionError(f"no exporter from {adapter.framework} to {fmt.value} here; available: {known}")
    spec = adapter.io_spec()
    sample = adapter.sample_batch(2)
    example = tuple(torch.from_numpy(sample[t.name]) for t in spec.inputs)
    path = out_dir / fmt.value / FILE_NAMES[fmt]
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        with torch.inference_mode():
            EXPORTERS[fmt](module, example, spec, path)
    except Exception as err:  # exporters raise many types; one clear line is what users need
        raise ConversionError(f"export of {adapter.name} to {fmt.value} failed: {type(err).__name__}: {err}") from err
    return ModelArtifact(format=fmt, precision=Precision.FP32, path=str(path), io_spec=spec,
                         source_hash=source_hash, seconds=time.monotonic() - start)


@task(name="export", cache_policy=NO_CACHE)
def export_task(adapter: ModelAdapter, module, formats: list[Format], out_dir: Path) -> list[ModelArtifact]:
    digest = state_hash(module)
    return [export_model(adapter, module, fmt, out_dir, digest) for fmt in formats]
