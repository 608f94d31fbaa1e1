"""Synthetic inputs and the checks of what a user says about a model file's inputs (--shape, --value-range): shared by
every model-file reader (tbench.core.model_file, tbench.core.pt2_files)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from tbench.core.errors import ConfigError
from tbench.core.iospec import _TRITON_DTYPES, IoSpec, TensorSpec

DEFAULT_DYNAMIC_DIM = 16  # the size a dynamic non-batch dim gets when the user names none
# the words synthetic strings are made of: common English, so a text model's vocabulary finds some of them
SYNTHETIC_WORDS = (
    "the a of and to in is it that was for on with as this movie film good bad great not very story time one "
    "like just plot best well even really people acting love characters could would see make ever only little"
).split()
SHAPE_FLAG = "--shape NAME:D1,D2,..."
RANGE_FLAG = "--value-range NAME:LO,HI"
# what a file's inputs are tried with when it declares no shapes, in order: a batch axis (two sizes), a batch fixed at
# 1 (a module that takes one sample), nothing (the --shape is the whole shape); the last two are served without a batch
# axis
PROBE_LEADS = (([2], [3]), ([1], [1]), ([], []))


def check_names(names: list[str], given: dict, flag: str) -> None:
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(
            f"{flag} names unknown input(s) {', '.join(unknown)}; the model's inputs are {', '.join(names)}"
        )


def check_ranges(spec: IoSpec, ranges: dict[str, list[float]]) -> None:
    """Each --value-range: two numbers LO <= HI that hold at least one value of the input's dtype."""
    check_names(spec.input_names(), ranges, "--value-range")
    dtypes = {t.name: t.np_dtype for t in spec.inputs}
    for name, bounds in ranges.items():
        given = f"--value-range {name}:{','.join(f'{b:g}' for b in bounds)}"
        if len(bounds) != 2 or not all(math.isfinite(b) for b in bounds) or bounds[0] > bounds[1]:
            raise ConfigError(f"{given} needs two finite numbers LO,HI with LO <= HI")
        if dtypes[name].kind == "O":  # a string input: words per string
            low, high = int_bounds(bounds)
            if low < 1 or low > high:
                raise ConfigError(f"{given}: a string input's range is its words per string, LO >= 1 and LO <= HI")
        elif dtypes[name].kind in "biu":
            low, high = int_bounds(bounds)
            limits = (
                (0, 1)
                if dtypes[name].kind == "b"
                else (int(np.iinfo(dtypes[name]).min), int(np.iinfo(dtypes[name]).max))
            )
            if low > high:
                raise ConfigError(f"{given} holds no integer, and {name} is {dtypes[name].name}")
            if low < limits[0] or high > limits[1]:
                raise ConfigError(f"{given} does not fit {name}'s {dtypes[name].name} ({limits[0]}..{limits[1]})")


def guessed_values_line(guessed: dict[str, str]) -> str:
    """The synthetic integers tbench chose for a model file's inputs, and the flag that chooses them: on the terminal
    before the first point and in the report's summary, beside the shapes it chose."""
    named = ", ".join(f"{name} {values}" for name, values in guessed.items())
    return f"integer inputs no --value-range sets are drawn from {named}; to choose: {RANGE_FLAG} or --input-data PATH"


def int_bounds(bounds: list[float]) -> tuple[int, int]:
    """An integer input's inclusive range from [LO, HI]: the integers within it."""
    return math.ceil(bounds[0]), math.floor(bounds[1])


def dims_text(shape: list[int]) -> str:
    return ",".join(str(d) for d in shape)


def tensor_spec(name: str, dtype: Any, shape: list[int], path: Path) -> TensorSpec:
    dtype_name = np.dtype(dtype).name
    if dtype_name not in _TRITON_DTYPES:
        raise ConfigError(
            f"tensor {name} of {path} has dtype {dtype_name}, which tbench cannot feed or read; "
            f"supported: {', '.join(_TRITON_DTYPES)}"
        )
    return TensorSpec(name=name, dtype=dtype_name, shape=shape)


def positive_shape(name: str, shape: list[int]) -> list[int]:
    if any(d == 0 or d < -1 for d in shape):
        raise ConfigError(f"--shape {name}:{dims_text(shape)} needs positive dims (or -1 for dynamic)")
    return list(shape)


def probe_dim(dim: int, grow: int) -> int:
    return DEFAULT_DYNAMIC_DIM + grow if dim == -1 else dim


def random_values(
    dtype: str, shape: list[int], rng: np.random.Generator, bounds: list[float] | None = None, int_high: int = 16
) -> np.ndarray:
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "O":  # strings: LO..HI words each (--value-range), 1..8 by default
        low, high = int_bounds(bounds) if bounds is not None else (1, 8)
        counts = rng.integers(low, high, shape, endpoint=True)
        words = rng.integers(0, len(SYNTHETIC_WORDS), int(counts.sum()))
        out, start = np.empty(shape, dtype=object), 0
        for index, count in np.ndenumerate(counts):
            out[index] = " ".join(SYNTHETIC_WORDS[w] for w in words[start : start + count])
            start += count
        return out
    if np_dtype.kind in "biu" and bounds is not None:
        low, high = int_bounds(bounds)
        return rng.integers(
            low, high, shape, dtype=np.int8 if np_dtype == np.bool_ else np_dtype, endpoint=True
        ).astype(np_dtype)
    if np_dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np_dtype.kind in "iu":
        high = min(int_high, int(np.iinfo(np_dtype).max) + 1)  # int_high may not fit a narrow dtype
        return rng.integers(0, high, shape, dtype=np_dtype)
    if bounds is not None:
        return rng.uniform(bounds[0], bounds[1], shape).astype(np_dtype)
    return rng.standard_normal(shape).astype(np_dtype)


def declared_inputs(
    what: str, names: list[str], shapes: dict, dtypes: dict, ranges: dict, order_hint: str = ""
) -> list[TensorSpec]:
    """The inputs of a file that declares no shapes (TorchScript, an AOTInductor package not made by tbench): the user's
    --shape and --dtype for each, checked, with their --value-range (before a probe draws its inputs from them)."""
    check_names(names, shapes, "--shape")
    check_names(names, dtypes, "--dtype")
    missing = [n for n in names if n not in shapes]
    if missing:
        raise ConfigError(
            f"{what} declares no input shapes: give {SHAPE_FLAG} (without the batch axis) "
            f"for {', '.join(missing)}{order_hint}"
        )
    inputs = [TensorSpec(name=n, dtype=dtypes.get(n, "float32"), shape=positive_shape(n, shapes[n])) for n in names]
    check_ranges(IoSpec(inputs=inputs, outputs=[]), ranges)
    return inputs


def probed_spec(inputs: list[TensorSpec], probe) -> tuple[IoSpec, bool, bool]:
    """(spec, batching, shapes_are_spec) from the first of PROBE_LEADS the model runs with; `probe(leads)` returns the
    outputs it gave, or raises ConfigError."""
    failed = None
    for leads in PROBE_LEADS:
        try:
            outputs = probe(leads)
        except ConfigError as err:
            failed = failed or err  # the batch axis' error is the one to show: it is what was expected
            continue
        batching = leads == PROBE_LEADS[0]
        served = inputs if batching else [t.model_copy(update={"shape": leads[0] + t.shape}) for t in inputs]
        return IoSpec(inputs=served, outputs=outputs), batching, True
    raise failed
