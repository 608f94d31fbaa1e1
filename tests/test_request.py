import pytest

from tbench.enums import Format, Scenario
from tbench.errors import ConfigError
from tbench.request import BenchmarkRequest


def test_cpu_profile_fills_the_adapters_defaults():
    r = BenchmarkRequest(model="resnet50").resolve(has_gpu=False)
    assert r.profile == "cpu" and r.formats == [Format.ONNX, Format.TS_TRACE] and r.serve_format is Format.ONNX
    assert max(r.batch_sizes) <= r.max_batch_size and set(r.preferred_batch_sizes) <= set(range(1, r.max_batch_size + 1))
    assert r.scenarios == [Scenario.OFFLINE, Scenario.ONLINE]


def test_gpu_profile_uses_the_guides_grid():
    r = BenchmarkRequest(model="resnet50").resolve(has_gpu=True)
    assert r.max_batch_size == 128 and r.batch_sizes[-1] == 128 and r.concurrency[0] == 16 and r.concurrency[-1] == 256
    assert r.measurement.stability_percentage == 10.0


def test_serving_a_format_not_exported_adds_it():
    r = BenchmarkRequest(model="resnet50", formats=["onnx"], serve_format="ts-trace").resolve(False)
    assert r.formats == [Format.ONNX, Format.TS_TRACE] and r.serve_format is Format.TS_TRACE


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "nosuch"}, "unknown model 'nosuch'; known: resnet50"),
    ({"formats": ["onnx", "bogus"]}, "unknown format 'bogus'"),
    ({"batch_sizes": [1, 64]}, "batch size 64 is above max_batch_size"),
    ({"max_batch_size": 2, "batch_sizes": [1], "preferred_batch_sizes": [4]}, "preferred batch size 4 is above max_batch_size 2"),
    ({"serve_format": "trt"}, "cannot be served by the embedded server"),
    ({"precision": "fp16"}, "needs a GPU"),
    ({"profile": "laptop"}, "unknown profile"),
    ({"size": "huge"}, "unknown size 'huge'"),
    ({"scenarios": ["offline", "batch"]}, "unknown scenario 'batch'"),
])
def test_impossible_requests_fail_with_one_clear_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        BenchmarkRequest(**kwargs).resolve(has_gpu=False)
    assert "\n" not in str(err.value)


def test_plain_flow_run_reads_request_fields_from_argv():
    from flows.benchmark import request_from_argv

    r = request_from_argv(["resnet50", "size=small", "batch_sizes=[1,4]", "output=/tmp/x"])
    assert (r.model, r.size, r.batch_sizes, r.output) == ("resnet50", "small", [1, 4], "/tmp/x")
