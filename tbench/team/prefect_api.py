"""The Prefect API of a terminal run, in its own session.

Without PREFECT_API_URL, Prefect starts a temporary API server as a plain child of the CLI: a Ctrl-C in the terminal
reaches it too, so it is gone while the interrupted run still needs it (to record the crash, to free the device
lock) and the user gets an httpx ConnectError. The CLI starts its own instead (`prefect server start --no-services`,
the same database under PREFECT_HOME, ~3 s), in its own session, and stops it after the run has finished cleaning up.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tbench.core.errors import BenchError
from tbench.node import procs
from tbench.node.ports import free_port
from tbench.team import prefect_server

_early: tuple[subprocess.Popen, str, Path] | None = None  # the server start_early() launched: (process, API URL, log)


def _configured_url() -> str | None:
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def _launch() -> tuple[subprocess.Popen, str, Path]:
    """Start a private API server (not waiting for it): its process, API URL and log."""
    port = free_port()
    log = (
        Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser() / "logs" / f"api-{os.getpid()}.log"
    )
    server = procs.start(
        prefect_server.argv(
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
        ),
        log,
    )
    return server, f"http://127.0.0.1:{port}/api", log


def start_early() -> None:
    """Launch the private API server now, so that it starts while the CLI imports the flows (seconds each);
    prefect_api() then waits for it. It is stopped at exit if no run came to use it."""
    global _early
    if _early is None and not _configured_url():
        _early = _launch()
        atexit.register(_stop_unused)


def _stop_unused() -> None:
    if _early is not None:
        procs.stop(_early[0], timeout_s=10)


@contextlib.contextmanager
def prefect_api() -> Iterator[str | None]:
    """Yields the API URL the run uses: the configured one, or a private server's for the duration."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    global _early
    configured = _configured_url()
    if configured:
        yield configured
        return
    launched, _early = _early or _launch(), None
    with private_server(launched) as url, temporary_settings(updates={PREFECT_API_URL: url}):
        yield url


@contextlib.contextmanager
def private_server(launched: tuple[subprocess.Popen, str, Path] | None = None) -> Iterator[str]:
    """A private API server (`launched` already, or started now) on the database under PREFECT_HOME, healthy; its
    URL while it serves, then stopped once what was sent to it has arrived."""
    server, url, log = launched or _launch()
    try:
        _wait_healthy(
            url, server, log, float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
        )
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
    # one client for every poll: each new one loads the machine's CA certificates (0.8 s of CPU over a start, seen
    # by py-spy), while the server starting beside it wants the same cores
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise BenchError(f"the Prefect API server exited with {server.returncode}: {procs.tail(log, 3)}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/health").status_code == 200:
                    return
            time.sleep(0.2)
    raise BenchError(f"the Prefect API server did not answer within {timeout_s:.0f} s (log: {log})")
