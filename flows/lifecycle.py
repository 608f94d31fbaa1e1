"""What every run does around its stages, in one place: clean up after a killed run, make the run folder, capture the
logs, take the device lock (a stage of its own: a run that waits says so), and at the end, whatever happened, stop the
server, report, store the run folder and leave a manifest that says how the run ended (`finish_run`)."""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from tasks.history import history_task
from tasks.store import store_task
from tbench.core import progress
from tbench.core.errors import BenchError, StorageError
from tbench.core.layout import RunLayout, new_run_id
from tbench.node import procs
from tbench.node.device_lock import device_lock
from tbench.node.interrupts import second_signal_exits
from tbench.planning.preflight import preflight
from tbench.stages.killed import RUNNING, mark_ended, mark_killed_runs, mark_running, owner, read_manifest
from tbench.stages.store import discard_staged, staging_root, store_manifest_only, write_manifest
from tbench.stages.tracker import RunTracker
from tbench.team.zombies import crash_if_unfinished

log = logging.getLogger("prefect.tbench.lifecycle")
PREFLIGHT_STAGE = "preflight"  # a run its worker refused before it made its folder


def flow_run_id() -> str | None:
    """The Prefect flow run this run is, as its manifest names it."""
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def clean_up_after_killed_runs(root) -> None:
    """Servers and perf_analyzers whose run was killed (SIGKILL, a crash), with the shared memory they mapped; and
    the killed runs' folders under `root`, whose manifests then say so."""
    for what in procs.reap_orphans():
        log.warning(f"stopped {what}, left running by a run that was killed")
    clean_up_killed_folders(root)


def clean_up_killed_folders(root) -> None:
    for run_id in mark_killed_runs(root):
        log.warning(f"run {run_id} was killed before it finished: its manifest now says so")
        manifest = read_manifest(Path(root) / run_id) or {}
        if manifest.get("flow_run_id") and crash_if_unfinished(manifest["flow_run_id"], manifest.get("error") or ""):
            log.warning(f"its flow run {manifest['flow_run_id']} still said it was running: now Crashed")


def record_refusal(req, root: Path, run_id: str, err: BenchError) -> str | None:
    """A flow run that its worker refused (its disk full, a port taken) says why in a remote store too: its manifest
    alone (failed stage `preflight`), as a run that cannot write its folder does. Outside a flow run nothing is stored:
    the command line refuses in one line before any run begins (`tbench run` checks the same before its flow). Returns
    the manifest's URL, if stored."""
    if flow_run_id() is None:
        return None
    return store_failure_alone(req, RunTracker(RunLayout(root, run_id)), err, PREFLIGHT_STAGE)


def store_failure_alone(req, tracker: RunTracker, err: BenchError, stage: str) -> str | None:
    """A run that failed before it had a folder: its error recorded, its manifest alone sent to a remote store
    (stages.store.store_manifest_only). Returns the manifest's URL, if stored."""
    tracker.record_error(err, stage)
    manifest = tracker.manifest(request=req.model_dump(mode="json"), flow_run_id=flow_run_id())
    return store_manifest_only(req.output, tracker.layout.run_id, manifest)


def start_run_folder(req, root: Path, run_id: str, request_json) -> RunTracker:
    """The run's folder in staging, its `running` manifest (the run listed as running: stages.killed), its log and
    its request. Where the disk cannot take them (full), the run fails in one line before anything runs, leaves
    nothing behind here, and its manifest alone goes to a remote store, so that the run says why there too."""
    layout = RunLayout(root, run_id)
    tracker = RunTracker(layout)
    who = owner()
    try:
        layout.create()
        # until the run's end rewrites it: a run killed outright is told from one still running (stages.killed)
        start = tracker.manifest(status=RUNNING, owner=who, local_dir=str(layout.run_dir), flow_run_id=flow_run_id())
        write_manifest(layout.run_dir, start)
        mark_running(root, run_id, who)
        tracker.capture_logs()
        tracker.save_json(layout.request_json, request_json)
    except OSError as err:
        tracker.release_logs()
        shutil.rmtree(layout.run_dir, ignore_errors=True)  # nothing measured yet
        mark_ended(root, run_id)
        why = f"cannot write the run folder {layout.run_dir}: {err.strerror or err}"
        fix = "free some space there, or write elsewhere (TBENCH_STAGING_DIR, --output)"
        stored = store_failure_alone(req, tracker, StorageError(f"{why}: {fix}"), "staging")
        raise StorageError(f"{why}: {fix}" + (f" (recorded in {stored})" if stored else "")) from None
    return tracker


@contextlib.contextmanager
def run_lifecycle(req, hardware, name: str, request_json, lock: bool = True) -> Iterator[RunTracker]:
    """Set-up and lock; the body runs the stages and calls `finish_run()` at its end, whatever happened. `lock`
    False: the run takes the device lock itself, only while it measures here (a fleet whose other nodes are
    measured by other runs, which may be on this machine)."""
    root, run_id = staging_root(req.output), new_run_id(name)
    try:
        preflight(req)  # a worker checks what the CLI checked on the user's machine: its ports, paths and store
    except BenchError as err:
        record_refusal(req, root, run_id, err)
        raise
    clean_up_after_killed_runs(root)
    tracker = start_run_folder(req, root, run_id, request_json)
    layout = tracker.layout
    progress.emit("run_start", run_id=layout.run_id, run_dir=str(layout.run_dir))
    with contextlib.ExitStack() as held:
        # last, after the lock is released: runs killed while this one ran (waiting for the lock with it, say) say so
        # now, not only when the next run starts
        held.callback(clean_up_killed_folders, root)
        held.callback(mark_ended, root, layout.run_id)  # its final manifest written by then: off the list
        held.callback(tracker.release_logs)
        try:
            if lock:
                with tracker.stage("device-lock"):
                    held.enter_context(device_lock(hardware, layout.run_id))
        except BaseException as err:  # interrupted (or refused) while waiting: nothing ran, and the folder says so
            tracker.record_error(err, "device-lock")
            tracker.write_manifest(request=req.model_dump(mode="json"), local_dir=str(layout.run_dir))
            progress.emit(
                "run_end",
                run_id=layout.run_id,
                url=str(layout.run_dir),
                status=tracker.status,
                detail=tracker.status_line,
                stage=tracker.failed_stage,
            )
            raise
        yield tracker  # the lock is released first, then the log capture


@contextlib.contextmanager
def finishing(tracker: RunTracker, error: BaseException | None, manifest: dict) -> Iterator[dict]:
    """A run's finish, around its steps (finish_run: stop the server, report, store), which put the stored URL in the
    dict this yields. The error is recorded and the manifest written at once (a second Ctrl-C or a failing report
    still leaves one), an unexpected error's traceback logged, and a second signal during the clean-up exits
    promptly. A failure of the steps themselves is recorded, the manifest written again, and raised; with an error
    already in flight it is only logged, so the first error is the one the user sees."""
    layout = tracker.layout
    end = {"url": str(layout.run_dir)}
    if error is not None:
        tracker.record_error(error)
        if not tracker.interrupted and not isinstance(error, BenchError):
            log.error("unexpected error", exc_info=error)  # the full traceback, in logs/prefect.log
    tracker.write_manifest(**manifest)
    try:
        with second_signal_exits() if tracker.interrupted else contextlib.nullcontext():
            yield end
    except Exception as err:
        tracker.record_error(err)  # a no-op when the run had failed already
        tracker.write_manifest(**manifest)
        if error is None:
            raise
        log.error(f"while finishing a failed run: {err}; the run folder is {layout.run_dir}")
    finally:
        tracker.release_logs()
        progress.emit(
            "run_end",
            run_id=layout.run_id,
            url=end["url"],
            status=tracker.status,
            detail=tracker.status_line,
            stage=tracker.failed_stage,
        )


def finish_run(
    tracker: RunTracker,
    error: BaseException | None,
    manifest: dict,
    *,
    server,
    output: str,
    report: Callable[[], None],
    summary: Callable[[], dict] | None = None,
) -> str:
    """Every flow's finish, in this order (`finishing` around it): stop the server (stage server-stop, when there is
    one), the flow's `report()` (its own stages), then store the run folder (stage store) with the manifest, whose
    summary `summary()` gives where the report did not set it. Returns the stored URL, or the run folder when it
    was not stored."""
    layout = tracker.layout
    with finishing(tracker, error, manifest) as end:
        if server is not None:
            with tracker.stage("server-stop"):
                server.stop()
        unreported = None
        try:
            report()
        except Exception as err:  # a report that cannot be written (a full disk): what was measured is stored anyway
            tracker.record_error(err)
            unreported = err
        tracker.release_logs()
        with tracker.stage("store"):
            if summary is not None:
                manifest["summary"] = summary()
            end["url"] = store_task(layout.run_dir, output, layout.run_id, tracker.manifest(**manifest))
        if not tracker.results.empty and manifest.get("request", {}).get("model"):
            with tracker.stage("history"):
                history_task(output, manifest["request"]["model"], layout.run_id)
        if tracker.error is None:  # a failed run keeps its copy: `tbench upload` and a search's resume start there
            discard_staged(layout.run_dir, output)
        if unreported is not None:
            raise unreported
    return end["url"]
