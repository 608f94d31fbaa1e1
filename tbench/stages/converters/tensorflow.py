"""TensorFlow's converters: Keras -> SavedModel (Keras' export), SavedModel -> ONNX (tf2onnx's command line) and
SavedModel -> TF-TRT (TensorFlow's TF-TRT converter, over the same profile and calibration set as TensorRT's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tbench.core.enums import Format, Precision
from tbench.core.errors import ConversionError
from tbench.core.iospec import IoSpec
from tbench.request.trt_profiles import shaped_inputs
from tbench.stages.converters.registry import ONNX_OPSET, ConversionOptions, converter
from tbench.stages.converters.tensorrt import CalibrationData, CalibrationSet, engine_profile


def _tf_signature(spec: IoSpec):
    import tensorflow as tf

    return [
        tf.TensorSpec([None, *(None if d == -1 else d for d in t.shape)], tf.as_dtype(t.dtype), name=t.name)
        for t in spec.inputs
    ]


@converter("tensorflow", Format.TF_SAVEDMODEL, tools=("tensorflow", "keras"))
def keras_to_savedmodel(model, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """A SavedModel whose serving_default signature uses the io spec's names, which Triton's TF backend reads."""
    import keras

    def serve(*args):
        result = model(list(args) if len(args) > 1 else args[0], training=False)
        results = result if isinstance(result, (list, tuple)) else [result]
        return {t.name: r for t, r in zip(spec.outputs, results)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=_tf_signature(spec))
    archive.write_out(str(out), verbose=False)


@converter(Format.TF_SAVEDMODEL.value, Format.ONNX, tools=("tf2onnx", "tensorflow", "onnx"))
def savedmodel_to_onnx(saved: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict) -> None:
    """tf2onnx's own command line (as the guides run it); its output is kept next to the model."""
    argv = [
        sys.executable,
        "-m",
        "tf2onnx.convert",
        "--saved-model",
        str(saved),
        "--signature_def",
        "serving_default",
        "--opset",
        str(options.onnx_opset or ONNX_OPSET),
        "--output",
        str(out),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    (out.parent / "tf2onnx.log").write_text(" ".join(argv) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionError(f"tf2onnx failed (exit {done.returncode}): {tail[0]}")
    _rename_onnx_io(out, spec)


def _rename_onnx_io(path: Path, spec: IoSpec) -> None:
    """tf2onnx may suffix tensor names (`input:0`); Triton and perf_analyzer need the io spec's names."""
    import onnx

    model = onnx.load(str(path))
    wanted = set(spec.input_names() + spec.output_names())
    renames = {
        v.name: v.name.split(":")[0]
        for v in [*model.graph.input, *model.graph.output]
        if v.name != v.name.split(":")[0] and v.name.split(":")[0] in wanted
    }
    if not renames:
        return
    for v in [*model.graph.input, *model.graph.output]:
        v.name = renames.get(v.name, v.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    onnx.save(model, str(path))


@converter(
    Format.TF_SAVEDMODEL.value,
    Format.TF_TRT,
    tools=("tensorrt", "tensorflow"),
    where="run it on a GPU node whose TensorFlow is built with TensorRT (e.g. NGC's TensorFlow image)",
    precisions=tuple(Precision),
    builds_engine=True,
)
def savedmodel_to_tftrt(
    saved: Path, out: Path, spec: IoSpec, options: ConversionOptions, sample: dict, data: CalibrationData | None = None
) -> dict:
    """TF-TRT's converter with dynamic shapes over the same profile as TensorRT's (engine_profile): engines built at
    its min, opt and max shapes plus one over the whole range (Range+Optimal), so any batch 1..max runs on TensorRT;
    INT8 calibrates on the same calibration set as onnx_to_tensorrt. Returns the profile and calibration."""
    import tensorflow as tf
    from tensorflow.python.compiler.tensorrt import trt_convert as trt

    modes = {
        Precision.FP32: trt.TrtPrecisionMode.FP32,
        Precision.FP16: trt.TrtPrecisionMode.FP16,
        Precision.INT8: trt.TrtPrecisionMode.INT8,
    }
    params = trt.TrtConversionParams(
        precision_mode=modes[options.precision],
        max_workspace_size_bytes=options.max_workspace_bytes,
        use_calibration=options.precision is Precision.INT8,
    )
    conv = trt.TrtGraphConverterV2(
        input_saved_model_dir=str(saved),
        conversion_params=params,
        use_dynamic_shape=True,
        dynamic_shape_profile_strategy="Range+Optimal",
    )
    profile = engine_profile(spec, options, sample)

    def tensors(arrays: dict[str, np.ndarray]) -> list:
        return [tf.constant(arrays[t.name]) for t in spec.inputs]  # the signature's inputs in the io spec's order

    calibration = CalibrationSet(spec, options, profile, data) if options.precision is Precision.INT8 else None
    conv.convert(calibration_input_fn=(lambda: (tensors(b) for b in calibration)) if calibration else None)
    shapes = [profile.shapes(which) for which in ("min", "opt", "max")]
    shapes = [s for i, s in enumerate(shapes) if s not in shapes[:i]]  # max_batch_size 1: one shape, built once
    conv.build(input_fn=lambda: (tensors(shaped_inputs(sample, spec, s)) for s in shapes))
    conv.save(str(out))
    return {"profile": profile.model_dump(), **({"calibration": calibration.record()} if calibration else {})}
