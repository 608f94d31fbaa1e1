"""A user's own input samples (`--input-data PATH`): read, checked against the model's io spec, and handed out in
batches that cycle through them, so correctness, accuracy and perf_analyzer all send the same real samples.

Three forms, each holding every model input with the samples on the first axis:
- perf_analyzer's JSON input data: {"data": [{"NAME": [...flat values...]} or {"NAME": {"content": [...] or
  {"b64": "..."}, "shape": [...]}} or {"NAME": {"b64": "..."}}, ...]}, one entry per sample (a batch-1 request),
  shapes without the batch axis; "validation_data" is ignored, sequence streams are read one after the other;
- an .npz file with one array per input;
- a folder of NAME.npy files, one per input.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec

FORMS = "a perf_analyzer JSON file, an .npz file or a folder of NAME.npy files"


class InputSamples:
    """The samples of every input, stacked on axis 0 (or, where their shapes vary, a list of them: each request is then
    sent at its own shape, as real traffic is); batches cycle through them from the first sample."""

    def __init__(self, path: str, arrays: dict[str, np.ndarray | list[np.ndarray]]):
        self.path, self.arrays = str(path), arrays
        self.count = len(next(iter(arrays.values())))

    @property
    def varying(self) -> bool:
        """The samples of some input differ in shape (a text model's lengths)."""
        return any(isinstance(a, list) for a in self.arrays.values())

    def shapes(self) -> dict[str, list[int]]:
        """The non-batch shape of each input: the one every sample has, or where they vary the largest sample's (what
        warm-up sends and perf_analyzer's --shape names; each request still carries its own)."""
        return {
            name: list(max(a, key=np.size).shape if isinstance(a, list) else a.shape[1:])
            for name, a in self.arrays.items()
        }

    def distribution(self, sent: Sequence[int] | None = None) -> dict[str, str]:
        """Per input whose samples vary in shape: their range and median per dim, e.g. '[12..96] (median [50]) over 32
        samples', over the samples `sent` (indices) where perf_analyzer was given only those, saying so."""
        described = {}
        chosen = range(self.count) if sent is None else sent
        of = f" of the {self.count} given, spread over them" if len(chosen) < self.count else ""
        for name, a in self.arrays.items():
            if isinstance(a, list):
                dims = np.array([a[i].shape for i in chosen])
                spans = [f"{lo}..{hi}" if lo != hi else f"{lo}" for lo, hi in zip(dims.min(0), dims.max(0))]
                median = ",".join(f"{m:g}" for m in np.median(dims, axis=0))
                described[name] = f"[{','.join(spans)}] (median [{median}]) over {len(chosen)} samples{of}"
        return described

    def digest(self) -> str:
        """sha256 of the samples' contents (names, dtypes, shapes, values), whichever file form they came in."""
        h = hashlib.sha256()
        for name in sorted(self.arrays):
            a = self.arrays[name]
            for sample in a if isinstance(a, list) else [a]:
                h.update(f"{name}:{sample.dtype.str}:{sample.shape};".encode())
                h.update(np.ascontiguousarray(sample).tobytes())
        return h.hexdigest()

    def spread(self, wanted: int) -> list[int]:
        """`wanted` sample indices spread over all the samples, in an order whose every prefix spans them too (the
        first, the last, the middle, the quarters...): a prefix of the user's file (often sorted by length) would
        measure its shortest samples only, and perf_analyzer may be sent only the first few of these."""
        order: list[int] = []
        seen: set[int] = set()
        parts = 1
        while len(order) < min(wanted, self.count):
            for i in np.linspace(0, self.count - 1, parts + 1).round().astype(int).tolist():
                if i not in seen and len(order) < wanted:
                    seen.add(i)
                    order.append(i)
            parts *= 2
        return order

    def one(self, i: int) -> dict[str, np.ndarray]:
        """Sample i (cycling), without the stacking axis: one request's row, or the whole request of a model without a
        batch axis."""
        return {name: a[i % self.count] for name, a in self.arrays.items()}

    def take(self, start: int, n: int) -> dict[str, np.ndarray]:
        index = np.arange(start, start + n) % self.count
        return {
            name: np.stack([a[i] for i in index]) if isinstance(a, list) else a[index]
            for name, a in self.arrays.items()
        }

    def batches(self, n_samples: int, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """`n_samples` samples from the first, in batches of at most `batch_size`; where shapes vary, a batch holds
        consecutive samples of one shape (a request carries one shape), so it may be smaller."""
        start, end = 0, n_samples
        while start < end:
            n = min(batch_size, end - start)
            if self.varying:
                first = self._shapes_of(start)
                n = next((k for k in range(1, n) if self._shapes_of(start + k) != first), n)
            yield self.take(start, n)
            start += n

    def _shapes_of(self, i: int) -> tuple:
        return tuple(a.shape for a in self.one(i).values())


def load_input_data(
    path: str | Path, spec: IoSpec, default_shapes: Callable[[], dict[str, list[int]]] | None = None
) -> InputSamples:
    """Read and check `path`: every model input present, values castable to its dtype, its non-batch shape the io
    spec's (dynamic dims free). `default_shapes` gives the shape of JSON samples that carry only their values and
    whose input has several dynamic dims (perf_analyzer's --shape), as perf_analyzer would."""
    p = Path(path)
    where = f"--input-data {path}"
    if p.is_dir():
        raw = _read_npy_folder(p, where)
    elif not p.is_file():
        raise ConfigError(f"{where} does not exist; give {FORMS}")
    elif p.suffix.lower() == ".npz" or zipfile.is_zipfile(p):
        raw = _read_npz(p, where)
    else:
        raw = _read_json(p, spec, where, default_shapes)
    names = spec.input_names()
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(
            f"{where} names unknown input(s) {', '.join(unknown)}; the model's inputs are {', '.join(names)}"
        )
    missing = [n for n in names if n not in raw]
    if missing:
        raise ConfigError(f"{where} lacks input(s) {', '.join(missing)}; the model's inputs are {', '.join(names)}")
    arrays = {
        t.name: [_checked(v[None], t, where)[0] for v in raw[t.name]]
        if isinstance(raw[t.name], list)
        else _checked(raw[t.name], t, where)
        for t in spec.inputs
    }
    counts = {name: len(a) for name, a in arrays.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise ConfigError(
            f"{where}: the inputs hold different numbers of samples ({listed}); give the same number for each"
        )
    if not next(iter(counts.values()), 0):
        raise ConfigError(f"{where} holds no samples")
    return InputSamples(str(path), arrays)


# ---------------------------------------------------------------- numpy forms


def _read_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except Exception as err:
        raise ConfigError(f"{where} is not a readable .npz file: {_line(err)}") from None


def _read_npy_folder(path: Path, where: str) -> dict[str, np.ndarray]:
    files = sorted(path.glob("*.npy"))
    if not files:
        raise ConfigError(f"{where} is a folder without NAME.npy files; give {FORMS}")
    arrays = {}
    for f in files:
        try:
            arrays[f.stem] = np.load(f, allow_pickle=False)
        except Exception as err:
            raise ConfigError(f"{where}: {f.name} is not a readable .npy file: {_line(err)}") from None
    return arrays


# ---------------------------------------------------------------- perf_analyzer JSON


def _read_json(
    path: Path, spec: IoSpec, where: str, default_shapes: Callable[[], dict[str, list[int]]] | None
) -> dict[str, np.ndarray]:
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{where} is neither JSON nor .npz ({_line(err)}); give {FORMS}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(
            f'{where} is not perf_analyzer input data: it needs a "data" list of samples, '
            '{"data": [{"NAME": [values...]}, ...]}'
        )
    # sequence models' streams (a list of lists) are read one after the other
    entries = [e for item in entries for e in (item if isinstance(item, list) else [item])]
    tensors = {t.name: t for t in spec.inputs}
    defaults: dict[str, list[int]] | None = None
    samples: dict[str, list[np.ndarray]] = {name: [] for name in tensors}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f'{where}: sample {i} of "data" is not an object of input names')
        unknown = sorted(set(entry) - set(tensors))
        if unknown:
            raise ConfigError(
                f"{where} names unknown input(s) {', '.join(unknown)}; the model's inputs are {', '.join(tensors)}"
            )
        missing = [n for n in tensors if n not in entry]
        if missing:
            raise ConfigError(
                f"{where}: sample {i} lacks input(s) {', '.join(missing)}; every sample needs every "
                f"input ({', '.join(tensors)})"
            )
        for name, value in entry.items():
            t, what = tensors[name], f"{where}: sample {i} of {name}"
            flat, shape = _json_value(value, t, what)
            if shape is None:
                if defaults is None and default_shapes is not None and sum(d == -1 for d in t.shape) > 1:
                    defaults = default_shapes()
                shape = _implied_shape(flat.size, t, (defaults or {}).get(name), what)
            if int(np.prod(shape)) != flat.size:
                raise ConfigError(
                    f"{what} has {flat.size} values, not the {int(np.prod(shape))} of its shape {list(shape)}"
                )
            samples[name].append(flat.reshape(shape))
    if not entries:
        raise ConfigError(f'{where} holds no samples: its "data" list is empty')
    return {name: _stack(values) for name, values in samples.items()}


def _json_value(value, t: TensorSpec, what: str) -> tuple[np.ndarray, list[int] | None]:
    """(flat values, shape or None) of one input of one sample."""
    shape = None
    if isinstance(value, dict):
        if "shape" in value:
            shape = value["shape"]
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
                raise ConfigError(f'{what}: "shape" must be a list of dims (without the batch axis), got {shape!r}')
        if "content" in value:
            value = value["content"]
        elif "b64" not in value:
            raise ConfigError(f'{what} is an object without "content" or "b64"')
    if isinstance(value, dict) and "b64" in value:
        return _b64(value["b64"], t, what), shape
    try:
        flat = np.asarray(value).ravel()
    except ValueError:
        raise ConfigError(f"{what} is a ragged list; give its values flat, in row-major order") from None
    if t.np_dtype.kind == "O":  # a string input: JSON strings
        if flat.dtype.kind != "U":
            raise ConfigError(f"{what} holds {_kind(flat)}; {t.name} takes strings")
        return flat.astype(object), shape
    if flat.dtype.kind not in "biuf":
        raise ConfigError(f"{what} holds {_kind(flat)}, not numbers; {t.name} takes {t.dtype}")
    return flat, shape


def _b64(text, t: TensorSpec, what: str) -> np.ndarray:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ConfigError(f"{what}: b64 is not valid base64") from None
    itemsize = t.np_dtype.itemsize
    if len(raw) % itemsize:
        raise ConfigError(f"{what}: b64 holds {len(raw)} bytes, not a whole number of {t.dtype} values")
    return np.frombuffer(raw, dtype=t.np_dtype.newbyteorder("<")).astype(t.np_dtype)


def _implied_shape(size: int, t: TensorSpec, default: list[int] | None, what: str) -> list[int]:
    """A sample given without its shape: the io spec's when static, the default (--shape) when its size fits, else
    the one dynamic dim the size implies."""
    dynamic = [i for i, d in enumerate(t.shape) if d == -1]
    if not dynamic:
        return list(t.shape)
    if default is not None and int(np.prod(default)) == size:
        return list(default)
    static = int(np.prod([d for d in t.shape if d != -1]))
    if len(dynamic) == 1 and static and size % static == 0:
        shape = list(t.shape)
        shape[dynamic[0]] = size // static
        return shape
    raise ConfigError(
        f"{what}: its {size} values fit no single shape of {_dims(t.shape)}; give them as "
        '{"content": [...], "shape": [...]}'
    )


def _stack(values: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """The samples of one input stacked, or kept as a list where their shapes vary (each request its own shape)."""
    if len({v.shape for v in values}) > 1:
        return values
    return np.stack(values)


# ---------------------------------------------------------------- checks


def _checked(array: np.ndarray, t: TensorSpec, where: str) -> np.ndarray:
    """The samples of one input cast to its dtype, once its shape and values are known to fit."""
    array = np.asarray(array)
    if array.ndim != len(t.shape) + 1 or any(d != -1 and d != a for d, a in zip(t.shape, array.shape[1:])):
        raise ConfigError(
            f"{where}: {t.name} has samples of shape {_dims(list(array.shape[1:]))} (array "
            f"{_dims(list(array.shape))}, samples on axis 0); the model takes {_dims(t.shape)} "
            "(-1 is dynamic)"
        )
    if t.np_dtype.kind == "O":  # strings: from JSON, or an .npz's unicode (or object) arrays
        if array.dtype.kind == "U" or (array.dtype.kind == "O" and all(isinstance(v, str) for v in array.ravel())):
            return array.astype(object)
        raise ConfigError(f"{where}: {t.name} holds {_kind(array)}; the model takes strings")
    if array.dtype == t.np_dtype:
        return array
    if array.dtype.kind not in "biuf":
        raise ConfigError(f"{where}: {t.name} holds {_kind(array)}; the model takes {t.dtype}")
    target = t.np_dtype
    if target.kind in "biu" and array.size:
        if array.dtype.kind == "f" and not (np.all(np.isfinite(array)) and np.all(array == np.round(array))):
            raise ConfigError(f"{where}: {t.name} holds non-integer values; the model takes {t.dtype}")
        low, high = (0, 1) if target.kind == "b" else (np.iinfo(target).min, np.iinfo(target).max)
        if array.min() < low or array.max() > high:
            raise ConfigError(
                f"{where}: {t.name} holds values in {_num(array.min())}..{_num(array.max())}, outside "
                f"{t.dtype}'s {low}..{high}"
            )
    return array.astype(target)


def _kind(array: np.ndarray) -> str:
    return "strings" if array.dtype.kind in "US" else f"{array.dtype} values"


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, (float, np.floating)) else str(x)


def _dims(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
