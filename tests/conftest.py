from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tbench.core.settings import PREFECT_DEFAULTS, configure_prefect_env

if TYPE_CHECKING:
    import pandas as pd


def _private_prefect_home() -> None:
    """Each test process (each xdist worker) gets a Prefect home of its own, so the `tbench` commands that the tests
    start get their own database: a worker's runs never wait for another worker's device lock, nor write to one
    SQLite file at once, and the user's own Prefect database stays untouched. It starts as a copy of the database
    scripts/setup.sh migrated, so no process pays for the migration again."""
    home = Path(tempfile.mkdtemp(prefix="tbench-tests-prefect-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    migrated = Path(os.environ.get("PREFECT_HOME", PREFECT_DEFAULTS["PREFECT_HOME"])).expanduser() / "prefect.db"
    if migrated.is_file():
        shutil.copy(migrated, home / "prefect.db")
    os.environ["PREFECT_HOME"] = str(home)


def _own_cpu() -> None:
    """An xdist worker runs on a CPU of its own, and so does everything it starts (servers, their stubs, perf_analyzer,
    `tbench` commands, the stack): each worker measures like a machine of one core (tbench sizes its thread pools
    from the CPUs it may use), instead of two workers' thread pools fighting over every core. A worker beyond the
    CPUs' count (scripts/test.sh starts one: much of the suite waits) shares them all."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    cpus = sorted(os.sched_getaffinity(0))
    index = int(worker.removeprefix("gw")) if worker else len(cpus)
    if count > 1 and index < len(cpus):
        os.sched_setaffinity(0, {cpus[index]})


_private_prefect_home()
_own_cpu()
configure_prefect_env()

# The modules that take longest, by their summed time in a full run (`--junitxml` of a fresh clone's suite at f9dd7fe,
# three workers; setup and teardown included), started first so that the workers finish together: each worker takes the
# next module when it is almost done with its own (xdist's scope scheduling, unreordered: below). Every other module
# follows in its usual order.
SLOWEST_FIRST = (
    "test_stack_e2e",  # 419 s
    "test_e2e_formats",  # 389
    "test_stack_schedules",  # 266, one test, mostly waiting for its nights: started with the first
    "test_docker_mode",  # 213 with test_docker_pool (one group, below)
    "test_e2e_recommenders",  # 208
    "test_e2e",  # 207
    "test_search_repository",  # 205
    "test_faults",  # 185
    "test_client_install",  # 146
    "test_stack_capacity",  # 144
    "test_ab_session",  # 115
    "test_colocated",  # 107
    "test_capabilities",  # 88
    "test_pt2",  # 87
    "test_stack_postgres",  # 79
    "test_point_cache",  # 63
    "test_user_repository",  # 60
    "test_precision",  # 51
    "test_arrivals",  # 51
    "test_input_data",  # 47
    "test_served_model",  # 47
    "test_export",  # 45
    "test_history",  # 39
    "test_pipeline_steps",  # 37
    "test_direct",  # 37
    "test_trials",  # 36
    "test_search_e2e",  # 33
    "test_fastpitch",  # 28
    "test_capacity_e2e",  # 28
    "test_search",  # 28
    "test_compare",  # 27
    "test_widedeep",  # 26
    "test_strings",  # 22
    "test_onnx_exporter",  # 22
    "test_run_noise",  # 22
    "test_dlrm",  # 20
)
# Modules that share an expensive session fixture run in one worker: the Docker daemon.
SHARED_WORKER = {"test_docker_pool": "test_docker_mode"}


def _group(module: str) -> str:
    return SHARED_WORKER.get(module, module)


def pytest_xdist_make_scheduler(config, log):
    """Whole modules (or groups of them) go to one worker, so their module fixtures are built once: xdist's scope
    scheduling, scoped by our groups (its own loadgroup marks are lost on pytest 9.2, whose node ids are read-only)."""
    from xdist.scheduler import LoadScopeScheduling

    # xdist reorders scopes by their number of tests unless told not to: our slowest-first order would be lost (a
    # module of one long test, like the nightly schedule's, would start last and hold the suite's end alone)
    config.option.loadscopereorder = False

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(Path(nodeid.split("::", 1)[0]).stem)

    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    order = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: order.get(_group(item.module.__name__.rsplit(".", 1)[-1]), len(order)))


@pytest.fixture(scope="session", autouse=True)
def prefect_api_server(request):
    """One Prefect API server per test process (xdist worker), on its private database (_private_prefect_home),
    when end-to-end tests run: the `tbench` commands they start use it (PREFECT_API_URL) instead of starting a
    private one each (tbench.team.prefect_api: seconds per command, on 2 busy cores). The tests of a user's default
    path, with no PREFECT_API_URL (test_faults' Ctrl-C and kills), take it out of their environment."""
    if os.environ.get("PREFECT_API_URL") or not any(item.get_closest_marker("e2e") for item in request.session.items):
        yield None
        return
    from tbench.team.prefect_api import private_server

    with private_server() as url:
        os.environ["PREFECT_API_URL"] = url
        try:
            yield url
        finally:
            os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture(scope="session", autouse=True)
def conversion_cache(tmp_path_factory):
    """A fresh conversion cache per suite, so tests see real conversions first, shared by its xdist workers (each
    worker's temporary folder is in the suite's own): a model one worker converted is not converted again by another,
    as on a machine whose runs share ~/.cache/tbench (the cache takes concurrent writers: tbench.stages.export)."""
    suite = tmp_path_factory.getbasetemp()
    cache = (suite.parent if os.environ.get("PYTEST_XDIST_WORKER") else suite) / "conversion-cache"
    cache.mkdir(exist_ok=True)
    os.environ["TBENCH_CACHE_DIR"] = str(cache)


GOLDEN = Path(__file__).parent / "golden"


def measured(results: pd.DataFrame) -> pd.DataFrame:
    """Assert every point was measured, and return those with numbers. A point is ok, or unstable: on a busy machine
    (the suite beside other work, a core kept busy) its windows may disagree beyond the stability bound, and the run
    says so and keeps its log, as it should. A test whose subject is not a measurement's stability takes that; never an
    error, and never a run with no stable point."""
    from tbench.core.metrics import OK, UNSTABLE

    assert results["status"].isin([OK, UNSTABLE]).all(), results[["scenario", "status", "error"]].to_string()
    unstable = results[results["status"] == UNSTABLE]
    assert unstable["error"].str.startswith("not stable within").all(), unstable["error"].to_string()
    ok = results[results["status"] == OK]
    assert len(ok), "no point was stable"
    return ok


@pytest.fixture(scope="session")
def small_adapter():
    import model_adapters

    return model_adapters.get("resnet50", "small")


@pytest.fixture(scope="session")
def small_module(small_adapter):
    return small_adapter.build()


@pytest.fixture(scope="session")
def small_artifacts(small_adapter, small_module, tmp_path_factory):
    """The small ResNet-50 exported once for the session: [onnx, ts-trace]."""
    from tbench.core.enums import Format
    from tbench.core.runtimes import source_digest
    from tbench.stages.export import export_model

    out = tmp_path_factory.mktemp("models")
    digest = source_digest("pytorch", small_module)
    return [export_model(small_adapter, small_module, f, out, digest) for f in (Format.ONNX, Format.TS_TRACE)]


@pytest.fixture(scope="session")
def served_small(small_artifacts, tmp_path_factory):
    """A real embedded tritonserver serving the small model (onnxruntime inside the python backend)."""
    from tbench.triton.process_server import EmbeddedServer
    from tbench.triton.repository import ServingConfig, write_repository

    root = tmp_path_factory.mktemp("served")
    write_repository(root / "repo", ServingConfig("resnet50", 8, [4, 8], 1000, 1), small_artifacts[0])
    server = EmbeddedServer(root / "repo", root / "tritonserver.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_to_stop(tmp_path, monkeypatch):
    """A private S3 endpoint (moto's server) that the test may stop: its environment set, stopped at the end if not."""
    from tbench.team.stack import S3Endpoint

    endpoint = S3Endpoint(tmp_path / "moto.log").start()
    for key, value in endpoint.env().items():
        monkeypatch.setenv(key, value)
    yield endpoint
    endpoint.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The local stack: a Prefect server with every pool and its deployments, a process worker for the cpu pool, and
    moto's S3 over HTTP."""
    # a run whose worker is killed is marked Crashed after 40 s without a heartbeat, one never started after 120 s
    # Pending (the tests wait for them; at 30 s a matrix child still starting was marked Crashed)
    yield from running_stack(tmp_path_factory.mktemp("stack"), zombie_silence_s=40, never_started_s=120)


def running_stack(root: Path, **options):
    """A stack brought up in `root` for a fixture to yield, and taken down after it (Stack's options as keywords)."""
    from tbench.team.stack import Stack

    clear_s3_clients()  # a filesystem cached by an earlier module points at its stopped S3
    s = Stack(root=root, **options)
    try:
        s.up()
        yield s
    finally:
        s.down()
        clear_s3_clients()


def clear_s3_clients() -> None:
    """fsspec keeps an S3 filesystem per set of arguments for the whole process, with the endpoint it was made for:
    the next stack's S3 (another port) must not be read through a stopped endpoint."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def prefect_test_server():
    """Prefect's test harness: a server on a database of its own, for the test process's in-process flows."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(
        server_startup_timeout=int(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"])
    ):
        yield
        forget_stale_services()


def forget_stale_services(timeout_s: float = 10) -> None:
    """Prefect's events and API-log services are one per process, bound to the API they were first used with
    (PrefectHQ/prefect#19343; opsmill/infrahub#10541): one bound to a stack that is down by now sends each queued event
    into a 60 s client timeout, and the harness's exit drains them without a bound (seen in a busy-core suite: a
    worker's last teardown waited for minutes). Drain them for a bounded time first, then forget what is left."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (EventsWorker, APILogWorker):
        service.drain_all(timeout=timeout_s)
    EventsWorker.reset_instances_for_fork()  # every queue service's instances (one registry), as after a fork


@pytest.fixture
def prefect_harness(prefect_test_server, monkeypatch):
    """The harness's server for this test; code that reads PREFECT_API_URL from the environment
    (tbench.team.pool_setup) must not find the session's server there (prefect_api_server)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


def run_flow(tmp_path: Path, request) -> tuple[Path, pd.DataFrame, str]:
    """One benchmark flow run into tmp_path that must complete: (run folder, results, report text)."""
    import json

    import pandas as pd

    from flows.benchmark import benchmark_flow

    url = benchmark_flow(request)
    run = tmp_path / url.rsplit("/", 1)[-1]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed", manifest["error"]
    return run, pd.read_parquet(run / "results.parquet"), (run / "report.md").read_text()


def _service(name: str, context):
    """A system service as a session fixture: its environment set while the session runs, skipped with the reason
    when it cannot run here."""
    from services import Unavailable

    try:
        value = context.__enter__()
    except Unavailable as why:
        pytest.skip(f"{name}: {why}")
    saved = {k: os.environ.get(k) for k in value} if isinstance(value, dict) else {}
    os.environ.update(value if isinstance(value, dict) else {})
    try:
        yield value
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        context.__exit__(None, None, None)


@pytest.fixture(scope="session")
def docker_env():
    """A reachable Docker daemon: {} for the machine's own, else DOCKER_HOST of one this session started."""
    from services import docker_daemon

    yield from _service("docker", docker_daemon())


@pytest.fixture(scope="session")
def postgres_url():
    """The SQLAlchemy URL of a PostgreSQL server this session started."""
    from services import postgres_server

    yield from _service("postgresql", postgres_server())
