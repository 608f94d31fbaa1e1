"""What the run measured on: CPU model and cores, memory, GPU(s) if any."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

import psutil
from pydantic import BaseModel


class Hardware(BaseModel):
    cpu_model: str
    cpu_cores: int  # logical CPUs this process may use
    memory_gib: float
    gpus: list[str]
    driver: str | None = None
    os: str

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def gpu_label(self) -> str:
        """The `gpu` column of the results: the GPU name, or "CPU" when the run had none."""
        return self.gpus[0] if self.gpus else "CPU"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> tuple[list[str], str | None]:
    if not shutil.which("nvidia-smi"):
        return [], None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return [], None
    rows = [ln.split(",") for ln in out.strip().splitlines() if ln.strip()]
    return [r[0].strip() for r in rows], (rows[0][1].strip() if rows else None)


def detect() -> Hardware:
    gpus, driver = _gpus()
    return Hardware(cpu_model=_cpu_model(), cpu_cores=len(os.sched_getaffinity(0)),
                    memory_gib=round(psutil.virtual_memory().total / 2**30, 1), gpus=gpus, driver=driver,
                    os=f"{platform.system()} {platform.release()}")
