"""The device lock against a real Prefect server (the test harness's): waiting says for whom, a stale holder's slot is
reclaimed, and a holder on another host is only reclaimed once its lease stops being renewed."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tbench.core import progress
from tbench.node.device_lock import DeviceLock, Holder, LockTimeout


@pytest.fixture
def name() -> str:
    return f"tbench-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def events():
    seen = []
    listener = lambda event, **data: seen.append((event, data))  # noqa: E731
    progress.subscribe(listener)
    yield seen
    progress.unsubscribe(listener)


def lock(name: str, run: str, lease_s: float = 3.0) -> DeviceLock:
    taken = DeviceLock(name, run, lease_s=lease_s, poll_s=0.2, report_every_s=0.5)
    taken._ensure_limit()  # a limit that does not exist yet takes any increment without counting it
    return taken


def test_a_second_run_waits_saying_for_whom_then_takes_the_freed_slot(prefect_harness, name, events):
    first, second = lock(name, "run-a"), lock(name, "run-b")
    first.acquire()
    with pytest.raises(LockTimeout, match=r"still held by run run-a on .* \(pid \d+\) since .* after \d+ s of waiting"):
        second.acquire(timeout_s=4)  # past the lease: the holder renews, so it is not stale
    waits = [d for e, d in events if e == "lock_wait"]
    # it kept saying so past the holder's 3 s lease (the timeout above is the proof it did not reclaim); how many
    # reports fit in 4 s depends on how loaded the Prefect API is, so only "more than one, growing" is asserted
    assert len(waits) >= 2 and all("run run-a" in w["holder"] for w in waits)
    assert waits[-1]["waited_s"] > waits[0]["waited_s"]
    first.release()
    started = time.monotonic()
    second.acquire(timeout_s=10)
    assert time.monotonic() - started < 2
    assert second._read_record().run == "run-b"
    second.release()
    assert second._read_record() is None and second._try_take()  # released: the slot is free
    second._reset_slot()


def test_a_holder_whose_process_is_gone_is_reclaimed_at_once(prefect_harness, name, events):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = lock(name, "killed-run")
    assert dead._try_take()  # a run that took the slot, wrote its lease and was killed
    dead.holder = dead.holder.model_copy(update={"pid": int(gone.stdout), "pid_started": 1.0})
    dead._write_record()
    started = time.monotonic()
    waiter = lock(name, "next-run", lease_s=600)  # a long lease: only the dead process can explain a quick reclaim
    waiter.acquire(timeout_s=30)
    assert time.monotonic() - started < 5
    assert [d["holder"] for e, d in events if e == "lock_reclaimed"][0].startswith("run killed-run")
    waiter.release()


def test_a_holder_elsewhere_is_reclaimed_only_when_its_lease_lapses(prefect_harness, name):
    elsewhere = lock(name, "remote-run")
    assert elsewhere._try_take()
    elsewhere.holder = elsewhere.holder.model_copy(update={"host": "another-host"})  # its pid cannot be checked here
    elsewhere._write_record()
    started = time.monotonic()
    waiter = lock(name, "next-run", lease_s=3)
    waiter.acquire(timeout_s=30)
    assert 3 <= time.monotonic() - started < 10  # one lease without renewal
    waiter.release()


def test_a_slot_taken_without_a_lease_record_is_reclaimed_after_one_lease(prefect_harness, name):
    leaked = lock(name, "old-tbench")
    assert leaked._try_take()  # what a run of a version without leases left behind
    started = time.monotonic()
    waiter = lock(name, "next-run", lease_s=2)
    waiter.acquire(timeout_s=30)
    assert 2 <= time.monotonic() - started < 8
    waiter.release()


def test_a_lease_record_deleted_between_create_and_update_is_written_anyway(prefect_harness, name, monkeypatch):
    """The last holder's record was there when this run created its own, and gone (released) before it updated it:
    the update's 404 took a run down in the soak."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.exceptions import ObjectAlreadyExists

    real, calls = SyncPrefectClient.create_variable, []

    def raced(self, variable):
        calls.append(variable.name)
        if len(calls) == 1:
            raise ObjectAlreadyExists(http_exc=RuntimeError("409"))
        return real(self, variable)

    monkeypatch.setattr(SyncPrefectClient, "create_variable", raced)
    taken = lock(name, "next-run")
    taken.acquire(timeout_s=10)
    try:
        assert len(calls) == 2 and taken._read_record().run == "next-run"
    finally:
        taken.release()


def test_lease_records_are_read_back_as_written():
    holder = Holder(run="r", host="h", pid=1, since="2026-11-23T08:00:00Z", renewed="2026-11-23T08:00:20Z")
    assert Holder.model_validate(holder.model_dump(mode="json")) == holder
    assert "run r on h (pid 1) since 2026-11-23 08:00:00 UTC" == holder.describe()


def test_a_wait_outlives_an_api_that_stops_answering_for_a_while(monkeypatch):
    import httpx

    import tbench.node.device_lock as device_lock

    request = httpx.Request("POST", "http://127.0.0.1:1/api/v2/concurrency_limits/increment")
    unavailable = httpx.HTTPStatusError("503", request=request, response=httpx.Response(503, request=request))
    answers = [httpx.ConnectError("refused"), unavailable, "taken"]  # a server restarting, then back

    def call():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    waiting = DeviceLock("tbench-test-outage", "run-a", poll_s=0.01)
    assert waiting._answered(call, time.monotonic()) == "taken"
    forbidden = httpx.HTTPStatusError("403", request=request, response=httpx.Response(403, request=request))
    with pytest.raises(httpx.HTTPStatusError):  # an answer that is no outage is not tried again
        waiting._answered(lambda: (_ for _ in ()).throw(forbidden), time.monotonic())
    monkeypatch.setattr(device_lock, "API_OUTAGE_S", 0.05)
    with pytest.raises(device_lock.LockError, match=r"the Prefect API did not answer for 0.05 s while this run waited"):
        waiting._answered(lambda: (_ for _ in ()).throw(httpx.ConnectError("refused")), time.monotonic())
