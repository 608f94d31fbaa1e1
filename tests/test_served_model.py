"""A model someone else serves, measured where it is (--served-model with --server-url): the request's checks, the io
spec read from a served config, and on the real embedded server a whole run that leaves the server as it found it."""

from __future__ import annotations

import json

import pytest
from conftest import run_flow
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.capacity.report import AnswerStatus
from tbench.core.enums import Format, Scenario
from tbench.core.errors import ConfigError, ServerStartError
from tbench.request.benchmark import BenchmarkRequest, MeasurementOverrides
from tbench.request.served import SERVED_BATCH_SIZES, check_served, resolve_served
from tbench.triton.served import ServedModel, parse_served_model, split_server_url

URL = "127.0.0.1:8001,127.0.0.1:8000"
CONFIG = """
name: "bert"
platform: "onnxruntime_onnx"
max_batch_size: 4
input { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }
input { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
output { name: "logits" data_type: TYPE_FP32 dims: [ 2 ] }
instance_group { count: 2 kind: KIND_CPU }
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


def served(text: str = CONFIG, version: str = "3") -> ServedModel:
    return ServedModel(name="bert", version=version, config=text_format.Parse(text, mc.ModelConfig()))


def test_a_served_config_gives_the_io_spec_batching_and_format():
    model = served()
    spec = model.io_spec
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [
        ("input_ids", "int64", [-1]),
        ("attention_mask", "int64", [-1]),
    ]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [("logits", "float32", [2])]
    assert model.batching and model.instances == 2 and model.queue_delay_us == 500
    assert model.format == Format.ONNX.value and model.kind == "onnxruntime_onnx"
    python = served(CONFIG.replace('platform: "onnxruntime_onnx"', 'backend: "python"'))
    assert python.format == "python" and python.model_format == "python backend"


def test_a_served_config_says_which_batches_its_dynamic_batcher_forms():
    assert served().dynamic_max_batch == 4
    assert served(CONFIG.replace("dynamic_batching { max_queue_delay_microseconds: 500 }", "")).dynamic_max_batch == 0


def test_a_string_input_is_read_and_a_type_tbench_cannot_send_refused_in_one_line():
    text = CONFIG.replace('name: "input_ids" data_type: TYPE_INT64', 'name: "text" data_type: TYPE_STRING')
    assert served(text).io_spec.inputs[0].dtype == "object"  # strings: sent as BYTES
    bf16 = CONFIG.replace('name: "input_ids" data_type: TYPE_INT64', 'name: "x" data_type: TYPE_BF16')
    with pytest.raises(ConfigError, match="input 'x' is BF16, which tbench cannot send yet") as err:
        _ = served(bf16).io_spec
    assert "\n" not in str(err.value)


def test_a_repositorys_onnx_file_bounds_its_integer_inputs_by_the_tables_they_index(tmp_path):
    """A model of a repository tbench serves: its ONNX file is at hand, so its ids stay below the embedding's rows as
    a model file's do (they were 0..15 whatever the vocabulary); a model served elsewhere has no file to read."""
    from test_input_data import VOCAB, write_bert_onnx

    folder = tmp_path / "bert" / "3"
    folder.mkdir(parents=True)
    write_bert_onnx(folder / "model.onnx")
    model = served()
    assert model.table_rows(tmp_path) == {"input_ids": VOCAB}  # token_type_ids is not in this config
    assert "parameters" not in model.config_json()  # read, not written
    assert served().table_rows(None) == {} and served().table_rows(tmp_path / "elsewhere") == {}
    (folder / "model.onnx").rename(folder / "bert.onnx")  # the file the config names
    named = served(CONFIG + 'default_model_filename: "bert.onnx"')
    assert named.table_rows(tmp_path) == {"input_ids": VOCAB} and served().table_rows(tmp_path) == {}


@pytest.mark.parametrize(
    "value, parsed", [("bert", ("bert", "")), ("bert:3", ("bert", "3")), (" bert:12 ", ("bert", "12"))]
)
def test_served_model_names_parse(value, parsed):
    assert parse_served_model(value) == parsed


@pytest.mark.parametrize("value", ["", ":3", "bert:latest", "bert:"])
def test_a_malformed_served_model_is_refused(value):
    if value == "bert:":
        assert parse_served_model(value) == ("bert", "")  # an empty version is the server's choice
        return
    with pytest.raises(ConfigError, match="is not NAME or NAME:VERSION"):
        parse_served_model(value)


def test_server_urls_split_into_grpc_and_http():
    assert split_server_url(URL) == ("127.0.0.1:8001", "127.0.0.1:8000")
    assert split_server_url("host:8001") == ("host:8001", "host:8001")


@pytest.mark.parametrize(
    "fields, refused",
    [
        ({"formats": ["onnx"]}, "--formats does not apply to --served-model"),
        ({"max_batch_size": 8}, "--max-batch-size does not apply"),
        ({"model_file": "m.onnx"}, "--model-file does not apply"),
        ({"precision": "fp16"}, "--precision does not apply"),
        ({"server": "docker"}, "--server docker starts one"),
        ({"server_url": None}, "needs the server's address"),
    ],
)
def test_options_that_export_or_configure_are_refused(fields, refused):
    request = BenchmarkRequest(**{"served_model": "bert", "server_url": URL, **fields})
    with pytest.raises(ConfigError, match=refused):
        check_served(request)


def test_a_served_request_reads_as_remote_and_keeps_the_measurement_options():
    checked = check_served(BenchmarkRequest(served_model="bert", server_url=URL, precision="fp32", batch_sizes=[1, 2]))
    assert checked.server == "remote" and checked.batch_sizes == [1, 2]


def test_the_sweep_follows_the_served_max_batch_size():
    request = BenchmarkRequest(served_model="bert", server_url=URL)
    sweep = resolve_served(request, max_batch_size=4, has_gpu=False)
    assert sweep.batch_sizes == [b for b in SERVED_BATCH_SIZES["cpu"] if b <= 4]
    assert sweep.scenarios == [Scenario.OFFLINE, Scenario.ONLINE] and sweep.profile == "cpu"
    assert resolve_served(request, max_batch_size=0, has_gpu=False).batch_sizes == [1]  # no batch axis
    with pytest.raises(ConfigError, match="batch size 8 is above the served model's max_batch_size 4"):
        resolve_served(BenchmarkRequest(served_model="bert", server_url=URL, batch_sizes=[8]), 4, has_gpu=False)
    windowed = BenchmarkRequest(served_model="bert", server_url=URL, measurement=MeasurementOverrides(window_s=0.5))
    assert resolve_served(windowed, 4, has_gpu=False).measurement.window_s == 0.5


# ---- on the real embedded server


def _state(grpc_url: str) -> tuple:
    """What a run must not change: the repository index and each ready model's config."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        index = client.get_model_repository_index(as_json=True).get("models", [])
        configs = {
            m["name"]: client.get_model_config(m["name"], as_json=True)["config"]
            for m in index
            if m.get("state") == "READY"
        }
        return json.dumps(index, sort_keys=True), json.dumps(configs, sort_keys=True)
    finally:
        client.close()


@pytest.mark.e2e
def test_a_served_model_is_measured_where_it_is_and_the_server_left_as_found(prefect_harness, served_small, tmp_path):
    ep = served_small.endpoints
    before = _state(ep.grpc_url)
    run, results, report = run_flow(
        tmp_path,
        BenchmarkRequest(
            served_model="resnet50",
            server_url=f"{ep.grpc_url},{ep.http_url}",
            batch_sizes=[1, 4],
            concurrency=[2],
            measurement=MeasurementOverrides(window_s=0.5, stability_percentage=50),
            output=str(tmp_path),
        ),
    )
    assert _state(ep.grpc_url) == before  # nothing loaded, unloaded or reconfigured
    assert served_small.alive()
    ok = results[results["status"] == "ok"]
    assert set(ok["scenario"]) == {"offline", "online"} and len(ok) == 3
    assert set(results["model"]) == {"resnet50"} and set(results["backend"]) == {"python (as served)"}
    assert set(results["batching"]) == {"dynamic"} and set(results["max_queue_delay_us"]) == {1000}
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["served_model"]["name"] == "resnet50" and manifest["served_model"]["version"] == "1"
    assert manifest["environment"]["server"]["version"]  # the server's identity
    served_config = json.loads((run / "served_config.json").read_text())
    assert served_config["max_batch_size"] == 8 and served_config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert not (run / "model_repository").exists() and not list((run / "models").glob("*"))  # nothing exported
    assert "Accuracy is not measured" in report and "dynamic batching (max queue delay 1000 us" in report
    assert "### Offline scenario" in report and "### Online scenario" in report


@pytest.mark.e2e
def test_a_model_the_server_does_not_have_is_refused_naming_what_it_has(served_small):
    from tbench.triton.served import read_served_model

    with pytest.raises(ConfigError, match="serves no model 'nope'; it has: resnet50"):
        read_served_model(served_small.endpoints.grpc_url, "nope")
    with pytest.raises(ConfigError, match="served model 'resnet50' version 7 is not ready"):
        read_served_model(served_small.endpoints.grpc_url, "resnet50", "7")


@pytest.mark.e2e
def test_the_offline_configs_stay_until_a_sweep_asks_for_the_models_own(served_small, small_artifacts):
    """Triton keeps a load's config override through a later load without one: the repository's own is sent back
    explicitly when a sweep asks for it, and a config the model is served with already is not loaded again. What is
    served is read back before a sweep: the other scenario's batching is refused in one line."""
    import tritonclient.grpc as grpcclient

    from tbench.triton.repository import ServingConfig, build_config
    from tbench.triton.server import configs_to_load, load_all

    client = grpcclient.InferenceServerClient(served_small.endpoints.grpc_url)
    static = build_config(ServingConfig("resnet50", 8, [4, 8], 1000, 1, batching="static"), small_artifacts[0])
    with pytest.raises(
        ServerStartError,
        match="serves resnet50 with dynamic batching, max_batch_size 8; its offline config asks for static",
    ):
        served_small.confirm({"resnet50": static})
    try:
        load_all(served_small, configs_to_load(served_small, {"resnet50": static}))
        assert not client.get_model_config("resnet50").config.HasField("dynamic_batching")
        served_small.confirm({"resnet50": static})
        with pytest.raises(
            ServerStartError, match="with static batching, max_batch_size 8; its own config asks for dynamic"
        ):
            served_small.confirm({"resnet50": None})
        log_size = served_small.log_path.stat().st_size
        load_all(served_small, configs_to_load(served_small, {"resnet50": static}))  # served so already: no load
        assert "loading: resnet50" not in served_small.log_path.read_text()[log_size:]
    finally:
        load_all(served_small, configs_to_load(served_small, {"resnet50": None}))
    assert client.get_model_config("resnet50").config.dynamic_batching.max_queue_delay_microseconds == 1000
    client.close()


@pytest.mark.e2e
def test_the_capacity_of_a_served_model_is_its_sustainable_rate_as_served(prefect_harness, served_small, tmp_path):
    from flows.capacity import capacity_flow
    from tbench.capacity.request import CapacityRequest

    ep = served_small.endpoints
    before = _state(ep.grpc_url)
    url = capacity_flow(
        BenchmarkRequest(
            served_model="resnet50",
            server_url=f"{ep.grpc_url},{ep.http_url}",
            measurement=MeasurementOverrides(window_s=0.5),
            output=str(tmp_path),
        ),
        CapacityRequest(slo_ms=5000, traffic_rps=20, max_points=3),
    )
    assert _state(ep.grpc_url) == before
    run = tmp_path / url.rsplit("/", 1)[-1]
    (answer,) = json.loads((run / "capacity.json").read_text())["answers"]
    assert answer["status"] == AnswerStatus.OK and answer["rate"]["points"] and answer["plan"]["instances"] >= 1
    assert answer["configuration"]["format"] == "python (as served)" and answer["configuration"]["max_batch_size"] == 8
    assert "the server at" in answer["hardware"] and (run / "capacity.md").is_file()
