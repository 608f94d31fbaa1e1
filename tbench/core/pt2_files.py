"""AOTInductor packages (`.pt2`, torch.export + torch._inductor.aoti_compile_and_package): what one is, whether this
machine can load it, loading it, and its io spec for `--model-file x.pt2`.

A package is a zip whose root folder holds `archive_format` ("pt2"), `archive_version` and, per model,
`data/aotinductor/<model>/`: the compiled library and a `*_metadata.json` of strings: AOTInductor's own (the device
it was compiled for, `AOTI_DEVICE_KEY`; the platform and machine) and the user's. tbench's converter
(tbench/stages/converters/aoti.py) puts the io spec, the precision, the batch range and the torch version there, so a
package it made is read like an ONNX file; another package declares no shapes, so its inputs (`input__0`, ...) take
`--shape` as a TorchScript file's do, and its outputs are found by running it.

A package compiled for another device (a CUDA one here, without CUDA) or machine, or by a torch whose package format
this one does not read, is refused in one line naming it and the fix, before anything is exported or started."""

from __future__ import annotations

import json
import platform
import re
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.runtime_cache import cached
from tbench.core.synthetic import (
    RANGE_FLAG,
    SHAPE_FLAG,
    declared_inputs,
    probe_dim,
    probed_spec,
    random_values,
    tensor_spec,
)

MODEL = "model"  # the model name aoti_compile_and_package gives, and the one Triton's PyTorch backend loads
RECOMPILE = (
    "re-export it on this machine with this torch: torch._inductor.aoti_compile_and_package(torch.export.export("
    "model, inputs)), or give tbench the PyTorch model (--formats pt2 compiles it here)"
)
# the metadata keys tbench.stages.converters.aoti writes (AOTInductor keeps user metadata as strings)
IO_SPEC_KEY = "tbench.io_spec"
PRECISION_KEY = "tbench.precision"
MAX_BATCH_KEY = "tbench.max_batch"
TORCH_KEY = "tbench.torch"
PROBE_TIMEOUT_S = 300  # loading torch and the package, and two runs on synthetic inputs
# the start of tbench.core.pt2_probe's line saying why a run failed (an abort has none)
PROBE_ERROR_MARK = "tbench-pt2-probe error: "
# an AOTInductor kernel's bounds check on an index (an embedding's rows): `index out of bounds: 0 <= tmp2 < 1000L`
INDEX_BOUND = re.compile(r"index out of bounds: 0 <= \w+ < (\d+)")


def is_pt2(path: Path) -> bool:
    """A zip whose root folder's archive_format says pt2."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            root = names[0].split("/")[0] if names else ""
            return f"{root}/archive_format" in names and archive.read(f"{root}/archive_format").strip() == b"pt2"
    except (OSError, zipfile.BadZipFile):
        return False


def package_metadata(path: Path) -> dict[str, str]:
    """The metadata of the package's model ({} when it has none), and its archive version as `archive_version`."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            root = names[0].split("/")[0]
            folder = f"{root}/data/aotinductor/{MODEL}/"
            if not any(n.startswith(folder) for n in names):
                models = sorted({n[len(root) + 18 :].split("/")[0] for n in names if "/data/aotinductor/" in n})
                raise ConfigError(
                    f"AOTInductor package {path} holds no model named {MODEL!r} (it holds: "
                    f"{', '.join(models) or 'no compiled model'}); package one model with "
                    "torch._inductor.aoti_compile_and_package"
                )
            found = sorted(n for n in names if n.startswith(folder) and n.endswith("_metadata.json"))
            metadata = json.loads(archive.read(found[0])) if found else {}
            version = f"{root}/archive_version"
            if version in names:
                metadata["archive_version"] = archive.read(version).decode().strip()
            return {str(k): str(v) for k, v in metadata.items()}
    except (OSError, zipfile.BadZipFile, ValueError, IndexError) as err:
        raise ConfigError(f"cannot read AOTInductor package {path}: {err}") from None


def package_precision(path: Path) -> str:
    """'fp16' for a package tbench made in FP16, else 'fp32' (another package: its weights are not read)."""
    return package_metadata(path).get(PRECISION_KEY, "fp32")


def check_package(path: Path) -> dict[str, str]:
    """The package's metadata, once it is known to be for this device, machine and torch's package format."""
    import torch
    from torch.export.pt2_archive.constants import ARCHIVE_VERSION_VALUE

    meta = package_metadata(path)
    made_by = f"torch {meta[TORCH_KEY]}" if TORCH_KEY in meta else "another torch"
    if meta.get("archive_version", ARCHIVE_VERSION_VALUE) != ARCHIVE_VERSION_VALUE:
        raise ConfigError(
            f"AOTInductor package {path} is in package format {meta['archive_version']} ({made_by}); torch "
            f"{torch.__version__} here reads format {ARCHIVE_VERSION_VALUE}: {RECOMPILE}"
        )
    device = meta.get("AOTI_DEVICE_KEY", "cpu")
    if device != "cpu" and not (device == "cuda" and torch.cuda.is_available()):
        raise ConfigError(
            f"AOTInductor package {path} was compiled for {device} and this machine has no {device} device "
            f"(torch {torch.__version__}): run it on a {device} node, or {RECOMPILE} (model and inputs on the CPU)"
        )
    for key, here in (("AOTI_PLATFORM", sys.platform), ("AOTI_MACHINE", platform.machine())):
        if meta.get(key, here) != here:
            raise ConfigError(
                f"AOTInductor package {path} was compiled for {meta[key]}, this machine is {here}: {RECOMPILE}"
            )
    return meta


class AotiModel:
    """A loaded package: called with CPU tensors, it runs them on the device it was compiled for."""

    def __init__(self, compiled: Any, device: str):
        self.compiled, self.device = compiled, device

    def __call__(self, *tensors):
        return self.compiled(*(t.to(self.device) for t in tensors))

    @property
    def input_count(self) -> int:
        from torch.utils import _pytree as pytree

        return pytree.treespec_loads(self.compiled.loader.get_call_spec()[0]).num_leaves


def load_package(path: Path) -> AotiModel:
    import torch
    from torch._inductor import aoti_load_package

    meta = check_package(path)
    device = meta.get("AOTI_DEVICE_KEY", "cpu")
    try:
        compiled = aoti_load_package(str(path), device_index=0 if device == "cuda" else -1)
    except Exception as err:
        made_by = f"torch {meta[TORCH_KEY]}" if TORCH_KEY in meta else "a torch other than this one, perhaps"
        raise ConfigError(
            f"cannot load AOTInductor package {path} (made by {made_by}; torch {torch.__version__} here): "
            f"{_last_line(err)}; {RECOMPILE}"
        ) from None
    return AotiModel(compiled, device)


# ---------------------------------------------------------------- io spec


def read_pt2(
    path: Path,
    shapes: dict[str, list[int]],
    dtypes: dict[str, str],
    int_high: int,
    ranges: dict[str, list[float]],
) -> tuple[IoSpec, bool, bool]:
    """(spec, batching, shapes_are_spec), as tbench.core.model_file reads a TorchScript file: the io spec tbench's
    converter stored, else the user's --shape for `input__0`... and the outputs the package gives on them."""

    meta = check_package(path)
    model = cached("aoti", path, lambda: load_package(path))
    if IO_SPEC_KEY in meta:
        try:
            return IoSpec.model_validate_json(meta[IO_SPEC_KEY]), True, False
        except ValueError as err:
            raise ConfigError(f"{IO_SPEC_KEY} in {path}'s metadata is not an io spec: {_last_line(err)}") from None
    names = [f"input__{i}" for i in range(model.input_count)]
    inputs = declared_inputs(
        f"AOTInductor package {path}", names, shapes, dtypes, ranges, " (its inputs in forward's order)"
    )
    return probed_spec(inputs, lambda leads: _probe(inputs, path, int_high, ranges, leads))


def _probe(inputs, path: Path, int_high: int, ranges, leads) -> list[TensorSpec]:
    """The outputs' dtypes and shapes from two runs (dims that move with the inputs are dynamic), in a process of its
    own (tbench.core.pt2_probe): a package fed what it does not expect can abort the process it runs in."""
    runs = [
        [
            random_values(
                t.dtype,
                lead + [probe_dim(d, grow) for d in t.shape],
                np.random.default_rng(grow),
                ranges.get(t.name),
                int_high,
            )
            for t in inputs
        ]
        for grow, lead in enumerate(leads)
    ]
    outputs = _run_apart(path, inputs, runs)
    batching = leads[0] != leads[1]
    skip = 1 if batching else 0  # without a batch axis the shapes are whole
    specs = []
    for i, (a, b) in enumerate(zip(*outputs)):
        if batching and (not a["shape"] or a["shape"][0] != leads[0][0] or b["shape"][0] != leads[1][0]):
            raise ConfigError(f"output {i} of AOTInductor package {path} does not keep the batch on axis 0")
        shape = [da if da == db else -1 for da, db in zip(a["shape"][skip:], b["shape"][skip:])]
        specs.append(tensor_spec(f"output__{i}", a["dtype"], shape, path))
    return specs


def _run_apart(path: Path, inputs: list[TensorSpec], runs: list[list[np.ndarray]]) -> list[list[dict]]:
    """Each run's outputs ({dtype, shape}) from `python -m tbench.core.pt2_probe`; a run that fails or aborts it is a
    ConfigError naming the inputs as fed and the flags that set them."""
    with tempfile.TemporaryDirectory(prefix="tbench-pt2-probe-") as folder:
        files = []
        for i, arrays in enumerate(runs):
            files.append(str(Path(folder) / f"run{i}.npz"))
            np.savez(files[-1], *arrays)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "tbench.core.pt2_probe", str(path), *files],
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"AOTInductor package {path} did not finish two runs on synthetic inputs in {PROBE_TIMEOUT_S} s; "
                f"check {SHAPE_FLAG}"
            ) from None
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    shown = ", ".join(f"{t.name}:{','.join(map(str, a.shape))} {a.dtype}" for t, a in zip(inputs, runs[0]))
    how = f"aborted ({_signal_name(-done.returncode)})" if done.returncode < 0 else "failed"
    failure = probe_failure(done.stderr)
    raise ConfigError(
        f"AOTInductor package {path} {how} on synthetic inputs ({shown}, batch axis included): "
        f"{failure}; {_probe_fix(failure, inputs, runs[0])}"
    )


def _probe_fix(failure: str, inputs: list[TensorSpec], fed: list[np.ndarray]) -> str:
    """The flags that feed a package what it expects: integer ids past a table's rows need their range (the synthetic
    ones run to 15, a vocabulary can be smaller); otherwise the dtypes a package never declares."""
    bound = INDEX_BOUND.search(failure)
    ints = [t.name for t, a in zip(inputs, fed) if a.dtype.kind in "iu"]
    if bound and ints:
        top = int(bound.group(1)) - 1
        return f"an index must lie in 0..{top}: give the ids' range, e.g. --value-range {ints[0]}:0,{top}"
    return (
        f"a package declares no input dtypes (float32 unless --dtype): give each input's, e.g. --dtype "
        f"{inputs[0].name}:int64 for token ids, with {RANGE_FLAG}, and check {SHAPE_FLAG}"
    )


def probe_failure(stderr: str) -> str:
    """Why a probe process died, in one line: its own error line, else a C++ exception's `what():` (an abort), else the
    exception's type (two threads that throw at once abort without the `what()`), else stderr's last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line.removeprefix(PROBE_ERROR_MARK) for line in lines if line.startswith(PROBE_ERROR_MARK)), "")
    what = next((line.partition("what():")[2].strip() for line in lines if "what():" in line), "")
    thrown = next((line for line in lines if line.startswith("terminate called after throwing")), "")
    return (said or what or thrown or (lines[-1] if lines else "no output"))[:300]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(err).__name__
