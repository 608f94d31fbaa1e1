"""Models are loaded over gRPC, never over HTTP (loading over HTTP stalled live inference for seconds where gRPC took
a millisecond: commaai/miniray PR 93), and never while perf_analyzer measures: the offline scenario's reload with its
static config comes before the sweep's warm-up, as does the reload that gives an online sweep the model's own."""

import ast
import contextlib
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from tritonclient.grpc import model_config_pb2 as mc

import flows.benchmark as benchmark
from tbench.core.enums import Format, Scenario
from tbench.core.errors import ServerStartError
from tbench.search.evaluate import TritonEvaluator
from tbench.triton.loads import log_offset, wait_released
from tbench.triton.remote_server import RemoteServer
from tbench.triton.server import ServerEndpoints, TritonServer, configs_to_load, load_all

ROOT = Path(__file__).resolve().parents[1]
CONFIG = 'name: "m"\nbackend: "python"\nmax_batch_size: 8\ninput [{ name: "x" data_type: TYPE_FP32 dims: [3] }]\n'


class FakeGrpcClient:
    """tritonclient.grpc's client as the loaders use it, recording what they asked."""

    calls: list[tuple] = []
    ready: set[str] = set()  # the models the server serves already (a load of one replaces it)

    def __init__(self, url, *args, **kwargs):
        self.url = url

    def load_model(self, name, headers=None, config=None, files=None, client_timeout=None):
        self.calls.append(("load", name, config is not None, sorted(files or {})))

    def unload_model(self, name, *args, **kwargs):
        self.calls.append(("unload", name))

    def get_model_repository_index(self, as_json=False):
        return {"models": []}

    def is_model_ready(self, name, *args, **kwargs):
        return name in self.ready

    def is_server_live(self, *args, **kwargs):
        return True

    def get_server_metadata(self, as_json=False, **kwargs):
        return {"name": "triton", "version": "2.51.0"}

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class NoHttpClient:
    def __init__(self, *args, **kwargs):
        raise AssertionError("a model load or unload went over HTTP")


@pytest.fixture
def grpc_only(monkeypatch):
    """Every loader's client is gRPC's (faked, recording); constructing HTTP's fails the test."""
    import tritonclient.grpc
    import tritonclient.http

    FakeGrpcClient.calls, FakeGrpcClient.ready = [], set()
    monkeypatch.setattr(tritonclient.grpc, "InferenceServerClient", FakeGrpcClient)
    monkeypatch.setattr(tritonclient.http, "InferenceServerClient", NoHttpClient)
    return FakeGrpcClient.calls


@pytest.fixture
def repository(tmp_path):
    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    return tmp_path / "repo"


class StartedServer(TritonServer):
    """A started server of a process mode as far as loading goes (embedded, local and docker share this path)."""

    mode = "test"

    @property
    def endpoints(self):
        return ServerEndpoints("127.0.0.1:1", "127.0.0.1:2", "")

    def start(self):
        return self.endpoints

    def stop(self):
        pass

    def alive(self):
        return True

    def backends(self):
        return {"python"}


StartedServer.__abstractmethods__ = frozenset()  # whatever the interface adds, loading is what is tested here


def test_a_started_servers_loads_go_over_grpc(grpc_only, repository, tmp_path):
    server = StartedServer(repository, tmp_path / "server.log")
    server.load("m", mc.ModelConfig(name="m", max_batch_size=8))  # the offline scenario's static config
    server.load("m")  # the repository's own again
    assert grpc_only == [("load", "m", True, []), ("load", "m", True, [])]


def test_a_remote_servers_loads_and_unloads_go_over_grpc(grpc_only, repository, tmp_path):
    server = RemoteServer(repository, tmp_path / "server.log", "127.0.0.1:1", "127.0.0.1:2", backends={"python"})
    server.start()
    server.load("m", mc.ModelConfig(name="m", max_batch_size=8))
    server.stop()
    assert grpc_only == [
        ("load", "m", True, ["file:1/model.py"]),
        ("load", "m", True, ["file:1/model.py"]),
        ("unload", "m"),
    ]


def test_a_search_candidates_load_and_unload_go_over_grpc(grpc_only, repository, tmp_path):
    evaluator = object.__new__(TritonEvaluator)  # no perf_analyzer needed to load a candidate
    evaluator.server = StartedServer(repository, tmp_path / "server.log")
    evaluator.name, evaluator.load_timeout_s = "m", 5.0
    evaluator.load(repository / "m")
    evaluator.unload()
    assert grpc_only == [("load", "m", False, []), ("unload", "m")]


def test_no_load_or_unload_in_tbench_is_made_with_an_http_client():
    """Every function that calls load_model or unload_model takes its client from a gRPC `_client()` (or a client
    passed to it), and none of them or their modules' `_client` builds an HTTP one."""
    callers = []
    for path in sorted((ROOT / "tbench").rglob("*.py")):
        source = path.read_text()
        if "load_model(" not in source:
            continue
        tree = ast.parse(source)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            calls = [
                n
                for n in ast.walk(fn)
                if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("load_model", "unload_model")
            ]
            if calls:
                body = ast.get_source_segment(source, fn)
                assert "tritonclient.http" not in body and "httpclient" not in body, f"{path.name}:{fn.name}"
                callers.append(f"{path.relative_to(ROOT)}:{fn.name}")
    assert callers  # the loaders were found
    for module in {c.split(":")[0] for c in callers}:
        source = (ROOT / module).read_text()
        for fn in ast.walk(ast.parse(source)):
            if isinstance(fn, ast.FunctionDef) and fn.name == "_client":
                assert "tritonclient.grpc" in ast.get_source_segment(source, fn), module


def test_a_sweep_loads_the_configs_it_needs_in_a_stage_before_it_and_gives_nothing_back(monkeypatch):
    events: list[tuple] = []
    measuring = []

    class Server:
        overridden: dict = {}

        def load(self, name, config=None):
            assert not measuring, "a model load during a measurement"
            events.append(("load", name, "offline" if config is not None else "own"))
            self.overridden = {name: config} if config is not None else {}

        def confirm(self, configs):
            events.append(("confirm", {n: "offline" if c is not None else "own" for n, c in configs.items()}))

    class Tracker:
        @contextlib.contextmanager
        def stage(self, name):
            events.append(("stage", name))
            yield

    def sweep(plan, tracker, server, model, scenario, shapes, cache, samples, trial):
        measuring.append(shapes)
        events.append(("sweep", shapes))
        measuring.pop()

    monkeypatch.setattr(benchmark, "_sweep", sweep)
    model = SimpleNamespace(behind=["m"], format=Format.ONNX)
    offline = {"m": mc.ModelConfig(name="m", max_batch_size=8)}
    plan = SimpleNamespace(req=SimpleNamespace(trials=2))
    args = (plan, Tracker(), Server(), model)
    benchmark._measure_scenario(*args, Scenario.OFFLINE, offline, ["a", "b"], [None, None], None, 1)
    # once for every shape set, in a stage named for what is loaded, and read back before the first point
    confirmed_offline, confirmed_own = ("confirm", {"m": "offline"}), ("confirm", {"m": "own"})
    assert events == [
        ("stage", "reload-offline-onnx-trial1"),
        ("load", "m", "offline"),
        confirmed_offline,
        ("sweep", "a"),
        ("sweep", "b"),
    ]
    events.clear()
    benchmark._measure_scenario(*args, Scenario.OFFLINE, offline, ["a"], [None], None, 1)
    assert events == [confirmed_offline, ("sweep", "a")]  # served so already: no load, no stage
    events.clear()
    benchmark._measure_scenario(*args, Scenario.ONLINE, offline, ["a"], [None], None, 2)
    # the online scenario wants the repository's own
    assert events == [("stage", "reload-online-onnx-trial2"), ("load", "m", "own"), confirmed_own, ("sweep", "a")]
    events.clear()
    benchmark._measure_scenario(*args, Scenario.ONLINE, offline, ["a"], [None], None, 2)
    assert events == [confirmed_own, ("sweep", "a")]


def test_a_server_knows_which_models_it_serves_with_another_config(grpc_only, repository, tmp_path):
    server = StartedServer(repository, tmp_path / "server.log")
    static = mc.ModelConfig(name="m", max_batch_size=8)
    load_all(server, configs_to_load(server, {"m": None}))
    assert grpc_only == [] and server.overridden == {}  # its own already: nothing to load
    load_all(server, configs_to_load(server, {"m": static}))
    load_all(server, configs_to_load(server, {"m": static}))
    assert len(grpc_only) == 1 and server.overridden == {"m": static}
    load_all(server, configs_to_load(server, {"m": None}))
    assert len(grpc_only) == 2 and server.overridden == {}


def test_an_ensembles_composing_models_reload_side_by_side_and_a_failed_load_is_raised():
    """DLRM's sparse step (TensorFlow, 5 s to load and 2 s to release) and dense step reload at once."""
    started = []

    class Server:
        def load(self, name, config=None):
            started.append(time.monotonic())
            time.sleep(0.4)
            if name == "broken":
                raise ServerStartError("could not load broken")

    began = time.monotonic()
    load_all(Server(), {"sparse": mc.ModelConfig(name="sparse"), "dense": None})
    assert time.monotonic() - began < 0.75 and len(started) == 2
    with pytest.raises(ServerStartError, match="broken"):
        load_all(Server(), {"broken": None, "dense": None})


def test_a_reload_returns_once_the_replaced_version_is_released(grpc_only, repository, tmp_path):
    """Triton answers the load when the new version serves and releases the old one in a detached thread; the load
    waits for its 'successfully unloaded' line, so the release does not fall in the first measured window."""
    log = tmp_path / "server.log"
    log.write_text("I1128 model_lifecycle.cc:849] successfully loaded 'm' version 1\n")
    server = StartedServer(repository, log)
    FakeGrpcClient.ready = {"m"}  # loaded already: this load replaces it

    def release():
        time.sleep(0.3)
        with log.open("a") as f:
            f.write("I1128 model_lifecycle.cc:636] successfully unloaded 'm' version 1\n")

    started = time.monotonic()
    threading.Thread(target=release).start()
    server.load("m", mc.ModelConfig(name="m", max_batch_size=8))
    assert time.monotonic() - started >= 0.3 and grpc_only == [("load", "m", True, [])]


def test_a_first_load_replaces_nothing_and_waits_for_no_release(grpc_only, repository, tmp_path):
    """A model the server did not serve yet: no version is released, so nothing is waited for (it was 10 s per
    model at every server start)."""
    log = tmp_path / "server.log"
    log.write_text("I1128 model_lifecycle.cc:849] successfully loaded 'm' version 1\n")
    started = time.monotonic()
    StartedServer(repository, log).load("m")
    assert time.monotonic() - started < 2.0 and grpc_only == [("load", "m", True, [])]


def test_the_release_is_looked_for_after_the_load_only_and_not_for_ever(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("successfully unloaded 'm' version 1\n")  # an earlier reload's
    offset = log_offset(log)
    started = time.monotonic()
    assert not wait_released(log, "m", offset, timeout_s=0.2)  # a reload that replaced nothing: 0.2 s, not more
    assert time.monotonic() - started < 1.0
    with log.open("a") as f:
        f.write("successfully unloaded 'other' version 1\nsuccessfully unloaded 'm' version 1\n")
    assert wait_released(log, "m", offset, timeout_s=0.2)
    assert not wait_released(log, "other2", offset, timeout_s=0.0)
    assert log_offset(tmp_path / "absent.log") is None and not wait_released(None, "m", None)
