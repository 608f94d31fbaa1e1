"""The TensorFlow/Keras ResNet-50 adapter, small size only (fast, CPU)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from model_adapters.resnet50_tf import ResNet50TF  # noqa: E402
from tbench.core.errors import ConfigError
from tbench.core.runtimes import run_keras


@pytest.fixture(scope="module")
def adapter():
    return ResNet50TF("small")


@pytest.fixture(scope="module")
def model(adapter):
    return adapter.build()


def test_output_shape_and_dtype(adapter, model):
    spec = adapter.io_spec()
    assert spec.input_names() == ["input"] and spec.inputs[0].shape == [32, 32, 3]
    assert spec.output_names() == ["output"] and spec.outputs[0].shape == [10]
    batch = adapter.sample_batch(4)
    assert batch["input"].shape == (4, 32, 32, 3) and batch["input"].dtype == np.float32
    out = run_keras(model, adapter.io_spec(), batch)
    assert list(out) == ["output"]
    assert out["output"].shape == (4, 10) and out["output"].dtype == np.float32
    assert np.isfinite(out["output"]).all() and out["output"].std() > 0
    assert model.inputs[0].name == "input"
    preds = adapter.predict(out)
    assert preds.shape == (4,) and 0.0 <= adapter.metric(preds, np.zeros(4, dtype=int)) <= 1.0


def test_same_weights_on_two_builds(adapter, model):
    random.seed(99)  # others drawing from Python's global RNG in between (Prefect's threads do) change nothing
    random.random()
    again = adapter.build()
    first, second = model.get_weights(), again.get_weights()
    assert len(first) == len(second)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_checkpoint_round_trip(adapter, model, tmp_path):
    # perturb the weights so the round trip cannot pass by rebuilding the seeded initial weights
    rng = np.random.default_rng(7)
    trained = adapter.build()
    trained.set_weights([w + rng.normal(0, 0.01, w.shape).astype(w.dtype) for w in trained.get_weights()])
    path = str(tmp_path / "resnet50_small.weights.h5")
    trained.save_weights(path)

    loaded = ResNet50TF("small", checkpoint=path).build()
    batch = adapter.sample_batch(2)
    expected = run_keras(trained, adapter.io_spec(), batch)["output"]
    np.testing.assert_allclose(run_keras(loaded, adapter.io_spec(), batch)["output"], expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(run_keras(model, adapter.io_spec(), batch)["output"], expected)


def test_bad_checkpoint_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        ResNet50TF("small", checkpoint=str(tmp_path / "missing.weights.h5")).build()
    garbage = tmp_path / "garbage.weights.h5"
    garbage.write_bytes(b"not hdf5")
    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        ResNet50TF("small", checkpoint=str(garbage)).build()
    with pytest.raises(ConfigError, match="weights.h5"):
        ResNet50TF("small", checkpoint=str(tmp_path / "model.pt")).build()


def test_mismatching_checkpoint_raises_config_error(tmp_path):
    from model_adapters.resnet50_tf import _build_model

    other = _build_model((1, 1, 1, 1), 8, 32, 5)  # 5 classes instead of 10
    path = str(tmp_path / "five_classes.weights.h5")
    other.save_weights(path)
    with pytest.raises(ConfigError, match="does not fit") as info:
        ResNet50TF("small", checkpoint=path).build()
    assert "\n" not in str(info.value)


def test_defaults_formats():
    from model_adapters.resnet50 import ResNet50

    for size in ("small", "full"):
        for profile in ("cpu", "gpu"):
            tf_defaults = ResNet50TF(size).defaults(profile)
            assert tf_defaults.formats == ["tf-savedmodel", "onnx"]
            torch_defaults = ResNet50(size).defaults(profile)
            assert tf_defaults.max_batch_size == torch_defaults.max_batch_size
            assert tf_defaults.offline_batch_sizes == torch_defaults.offline_batch_sizes
            assert tf_defaults.accuracy_samples == torch_defaults.accuracy_samples


def test_adapter_identity():
    assert (ResNet50TF.name, ResNet50TF.framework, ResNet50TF.metric_name) == ("resnet50", "tensorflow", "top1")
