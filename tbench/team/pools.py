"""GPU pools: which GPU each work pool promises and the check a run makes against the worker's hardware (the lock that
keeps two runs from measuring on the same GPU or CPU machine at once is `tbench.device_lock`).

A deployment's job variables set ``TBENCH_POOL_GPU`` (the pool's GPU kind, e.g. ``A100``; ``cpu`` for the cpu pool).
A run started by a worker compares it with what nvidia-smi reports and refuses a mismatch before it does anything:
numbers measured on a T4 must never be filed under A100.
"""

from __future__ import annotations

import os
import re

from pydantic import BaseModel

from tbench.core.errors import ConfigError
from tbench.node.hardware import Hardware

POOL_GPU_ENV = "TBENCH_POOL_GPU"


class Pool(BaseModel):
    name: str  # the Prefect work pool
    gpu: str  # what nvidia-smi's name must contain ("cpu": no GPU needed)
    product_label: str | None = None  # Kubernetes node label nvidia.com/gpu.product


# The GPUs of the reference guides' published results, plus H100; and the cpu pool every machine can serve.
POOLS = {
    p.name: p
    for p in [
        Pool(name="a100", gpu="A100", product_label="NVIDIA-A100-SXM4-80GB"),
        Pool(name="v100", gpu="V100", product_label="Tesla-V100-SXM2-32GB"),
        Pool(name="t4", gpu="T4", product_label="Tesla-T4"),
        Pool(name="a30", gpu="A30", product_label="NVIDIA-A30"),
        Pool(name="a40", gpu="A40", product_label="NVIDIA-A40"),
        Pool(name="h100", gpu="H100", product_label="NVIDIA-H100-80GB-HBM3"),
        Pool(name="cpu", gpu="cpu"),
    ]
}


def unknown_pools(names: list[str]) -> str | None:
    """The error for names that are not pools (in the order given), or None when all are."""
    unknown = [n for n in names if n not in POOLS]
    return f"unknown pool(s) {', '.join(unknown)}; known: {', '.join(POOLS)}" if unknown else None


def gpu_matches(expected: str, gpu_name: str) -> bool:
    """'A100' matches 'NVIDIA A100-SXM4-80GB' but 'A10' does not match 'NVIDIA A100...' (a whole token)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(expected)}(?![0-9])", gpu_name, re.IGNORECASE) is not None


def check_worker_hardware(hardware: Hardware, expected: str | None = None) -> None:
    """Refuse to run on hardware other than the pool's GPU kind (from TBENCH_POOL_GPU when not given)."""
    expected = expected if expected is not None else os.environ.get(POOL_GPU_ENV)
    if not expected or expected.lower() == "cpu":
        return
    if not hardware.gpus:
        raise ConfigError(
            f"this worker's pool promises {expected} GPUs but the machine has none (nvidia-smi found no GPU); "
            "fix the worker's pool or its GPU driver"
        )
    if not gpu_matches(expected, hardware.gpus[0]):
        raise ConfigError(
            f"this worker's pool promises {expected} GPUs but the machine has {hardware.gpus[0]}; "
            "the run was refused so its numbers are not filed under the wrong GPU"
        )


def pool_of(hardware: Hardware, env: dict | None = None) -> str | None:
    """The pool this machine stands for: its worker's pool GPU (TBENCH_POOL_GPU), else the cpu pool without a GPU,
    else the pool whose GPU it has; None for a GPU no pool names."""
    expected = (env if env is not None else os.environ).get(POOL_GPU_ENV)
    for pool in POOLS.values():
        if expected and pool.gpu.lower() == expected.lower():
            return pool.name
    if not hardware.has_gpu:
        return "cpu"
    return next((p.name for p in POOLS.values() if p.gpu != "cpu" and gpu_matches(p.gpu, hardware.gpus[0])), None)
