"""Runs whose process died are marked Crashed, not left Running for ever: a worker SIGKILLed, a machine gone or a
container evicted leaves its flow run in the Running state, since nothing is left to report its end. Every flow run
a pool starts emits a heartbeat event (PREFECT_FLOWS_HEARTBEAT_FREQUENCY, set in each pool's job template by
tbench.team.pool_setup), and this Prefect automation (Prefect's own recipe for "zombie" flow runs) marks a run whose
heartbeats stop, without a final state, Crashed with a message that says what to do. Installed with the pools."""

from __future__ import annotations

from tbench.stages.tracker import STATE_COMPLETED_WITH_FAILURES

HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}  # seconds; Prefect's smallest
SILENCE_S = 90  # three heartbeats missed
AUTOMATION = "tbench: a flow run stopped answering"
NEVER_STARTED_S = 900  # Pending this long without running: a docker worker's first image pull fits in it
NEVER_STARTED = "tbench: a flow run was never started"
FINAL_EVENTS = (  # events are named after the state's name: ours (CompletedWithFailures) included
    "prefect.flow-run.Completed",
    f"prefect.flow-run.{STATE_COMPLETED_WITH_FAILURES}",
    "prefect.flow-run.Failed",
    "prefect.flow-run.Cancelled",
    "prefect.flow-run.Crashed",
)


def message(silence_s: float = SILENCE_S) -> str:
    """The Crashed state's message: what happened, and what to do."""
    return (
        f"no heartbeat for {silence_s:g} s: the run's process or its machine stopped (a killed worker, a crash); the "
        "points it measured are kept in its run folder on that machine: submit it again with --reuse to measure only "
        "the rest"
    )


def never_started_message(pending_s: float = NEVER_STARTED_S) -> str:
    return (
        f"taken by a worker but not started within {pending_s:g} s (the worker was killed, or the API failed while it "
        "started the run): nothing was measured; submit it again"
    )


def install_zombie_detection(silence_s: float = SILENCE_S, never_started_s: float = NEVER_STARTED_S) -> str:
    """The automations on the Prefect server at PREFECT_API_URL (earlier ones of the same names are replaced): a run
    without a heartbeat for `silence_s` is marked Crashed, and so is one Pending for `never_started_s`; returns the
    first's id."""
    crash_if_silent(
        NEVER_STARTED,
        "A flow run taken by a worker never started",
        after={"prefect.flow-run.Pending"},
        expect={"prefect.flow-run.Running"},
        within_s=never_started_s,
        why=never_started_message(never_started_s),
    )
    return crash_if_silent(
        AUTOMATION,
        "A flow run's heartbeats stopped before it ended",
        # from its first heartbeat, or from Running: a run killed before its first heartbeat is a zombie too
        after={"prefect.flow-run.heartbeat", "prefect.flow-run.Running"},
        expect={"prefect.flow-run.heartbeat"},
        within_s=silence_s,
        why=message(silence_s),
    )


def crash_if_silent(name: str, what: str, after: set[str], expect: set[str], within_s: float, why: str) -> str:
    """An automation (replacing one of the same name) that marks a flow run Crashed, saying `why`, when none of
    `expect` nor a final state follows one of `after` within `within_s` seconds; returns its id."""
    from datetime import timedelta

    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    from tbench.history.alerts import delete_automation

    delete_automation(name)
    automation = Automation(
        name=name,
        description=f"{what}: mark it Crashed (tbench.team.zombies).",
        trigger=EventTrigger(
            after=after,
            expect={*expect, *FINAL_EVENTS},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=why)],
    ).create()
    return str(automation.id)


def crash_if_unfinished(flow_run_id: str, why: str) -> bool:
    """A run the next run on its machine found killed (tbench.stages.killed) is marked Crashed in Prefect too, saying
    `why`, where it has no final state yet: the automation above misses a run whose heartbeat events the server
    dropped (the soak's: a SQLite database locked under load). Returns whether it was marked; False on any API error
    (the run's folder says why all the same)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(flow_run_id))
            if run.state is not None and run.state.is_final():
                return False
            client.set_flow_run_state(run.id, Crashed(message=why), force=True)
    except Exception:  # another API, one that is down, a run deleted: nothing to correct from here
        return False
    return True
