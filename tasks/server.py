"""Stage 4: the Triton server: the Prefect task; the logic is in tbench.triton.server."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tbench.triton.server import (
    TritonServer,
)


@task(name="server", cache_policy=NO_CACHE)
def server_task(server: TritonServer) -> TritonServer:
    server.start()
    return server
