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
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.runtime_cache import cached
from tbench.core.synthetic import SHAPE_FLAG, declared_inputs, probe_dim, probed_spec, random_values, tensor_spec

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
    return probed_spec(inputs, lambda leads: _probe(model, inputs, path, int_high, ranges, leads))


def _probe(model, inputs, path: Path, int_high: int, ranges, leads) -> list[TensorSpec]:
    """The outputs' dtypes and shapes from two runs (dims that move with the inputs are dynamic)."""
    import torch

    runs = []
    for grow, lead in enumerate(leads):
        arrays = [
            random_values(
                t.dtype,
                lead + [probe_dim(d, grow) for d in t.shape],
                np.random.default_rng(grow),
                ranges.get(t.name),
                int_high,
            )
            for t in inputs
        ]
        try:
            with torch.inference_mode():
                result = model(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
        except Exception as err:
            shown = ", ".join(f"{t.name}:{','.join(map(str, a.shape))}" for t, a in zip(inputs, arrays))
            raise ConfigError(
                f"AOTInductor package {path} failed on synthetic inputs ({shown}, batch axis included): "
                f"{_last_line(err)}; check {SHAPE_FLAG} and --dtype"
            ) from None
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        runs.append([r.detach().cpu().numpy() for r in results])
    batching = leads[0] != leads[1]
    skip = 1 if batching else 0  # without a batch axis the shapes are whole
    outputs = []
    for i, (a, b) in enumerate(zip(*runs)):
        if batching and (a.ndim == 0 or a.shape[0] != leads[0][0] or b.shape[0] != leads[1][0]):
            raise ConfigError(f"output {i} of AOTInductor package {path} does not keep the batch on axis 0")
        shape = [da if da == db else -1 for da, db in zip(a.shape[skip:], b.shape[skip:])]
        outputs.append(tensor_spec(f"output__{i}", a.dtype, shape, path))
    return outputs


def _last_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(err).__name__
