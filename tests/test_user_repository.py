"""A model of the user's own Triton repository (`tbench run --repository DIR --model NAME[:VERSION]`): what Triton or
the server would refuse, refused in one line naming the file and field before a server starts; what is copied,
loaded and rewritten (the user's folder never changed); and on the real embedded server, an ONNX model (served by the
python-backend runtime: the embedded server has no onnxruntime backend) and an ensemble measured end to end."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from tbench.cli import app
from tbench.core.errors import ConfigError
from tbench.request.benchmark import BenchmarkRequest
from tbench.request.repository import check_repository
from tbench.triton.capabilities import ServerCapabilities
from tbench.triton.config import PYTHON_BACKEND
from tbench.triton.repository_copy import copy_repository
from tbench.triton.user_repository import (
    BY_RUNTIME,
    CONFIG_FILE,
    NATIVELY,
    parse_model_ref,
    plan_repository,
    read_config,
)

# the embedded server: the python backend only, its runtimes this venv's
EMBEDDED = ServerCapabilities(
    version="2.51.0",
    backends=frozenset({"python"}),
    python_runtimes=frozenset({"onnxruntime", "torchscript"}),
    mode="embedded",
)
WITH_ORT = ServerCapabilities(version="2.51.0", backends=frozenset({"python", "onnxruntime"}), mode="local")

ONNX_CONFIG = """
name: "doubler"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
dynamic_batching { max_queue_delay_microseconds: 200 preferred_batch_size: [ 4 ] }
instance_group { count: 2 kind: KIND_CPU }
version_policy { all { } }
parameters { key: "intra_op_thread_count" value { string_value: "1" } }
"""

PYTHON_CONFIG = """
backend: "python"
max_batch_size: 8
input { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "z" data_type: TYPE_FP32 dims: [ 4 ] }
instance_group { count: 1 kind: KIND_CPU }
"""

PYTHON_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "y").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("z", (y + 1).astype(np.float32))]))
        return out
"""

ENSEMBLE_CONFIG = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "z" data_type: TYPE_FP32 dims: [ 4 ] }
ensemble_scheduling {
  step {
    model_name: "doubler" model_version: -1
    input_map { key: "x" value: "x" } output_map { key: "y" value: "mid" }
  }
  step {
    model_name: "plus_one" model_version: -1
    input_map { key: "y" value: "mid" } output_map { key: "z" value: "z" }
  }
}
"""


def tiny_onnx(path: Path) -> None:
    """y = x + x over [batch, 4] floats."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "doubler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what every onnxruntime of the last years reads
    onnx.save(model, path)


def write_model(root: Path, name: str, config: str, versions=(1,), files: dict[str, str] | None = None) -> Path:
    model = root / name
    model.mkdir(parents=True)
    (model / CONFIG_FILE).write_text(config)
    for v in versions:
        (model / str(v)).mkdir()
        for file, text in (files or {}).items():
            (model / str(v) / file).write_text(text)
    return model


@pytest.fixture
def repo(tmp_path) -> Path:
    return user_repository(tmp_path / "user_repo")


def user_repository(root: Path) -> Path:
    """An ONNX model with the user's batching in two versions, a python model, and an ensemble of the two."""
    doubler = write_model(root, "doubler", ONNX_CONFIG, versions=(1, 2))
    for v in (1, 2):
        tiny_onnx(doubler / str(v) / "model.onnx")
    write_model(root, "plus_one", PYTHON_CONFIG, files={"model.py": PYTHON_MODEL})
    write_model(root, "pipeline", ENSEMBLE_CONFIG)
    return root


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


# ---- what is refused, in one line naming the file and field


def test_a_config_that_does_not_parse_names_the_file_and_protobufs_message(repo):
    (repo / "doubler" / CONFIG_FILE).write_text(ONNX_CONFIG.replace("max_batch_size: 8", "max_batch_size: eight"))
    with pytest.raises(ConfigError, match=r"doubler/config.pbtxt: not a Triton model config: .*max_batch_size"):
        plan_repository(repo, "doubler", EMBEDDED)


def test_a_missing_version_folder_or_version_is_refused(repo):
    with pytest.raises(ConfigError, match=r"doubler: no version folder 3 \(it has 1, 2\)"):
        plan_repository(repo, "doubler:3", EMBEDDED)
    (repo / "plus_one" / "1" / "model.py").unlink()
    (repo / "plus_one" / "1").rmdir()
    with pytest.raises(ConfigError, match="plus_one: no numeric version folder"):
        plan_repository(repo, "plus_one", EMBEDDED)


def test_a_version_its_policy_does_not_serve_is_refused(repo):
    (repo / "doubler" / CONFIG_FILE).write_text(ONNX_CONFIG.replace("version_policy { all { } }", ""))
    assert plan_repository(repo, "doubler:2", EMBEDDED).version == "2"  # latest 1: the newest
    with pytest.raises(ConfigError, match=r"doubler/config.pbtxt: version_policy serves 2, not version 1"):
        plan_repository(repo, "doubler:1", EMBEDDED)


def test_an_ensemble_step_naming_a_model_not_there_names_the_step(repo):
    (repo / "pipeline" / CONFIG_FILE).write_text(ENSEMBLE_CONFIG.replace('"plus_one"', '"plus_two"'))
    with pytest.raises(
        ConfigError, match=r"pipeline/config.pbtxt: ensemble_scheduling.step\[1\].model_name 'plus_two': no such model"
    ):
        plan_repository(repo, "pipeline", EMBEDDED)


def test_an_ensemble_batching_more_than_a_step_takes_is_refused(repo):
    """Triton's rule: an ensemble's max_batch_size may not exceed a step's (Model Analyzer's per-step picks can)."""
    (repo / "plus_one" / CONFIG_FILE).write_text(PYTHON_CONFIG.replace("max_batch_size: 8", "max_batch_size: 2"))
    with pytest.raises(
        ConfigError, match=r"plus_one/config.pbtxt: max_batch_size 2 is below the max_batch_size 8 of ensemble pipeline"
    ):
        plan_repository(repo, "pipeline", EMBEDDED)


def test_a_model_not_in_the_repository_is_refused_naming_its_models(repo):
    with pytest.raises(ConfigError, match="no model 'resnet' .*its models: doubler, pipeline, plus_one"):
        plan_repository(repo, "resnet", EMBEDDED)
    with pytest.raises(ConfigError, match="is not NAME or NAME:VERSION"):
        parse_model_ref("doubler:latest")


@pytest.mark.parametrize(
    "kind, why",
    [
        ('platform: "tensorrt_plan"', "a TensorRT plan needs TensorRT, which this server lacks"),
        ('backend: "openvino"', "the server has no openvino backend and tbench's python-backend runtime serves only"),
        (
            'platform: "tensorflow_savedmodel"',
            "the server can serve it neither natively .*its environment has no tensorflow",
        ),
    ],
)
def test_a_backend_neither_the_server_nor_the_runtime_serves_is_refused(repo, kind, why):
    (repo / "doubler" / CONFIG_FILE).write_text(ONNX_CONFIG.replace('platform: "onnxruntime_onnx"', kind))
    with pytest.raises(ConfigError, match=rf"doubler/config.pbtxt: {kind}: {why}"):
        plan_repository(repo, "pipeline", EMBEDDED)


def test_options_that_configure_a_model_do_not_apply_to_a_repository():
    base = {"repository": "/r", "repository_model": "m"}
    with pytest.raises(ConfigError, match="--max-batch-size does not apply to --repository"):
        check_repository(BenchmarkRequest(**base, max_batch_size=4))
    with pytest.raises(ConfigError, match="--server embedded, local or docker, not remote"):
        check_repository(BenchmarkRequest(**base, server="remote", server_url="h:1"))
    with pytest.raises(ConfigError, match="--repository needs the model to measure"):
        check_repository(BenchmarkRequest(repository="/r"))
    assert check_repository(BenchmarkRequest(**base, batch_sizes=[1])).model == "m"


def test_the_cli_refuses_a_bad_repository_in_one_line_before_a_server_starts(repo):
    (repo / "doubler" / CONFIG_FILE).write_text("max_batch_size: {")
    result = CliRunner().invoke(app, ["run", "--repository", str(repo), "--model", "pipeline"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code != 0 and len(lines) == 1, result.output
    assert "doubler/config.pbtxt: not a Triton model config" in lines[0]


# ---- what is copied, loaded and rewritten


def test_an_ensemble_loads_its_steps_first_and_says_what_serves_each(repo):
    plan = plan_repository(repo, "pipeline", EMBEDDED)
    assert plan.loaded == ["doubler", "plus_one", "pipeline"]
    assert plan.served["doubler"].runtime == "onnxruntime" and BY_RUNTIME in plan.served_by()["doubler"]
    assert plan.served["plus_one"].native and NATIVELY in plan.served_by()["plus_one"]
    assert plan.whole  # plus_one is a python model: it may call any model (BLS)
    native = plan_repository(repo, "doubler", WITH_ORT)
    assert native.copied == native.loaded == ["doubler"] and not native.whole
    assert native.served_by()["doubler"].startswith(f"onnxruntime_onnx, {NATIVELY}: the server has the onnxruntime")


def test_a_python_model_copies_the_whole_repository_and_loads_what_can_be_served(repo):
    write_model(repo, "engine", 'platform: "tensorrt_plan"\nmax_batch_size: 1')
    plan = plan_repository(repo, "plus_one", EMBEDDED)
    assert plan.copied == ["doubler", "engine", "pipeline", "plus_one"]
    assert plan.loaded == ["plus_one", "doubler", "pipeline"]  # what it may call loaded too; steps before ensembles
    assert "TensorRT" in plan.skipped["engine"]


def test_the_copy_serves_an_onnx_model_by_the_runtime_and_leaves_the_users_folder_alone(repo, tmp_path):
    before = tree_digest(repo)
    copy = copy_repository(plan_repository(repo, "pipeline", EMBEDDED), tmp_path / "copy")
    assert tree_digest(repo) == before
    config = read_config(copy / "doubler" / CONFIG_FILE)
    assert config.backend == PYTHON_BACKEND and not config.platform
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["runtime"] == "onnxruntime" and params["model_file"] == "model.onnx"
    assert params["intra_op_threads"] == "1"  # the user's onnxruntime threads
    # the user's batching, instances and version policy as written
    assert list(config.dynamic_batching.preferred_batch_size) == [4] and config.instance_group[0].count == 2
    assert config.version_policy.HasField("all")
    assert all((copy / "doubler" / v / "model.py").is_file() for v in ("1", "2"))
    assert (copy / "plus_one" / "1" / "model.py").read_text() == PYTHON_MODEL  # its own, as written
    assert read_config(copy / "pipeline" / CONFIG_FILE) == read_config(repo / "pipeline" / CONFIG_FILE)


# ---- on the real embedded server


def _cli_run(tmp_path: Path, repo: Path, model: str):
    from test_faults import CliRun

    args = ["--repository", str(repo), "--model", model, "--batch-sizes", "1,4", "--concurrency", "2"]
    run = CliRun([*args, "--window-s", "0.5", "--stability", "50", "--no-pin-cpus"], tmp_path / "runs")
    assert run.finish(timeout=400) == 0, run.output
    run_dir = run.run_dir()
    return run_dir, pd.read_csv(run_dir / "results.csv"), json.loads((run_dir / "manifest.json").read_text())


@pytest.mark.e2e
def test_an_onnx_model_of_a_repository_is_served_by_the_runtime_and_measured(repo, tmp_path):
    before = tree_digest(repo)
    run_dir, rows, manifest = _cli_run(tmp_path, repo, "doubler:1")
    assert tree_digest(repo) == before
    assert (rows["status"] == "ok").all() and set(rows["scenario"]) == {"offline", "online"}, rows.to_string()
    assert set(rows["backend"]) == {"python (onnxruntime)"} and set(rows["model_size"]) == {"repository v1"}
    assert set(rows["max_queue_delay_us"]) == {200}  # the user's dynamic batching, as written
    served = manifest["repository"]["served_by"]["doubler"]
    assert served["runtime"] == "onnxruntime" and not served["natively"]
    assert manifest["repository"]["source"] == str(repo.resolve())
    assert BY_RUNTIME in (run_dir / "report.md").read_text()


@pytest.mark.e2e
def test_an_ensemble_of_an_onnx_and_a_python_model_is_measured_whole(repo, tmp_path):
    run_dir, rows, manifest = _cli_run(tmp_path, repo, "pipeline")
    assert (rows["status"] == "ok").all() and len(rows) == 3, rows.to_string()
    assert set(rows["backend"]) == {"ensemble of doubler (python (onnxruntime)), plus_one (python)"}
    assert manifest["repository"]["loaded"] == ["doubler", "plus_one", "pipeline"]
    assert manifest["served_by"]["plus_one"].startswith(f"python, {NATIVELY}")
    steps = pd.read_csv(run_dir / "pipeline_steps.csv")  # its two steps at every point, from Triton's statistics
    assert len(steps) == 2 * len(rows) and set(steps["step"]) == {"doubler", "plus_one"}, steps.to_string()
    assert set(manifest["pipeline_bounds"]) == set(rows["scenario"])
