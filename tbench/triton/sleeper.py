"""A model of known capacity: a python-backend model that takes a set service time per request (one CPU instance,
no batching, so it serves one request at a time: capacity 1 / service time). The capacity and latency benchmarks
measure the rules against it, and the tests serve it where a model's own speed must not matter."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tbench.core.iospec import IoSpec, TensorSpec

MODEL = "sleeper"
SPEC = IoSpec(
    inputs=[TensorSpec(name="INPUT0", dtype="float32", shape=[1])],
    outputs=[TensorSpec(name="OUTPUT0", dtype="float32", shape=[1])],
)

MODEL_PY = '''
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps a fixed service time per request, then echoes its input: a server of known capacity."""

    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.service_s = float(params["service_ms"]["string_value"]) / 1000
        record = params.get("record_to", {}).get("string_value")
        self.record = open(record, "a", buffering=1) if record else None  # one line per request: what it received

    def execute(self, requests):
        responses = []
        for request in requests:
            end = time.perf_counter() + self.service_s
            time.sleep(max(0.0, self.service_s - 0.001))
            while time.perf_counter() < end:  # the last millisecond spun: sleep alone overshoots
                pass
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if self.record:
                self.record.write(f"{float(x.ravel()[0])!r}\\n")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''


def sleeper_repository(repo: Path, service_ms: float, name: str = MODEL, record_to: Path | None = None) -> Path:
    """A model repository with the sleeper (named `name`): one CPU instance, max batch 1, no dynamic batcher;
    `record_to`: a file it appends each request's first input value to, in the order it serves them."""
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=1)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[1])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.parameters["service_ms"].string_value = f"{service_ms:g}"
    if record_to is not None:
        config.parameters["record_to"].string_value = str(record_to)
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    return repo
