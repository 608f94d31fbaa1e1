"""Where each embedding table of a recommender lives: the reference guide's rule as a pure function.

The tables are sorted by size (rows x dim x bytes per value) from smallest to largest, and the first N of them that
together fit under a memory threshold go to the GPU; the rest (the big ones) stay in host memory on the CPU. The
rule stops at the first table that does not fit, so the GPU always holds a prefix of the size order. Ties keep the
original table order (a stable sort). Threshold 0 or no GPU puts every table on the CPU; sizes are still computed so
the report can show them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class TablePlacement:
    index: int  # the table's position in the model (categorical feature index)
    rows: int
    bytes: int
    device: str  # "gpu" | "cpu"


@dataclass(frozen=True)
class Placement:
    tables: tuple[TablePlacement, ...]  # in the original table order
    threshold_bytes: int
    gpu_available: bool

    @property
    def gpu_bytes(self) -> int:
        return sum(t.bytes for t in self.tables if t.device == "gpu")

    @property
    def cpu_bytes(self) -> int:
        return sum(t.bytes for t in self.tables if t.device == "cpu")

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.tables)

    def device_of(self, index: int) -> str:
        return self.tables[index].device

    def on(self, device: str) -> list[TablePlacement]:
        return [t for t in self.tables if t.device == device]


def place_tables(
    rows: Sequence[int], dim: int, threshold_bytes: int, bytes_per_value: int = 4, gpu_available: bool = True
) -> Placement:
    """The placement of tables with `rows[i]` rows of `dim` values each under a GPU memory threshold in bytes."""
    if threshold_bytes < 0:
        raise ValueError(f"memory threshold must be >= 0 bytes, got {threshold_bytes}")
    sizes = [int(r) * int(dim) * int(bytes_per_value) for r in rows]
    on_gpu: set[int] = set()
    if gpu_available and threshold_bytes > 0:
        used = 0
        for i in sorted(range(len(sizes)), key=lambda i: sizes[i]):  # sorted() is stable: ties keep table order
            if used + sizes[i] > threshold_bytes:
                break
            used += sizes[i]
            on_gpu.add(i)
    tables = tuple(TablePlacement(i, int(r), sizes[i], "gpu" if i in on_gpu else "cpu") for i, r in enumerate(rows))
    return Placement(tables=tables, threshold_bytes=int(threshold_bytes), gpu_available=gpu_available)


def human_bytes(n: int) -> str:
    """1.2 GiB, 83 GiB, 14.5 MiB, 512 KiB, 12 B: two significant-ish digits, binary units."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} B"


def placement_table_md(placement: Placement) -> str:
    """A markdown table for the report: table, rows, MiB, device; one line per table in model order."""
    lines = ["| table | rows | MiB | device |", "|---:|---:|---:|:---|"]
    for t in placement.tables:
        lines.append(f"| {t.index} | {t.rows:,} | {t.bytes / MIB:,.2f} | {t.device.upper()} |")
    return "\n".join(lines)


def placement_summary(placement: Placement) -> str:
    """One line, e.g. '12 of 26 tables (1.2 GiB) on the GPU under a 16 GiB threshold, 14 (83 GiB) on the CPU'."""
    gpu, cpu = placement.on("gpu"), placement.on("cpu")
    where = (
        f"under a {placement.threshold_bytes / GIB:g} GiB threshold" if placement.gpu_available else "(no GPU visible)"
    )
    return (
        f"{len(gpu)} of {len(placement.tables)} tables ({human_bytes(placement.gpu_bytes)}) on the GPU {where}, "
        f"{len(cpu)} ({human_bytes(placement.cpu_bytes)}) on the CPU"
    )
