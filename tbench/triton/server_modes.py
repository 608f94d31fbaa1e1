"""The server modes by name, and `make_server`, which builds the one a run asks for. A module of its own because it
imports every mode's module, and triton/server.py, which those modules import, must import none of them (no cycle).
"""

from __future__ import annotations

from pathlib import Path

from tbench.core.errors import ServerStartError
from tbench.core.registry import Registry
from tbench.triton.process_server import DockerServer, EmbeddedServer, LocalServer
from tbench.triton.remote_server import RemoteServer
from tbench.triton.server import TritonServer

# The servers by mode: remote is built from its URL, the others from their ports and options.
SERVER_MODES: Registry[str, type[TritonServer]] = Registry("server mode")
for _server in (EmbeddedServer, LocalServer, DockerServer, RemoteServer):
    SERVER_MODES.register(_server.mode, _server)


def make_server(
    mode: str,
    repository: Path,
    log_path: Path,
    *,
    http_port: int | None = None,
    grpc_port: int | None = None,
    url: str | None = None,
    backends: set[str] | None = None,
    **options,
) -> TritonServer:
    if mode not in SERVER_MODES:
        raise ServerStartError(f"unknown server mode {mode!r}; known: {', '.join(SERVER_MODES.names())}")
    if mode == "remote":
        if not url:
            raise ServerStartError("remote mode needs the server's address: --server-url HOST:GRPC_PORT,HOST:HTTP_PORT")
        grpc_url, _, http_url = url.partition(",")
        return RemoteServer(repository, log_path, http_url=http_url or grpc_url, grpc_url=grpc_url, backends=backends)
    return SERVER_MODES.get(mode)(repository, log_path, http_port=http_port, grpc_port=grpc_port, **options)
