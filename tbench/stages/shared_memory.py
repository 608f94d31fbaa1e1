"""The shared-memory regions perf_analyzer leaves behind: unregistered from the server and unlinked, so the next
perf_analyzer never meets a stale region of its own name."""

from __future__ import annotations

from tbench.node import shm
from tbench.triton.server import CALL_TIMEOUT_S


def perf_analyzer_region(name: str, tensors: list[str]) -> bool:
    """Whether a registered region is one perf_analyzer makes for these tensors: named as the tensor, or the tensor
    followed by its batch and step (`input__0_0_3`) when it sends user data."""
    return any(name == t or name.startswith(t + "_") for t in tensors)


def release_shared_memory(grpc_url: str, kind: str, tensors: list[str] | None = None) -> list[str]:
    """Unregister the regions a perf_analyzer left registered with the server, and unlink their files.

    perf_analyzer unregisters its regions when it ends cleanly, but not when it is killed or stops on an unstable point.
    The server then still maps the old region (memory held until it stops), and the next perf_analyzer re-creates a
    region of the same name with another size: the server read past its end and died (SIGBUS) in our fault tests.
    With `tensors`, only the regions perf_analyzer names after them are released (a shared server may hold other
    clients' regions); without, every region. Returns the names released."""
    import tritonclient.grpc as grpcclient

    def ours(name: str) -> bool:
        return tensors is None or perf_analyzer_region(name, tensors)

    try:
        with grpcclient.InferenceServerClient(grpc_url) as client:
            status, unregister = (
                (client.get_cuda_shared_memory_status, client.unregister_cuda_shared_memory)
                if kind == "cuda"
                else (client.get_system_shared_memory_status, client.unregister_system_shared_memory)
            )
            found = status(as_json=True, client_timeout=CALL_TIMEOUT_S).get("regions", {})
            regions = {name: r for name, r in found.items() if ours(name)}
            for name in regions:
                unregister(name, client_timeout=CALL_TIMEOUT_S)
    except Exception:  # a server that cannot answer fails the point itself, with perf_analyzer's own error
        return []
    if kind != "cuda":  # a system region is a file under /dev/shm
        for region in regions.values():
            (shm.SHM_DIR / region.get("key", "").lstrip("/")).unlink(missing_ok=True)
    return list(regions)


def remove_unregistered_regions(tensors: list[str]) -> list[str]:
    """After a perf_analyzer that did not end cleanly, under the host-wide lock on system regions: the region files
    named after these tensors that no process maps, which it created and never registered (killed in between) or
    registered with a server that is gone; nothing else on the host uses those names while the lock is held."""
    removed = [p for p in shm.unmapped_regions() if perf_analyzer_region(p.name, tensors)]
    for path in removed:
        path.unlink(missing_ok=True)
    return [p.name for p in removed]
