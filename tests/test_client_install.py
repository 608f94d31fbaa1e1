"""The client install, as a laptop or a CI job has it: fresh virtual environments on Python 3.12 and 3.13 with
requirements-client.lock and the project (--no-deps), built by uv (its cache makes a rebuild take seconds), in
parallel with a local stack (the Prefect server with the cpu pool's deployments and moto's S3; no worker: nothing
runs). In each: NumPy 2 and none of the node's stack; `tbench --help`; `compare`, `history` and `results` on stored
runs (the golden run of tests/test_compare.py, the nightly runs of tests/test_history.py, stored by the suite's own
tbench as a node stores them); `stack env`, `submit` (a model name, and an ONNX model file handed over to S3) and
`upload` + `results` against the stack; and (on the newest) a command that needs the node's stack (`run`, `doctor`,
`stack up`) refused in one line naming `tbench[node]`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import pytest
from test_compare import BASELINE, make_run, scaled
from test_history import DROP, RUNS, STEP_AT, store_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from client_install import build_wheel, interpreter  # noqa: E402 - the benchmark's: one way to find and build both

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")
LOCK = ROOT / "requirements-client.lock"
PYTHONS = ("3.12", "3.13")
NOT_ON_THE_CLIENT = ("torch", "tensorflow", "onnxruntime", "tritonclient", "pytriton", "moto")


def uv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(UV), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )


def client_venv(version: str, python: str, wheel: Path, where: Path) -> Path:
    venv = where / f"client-{version}"
    steps = (
        ("venv", "--quiet", "--python", python, str(venv)),
        ("pip", "sync", "--quiet", "--python", str(venv / "bin" / "python"), str(LOCK)),
        ("pip", "install", "--quiet", "--no-deps", "--python", str(venv / "bin" / "python"), str(wheel)),
    )
    for step in steps:
        done = uv(*step)
        if done.returncode != 0:
            if any(s in done.stderr for s in ("dns error", "Failed to fetch", "Connect", "offline")):
                pytest.skip(f"no package registry for the client lock on {version}: {done.stderr.strip()[-300:]}")
            raise AssertionError(f"uv {' '.join(step)}:\n{done.stderr[-3000:]}")
    return venv


def start_stack(root: Path):
    """The local stack without its worker: the Prefect server with the cpu pool's deployments, and moto's S3."""
    from tbench.team.stack import S3Endpoint, Stack

    stack = Stack(root=root, pools=("cpu",))
    root.mkdir(parents=True, exist_ok=True)
    stack.s3 = S3Endpoint(root / "s3.log").start()
    try:
        stack.s3.create_bucket()
        stack.start_server()
        stack.setup_pools_and_deploy()
        stack.save()  # stack.json: what `tbench stack env --folder` reads
    except BaseException:
        stack.down()
        raise
    return stack


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """{version: venv, or why there is none} and the local stack (a Future: its start-up error, if it had one), built
    side by side; the stack is taken down at the end."""
    where = tmp_path_factory.mktemp("clients")
    assert LOCK.is_file(), "no requirements-client.lock: ./scripts/lock.sh writes it"
    pool = ThreadPoolExecutor(max_workers=len(PYTHONS) + 1)
    stack: Future = pool.submit(start_stack, where / "stack")
    try:
        pythons = {v: interpreter(v) for v in PYTHONS}
        wheel = build_wheel(where / "wheel")
        builds = {v: pool.submit(client_venv, v, p, wheel, where) for v, p in pythons.items() if p}
        venvs: dict[str, Path | str] = {v: f"no python{v} on this machine" for v, p in pythons.items() if not p}
        for v, build in builds.items():
            try:
                venvs[v] = build.result()
            except pytest.skip.Exception as skipped:
                venvs[v] = str(skipped)
        wait([stack])  # up before the tests start
        yield venvs, stack
    finally:
        pool.shutdown(wait=True)
        if stack.exception() is None:
            stack.result().down()


@pytest.fixture(params=PYTHONS)
def client(request, clients, tmp_path) -> dict:
    venvs, stack = clients
    venv = venvs[request.param]
    if isinstance(venv, str):
        pytest.skip(venv)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TBENCH_", "AWS_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    # uv installs no .pyc: the first command writes those of the modules it imports, the next ones reuse them (with
    # PYTHONDONTWRITEBYTECODE every command would compile Prefect again, ~3 s; --compile-bytecode compiles it all)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(PREFECT_HOME=str(home / "prefect"), TBENCH_STACK_DIR=str(home / "stack"), HOME=str(home))
    return {"venv": venv, "env": env, "cwd": tmp_path, "stack": stack, "version": request.param}


def tbench(client: dict, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(client["venv"] / "bin" / "tbench"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=client["cwd"],
        env={**client["env"], **(env or {})},
    )


def python(client: dict, code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(client["venv"] / "bin" / "python"), "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=client["cwd"],
        env=client["env"],
    )


def test_the_client_has_numpy_2_its_help_and_no_node_stack(client):
    done = python(
        client,
        "import importlib.util, sys, numpy, pyarrow, pandas; print(sys.version_info[:2], numpy.__version__); "
        f"print([m for m in {NOT_ON_THE_CLIENT!r} if importlib.util.find_spec(m)])",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    version, installed = done.stdout.strip().splitlines()
    assert version.startswith(f"({client['version'].replace('.', ', ')}) 2."), version  # NumPy 2 on this Python
    assert installed == "[]", f"the node's stack in a client install: {installed}"
    help_ = tbench(client, "--help")
    assert help_.returncode == 0 and all(c in help_.stdout for c in ("submit", "compare", "history")), help_.stderr


def test_compare_and_history_of_stored_runs(client, tmp_path):
    slower = make_run(tmp_path, "slower", scaled(0.8))
    # one trial each: the machine's run-to-run spread stated, as a CI job states it (tbench.results.run_noise)
    done = tbench(client, "compare", str(BASELINE), str(slower), "--run-cv", "0.02", "--output", str(tmp_path / "out"))
    assert done.returncode == 1 and done.stdout.startswith("slower than the baseline"), done.stdout + done.stderr
    assert (tmp_path / "out" / "comparison.png").stat().st_size > 5000
    # the nightly runs with a planted step of tests/test_history.py, as a node stores them
    root, rng = tmp_path / "artifacts", np.random.default_rng(3)
    for night in range(RUNS):
        level = 1000 * (1 - DROP) if night >= STEP_AT else 1000
        store_run(root, night, level * (1 + rng.normal(0, 0.01)), 1 if night >= STEP_AT else 2)
    done = tbench(client, "history", str(root), "--output", str(tmp_path / "site"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"regression: 3 series over {RUNS} runs") and "model instances: 2 → 1" in done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    done = tbench(client, "results", "--root", str(root), "--model", "tiny")
    assert done.returncode == 0 and f"{RUNS} rows from {RUNS} runs" in done.stdout, done.stdout + done.stderr


# on one Python: the refusal is tbench's own code, the same on each (the imports above are checked on both)
@pytest.mark.parametrize("client", PYTHONS[-1:], indirect=True)
@pytest.mark.parametrize(
    "argv",
    [["run", "resnet50", "--size", "small"], ["doctor"], ["stack", "up", "--pools", "cpu"]],
    ids=["run", "doctor", "stack-up"],
)
def test_a_command_that_needs_the_node_names_the_extra_in_one_line(client, argv):
    done = tbench(client, *argv)
    command = " ".join(argv[:2] if argv[0] == "stack" else argv[:1])
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: tbench {command} needs the node's stack (") and "tbench[node]" in line, line


def test_main_names_the_extra_for_a_node_module_missing_here_and_leaves_other_errors_alone(monkeypatch, capsys):
    """tbench.cli.main's refusal, in this (full) install: a node module that is not installed is the client's
    missing extra; one that is installed (torch here), or any other module, is an error of its own, raised as it is."""
    import tbench.cli as cli
    from tbench.cli import extras

    monkeypatch.setattr(extras, "NODE_MODULES", (*extras.NODE_MODULES, "tbench_no_such_framework"))
    monkeypatch.setattr(sys, "argv", ["tbench", "stack", "up", "--pools", "cpu"])
    for name, refused in [("tbench_no_such_framework.ops", True), ("torch._C", False), ("yaml_nowhere", False)]:

        def app(name=name, **_):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        monkeypatch.setattr(cli, "app", app)
        if not refused:
            with pytest.raises(ModuleNotFoundError):
                cli.main()
            continue
        with pytest.raises(SystemExit) as exited:
            cli.main()
        assert exited.value.code == 2
        assert capsys.readouterr().err == (
            f"error: tbench stack up needs the node's stack ({extras.NODE_STACK}; no tbench_no_such_framework here): "
            f"{extras.INSTALL}\n"
        )
    assert extras.command_name(["run", "resnet50", "--size", "small"]) == "tbench run"
    assert extras.command_name(["--help"]) == "tbench"


def flow_run(api_url: str, run_id: str) -> dict:
    with urllib.request.urlopen(f"{api_url}/flow_runs/{run_id}", timeout=30) as answer:
        return json.loads(answer.read())


def test_submit_and_upload_to_the_local_stack(client, tmp_path):
    stack = client["stack"].result()  # its start-up error, if it had one
    exports = tbench(client, "stack", "env", "--folder", str(stack.root))
    assert exports.returncode == 0, exports.stderr
    env = dict(line.removeprefix("export ").split("=", 1) for line in exports.stdout.splitlines())
    assert env["PREFECT_API_URL"] == stack.api_url and env["TBENCH_ARTIFACT_ROOT"] == stack.artifact_root

    done = tbench(client, "submit", "resnet50", "--size", "small", "--pool", "cpu", "--no-follow", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    run = flow_run(stack.api_url, done.stdout.strip().splitlines()[-1])
    assert run["parameters"]["request"]["model"] == "resnet50" and run["state_type"] == "SCHEDULED"

    import onnx
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in "xy")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "relu.onnx")
    done = tbench(
        client, "submit", "--model-file", str(tmp_path / "relu.onnx"), "--pool", "cpu", "--no-follow", env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = flow_run(stack.api_url, done.stdout.strip().splitlines()[-1])
    assert run["parameters"]["request"]["model_file"].startswith(f"{stack.artifact_root}/inputs/")  # handed over

    # a run folder kept on a node, uploaded from the client and read back from S3
    store_run(tmp_path / "kept", 0, 1000.0, 2)
    (run_dir,) = (p for p in (tmp_path / "kept").iterdir() if (p / "manifest.json").is_file())
    root = f"s3://tbench/client-{client['version']}"
    done = tbench(client, "upload", str(run_dir), "--to", root, env=env)
    assert done.returncode == 0 and done.stdout.strip() == f"{root}/{run_dir.name}", done.stdout + done.stderr
    done = tbench(client, "results", "--root", root, env=env)
    assert done.returncode == 0 and "1 rows from 1 runs" in done.stdout, done.stdout + done.stderr
