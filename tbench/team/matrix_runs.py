"""The matrix's child runs: one benchmark run through a pool's deployment, watched to its end within limits.

A child never raises: whatever happens (the run fails, crashes, is cancelled, waits on a pool with no worker, runs past
its limit, or cannot be submitted at all) it comes back as a `ChildRun` row with its final state and a one-line reason.
A child past a limit is cancelled through the API the way the UI's Cancel does (a Cancelling state, not forced): the
server turns a scheduled run without infrastructure straight into Cancelled, which a worker that shows up later cannot
take any more (Cancelled -> Pending is refused), and a worker that runs it kills its process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from uuid import UUID

from pydantic import BaseModel

from tbench.core.errors import one_line
from tbench.node.interrupts import is_interrupt
from tbench.team.submit import TERMINAL

POLL_S = 2.0  # one flow-run and one pool read per child per poll
CANCEL_GRACE_S = 60.0  # how long a cancelled running child gets to reach Cancelled (its worker kills the process)


class ChildRun(BaseModel):
    """One child of the matrix as the report and the manifest show it."""

    pool: str
    model: str
    format: str
    precision: str
    state: str  # final state type (COMPLETED, FAILED, CRASHED, CANCELLED), NOT_SUBMITTED, or the last one seen
    reason: str = ""  # why it did not finish, one line; empty when it completed
    flow_run: str | None = None
    run_url: str | None = None  # its stored run folder (failed runs store theirs too), when it got that far

    @property
    def finished(self) -> bool:
        return self.state == "COMPLETED"


def state_of(run) -> str:
    return run.state.type.value if run.state else "SCHEDULED"


def pool_status(client, pool: str) -> str:
    """READY while the pool has an online worker (Prefect keeps this from the workers' heartbeats)."""
    status = client.read_work_pool(pool).status
    return status.value if status else "NOT_READY"


# the child runs this process is watching (`watch`): a run that fanned them out and is interrupted cancels them
# (`children_cancelled_on_interrupt`), rather than leave them running on their pools with nobody waiting for them
_in_flight: set[UUID] = set()
_in_flight_lock = threading.Lock()


@contextlib.contextmanager
def children_cancelled_on_interrupt() -> Iterator[None]:
    """Around a fan-out: on Ctrl-C or SIGTERM (a cancelled parent run), the children still running are sent to
    Cancelling (without waiting for them), then the interrupt goes on."""
    try:
        yield
    except BaseException as err:
        if is_interrupt(err):
            cancel_in_flight("the run that started it was interrupted")
        raise


def cancel_in_flight(why: str) -> list[UUID]:
    """Send every child run being watched to Cancelling; returns their ids. Never raises: the interrupt matters more."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    with _in_flight_lock:
        runs = sorted(_in_flight, key=str)
    if runs:
        with contextlib.suppress(Exception), get_client(sync_client=True) as client:
            for run_id in runs:
                with contextlib.suppress(Exception):
                    client.set_flow_run_state(run_id, Cancelling(message=f"cancelled by tbench: {why}"))
    return runs


def cancel(
    client, run_id: UUID, why: str, grace_s: float = CANCEL_GRACE_S, poll_s: float = POLL_S
) -> tuple[object, str]:
    """Cancel the run and wait (a little) for it to end; the run as last read, and the reason to record."""
    from prefect.states import Cancelling

    client.set_flow_run_state(run_id, Cancelling(message=f"cancelled by the tbench matrix: {why}"))
    deadline = time.monotonic() + grace_s
    run = client.read_flow_run(run_id)
    while state_of(run) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(poll_s)
        run = client.read_flow_run(run_id)
    state = state_of(run)
    if state == "COMPLETED":  # it finished just before the cancel arrived
        return run, ""
    return run, f"{why}; cancelled" if state == "CANCELLED" else f"{why}; cancel requested, still {state}"


def watch(
    client, run_id: UUID, pool: str, start_timeout_s: float, child_timeout_s: float, poll_s: float = POLL_S
) -> tuple[object, str]:
    """Follow the run until it ends; cancel it once it has been scheduled for `start_timeout_s` on a pool without an
    online worker, or once `child_timeout_s` have passed since it was submitted. A run queued behind others on a pool
    whose worker is alive is not "unattended": only `child_timeout_s` bounds it. Returns (run, reason)."""
    with _in_flight_lock:
        _in_flight.add(run_id)
    try:
        return _watch(client, run_id, pool, start_timeout_s, child_timeout_s, poll_s)
    finally:
        with _in_flight_lock:
            _in_flight.discard(run_id)


def _watch(client, run_id: UUID, pool: str, start_timeout_s: float, child_timeout_s: float, poll_s: float):
    submitted = time.monotonic()
    unattended_since = None  # since when it has been scheduled on a pool with no online worker
    while True:
        run = client.read_flow_run(run_id)
        state = state_of(run)
        if state in TERMINAL:
            return run, "" if state == "COMPLETED" else one_line(run.state.message) or f"ended {state}"
        now = time.monotonic()
        status = pool_status(client, pool) if state == "SCHEDULED" else "READY"
        if status == "READY":
            unattended_since = None
        elif unattended_since is None:
            unattended_since = now
        if unattended_since is not None and now - unattended_since >= start_timeout_s:
            return cancel(
                client,
                run_id,
                f"no worker picked it up within {start_timeout_s:g} s (state {state}, pool {pool} {status})",
                poll_s=poll_s,
            )
        if now - submitted >= child_timeout_s:
            return cancel(client, run_id, f"did not finish within {child_timeout_s:g} s (state {state})", poll_s=poll_s)
        time.sleep(poll_s)
