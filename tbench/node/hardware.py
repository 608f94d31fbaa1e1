"""What the run measured on: CPU model and cores, memory, GPU(s) if any."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
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
    hostname: str = ""
    gpu_uuids: list[str] = []
    gpu_memory_mib: list[int] = []
    gpu_max_sm_clock_mhz: list[int] = []
    gpu_max_mem_clock_mhz: list[int] = []
    cuda: str | None = None  # the driver's CUDA version (nvidia-smi's header)

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


GPU_QUERY = "name,driver_version,uuid,memory.total,clocks.max.sm,clocks.max.mem"


def _int(text: str) -> int:
    try:
        return int(float(text.strip().split()[0]))
    except (ValueError, IndexError):
        return 0


def parse_gpu_query(csv_text: str) -> dict:
    """nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits -> the Hardware GPU fields."""
    rows = [[c.strip() for c in ln.split(",")] for ln in csv_text.strip().splitlines() if ln.strip()]
    rows = [r for r in rows if len(r) >= 6]
    return {
        "gpus": [r[0] for r in rows],
        "driver": rows[0][1] if rows else None,
        "gpu_uuids": [r[2] for r in rows],
        "gpu_memory_mib": [_int(r[3]) for r in rows],
        "gpu_max_sm_clock_mhz": [_int(r[4]) for r in rows],
        "gpu_max_mem_clock_mhz": [_int(r[5]) for r in rows],
    }


def parse_cuda_version(header: str) -> str | None:
    found = re.search(r"CUDA Version:\s*([0-9.]+)", header)
    return found.group(1) if found else None


def _gpus() -> dict:
    if not shutil.which("nvidia-smi"):
        return {"gpus": []}
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (subprocess.SubprocessError, OSError):
        return {"gpus": []}
    # CUDA_VISIBLE_DEVICES narrows what the run uses; a worker started for one GPU must report that one
    fields = parse_gpu_query(out)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible and fields["gpus"]:
        keep = [
            i
            for i, uuid in enumerate(fields["gpu_uuids"])
            if str(i) in visible.split(",") or uuid in visible.split(",")
        ]
        fields = {k: ([v[i] for i in keep] if isinstance(v, list) else v) for k, v in fields.items()}
    return {**fields, "cuda": parse_cuda_version(header)}


def detect() -> Hardware:
    return Hardware(
        cpu_model=_cpu_model(),
        cpu_cores=len(os.sched_getaffinity(0)),
        memory_gib=round(psutil.virtual_memory().total / 2**30, 1),
        os=f"{platform.system()} {platform.release()}",
        hostname=socket.gethostname(),
        **_gpus(),
    )
