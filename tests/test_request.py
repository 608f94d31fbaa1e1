import pytest

from tbench.core.enums import Format, Scenario
from tbench.core.errors import ConfigError
from tbench.request.benchmark import BenchmarkRequest


def test_cpu_profile_fills_the_adapters_defaults():
    r = BenchmarkRequest(model="resnet50").resolve(has_gpu=False)
    assert r.profile == "cpu" and r.formats == [Format.ONNX, Format.TS_TRACE] and r.serve_formats == [Format.ONNX]
    assert max(r.batch_sizes) <= r.max_batch_size and set(r.preferred_batch_sizes) <= set(
        range(1, r.max_batch_size + 1)
    )
    assert r.scenarios == [Scenario.OFFLINE, Scenario.ONLINE]


def test_gpu_profile_uses_the_guides_grid():
    r = BenchmarkRequest(model="resnet50").resolve(has_gpu=True)
    assert r.max_batch_size == 128 and r.batch_sizes[-1] == 128 and r.concurrency[0] == 16 and r.concurrency[-1] == 256
    assert r.measurement.stability_percentage == 10.0


def test_serving_a_format_not_exported_adds_it():
    r = BenchmarkRequest(model="resnet50", formats=["onnx"], serve_formats=["ts-trace"]).resolve(False)
    assert r.formats == [Format.ONNX, Format.TS_TRACE] and r.serve_formats == [Format.TS_TRACE]
    assert r.triton_name(Format.TS_TRACE) == "resnet50"


def test_serving_all_formats_names_one_triton_model_per_format():
    r = BenchmarkRequest(model="resnet50", formats=["onnx", "ts-trace", "ts-script"], serve_formats=["all"]).resolve(
        False
    )
    assert r.serve_formats == [Format.ONNX, Format.TS_TRACE, Format.TS_SCRIPT]
    assert [r.triton_name(f) for f in r.serve_formats] == ["resnet50_onnx", "resnet50_ts_trace", "resnet50_ts_script"]


def test_tensorflow_variant_defaults_to_savedmodel_and_onnx():
    r = BenchmarkRequest(model="resnet50", framework="tensorflow", size="small").resolve(False)
    assert r.framework == "tensorflow" and r.formats == [Format.TF_SAVEDMODEL, Format.ONNX]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": "nosuch"}, "unknown model 'nosuch'; known: dcnv2, dlrm, fastpitch, nnunet, resnet50, widedeep"),
        ({"formats": ["onnx", "bogus"]}, "unknown format 'bogus'"),
        ({"batch_sizes": [1, 64]}, "batch size 64 is above max_batch_size"),
        (
            {"max_batch_size": 2, "batch_sizes": [1], "preferred_batch_sizes": [4]},
            "preferred batch size 4 is above max_batch_size 2",
        ),
        ({"serve_formats": ["trt"]}, "cannot be served by the embedded server"),
        ({"framework": "jax"}, "model 'resnet50' has no jax implementation; it has: pytorch, tensorflow"),
        ({"model_file": "/nonexistent/model.onnx"}, "/nonexistent/model.onnx"),
        ({"precision": "int8"}, "precision int8 cannot be carried by onnx: int8 is carried by trt, tf-trt only"),
        ({"profile": "laptop"}, "unknown profile"),
        ({"scenarios": ["rate"]}, "the rate scenario needs request rates"),
        ({"scenarios": ["rate"], "request_rates": [10, 0]}, "request rates must be > 0"),
        ({"size": "huge"}, "unknown size 'huge'"),
        ({"scenarios": ["offline", "batch"]}, "unknown scenario 'batch'"),
    ],
)
def test_impossible_requests_fail_with_one_clear_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        BenchmarkRequest(**kwargs).resolve(has_gpu=False)
    assert "\n" not in str(err.value)


def test_plain_flow_run_reads_request_fields_from_argv():
    from tbench.request.benchmark import request_from_argv

    r = request_from_argv(["resnet50", "size=small", "batch_sizes=[1,4]", "output=/tmp/x"])
    assert (r.model, r.size, r.batch_sizes, r.output) == ("resnet50", "small", [1, 4], "/tmp/x")


def test_trials_and_cpu_pinning_are_kept_and_bounded():
    from pydantic import ValidationError

    from tbench.request.benchmark import request_from_argv

    assert (BenchmarkRequest().trials, BenchmarkRequest().pin_cpus) == (1, True)
    resolved = request_from_argv(["resnet50", "trials=5", "pin_cpus=false"]).resolve(has_gpu=False)
    assert (resolved.trials, resolved.pin_cpus) == (5, False)
    for trials in (0, 51):
        with pytest.raises(ValidationError, match="trials"):
            BenchmarkRequest(trials=trials)


def test_tolerances_follow_precision_unless_given():
    assert (BenchmarkRequest(model="resnet50").resolve(False).tolerance_atol) == 1e-3
    assert BenchmarkRequest(model="resnet50", precision="fp16").resolve(True).tolerance_rtol == 1e-2
    assert BenchmarkRequest(model="resnet50", precision="fp16", tolerance_rtol=0.1).resolve(True).tolerance_rtol == 0.1


def test_profiles_scale_what_a_model_needs_on_the_cpu():
    from tbench.request.benchmark import adapter_for
    from tbench.request.measurement import PROFILE_MEASUREMENT

    nnunet = BenchmarkRequest(model="nnunet").resolve(has_gpu=False)
    # ~0.9 s a volume: the profile's windows (as many requests as the band resolves, up to max_window_s) fit it
    assert nnunet.measurement == PROFILE_MEASUREMENT["cpu"] and nnunet.batch_sizes == [1]
    assert adapter_for(nnunet).io_spec().inputs[0].shape == [4, 64, 64, 64]  # the guide's 128^3 on GPU nodes
    on_gpu = BenchmarkRequest(model="nnunet").resolve(has_gpu=True)
    assert adapter_for(on_gpu).io_spec().inputs[0].shape == [4, 128, 128, 128] and on_gpu.measurement.window_s == 2.0


def test_an_ensemble_model_is_served_as_its_parts():
    req = BenchmarkRequest(model="dlrm", size="tiny").resolve(has_gpu=False)
    assert req.serve_formats == [Format.ENSEMBLE] and Format.ENSEMBLE not in req.formats
    assert req.scenarios == [Scenario.OFFLINE]  # the guide measures offline only
    assert req.triton_name(Format.ENSEMBLE) == "dlrm" and req.part_name("dense") == "dlrm_dense"
    with pytest.raises(ConfigError, match="served as a Triton ensemble"):
        BenchmarkRequest(model="dlrm", serve_formats=["onnx"]).resolve(has_gpu=False)
    with pytest.raises(ConfigError, match="not an ensemble"):
        BenchmarkRequest(model="resnet50", serve_formats=["ensemble"]).resolve(has_gpu=False)


def test_model_options_and_default_size_come_from_the_model():
    assert BenchmarkRequest(model="dlrm").resolve(has_gpu=False).size == "small"
    assert BenchmarkRequest(model="resnet50").resolve(has_gpu=False).size == "full"
    req = BenchmarkRequest(model="dcnv2", size="tiny", model_options={"memory_threshold_gb": 2}).resolve(has_gpu=False)
    assert req.model_options == {"memory_threshold_gb": 2}
    with pytest.raises(ConfigError, match="unknown option 'nope' for model 'resnet50'; it takes: none"):
        BenchmarkRequest(model="resnet50", model_options={"nope": 1}).resolve(has_gpu=False)


def test_online_batch_size_is_checked_against_max_batch():
    req = BenchmarkRequest(model="resnet50", size="small", online_batch_size=4).resolve(has_gpu=False)
    assert req.online_batch_size == 4
    with pytest.raises(ConfigError, match="online batch size 64 is above max_batch_size"):
        BenchmarkRequest(model="resnet50", size="small", online_batch_size=64).resolve(has_gpu=False)


def test_measurement_options_override_single_fields_of_the_profile():
    from tbench.request.benchmark import Measurement, MeasurementOverrides

    r = BenchmarkRequest(model="resnet50", measurement=MeasurementOverrides(stability_percentage=25)).resolve(
        has_gpu=True
    )
    assert r.measurement.stability_percentage == 25
    assert (r.measurement.window_s, r.measurement.min_requests) == (2.0, 50)  # the GPU profile's, not the CPU defaults
    # a full Measurement given as the override changes only the fields set on it (as tests and old callers pass it)
    r = BenchmarkRequest(model="resnet50", measurement=Measurement(max_trials=4)).resolve(has_gpu=True)
    assert r.measurement.max_trials == 4 and r.measurement.window_s == 2.0
    assert BenchmarkRequest(model="resnet50").resolve(has_gpu=False).measurement.stability_percentage == 10.0


def test_a_retired_or_misspelt_measurement_setting_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="images_per_window"):
        BenchmarkRequest(model="resnet50", measurement={"images_per_window": 16})


def test_a_remote_run_names_its_triton_models_its_own_way():
    """A remote server is shared: every name a run loads there ends with a suffix of its own; results show the plain
    one."""
    from tbench.request.benchmark import plain_name

    first = BenchmarkRequest(model="dlrm", size="tiny", server="remote", server_url="h:8001").resolve(has_gpu=False)
    second = BenchmarkRequest(model="dlrm", size="tiny", server="remote", server_url="h:8001").resolve(has_gpu=False)
    ensemble, part = first.triton_name(Format.ENSEMBLE), first.part_name("dense")
    assert ensemble.startswith("dlrm__tb") and part == "dlrm_dense" + first.triton_suffix
    assert first.triton_suffix != second.triton_suffix  # two runs on one server never share a name
    assert plain_name(ensemble) == "dlrm" and plain_name(part) == "dlrm_dense" and plain_name("resnet50") == "resnet50"
    local = BenchmarkRequest(model="resnet50", formats=["onnx", "ts-trace"], serve_formats=["all"]).resolve(False)
    assert local.triton_suffix == "" and local.triton_name(Format.ONNX) == "resnet50_onnx"  # a private server: plain


@pytest.fixture(scope="module")
def dynamic_onnx(tmp_path_factory):
    """An ONNX file whose inputs have a dynamic sequence dim: features [B, S, 8], ids [B, S]."""
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.proj = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 4)

        def forward(self, features, ids):
            return self.proj(features + self.embed(ids)).mean(dim=1)

    path = tmp_path_factory.mktemp("onnx") / "tagger.onnx"
    torch.onnx.export(
        Tagger().eval(),
        (torch.randn(2, 5, 8), torch.randint(0, 16, (2, 5))),
        str(path),
        dynamo=False,
        input_names=["features", "ids"],
        output_names=["pooled"],
        dynamic_axes={"features": {0: "B", 1: "S"}, "ids": {0: "B", 1: "S"}, "pooled": {0: "B"}},
    )
    return str(path)


def test_trt_shapes_are_checked_against_the_io_spec_and_kept(dynamic_onnx):
    shapes = {"features": [[4, 8], [64, 8], [256, 8]], "ids": [[4], [64], [256]]}
    r = BenchmarkRequest(model_file=dynamic_onnx, formats=["onnx", "trt"], trt_shapes=shapes).resolve(has_gpu=False)
    assert r.trt_shapes == shapes and r.calibration_samples is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"trt_shapes": {"ids": [[4], [64], [256]]}},
            "--trt-shape shapes TensorRT's optimisation profile; this run builds no trt",
        ),
        (
            {"formats": ["onnx", "trt"], "trt_shapes": {"tokens": [[4], [64], [256]]}},
            "--trt-shape tokens: no such input; the inputs are features, ids",
        ),
        (
            {"formats": ["onnx", "trt"], "trt_shapes": {"features": [[4, 8], [64, 9], [256, 8]]}},
            r"--trt-shape features: axis 2 is static \(8\); give 8 in MIN, OPT and MAX",
        ),
        (
            {"formats": ["onnx", "trt"], "trt_shapes": {"ids": [[64], [4], [256]]}},
            "--trt-shape ids: axis 1 needs 1 <= MIN <= OPT",
        ),
        (
            {
                "formats": ["trt"],
                "server": "local",
                "precision": "int8",
                "batch_sizes": [1, 8, 32],
                "max_batch_size": 64,
                "calibration_samples": 16,
            },
            r"a calibration set of 16 samples is less than one calibration batch \(32,",
        ),
    ],
)
def test_impossible_tensorrt_options_fail_with_one_clear_line(dynamic_onnx, kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        BenchmarkRequest(model_file=dynamic_onnx, **kwargs).resolve(has_gpu=True)
    assert "\n" not in str(err.value)


def test_an_ensemble_takes_no_trt_shapes():
    with pytest.raises(ConfigError, match="--trt-shape: model 'dlrm' is an ensemble"):
        BenchmarkRequest(model="dlrm", size="tiny", trt_shapes={"x": [[1], [2], [3]]}).resolve(has_gpu=True)


def test_calibration_samples_must_be_positive():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="calibration_samples"):
        BenchmarkRequest(calibration_samples=0)


@pytest.fixture(scope="module")
def fixed_batch_onnx(tmp_path_factory):
    import torch

    path = tmp_path_factory.mktemp("fixed") / "fixed.onnx"
    torch.onnx.export(torch.nn.Linear(3, 2), (torch.randn(1, 3),), str(path), dynamo=False, input_names=["x"])
    return str(path)


def test_a_model_without_a_batch_axis_resolves_to_max_batch_size_0(fixed_batch_onnx):
    r = BenchmarkRequest(model_file=fixed_batch_onnx).resolve(has_gpu=False)
    assert (r.max_batch_size, r.batch_sizes, r.preferred_batch_sizes, r.max_queue_delay_us) == (0, [1], [], 0)
    assert (r.online_batch_size, r.accuracy_batch_size) == (1, 1)
    assert BenchmarkRequest(model_file=fixed_batch_onnx, batch_sizes=[1]).resolve(has_gpu=False).batch_sizes == [1]


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"max_batch_size": 8}, "--max-batch-size"),
        ({"batch_sizes": [1, 2]}, "--batch-sizes"),
        ({"preferred_batch_sizes": [2]}, "--preferred-batch-sizes"),
        ({"max_queue_delay_us": 100}, "--queue-delay-us"),
        ({"online_batch_size": 4}, "--online-batch-size"),
    ],
)
def test_batching_options_on_a_model_without_a_batch_axis_are_refused(fixed_batch_onnx, kwargs, flag):
    with pytest.raises(ConfigError, match=f"^{flag}: model 'fixed' has no batch axis .* drop {flag}"):
        BenchmarkRequest(model_file=fixed_batch_onnx, **kwargs).resolve(has_gpu=False)
