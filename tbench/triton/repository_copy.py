"""The copy of a user's repository that tbench serves (triton/user_repository.py decides what goes in it): the user's
folder is only read. Each model keeps its config.pbtxt as written, except a model whose backend the server lacks:
its config names tbench's python-backend runtime instead (triton/python_backend/model.py in each version folder,
the model file as a parameter), its batching, instances, version policy and inputs unchanged.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tbench.triton.config import MODEL_FILENAMES, PLATFORMS, PYTHON_BACKEND, to_pbtxt
from tbench.triton.repository import RUNTIME_MODEL
from tbench.triton.served import config_format
from tbench.triton.user_repository import CONFIG_FILE, HowServed, RepositoryPlan, read_config

LINK_FROM_BYTES = 16 << 20  # weights this large are hard-linked, not copied; nothing in the copy writes to them
ORT_THREADS = "intra_op_thread_count"  # the onnxruntime backend's parameter; the runtime's is intra_op_threads


def _copy_file(src: str, dst: str) -> None:
    if os.path.getsize(src) >= LINK_FROM_BYTES:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def _write_new(path: Path, text: str) -> None:
    """A file of the copy written afresh: never through a hard link into the user's folder."""
    path.unlink(missing_ok=True)
    path.write_text(text)


def runtime_config(config: mc.ModelConfig, runtime: str) -> mc.ModelConfig:
    """The user's config served by the python-backend runtime: the same model, batching and instances; the model file
    (its default_model_filename, else Triton's default for its platform) named as the runtime's parameter."""
    served = mc.ModelConfig()
    served.CopyFrom(config)
    fmt = config_format(config)
    model_file = config.default_model_filename or MODEL_FILENAMES[PLATFORMS[fmt]]
    served.platform, served.backend, served.default_model_filename = "", PYTHON_BACKEND, ""
    threads = config.parameters[ORT_THREADS].string_value if ORT_THREADS in config.parameters else "0"
    for key, value in {"runtime": runtime, "model_file": model_file, "intra_op_threads": threads}.items():
        served.parameters[key].string_value = value
    return served


def _serve_by_runtime(model_dir: Path, how: HowServed) -> None:
    config = runtime_config(read_config(model_dir / CONFIG_FILE), how.runtime)
    _write_new(model_dir / CONFIG_FILE, to_pbtxt(config))
    for version in (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()):
        _write_new(version / "model.py", RUNTIME_MODEL.read_text())


def copy_repository(plan: RepositoryPlan, dest: Path) -> Path:
    """The plan's models copied from the user's repository into `dest` (emptied first), each ready to serve."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in plan.copied:
        shutil.copytree(plan.source / name, dest / name, symlinks=False, copy_function=_copy_file)
    for name, how in plan.served.items():
        if how.runtime:
            _serve_by_runtime(dest / name, how)
    return dest
