"""A terminal run's private Prefect API, for real: started early (while the CLI imports the flows), taken over by the
run, and stopped after it; one that no run came to use is stopped at exit."""

from __future__ import annotations

import httpx
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from tbench.team import prefect_api


@pytest.fixture
def no_configured_api():
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # as a user's terminal: no PREFECT_API_URL
        yield
    prefect_api._stop_unused()
    prefect_api._early = None


def test_the_server_started_early_is_the_runs_and_is_stopped_after_it(no_configured_api):
    prefect_api.start_early()
    server, url, _ = prefect_api._early
    prefect_api.start_early()  # a second call starts nothing more
    assert prefect_api._early[0] is server
    with prefect_api.prefect_api() as used:
        assert used == url and prefect_api._early is None
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert server.poll() is not None


def test_a_server_no_run_came_to_use_is_stopped(no_configured_api):
    prefect_api.start_early()
    server = prefect_api._early[0]
    prefect_api._stop_unused()  # what atexit does when the CLI ends before its run (a failed check, Ctrl-C)
    assert server.poll() is not None


def test_a_configured_api_is_used_as_it_is():
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        prefect_api.start_early()
        assert prefect_api._early is None
        with prefect_api.prefect_api() as used:
            assert used == "http://127.0.0.1:9/api"
