"""The command lines the docker and local modes run, exactly; real runs are in test_e2e."""

import pytest

from tbench.core.errors import ServerStartError
from tbench.triton.process_server import DockerServer, LocalServer
from tbench.triton.remote_server import RemoteServer
from tbench.triton.server_modes import make_server


def fixed_ports(server):
    server.ports = {"http": 18000, "grpc": 18001, "metrics": 18002}
    server.instance_id = "tbench-test"
    return server


def test_docker_run_command_line_on_the_host_network(tmp_path):
    """The guides' way: the host's network and IPC namespace; the server listens on 127.0.0.1 and our ports."""
    server = fixed_ports(
        DockerServer(tmp_path / "repo", tmp_path / "s.log", image="nvcr.io/nvidia/tritonserver:24.10-py3", gpus="0,1")
    )
    server.container = "tbench-triton-test"
    assert server.argv() == [
        "docker",
        "run",
        "--rm",
        "--name",
        "tbench-triton-test",
        "--ipc=host",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "--pid=host",
        "--gpus",
        '"device=0,1"',
        "--network=host",
        "-v",
        f"{(tmp_path / 'repo').resolve()}:/models:ro",
        "nvcr.io/nvidia/tritonserver:24.10-py3",
        "tritonserver",
        "--model-repository=/models",
        "--id=tbench-test",
        "--allow-gpu-metrics=true",
        "--http-address=127.0.0.1",
        "--http-port=18000",
        "--grpc-address=127.0.0.1",
        "--grpc-port=18001",
        "--metrics-address=127.0.0.1",
        "--metrics-port=18002",
        "--metrics-interval-ms=100",
        "--backend-config=python,shm-region-prefix-name=tbench-test-shm-",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--log-verbose=0",
    ]
    assert server.stop_argv(30) == ["docker", "stop", "-t", "30", "tbench-triton-test"]
    assert server.backends_argv() == [
        "docker",
        "run",
        "--rm",
        "--entrypoint",
        "ls",
        "nvcr.io/nvidia/tritonserver:24.10-py3",
        "/opt/tritonserver/backends",
    ]


def test_docker_run_command_line_on_a_bridge_publishes_on_loopback(tmp_path):
    server = fixed_ports(
        DockerServer(tmp_path / "repo", tmp_path / "s.log", image="img:1", gpus=None, network="bridge", ulimits=[])
    )
    server.container = "tbench-triton-test"
    assert server.argv() == [
        "docker",
        "run",
        "--rm",
        "--name",
        "tbench-triton-test",
        "--ipc=host",
        "-p",
        "127.0.0.1:18000:8000",
        "-p",
        "127.0.0.1:18001:8001",
        "-p",
        "127.0.0.1:18002:8002",
        "-v",
        f"{(tmp_path / 'repo').resolve()}:/models:ro",
        "img:1",
        "tritonserver",
        "--model-repository=/models",
        "--id=tbench-test",
        "--allow-gpu-metrics=true",
        "--http-address=0.0.0.0",
        "--http-port=8000",
        "--grpc-address=0.0.0.0",
        "--grpc-port=8001",
        "--metrics-address=0.0.0.0",
        "--metrics-port=8002",
        "--metrics-interval-ms=100",
        "--backend-config=python,shm-region-prefix-name=tbench-test-shm-",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--log-verbose=0",
    ]


def test_a_docker_server_writes_its_trace_through_a_mount_where_the_daemon_is_local(tmp_path, monkeypatch):
    server = fixed_ports(DockerServer(tmp_path / "repo", tmp_path / "s.log", gpus=None))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    server._before_launch()
    argv = server.argv()
    assert argv[argv.index(f"{server.trace_path.parent}:/tbench-trace") - 1] == "-v"
    assert argv[-2:] == ["--trace-config=triton,file=/tbench-trace/trace.json", "--trace-config=level=OFF"]
    server.stop()
    assert server.trace_path is None
    monkeypatch.setenv("DOCKER_HOST", "tcp://gpu-node:2375")  # a path of this host means nothing to that daemon
    server._before_launch()
    assert server.trace_path is None and server.request_trace("resnet50") is None
    assert not any("trace" in a for a in server.argv())


def test_docker_refuses_an_unknown_network(tmp_path):
    with pytest.raises(ServerStartError, match="unknown network 'overlay'"):
        DockerServer(tmp_path, tmp_path / "s.log", network="overlay")


def test_docker_options_of_a_request_reach_the_command_line(tmp_path):
    from tbench.planning.plan import server_options
    from tbench.request.benchmark import BenchmarkRequest

    options = server_options(BenchmarkRequest(server="docker", gpus="none", docker_network="bridge", docker_ulimits=[]))
    argv = make_server("docker", tmp_path, tmp_path / "s.log", **options).argv()
    assert "-p" in argv and "--ulimit" not in argv and "--gpus" not in argv and "--pid=host" not in argv


def test_docker_without_gpus_and_with_all_gpus(tmp_path):
    assert "--gpus" not in DockerServer(tmp_path, tmp_path / "s.log", gpus=None).argv()
    assert "--gpus" not in DockerServer(tmp_path, tmp_path / "s.log", gpus="none").argv()
    every = DockerServer(tmp_path, tmp_path / "s.log", gpus="all").argv()
    assert every[every.index("--gpus") + 1] == "all"


def test_local_command_line(tmp_path):
    server = fixed_ports(
        LocalServer(tmp_path / "repo", tmp_path / "s.log", binary="/opt/tritonserver/bin/tritonserver")
    )
    assert server.argv() == [
        "/opt/tritonserver/bin/tritonserver",
        f"--model-repository={tmp_path / 'repo'}",
        "--backend-directory=/opt/tritonserver/backends",
        "--id=tbench-test",
        "--allow-gpu-metrics=true",
        "--http-address=127.0.0.1",
        "--http-port=18000",
        "--grpc-address=127.0.0.1",
        "--grpc-port=18001",
        "--metrics-address=127.0.0.1",
        "--metrics-port=18002",
        "--metrics-interval-ms=100",
        "--backend-config=python,shm-region-prefix-name=tbench-test-shm-",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--log-verbose=0",
    ]
    server._before_launch()  # each launch: a trace file of its own, with tracing off until a point turns it on
    assert server.argv()[-2:] == [f"--trace-config=triton,file={server.trace_path}", "--trace-config=level=OFF"]
    server.stop()
    assert server.trace_path is None


def test_local_without_a_server_on_path_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerStartError, match="local mode: no tritonserver on PATH"):
        LocalServer(tmp_path, tmp_path / "s.log")


def test_docker_defaults_to_every_gpu(tmp_path):
    from tbench.planning.plan import server_options
    from tbench.request.benchmark import BenchmarkRequest

    options = server_options(BenchmarkRequest(server="docker"))
    argv = make_server("docker", tmp_path, tmp_path / "s.log", **options).argv()
    assert argv[argv.index("--gpus") + 1] == "all"


def test_make_server_modes(tmp_path):
    remote = make_server("remote", tmp_path, tmp_path / "s.log", url="h:8001,h:8000")
    assert (
        isinstance(remote, RemoteServer)
        and remote.endpoints.grpc_url == "h:8001"
        and remote.endpoints.http_url == "h:8000"
    )
    with pytest.raises(ServerStartError, match="remote mode needs the server's address"):
        make_server("remote", tmp_path, tmp_path / "s.log")
    with pytest.raises(ServerStartError, match="unknown server mode 'k8s'"):
        make_server("k8s", tmp_path, tmp_path / "s.log")


def test_remote_upload_is_the_model_directory(tmp_path):
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "m" backend: "python" max_batch_size: 4')
    (model / "1" / "model.py").write_text("code")
    (model / "1" / "__pycache__").mkdir()
    (model / "1" / "__pycache__" / "x.pyc").write_bytes(b"x")
    config, files = RemoteServer.upload(model)
    assert '"backend": "python"' in config and '"max_batch_size": 4' in config
    assert files == {"file:1/model.py": b"code"}


def test_the_point_cache_key_holds_the_server_identity():
    """Points measured on one server are not another's: the key changes with the server's address, mode and version."""
    from tbench.loadgen.perf_analyzer import PerfInputs
    from tbench.node.hardware import Hardware
    from tbench.planning.plan import point_cache
    from tbench.request.benchmark import BenchmarkRequest

    req = BenchmarkRequest(model="resnet50", size="small", server="remote", server_url="a:8001").resolve(False)
    machine = Hardware(cpu_model="cpu", cpu_cores=2, memory_gib=8.0, gpus=[], os="linux")
    server = {"mode": "remote", "url": "a:8001", "id": "triton", "version": "2.51.0"}

    def key(**changed):
        return point_cache(req, machine, {**server, **changed}, [], PerfInputs()).context_key

    assert key() == key()  # the same server: the same key (a re-run takes its points)
    assert len({key(), key(url="b:8001"), key(version="2.52.0"), key(id="other"), key(mode="embedded")}) == 5
    # another run's Triton names (its own suffix) do not change the key: only the server does
    other = req.model_copy(update={"triton_suffix": "__tb00000000"})
    assert point_cache(other, machine, server, [], PerfInputs()).context_key == key()


def test_embedded_and_local_servers_see_the_runs_gpu_and_report_its_metrics(tmp_path):
    """On a GPU node the embedded server asks Triton for GPU metrics and, like the local one, sees the run's GPU
    only."""
    from tbench.triton.process_server import EmbeddedServer

    pinned = {"CUDA_VISIBLE_DEVICES": "GPU-5b9e1c44-2a7f-4d3e-8c61-7f0a3b9d2e15"}
    cpu = EmbeddedServer(tmp_path / "repo", tmp_path / "s.log")
    gpu = EmbeddedServer(tmp_path / "repo", tmp_path / "s.log", gpu_env=pinned)
    for server in (cpu, gpu):
        server._work_dir = tmp_path
    assert "--allow-gpu-metrics=false" in cpu.argv() and "--allow-gpu-metrics=true" in gpu.argv()
    assert gpu.env()["CUDA_VISIBLE_DEVICES"] == pinned["CUDA_VISIBLE_DEVICES"]
    local = LocalServer(
        tmp_path / "repo", tmp_path / "s.log", binary="/opt/tritonserver/bin/tritonserver", gpu_env=pinned
    )
    assert local.env()["CUDA_VISIBLE_DEVICES"] == pinned["CUDA_VISIBLE_DEVICES"]


def test_a_container_that_answered_ready_and_then_exited_is_not_taken_for_started(tmp_path, monkeypatch):
    """CI met it: the container's server answered ready with our id, then exited on its taken metrics port; by the
    look at its sockets docker reported no process, and none seen was taken for a daemon this host cannot see."""
    from tbench.node import containers

    server = fixed_ports(DockerServer(tmp_path / "repo", tmp_path / "s.log", gpus=None))
    ours = {"name": server.instance_id}
    monkeypatch.setattr(containers, "processes", lambda *args, **kwargs: [])
    monkeypatch.setattr(containers, "main_pid", lambda *args, **kwargs: None)  # exited: docker reports no pid
    assert not server._is_ours(ours)
    # running in a pid namespace this host cannot see (a remote daemon): its id is all there is to go by
    monkeypatch.setattr(containers, "main_pid", lambda *args, **kwargs: 2**22 + 1)  # above Linux's pid_max
    assert server._is_ours(ours)
    assert not server._is_ours({"name": "tbench-another"})


def test_a_server_that_printed_a_fatal_signal_is_not_serving_while_it_goes_down(tmp_path):
    """Triton prints "Signal (11) received." on SIGSEGV (and 6 on SIGABRT), then its stack, and can take long to exit
    with its ports open: from that line on the run takes it for stopped. The same line for SIGTERM or SIGINT is a
    stop, not a crash."""
    from tbench.triton.server import fatal_signal

    log = tmp_path / "server.log"
    log.write_text("I1206 15:01:02.000 grpc_server.cc] Started GRPCInferenceService at 0.0.0.0:8001\n")
    server = LocalServer(tmp_path, log, binary="tritonserver")
    server.alive = lambda: True  # its process still runs
    assert fatal_signal(log) is None and server.stopped_serving() is None
    log.write_text(log.read_text() + "Signal (15) received.\n")
    assert fatal_signal(log) is None and server.stopped_serving() is None
    log.write_text(log.read_text() + "Signal (11) received.\n 0# 0x000055D0 in tritonserver\n")
    assert fatal_signal(log) == "Signal (11) received."
    assert server.stopped_serving() == f"crashed (Signal (11) received. in its log, {log})"
    server.alive = lambda: False
    log.write_text("")
    assert server.stopped_serving() == "exited"
    assert fatal_signal(tmp_path / "no.log") is None
