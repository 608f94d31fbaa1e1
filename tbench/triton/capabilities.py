"""What a Triton server can do, read once per run: its version and its backends, and from them the flags and formats the
plan may use. NGC releases are monthly and Triton's minor version counts them (24.10 is 2.51, 26.04 is 2.68), so an
image tag names a version as well as the server's own metadata does."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# NGC release (YY.MM) -> Triton version: 24.10 shipped 2.51.0, one minor version a month since
_NGC_ANCHOR = (24, 10, 51)

# Releases that changed what a run may ask of the server (the Triton version each arrived in)
CLIENT_SHM_FLAG = (2, 68)  # 26.04: --allow-client-shm, off by default; without it client shared memory is refused
LATENCY_HISTOGRAM = (2, 65)  # 26.01: --metrics-config histogram_latencies=true, a latency histogram per model
TORCH_AOTI = (2, 67)  # 26.03: the PyTorch backend's `torch_aoti` platform (an AOTInductor model.pt2)
TF_BACKEND_LAST = (2, 55)  # 25.02: the last NGC release whose image ships the TensorFlow backend


def ngc_release_version(release: str) -> str | None:
    """'26.04' -> '2.68.0'; None for a tag that is not a YY.MM release from 20.06 (Triton 2.0) on."""
    m = re.fullmatch(r"(\d{2})\.(\d{2})", release)
    if not m:
        return None
    year, month = int(m.group(1)), int(m.group(2))
    y0, m0, minor0 = _NGC_ANCHOR
    minor = minor0 + (year - y0) * 12 + (month - m0)
    return f"2.{minor}.0" if minor >= 0 and 1 <= month <= 12 else None


def image_release(image: str) -> str | None:
    """The NGC release an image tag names ('nvcr.io/nvidia/tritonserver:26.04-py3' -> '26.04'), else None."""
    m = re.search(r":(\d{2}\.\d{2})(?:-|$)", image)
    return m.group(1) if m else None


def parse_version(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class ServerCapabilities:
    """`version`: Triton's, as the server reports it or its image names it (None: unknown); `backends`: the backend
    directories it has; `python_runtimes`: the runtimes its python backend's environment can import (the embedded
    server's is ours; NGC's has no framework in it)."""

    version: str | None
    backends: frozenset[str] = field(default_factory=frozenset)
    python_runtimes: frozenset[str] = field(default_factory=frozenset)
    source: str = ""  # where the version was read: "metadata", "image tag", "image env", "wheel", ...

    def at_least(self, release: tuple[int, int]) -> bool | None:
        """None where the version is unknown: the caller decides what unknown means for its flag."""
        parsed = parse_version(self.version)
        return None if parsed is None else parsed >= release

    @property
    def client_shm_flag(self) -> bool:
        """A server we launch must be given --allow-client-shm=true (only versions that know the flag accept it)."""
        return bool(self.at_least(CLIENT_SHM_FLAG))

    @property
    def latency_histogram(self) -> bool:
        return bool(self.at_least(LATENCY_HISTOGRAM))

    @property
    def torch_aoti(self) -> bool:
        """The PyTorch backend serves `platform: "torch_aoti"` (model.pt2)."""
        return "pytorch" in self.backends and bool(self.at_least(TORCH_AOTI))
