"""A user's own model file (`tbench run --model-file PATH`): its format, io spec and runtime.

Frameworks are imported inside functions: tensorflow alone takes seconds to import, and a
run on an ONNX file should not pay for it.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.core.iospec import _TRITON_DTYPES, IoSpec, TensorSpec
from tbench.core.onnx_graph import onnx_table_rows
from tbench.core.runtimes import cached, run_file
from tbench.core.synthetic import (  # noqa: F401 - the flags and defaults stay importable from here
    DEFAULT_DYNAMIC_DIM,
    PROBE_LEADS,
    RANGE_FLAG,
    SHAPE_FLAG,
    SYNTHETIC_WORDS,
    check_names,
    check_ranges,
    declared_inputs,
    dims_text,
    int_bounds,
    positive_shape,
    probe_dim,
    probed_spec,
    random_values,
    tensor_spec,
)

ACCEPTED = (
    "an .onnx file, a TensorFlow SavedModel directory (with saved_model.pb), a TorchScript archive (torch.jit.save) "
    "or an AOTInductor package (.pt2, torch._inductor.aoti_compile_and_package)"
)
TS_IO_SPEC = "io_spec.json"  # optional extra file of a TorchScript archive holding IoSpec JSON


class ModelFile(BaseModel):
    path: str  # the file, or the address of the server that serves the model
    format: Format | None  # None: a served model, known by its io spec only
    io_spec: IoSpec  # shapes exclude the batch axis when `batching`, else they are the full shapes
    input_shapes: dict[str, list[int]]  # concrete non-batch shape per input: synthetic data, perf_analyzer --shape
    batching: bool  # dim 0 of every input and output is dynamic
    int_high: int  # integer inputs are drawn from [0, int_high) unless a range below says otherwise
    value_ranges: dict[str, list[float]] = {}  # the user's [LO, HI] per input (--value-range): synthetic data in it
    table_rows: dict[str, int] = {}  # ONNX: rows of the embedding table(s) an integer input indexes (the fewest)
    dim_names: dict[str, list[str]] = {}  # ONNX: each input's non-batch dims' names ("" for none): shared sizes


# ---------------------------------------------------------------- format


def detect_format(path: Path) -> Format:
    path = Path(path)
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return Format.TF_SAVEDMODEL
        raise ConfigError(f"model file {path} is a directory without saved_model.pb; expected {ACCEPTED}")
    if not path.is_file():
        raise ConfigError(f"model file {path} does not exist; expected {ACCEPTED}")
    if path.suffix.lower() == ".onnx":
        return Format.ONNX
    if path.suffix.lower() in (".keras", ".h5"):
        raise ConfigError(
            f"model file {path} is a Keras file; Triton serves SavedModels: "
            "export one with model.export(DIR) and pass DIR"
        )
    if zipfile.is_zipfile(path):
        return _zip_format(path)
    if _is_onnx_protobuf(path):
        return Format.ONNX
    raise ConfigError(f"model file {path} is not a model tbench can read; expected {ACCEPTED}")


def _zip_format(path: Path) -> Format:
    from tbench.core.pt2_files import is_pt2

    if is_pt2(path):
        return Format.PT2
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    # TorchScript archives carry compiled code; torch.save checkpoints only pickled tensors.
    if any("/code/" in n or n.endswith("/constants.pkl") for n in names):
        return Format.TS_SCRIPT
    if any(n.endswith("data.pkl") for n in names):
        raise ConfigError(
            f"model file {path} is a torch.save checkpoint, not TorchScript; "
            "save it with torch.jit.save(torch.jit.script(model), PATH)"
        )
    raise ConfigError(f"model file {path} is a zip archive but not TorchScript; expected {ACCEPTED}")


def _is_onnx_protobuf(path: Path) -> bool:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return False
    # Protobuf parses many byte strings as unknown fields; a real model has a version and a graph.
    return model.ir_version > 0 and len(model.graph.node) > 0


# ---------------------------------------------------------------- reading


def read_model_file(
    path: Path | str,
    shapes: dict[str, list[int]] | None = None,
    dtypes: dict[str, str] | None = None,
    int_high: int = 16,
    value_ranges: dict[str, list[float]] | None = None,
) -> ModelFile:
    path = Path(path).resolve()
    fmt = detect_format(path)
    shapes = {name: [int(d) for d in dims] for name, dims in (shapes or {}).items()}
    dtypes = {name: _dtype_name(value, f"--dtype {name}") for name, value in (dtypes or {}).items()}
    if int_high < 1:
        raise ConfigError(f"int_high must be at least 1, got {int_high}")
    ranges = {name: list(bounds) for name, bounds in (value_ranges or {}).items()}
    table_rows: dict[str, int] = {}
    if fmt is Format.TS_SCRIPT:
        spec, batching, shapes_are_spec = _read_torchscript(path, shapes, dtypes, int_high, ranges)
    elif fmt is Format.PT2:
        from tbench.core.pt2_files import read_pt2

        spec, batching, shapes_are_spec = read_pt2(path, shapes, dtypes, int_high, ranges)
    elif fmt is Format.ONNX:
        spec, batching, table_rows = _read_onnx(path)
        shapes_are_spec = False
    else:
        spec, batching = _read_savedmodel(path)
        shapes_are_spec = False
    check_names(spec.input_names(), dtypes, "--dtype")
    _check_dtypes(spec, dtypes, path)
    overrides = {} if shapes_are_spec else shapes  # then their -1 dims get the default like any dynamic dim
    return described_model(str(path), fmt, spec, batching, overrides, ranges, int_high, table_rows)


def described_model(
    path: str,
    fmt: Format | None,
    spec: IoSpec,
    batching: bool,
    shapes: dict[str, list[int]] | None = None,
    value_ranges: dict[str, list[float]] | None = None,
    int_high: int = 16,
    table_rows: dict[str, int] | None = None,
) -> ModelFile:
    """A model known by its io spec (read from a file, or from the server that serves it), with the user's --shape
    and --value-range checked against it and every dynamic dim given a size."""
    shapes = {name: [int(d) for d in dims] for name, dims in (shapes or {}).items()}
    ranges = {name: list(bounds) for name, bounds in (value_ranges or {}).items()}
    check_names(spec.input_names(), shapes, "--shape")
    check_ranges(spec, ranges)
    return ModelFile(
        path=path,
        format=fmt,
        io_spec=spec,
        input_shapes={t.name: _fill_shape(t, shapes.get(t.name)) for t in spec.inputs},
        batching=batching,
        int_high=int_high,
        value_ranges=ranges,
        table_rows=table_rows or {},
    )


def _dtype_name(value: str, what: str) -> str:
    try:
        name = np.dtype(value).name
    except TypeError:
        name = str(value)
    if name not in _TRITON_DTYPES:
        raise ConfigError(f"{what}: dtype {value!r} is not supported; known: {', '.join(_TRITON_DTYPES)}")
    return name


def _check_dtypes(spec: IoSpec, dtypes: dict[str, str], path: Path) -> None:
    for t in spec.inputs:
        if t.name in dtypes and dtypes[t.name] != t.dtype:
            raise ConfigError(f"--dtype {t.name}:{dtypes[t.name]} contradicts {path}, which declares {t.dtype}")


def _fill_shape(spec: TensorSpec, override: list[int] | None) -> list[int]:
    """The concrete shape of one input: the user's override, checked against the declared dims."""
    if override is None:
        return [DEFAULT_DYNAMIC_DIM if d == -1 else d for d in spec.shape]
    fits = len(override) == len(spec.shape) and all(o > 0 and (d == -1 or d == o) for d, o in zip(spec.shape, override))
    if not fits:
        raise ConfigError(
            f"--shape {spec.name}:{dims_text(override)} does not fit the model's shape {dims_text(spec.shape)} "
            f"for {spec.name} (-1 is dynamic; rank and static dims must match)"
        )
    return list(override)


def _split_batch(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> tuple[IoSpec, bool]:
    """Strips axis 0 when it is dynamic everywhere: Triton then owns it as the batch axis."""
    tensors = inputs + outputs
    batching = all(t.shape and t.shape[0] == -1 for t in tensors)
    if batching:
        for t in tensors:
            t.shape = t.shape[1:]
    return IoSpec(inputs=inputs, outputs=outputs), batching


# ---------------------------------------------------------------- ONNX


def _read_onnx(path: Path) -> tuple[IoSpec, bool, dict[str, int]]:
    """(spec, batching, the embedding-table rows each integer input indexes)."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph  # weights are not needed for the spec
    except Exception as err:
        raise ConfigError(f"cannot read ONNX model {path}: {_last_line(err)}") from None
    initializers = {i.name for i in graph.initializer}  # old exporters list weights as graph inputs
    inputs = [_onnx_tensor(v, path) for v in graph.input if v.name not in initializers]
    outputs = [_onnx_tensor(v, path) for v in graph.output]
    if not graph.node or not outputs:  # an empty file parses as an empty model: nothing to serve
        raise ConfigError(f"ONNX model {path} holds no graph (is the file empty or cut short?)")
    rows = onnx_table_rows(graph, [t.name for t in inputs if np.dtype(t.dtype).kind in "iu"])
    return *_split_batch(inputs, outputs), rows


# ONNX element types tbench cannot generate, send or compare, with the fix a user can make in the export
_CAST_INSIDE = "export it with float16 or float32 at the model's edge (cast inside the model)"
_UNFED_ONNX_TYPES = {
    16: f"is bfloat16, which numpy cannot hold and perf_analyzer takes only as raw bytes: {_CAST_INSIDE}",  # BFLOAT16
    **{t: f"is an 8-bit float, which numpy cannot hold: {_CAST_INSIDE}" for t in (17, 18, 19, 20)},  # FLOAT8*
    **{t: "is a complex tensor, which Triton has no type for" for t in (14, 15)},  # COMPLEX64, COMPLEX128
}


def _onnx_tensor(value: Any, path: Path) -> TensorSpec:
    from onnx.helper import tensor_dtype_to_np_dtype

    kind = value.type.WhichOneof("value")
    if kind == "sequence_type" and value.type.sequence_type.elem_type.WhichOneof("value") == "map_type":
        raise ConfigError(
            f"ONNX output {value.name} of {path} is a sequence of maps (skl2onnx's ZipMap), not a tensor: export the "
            "classifier with options={'zipmap': False} to get its probabilities as a tensor"
        )
    if kind != "tensor_type":
        raise ConfigError(
            f"ONNX value {value.name} of {path} is a {kind.removesuffix('_type') if kind else 'value of no type'}, "
            "not a tensor: Triton serves tensors only (export it as one)"
        )
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise ConfigError(f"ONNX tensor {value.name} of {path} has no declared rank")
    shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
    if tensor_type.elem_type in _UNFED_ONNX_TYPES:  # numpy has no such dtype (bf16, fp8) or holds it as objects
        raise ConfigError(f"ONNX tensor {value.name} of {path} {_UNFED_ONNX_TYPES[tensor_type.elem_type]}")
    try:
        dtype = tensor_dtype_to_np_dtype(tensor_type.elem_type)
    except KeyError:
        raise ConfigError(f"ONNX tensor {value.name} of {path} has an unknown element type") from None
    return tensor_spec(value.name, dtype, shape, path)


# ---------------------------------------------------------------- TF SavedModel


def _read_savedmodel(path: Path) -> tuple[IoSpec, bool]:
    signature = _savedmodel_signature(path)
    _, kwargs = signature.structured_input_signature
    outputs = signature.structured_outputs
    if not isinstance(outputs, dict):
        raise ConfigError(f"serving_default of {path} does not return a dict of named tensors")
    # The dict KEYS are the signature names Triton's tensorflow backend binds to, not spec.name.
    return _split_batch(
        [_tf_tensor(k, s, path) for k, s in kwargs.items()], [_tf_tensor(k, s, path) for k, s in outputs.items()]
    )


def _tf_tensor(name: str, spec: Any, path: Path) -> TensorSpec:
    if spec.shape.rank is None:
        raise ConfigError(f"signature tensor {name} of {path} has no declared rank")
    shape = [-1 if d is None else int(d) for d in spec.shape.as_list()]
    return tensor_spec(name, spec.dtype.as_numpy_dtype, shape, path)


def _savedmodel_signature(path: Path) -> Any:
    loaded = cached("tf", path, lambda: _load_savedmodel(path))
    if "serving_default" not in loaded.signatures:
        known = ", ".join(loaded.signatures) or "none"
        raise ConfigError(
            f"SavedModel {path} has no serving_default signature (signatures: {known}); "
            "save it with tf.saved_model.save(obj, PATH, signatures=obj.__call__) or keras model.export(PATH)"
        )
    return loaded.signatures["serving_default"]


def _load_savedmodel(path: Path) -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's banner out of the CLI output
    import tensorflow as tf

    try:
        return tf.saved_model.load(str(path))  # the cache keeps it alive: signatures need its variables
    except Exception as err:
        raise ConfigError(f"cannot load SavedModel {path}: {_last_line(err)}") from None


# ---------------------------------------------------------------- TorchScript


def _read_torchscript(
    path: Path,
    shapes: dict[str, list[int]],
    dtypes: dict[str, str],
    int_high: int,
    ranges: dict[str, list[float]],
) -> tuple[IoSpec, bool, bool]:
    """(spec, batching, shapes_are_spec): without io_spec.json the user's --shape values declare the inputs."""
    module, extra = _torchscript(path)
    if extra:
        try:
            spec = IoSpec.model_validate_json(extra)
        except ValidationError as err:
            raise ConfigError(f"{TS_IO_SPEC} in {path} is not a valid io spec: {_last_line(err)}") from None
        for t in spec.inputs + spec.outputs:
            _dtype_name(t.dtype, f"{TS_IO_SPEC} tensor {t.name}")
        return spec, True, False
    names = _forward_inputs(module, path, shapes)
    inputs = declared_inputs(f"TorchScript {path}", names, shapes, dtypes, ranges)
    return probed_spec(inputs, lambda leads: _probe_outputs(module, inputs, path, int_high, ranges, leads))


def _torchscript(path: Path) -> tuple[Any, str]:
    """The loaded module and the text of its io_spec.json extra file ("" when it has none)."""
    return cached("torchscript+extra", path, lambda: _load_torchscript(path))


def _load_torchscript(path: Path) -> tuple[Any, str]:
    import torch

    extra = {TS_IO_SPEC: ""}
    try:
        module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    except Exception as err:
        raise ConfigError(f"cannot load TorchScript {path}: {_last_line(err)}") from None
    module.eval()
    text = extra[TS_IO_SPEC]
    return module, text.decode() if isinstance(text, bytes) else text


def _forward_inputs(module: Any, path: Path, shapes: dict[str, list[int]]) -> list[str]:
    """forward's tensor arguments: required ones always, defaulted ones only when the user shapes them."""
    import torch

    names = []
    for arg in module.forward.schema.arguments[1:]:  # [0] is self
        wanted = not arg.has_default_value() or arg.name in shapes
        if wanted and not isinstance(arg.type, torch.TensorType):
            raise ConfigError(f"forward argument {arg.name} of {path} is {arg.type}; only tensor inputs can be fed")
        if wanted:
            names.append(arg.name)
    return names


def _probe_outputs(
    module: Any,
    inputs: list[TensorSpec],
    path: Path,
    int_high: int,
    ranges: dict[str, list[float]],
    leads: tuple[list[int], list[int]] = PROBE_LEADS[0],
) -> list[TensorSpec]:
    """Output count, dtypes and shapes, from two runs with the inputs' `leads` put before their shapes; dims that move
    with the inputs are dynamic. With a batch axis (two batch sizes) the outputs must keep it on axis 0, and their
    shapes are given without it; otherwise whole."""
    runs = []
    for grow, lead in enumerate(leads):
        feeds = {
            t.name: random_values(
                t.dtype,
                lead + [probe_dim(d, grow) for d in t.shape],
                np.random.default_rng(grow),
                ranges.get(t.name),
                int_high,
            )
            for t in inputs
        }
        runs.append(_run_torchscript_module(module, inputs, feeds, path))
    first, second = runs
    batching = leads[0] != leads[1]
    outputs = []
    for i, (a, b) in enumerate(zip(first, second)):
        if batching and (a.ndim == 0 or a.shape[0] != leads[0][0] or b.shape[0] != leads[1][0]):
            raise ConfigError(
                f"output {i} of TorchScript {path} does not keep the batch on axis 0 "
                f"(shapes {list(a.shape)} at batch {leads[0][0]}, {list(b.shape)} at batch {leads[1][0]})"
            )
        skip = 1 if batching else 0
        shape = [da if da == db else -1 for da, db in zip(a.shape[skip:], b.shape[skip:])]
        outputs.append(tensor_spec(f"output__{i}", a.dtype, shape, path))
    return outputs


def _run_torchscript_module(module: Any, inputs: list[TensorSpec], feeds: dict, path: Path) -> list[np.ndarray]:
    try:
        return _torchscript_outputs(module, [feeds[t.name] for t in inputs])
    except ConfigError:
        raise
    except Exception as err:
        shapes = ", ".join(f"{n}:{dims_text(list(a.shape))}" for n, a in feeds.items())
        ints = [t.name for t in inputs if t.np_dtype.kind in "iu"]
        ranges = f" and, for the integers of {', '.join(ints)}, {RANGE_FLAG}" if ints else ""
        raise ConfigError(
            f"TorchScript {path} failed on synthetic inputs ({shapes}, batch axis included): "
            f"{_last_line(err)}; check {SHAPE_FLAG}, --dtype{ranges}"
        ) from None


def _torchscript_outputs(module: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
    import torch

    with torch.inference_mode():
        result = module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if not all(isinstance(r, torch.Tensor) for r in results):
        raise ConfigError("TorchScript forward must return a tensor or a tuple/list of tensors")
    return [r.detach().cpu().numpy() for r in results]


# ---------------------------------------------------------------- data and runtime


def synthetic_inputs(mf: ModelFile, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Integers in the input's --value-range (inclusive), else below its embedding table's rows (ONNX), else in
    [0, int_high); floats uniform in the --value-range, else standard normal; booleans either value."""
    rng = np.random.default_rng(seed)
    lead = [batch_size] if mf.batching else []
    return {
        t.name: random_values(t.dtype, lead + mf.input_shapes[t.name], rng, synthetic_range(mf, t.name), mf.int_high)
        for t in mf.io_spec.inputs
    }


def synthetic_range(mf: ModelFile, name: str) -> list[float] | None:
    """The [LO, HI] synthetic values of an input are drawn from: the user's, else the embedding table's 0..rows-1,
    else 1 for an integer mask; None: the default (integers in [0, int_high), floats standard normal)."""
    if name in mf.value_ranges:
        return mf.value_ranges[name]
    if name in mf.table_rows:
        return [0, mf.table_rows[name] - 1]
    if is_integer_mask(mf, name):
        return [1, 1]
    return None


def is_integer_mask(mf: ModelFile, name: str) -> bool:
    """An integer input named as a mask (attention_mask, input_mask): 1 keeps a position in exporters' convention
    (Hugging Face's), so all ones is an unpadded batch; the default 0..15 would be no mask a tokenizer makes."""
    spec = next((t for t in mf.io_spec.inputs if t.name == name), None)
    return spec is not None and spec.np_dtype.kind in "iu" and name.lower().endswith("mask")


def chosen_values(mf: ModelFile) -> dict[str, str]:
    """The synthetic integers of the inputs no --value-range sets, as 'LO..HI (why)': the figures hold for those values
    (an embedding's ids, a mask), so a run says which it sent, as it says the shapes it chose."""
    chosen = {}
    for t in mf.io_spec.inputs:
        if t.np_dtype.kind not in "iu" or t.name in mf.value_ranges:
            continue
        why = (
            "the rows of the table it indexes"
            if t.name in mf.table_rows
            else "a mask: every position kept"
            if is_integer_mask(mf, t.name)
            else "the default"
        )
        chosen[t.name] = f"{describe_range(mf, t)} ({why})"
    return chosen


def describe_range(mf: ModelFile, t: TensorSpec) -> str:
    """An integer input's synthetic values as 'LO..HI'."""
    bounds = synthetic_range(mf, t.name)
    if bounds is None:
        return f"0..{min(mf.int_high, int(np.iinfo(t.np_dtype).max) + 1) - 1}"
    low, high = int_bounds(bounds)
    return str(low) if low == high else f"{low}..{high}"


def run_model_file(mf: ModelFile, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model file run by its own framework: the reference Triton's answers are checked against."""
    return run_file(mf.format, mf.path, mf.io_spec, inputs)


def _last_line(err: BaseException) -> str:
    """Framework errors span many lines (TorchScript tracebacks); the cause is on the last one."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
