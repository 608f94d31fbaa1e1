"""TensorRT's optimisation profile (min/opt/max shape per input) from a model's io spec, the run's batch grid and the
user's ranges for dynamic dims; and the INT8 calibration set, delivered in batches of the profile's opt shape. Pure
functions: the TensorRT and TF-TRT builders (tasks/export.py) read them, and tests check them without TensorRT.

Batch axis: min 1 (Triton's dynamic batcher, the online scenario and a last partial batch send any size from 1), opt
= `opt_batch_size` of the grid, max = max_batch_size. Dynamic non-batch dims: the sample's size for min, opt and max
unless `--trt-shape NAME:MIN,OPT,MAX` gives the input's non-batch shapes, dims joined by 'x' (static dims as the io
spec has them): `--trt-shape input_ids:16,128,512`, `--trt-shape mel:80x16,80x400,80x1000`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from pydantic import BaseModel

from tbench.core.errors import ConfigError, ConversionError
from tbench.core.iospec import IoSpec, TensorSpec

DEFAULT_CALIBRATION_SAMPLES = 512
# Calibration draws samples of its own (correctness seeds 7, accuracy 2024); given input data starts from its first.
CALIBRATION_SEED = 99


class InputProfile(BaseModel):
    """One input's shapes, batch axis first."""

    name: str
    min: list[int]
    opt: list[int]
    max: list[int]


class TrtProfile(BaseModel):
    inputs: list[InputProfile]

    @property
    def opt_batch(self) -> int:
        return self.inputs[0].opt[0] if self.inputs else 1

    @property
    def max_batch(self) -> int:
        return self.inputs[0].max[0] if self.inputs else 1

    def shapes(self, which: str) -> dict[str, list[int]]:
        """'min', 'opt' or 'max' shape per input."""
        return {p.name: list(getattr(p, which)) for p in self.inputs}


def opt_batch_size(batch_sizes: Sequence[int], max_batch_size: int) -> int:
    """The batch TensorRT tunes its kernels for: the largest batch of the run's grid at most half of max_batch_size
    (the middle of the range the dynamic batcher fills, so small and large batches both run near their best; the max
    itself stays valid), or half of max_batch_size when the grid has none."""
    half = max(1, max_batch_size // 2)
    fitting = [b for b in batch_sizes if 1 <= b <= half]
    return max(fitting) if fitting else half


def default_calibration_samples(opt_batch: int) -> int:
    """512 samples, or one calibration batch where the opt batch is larger (recommenders batch thousands)."""
    return max(DEFAULT_CALIBRATION_SAMPLES, opt_batch)


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "(scalar)"


def check_trt_shapes(spec: IoSpec, shapes: dict[str, list[list[int]]] | None) -> None:
    """Refuse, in one line, a range that names no input, a static input, a shape of the wrong rank, a static dim
    that differs from the io spec's, or dims not 1 <= MIN <= OPT <= MAX."""
    by_name = {t.name: t for t in spec.inputs}
    for name, given in (shapes or {}).items():
        t = by_name.get(name)
        if t is None:
            raise ConfigError(f"--trt-shape {name}: no such input; the inputs are {', '.join(by_name)}")
        if -1 not in t.shape:
            raise ConfigError(
                f"--trt-shape {name}: the input has no dynamic dim (shape {_dims(t.shape)}); its profile is its shape"
            )
        if len(given) != 3:
            raise ConfigError(f"--trt-shape {name}: give three shapes, MIN,OPT,MAX (got {len(given)})")
        for shape in given:
            if len(shape) != len(t.shape):
                raise ConfigError(
                    f"--trt-shape {name}: {_dims(shape)} has {len(shape)} dims; the input's non-batch "
                    f"shape {_dims(t.shape)} (-1: dynamic) has {len(t.shape)}"
                )
        for axis, (d, lo, mid, hi) in enumerate(zip(t.shape, *given), start=1):
            if d != -1 and (lo, mid, hi) != (d, d, d):
                raise ConfigError(f"--trt-shape {name}: axis {axis} is static ({d}); give {d} in MIN, OPT and MAX")
            if not 1 <= lo <= mid <= hi:
                raise ConfigError(f"--trt-shape {name}: axis {axis} needs 1 <= MIN <= OPT <= MAX, got {lo},{mid},{hi}")


def optimisation_profile(
    spec: IoSpec,
    sample_shapes: dict[str, Sequence[int]],
    max_batch_size: int,
    opt_batch: int,
    shapes: dict[str, list[list[int]]] | None = None,
) -> TrtProfile:
    """Min/opt/max shape per input: batch 1 / opt_batch / max_batch_size; non-batch dims from `shapes` (non-batch
    MIN, OPT, MAX per input) where given, else static dims as the io spec has them and dynamic ones pinned to the
    sample's size (`sample_shapes`: non-batch shape per input)."""
    check_trt_shapes(spec, shapes)
    if not 1 <= opt_batch <= max_batch_size:
        raise ConfigError(
            f"the TensorRT profile needs 1 <= opt batch <= max batch, got {opt_batch} and {max_batch_size}"
        )
    inputs = []
    for t in spec.inputs:
        if shapes and t.name in shapes:
            lo, mid, hi = shapes[t.name]
        else:
            lo = mid = hi = [d if d != -1 else max(1, int(s)) for d, s in zip(t.shape, sample_shapes[t.name])]
        inputs.append(InputProfile(name=t.name, min=[1, *lo], opt=[opt_batch, *mid], max=[max_batch_size, *hi]))
    return TrtProfile(inputs=inputs)


def check_calibration_samples(n_samples: int, opt_batch: int) -> None:
    if n_samples < opt_batch:
        raise ConfigError(
            f"a calibration set of {n_samples} samples is less than one calibration batch ({opt_batch}, "
            f"the TensorRT profile's opt batch); give --calibration-samples {opt_batch} or more"
        )


def fit(value: np.ndarray, t: TensorSpec, shape: Sequence[int]) -> np.ndarray:
    """Samples (axis 0) in the io spec's dtype with each dynamic dim at `shape`'s size (non-batch): a longer dim is
    cut, a shorter one padded with zeros (a sequence model's padding). A static dim must already match."""
    value = np.asarray(value)
    if value.ndim != len(shape) + 1:
        raise ConversionError(
            f"calibration data for {t.name} has shape {value.shape}; the input has {len(shape)} non-batch dims"
        )
    for axis, (d, want) in enumerate(zip(t.shape, shape), start=1):
        have = value.shape[axis]
        if d != -1 and have != d:
            raise ConversionError(
                f"calibration data for {t.name} has {have} on axis {axis}, which the io spec fixes at {d}"
            )
        if have > want:
            value = np.take(value, np.arange(want), axis=axis)
        elif have < want:
            pad = [(0, 0)] * value.ndim
            pad[axis] = (0, want - have)
            value = np.pad(value, pad)
    return np.ascontiguousarray(value, dtype=t.np_dtype)


def calibration_batches(
    source: Iterable[dict[str, np.ndarray]], spec: IoSpec, profile: TrtProfile, n_samples: int
) -> Iterator[dict[str, np.ndarray]]:
    """The calibration set, `n_samples` // opt batch batches of exactly the profile's opt shape per input (batch axis
    = opt batch; dynamic dims fitted by `fit`), in the io spec's dtypes. Samples are taken from `source` (dicts of
    arrays, samples on axis 0, batched any way) in its order; the remainder short of a whole batch is dropped, and
    the batches stop early where the source ends (the adapter's data cycles given input data, so it does not)."""
    batch, opt = profile.opt_batch, profile.shapes("opt")
    wanted, made = n_samples // batch, 0
    pending: dict[str, list[np.ndarray]] = {t.name: [] for t in spec.inputs}
    held = 0
    if wanted < 1:
        return
    for chunk in source:
        for t in spec.inputs:
            pending[t.name].append(fit(chunk[t.name], t, opt[t.name][1:]))
        held += len(pending[spec.inputs[0].name][-1])
        while held >= batch:
            joined = {name: np.concatenate(parts) for name, parts in pending.items()}
            yield {name: np.ascontiguousarray(v[:batch]) for name, v in joined.items()}
            made += 1
            if made == wanted:
                return
            pending = {name: [v[batch:]] for name, v in joined.items()}
            held -= batch


def shaped_inputs(sample: dict[str, np.ndarray], spec: IoSpec, shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """The sample at full shapes (batch axis first): its rows repeated in order up to the batch, dynamic dims fitted
    by `fit`. For builders that need inputs of a profile's shapes (TF-TRT's build), not for calibration."""
    out = {}
    for t in spec.inputs:
        rows = np.asarray(sample[t.name])
        shape = shapes[t.name]
        out[t.name] = fit(np.take(rows, np.arange(shape[0]) % len(rows), axis=0), t, shape[1:])
    return out


def describe(profile: TrtProfile) -> list[str]:
    """One line per input, for the conversion log: `name: min 1x3x224x224, opt ..., max ...`."""
    return [f"{p.name}: min {_dims(p.min)}, opt {_dims(p.opt)}, max {_dims(p.max)}" for p in profile.inputs]
