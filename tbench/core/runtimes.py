"""Running a model in its own framework: the source a conversion started from, and each exported file. Correctness
and accuracy compare against these; frameworks are imported only when a model of theirs is run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from tbench.core.enums import Format
from tbench.core.iospec import IoSpec
from tbench.core.runtime_cache import cached

FILE_FRAMEWORKS = {f.value for f in (Format.ONNX, Format.TS_SCRIPT, Format.TS_TRACE, Format.PT2, Format.TF_SAVEDMODEL)}


def _as_outputs(spec: IoSpec, out) -> dict[str, np.ndarray]:
    if isinstance(out, dict):
        return {t.name: np.asarray(out[t.name]) for t in spec.outputs}
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return {t.name: np.asarray(o) for t, o in zip(spec.outputs, outs)}


def run_pytorch(module, spec: IoSpec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    with torch.inference_mode():
        out = module(*(torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in spec.inputs))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return _as_outputs(spec, [o.cpu().numpy() for o in outs])


def run_keras(model, spec: IoSpec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A Keras model in inference mode; a functional model with several inputs takes them as a list."""
    args = [inputs[t.name] for t in spec.inputs]
    out = model(args if len(args) > 1 else args[0], training=False)
    if isinstance(out, dict):
        return {k: v.numpy() for k, v in out.items()}
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return _as_outputs(spec, [o.numpy() for o in outs])


def _load(fmt: Format, path: str):
    if fmt is Format.ONNX:
        import onnxruntime as ort

        return cached("onnxruntime", path, lambda: ort.InferenceSession(path, providers=["CPUExecutionProvider"]))
    if fmt in (Format.TS_TRACE, Format.TS_SCRIPT):
        import torch

        return cached("torchscript", path, lambda: torch.jit.load(path, map_location="cpu").eval())
    if fmt is Format.PT2:
        from tbench.core.pt2_files import load_package

        return cached("aoti", path, lambda: load_package(Path(path)))
    if fmt in (Format.TF_SAVEDMODEL, Format.TF_TRT):
        import tensorflow as tf

        # the loaded object is what is kept: its signatures lose their variables once it is collected
        return cached("tf", path, lambda: tf.saved_model.load(path)).signatures["serving_default"]
    if fmt is Format.TRT:
        from tbench.core.trt_runtime import TrtEngine

        return cached("tensorrt", path, lambda: TrtEngine(path))
    raise ValueError(f"no runtime here for {fmt.value}")


def run_file(fmt: Format, path: str, spec: IoSpec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An exported model file in its own runtime: ONNX Runtime, libtorch (TorchScript, an AOTInductor package),
    TensorFlow or TensorRT."""
    runtime = _load(fmt, str(path))
    if fmt is Format.TRT:  # outputs in the io spec's dtypes: an engine may hold int32 where the spec says int64
        out = runtime.run(inputs)
        return {t.name: out[t.name].astype(t.np_dtype, copy=False) for t in spec.outputs}
    if fmt is Format.ONNX:
        return dict(
            zip(spec.output_names(), runtime.run(spec.output_names(), {t.name: inputs[t.name] for t in spec.inputs}))
        )
    if fmt in (Format.TS_TRACE, Format.TS_SCRIPT, Format.PT2):
        return run_pytorch(runtime, spec, inputs)
    import tensorflow as tf

    out = runtime(**{t.name: tf.constant(inputs[t.name]) for t in spec.inputs})
    return {t.name: out[t.name].numpy() for t in spec.outputs}


def run_source(framework: str, module, spec: IoSpec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model the conversions started from: a PyTorch module, a Keras model, or a user's model file."""
    if framework == "pytorch":
        return run_pytorch(module, spec, inputs)
    if framework == "tensorflow":
        return run_keras(module, spec, inputs)
    if framework in FILE_FRAMEWORKS:
        return run_file(Format(framework), str(module), spec, inputs)
    raise ValueError(f"unknown framework {framework!r}")


def source_digest(framework: str, module) -> str:
    """Content hash of the source weights (or file), so conversions are cached and artifacts say what they came from."""
    h = hashlib.sha256()
    if framework == "pytorch":
        for name, tensor in sorted(module.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    elif framework == "tensorflow":
        h.update(module.to_json().encode())
        for w in module.weights:
            h.update(w.path.encode() if hasattr(w, "path") else w.name.encode())
            h.update(np.ascontiguousarray(w.numpy()).tobytes())
    else:
        from tbench.core.onnx_files import onnx_external_files

        path = Path(module)
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                h.update(f.relative_to(path).as_posix().encode() if path.is_dir() else b"")
                h.update(f.read_bytes())
        for location in onnx_external_files(path):  # the weights an ONNX file keeps beside it
            h.update(location.encode())
            h.update((path.parent / location).read_bytes())
    return h.hexdigest()[:16]
