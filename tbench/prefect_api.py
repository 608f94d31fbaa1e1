"""The Prefect API of a terminal run, in its own session.

Without PREFECT_API_URL, Prefect starts a temporary API server as a plain child of the CLI: a Ctrl-C in the terminal
reaches it too, so it is gone while the interrupted run still needs it (to record the crash, to free the device
lock) and the user gets an httpx ConnectError. The CLI starts its own instead (`prefect server start --no-services`,
the same database under PREFECT_HOME, ~3 s), in its own session, and stops it after the run has finished cleaning up.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tbench.core.errors import BenchError
from tbench.node import procs
from tbench.node.ports import free_port


@contextlib.contextmanager
def prefect_api() -> Iterator[str | None]:
    """Yields the API URL the run uses: the configured one, or a private server's for the duration."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    configured = get_current_settings().api.url
    if configured:
        yield configured
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = (
        Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser() / "logs" / f"api-{os.getpid()}.log"
    )
    prefect = Path(sys.executable).parent / "prefect"
    server = procs.start(
        [
            str(prefect),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-services",
            "--no-ui",
            "--log-level",
            "WARNING",
        ],
        log,
    )
    try:
        _wait_healthy(
            url, server, log, float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
        )
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        _flush_to_api()
        procs.stop(server, timeout_s=10)
        if server.returncode in (0, -15):  # a clean stop: its log has nothing to tell
            log.unlink(missing_ok=True)


def _flush_to_api() -> None:
    """Prefect sends logs and events from background workers; they must reach the API before it stops."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=5)


def _wait_healthy(url: str, server, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise BenchError(f"the Prefect API server exited with {server.returncode}: {procs.tail(log, 3)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise BenchError(f"the Prefect API server did not answer within {timeout_s:.0f} s (log: {log})")
