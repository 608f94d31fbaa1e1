"""The device lock: one run measures on a GPU (or a CPU machine) at a time, and a lock never outlives its holder.

The slot is a Prefect global concurrency limit of 1 per device (visible in the UI, shared by every worker that talks
to the same Prefect server). Beside it, the holder writes a lease record (a Prefect variable): who holds the device
(run, flow run, host, pid) since when, renewed every `lease_s / 3` seconds by a background thread while the run
lives. A run that finds the slot taken reads the record and says for whom and how long it has waited; it reclaims
the slot when the holder is stale:

- the holder ran on this host and its process is gone (a Ctrl-C that took the Prefect API down with it, SIGKILL,
  a crash): reclaimed at once;
- the record was not renewed for `lease_s` seconds of this waiter's own clock (a holder on another host that died;
  no clock skew involved), or its renewal time is more than 10 leases old;
- the slot is taken with no record for `lease_s` (a slot leaked by a version of tbench without leases).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterator

import psutil
from pydantic import BaseModel

from tbench.core import progress
from tbench.core.errors import BenchError
from tbench.node.hardware import Hardware

LEASE_S = float(os.environ.get("TBENCH_LOCK_LEASE_S", "60"))
API_OUTAGE_S = 120.0  # a waiting run tries the API again for this long (a server restart takes seconds)
log = logging.getLogger("prefect.tbench.lock")  # under "prefect": a run's log capture and Prefect's handlers see it


class LockTimeout(BenchError):
    """The device stayed held by another run for longer than the caller would wait."""


class LockError(BenchError):
    """The lock could not be waited for: the Prefect API that keeps it stopped answering."""


class Holder(BaseModel):
    run: str  # what holds it: a tbench run id, or the process when no run id is known yet
    flow_run: str | None = None
    host: str
    pid: int
    pid_started: float | None = None
    since: dt.datetime
    renewed: dt.datetime

    def describe(self) -> str:
        flow_run = f" (flow run {self.flow_run})" if self.flow_run else ""
        return f"run {self.run}{flow_run} on {self.host} (pid {self.pid}) since {self.since:%Y-%m-%d %H:%M:%S} UTC"

    def process_gone(self) -> bool:
        """Only answerable on the holder's own host."""
        if self.host != socket.gethostname():
            return False
        try:
            return self.pid_started is not None and psutil.Process(self.pid).create_time() != self.pid_started
        except psutil.Error:
            return True


def lock_name(hardware: Hardware) -> str:
    """One global concurrency limit per GPU (its UUID: unique across the fleet), or per CPU machine."""
    if hardware.gpu_uuids:
        return f"tbench-gpu-{hardware.gpu_uuids[0]}"
    return f"tbench-cpu-{re.sub(r'[^A-Za-z0-9-]+', '-', socket.gethostname())}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class DeviceLock:
    def __init__(
        self,
        name: str,
        run: str,
        flow_run: str | None = None,
        lease_s: float = LEASE_S,
        poll_s: float = 2.0,
        report_every_s: float = 15.0,
    ):
        self.name, self.lease_s, self.poll_s, self.report_every_s = name, lease_s, poll_s, report_every_s
        self.record_name = "tbench_lease_" + re.sub(r"[^a-z0-9_-]+", "_", name.lower())
        me = psutil.Process()
        self.holder = Holder(
            run=run,
            flow_run=flow_run,
            host=socket.gethostname(),
            pid=me.pid,
            pid_started=me.create_time(),
            since=_now(),
            renewed=_now(),
        )
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._taken_at: float | None = None

    # --- the server side: slot and record --------------------------------------------------------------------
    @staticmethod
    def _client():
        from prefect.client.orchestration import get_client

        return get_client(sync_client=True)

    def _ensure_limit(self) -> None:
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
        from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

        with self._client() as client:
            try:
                client.read_global_concurrency_limit_by_name(self.name)
            except ObjectNotFound:
                with contextlib.suppress(ObjectAlreadyExists):  # two workers may race: fine
                    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=self.name, limit=1))

    def _try_take(self) -> bool:
        import httpx

        with self._client() as client:
            try:
                client.increment_concurrency_slots(names=[self.name], slots=1, mode="concurrency")
                return True
            except httpx.HTTPStatusError as err:
                if err.response.status_code == 423:  # Locked: every slot is taken
                    return False
                raise

    def _read_record(self) -> Holder | None:
        with self._client() as client:
            variable = client.read_variable_by_name(self.record_name)
        if variable is None:
            return None
        try:
            return Holder.model_validate(variable.value)
        except ValueError:
            return None  # an unreadable record is treated as a missing one

    def _write_record(self) -> None:
        import httpx
        from prefect.client.schemas.actions import VariableCreate, VariableUpdate
        from prefect.exceptions import ObjectAlreadyExists

        value = self.holder.model_dump(mode="json")
        with self._client() as client:
            for attempt in range(3):
                try:
                    client.create_variable(VariableCreate(name=self.record_name, value=value))
                    return
                except ObjectAlreadyExists:
                    pass
                try:
                    client.update_variable(VariableUpdate(name=self.record_name, value=value))
                    return
                except httpx.HTTPStatusError as err:
                    # the last holder deleted its record between our create and update (the soak saw it): create it
                    if err.response.status_code != 404 or attempt == 2:
                        raise

    def _delete_record(self) -> None:
        from prefect.exceptions import ObjectNotFound

        with self._client() as client, contextlib.suppress(ObjectNotFound):
            client.delete_variable_by_name(self.record_name)

    def _reset_slot(self) -> None:
        from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

        with self._client() as client:
            client.update_global_concurrency_limit(self.name, GlobalConcurrencyLimitUpdate(active_slots=0))

    # --- acquire, renew, release -------------------------------------------------------------------------
    def acquire(self, timeout_s: float | None = None) -> None:
        self._ensure_limit()
        started = time.monotonic()
        seen: tuple | None = None  # the record as last seen, and when (this process's clock) it last changed
        seen_since = started
        reported = -float("inf")
        while not self._answered(self._try_take, started):
            holder = self._answered(self._read_record, started)
            key = (holder.run, holder.renewed) if holder else None
            if key != seen:
                seen, seen_since = key, time.monotonic()
            if self._stale(holder, time.monotonic() - seen_since) and self._read_record() == holder:
                self._reclaim(holder)
                continue
            waited = time.monotonic() - started
            if timeout_s is not None and waited >= timeout_s:
                raise LockTimeout(
                    f"the device lock {self.name} is still held by "
                    f"{holder.describe() if holder else 'an unknown run'} after {waited:.0f} s of waiting"
                )
            if time.monotonic() - reported >= self.report_every_s:
                reported = time.monotonic()
                whom = holder.describe() if holder else "a run that has not written its lease yet"
                log.warning(f"waiting for the device lock {self.name}: held by {whom}; waited {waited:.0f} s")
                progress.emit("lock_wait", lock=self.name, holder=whom, waited_s=waited)
            time.sleep(self.poll_s)
        self._taken_at = time.monotonic()
        self.holder.since = self.holder.renewed = _now()
        self._write_record()
        self._stop.clear()
        # the thread runs in this context: Prefect's settings (the API URL the run uses) live in context variables
        self._renewer = threading.Thread(
            target=contextvars.copy_context().run, args=(self._renew,), name=f"lease-{self.name}", daemon=True
        )
        self._renewer.start()

    def _answered(self, call, started: float):
        """`call()`, tried again while the Prefect API does not answer (a restart, a blip; it answers 503 or refuses
        connections), for at most API_OUTAGE_S in a row: a run waiting for the lock outlives a server restart."""
        import httpx

        down_since = None
        while True:
            try:
                return call()
            except (httpx.TransportError, httpx.HTTPStatusError) as err:
                status = err.response.status_code if isinstance(err, httpx.HTTPStatusError) else None
                if status is not None and status < 500:
                    raise
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > API_OUTAGE_S:
                    raise LockError(
                        f"the Prefect API did not answer for {API_OUTAGE_S:g} s while this run waited "
                        f"{time.monotonic() - started:.0f} s for the device lock {self.name}: {type(err).__name__}"
                    ) from None
                log.warning(f"the Prefect API did not answer ({type(err).__name__}); trying again")
                time.sleep(self.poll_s)

    def _stale(self, holder: Holder | None, unchanged_s: float) -> bool:
        if holder is None:
            return unchanged_s >= self.lease_s
        if holder.process_gone():
            return True
        return unchanged_s >= self.lease_s or (_now() - holder.renewed).total_seconds() > 10 * self.lease_s

    def _reclaim(self, holder: Holder | None) -> None:
        whom = holder.describe() if holder else "a holder that left no lease record"
        log.warning(f"reclaiming the device lock {self.name} from {whom}: its lease is stale")
        progress.emit("lock_reclaimed", lock=self.name, holder=whom)
        self._reset_slot()
        self._delete_record()

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                current = self._read_record()
                if current is not None and (current.pid, current.host) != (self.holder.pid, self.holder.host):
                    log.error(
                        f"the device lock {self.name} was reclaimed by {current.describe()} while this run held it"
                    )
                    return
                self.holder.renewed = _now()
                self._write_record()
            except Exception as err:  # a blip of the API must not end the run; the next renewal tries again
                log.warning(f"could not renew the lease of {self.name}: {err}")

    def release(self) -> None:
        """Stop renewing, drop the record if it is still ours, free the slot. Never raises: a run that ends must end,
        and a lease that could not be released here is reclaimed by the next run (its process is gone)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
            self._renewer = None
        if self._taken_at is None:
            return
        try:
            current = self._read_record()
            if current is not None and (current.pid, current.host) == (self.holder.pid, self.holder.host):
                self._delete_record()
                with self._client() as client:
                    client.release_concurrency_slots(
                        names=[self.name], slots=1, occupancy_seconds=time.monotonic() - self._taken_at
                    )
        except Exception as err:
            log.warning(f"could not release the device lock {self.name} ({err}); the next run reclaims it")
        finally:
            self._taken_at = None


@contextlib.contextmanager
def device_lock(hardware: Hardware, run: str, timeout_s: float | None = None) -> Iterator[DeviceLock]:
    """Hold this machine's GPU (or CPU) for the run: a second run on the same device waits for the first."""
    flow_run = None
    with contextlib.suppress(Exception):
        from prefect.runtime import flow_run as current_flow_run

        flow_run = current_flow_run.get_id()
    lock = DeviceLock(lock_name(hardware), run, flow_run)
    lock.acquire(timeout_s)
    try:
        yield lock
    finally:
        lock.release()
