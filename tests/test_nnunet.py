"""The nnU-Net 3D U-Net adapter, small size only (fast, CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from model_adapters.nnunet import IN_CHANNELS, NUM_CLASSES, NnUNet, _build_module, center_crop_or_pad, dice_per_class
from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.core.runtimes import run_pytorch

SIDE = 32


@pytest.fixture(scope="module")
def adapter():
    return NnUNet("small")


@pytest.fixture(scope="module")
def model(adapter):
    return adapter.build()


@pytest.fixture(scope="module")
def artifacts(adapter, model, tmp_path_factory):
    """The small model exported once for the module: [ts-script, onnx], the defaults' formats."""
    from tbench.core.runtimes import source_digest
    from tbench.stages.export import export_model

    out = tmp_path_factory.mktemp("nnunet-models")
    digest = source_digest("pytorch", model)
    return [export_model(adapter, model, Format.parse(f), out, digest) for f in adapter.defaults("cpu").formats]


def test_adapter_identity_and_base_signature(tmp_path):
    assert (NnUNet.name, NnUNet.framework, NnUNet.metric_name) == ("nnunet", "pytorch", "dice")
    plain = NnUNet("small", None)
    assert plain.checkpoint is None and plain.data_dir is None
    assert NnUNet("small", None, data_dir=str(tmp_path)).data_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="unknown size"):
        NnUNet("medium")


def test_output_shape_and_dtype(adapter, model):
    spec = adapter.io_spec()
    assert spec.input_names() == ["input__0"] and spec.inputs[0].shape == [IN_CHANNELS, SIDE, SIDE, SIDE]
    assert spec.output_names() == ["output__0"] and spec.outputs[0].shape == [NUM_CLASSES, SIDE, SIDE, SIDE]
    assert spec.inputs[0].dtype == spec.outputs[0].dtype == "float32"
    batch = next(adapter.batches(2, 2))
    assert batch.inputs["input__0"].shape == (2, 4, SIDE, SIDE, SIDE) and batch.inputs["input__0"].dtype == np.float32
    assert batch.labels.shape == (2, SIDE, SIDE, SIDE) and batch.labels.min() >= 0 and batch.labels.max() < NUM_CLASSES
    out = run_pytorch(model, spec, batch.inputs)
    assert list(out) == ["output__0"]
    assert out["output__0"].shape == (2, NUM_CLASSES, SIDE, SIDE, SIDE) and out["output__0"].dtype == np.float32
    assert np.isfinite(out["output__0"]).all() and out["output__0"].std() > 0
    preds = adapter.predict(out)
    assert preds.shape == (2, SIDE, SIDE, SIDE) and np.issubdtype(preds.dtype, np.integer)
    assert set(np.unique(preds)) <= set(range(NUM_CLASSES))
    assert 0.0 <= adapter.metric(preds, batch.labels) <= 1.0
    assert adapter.input_shapes() == {"input__0": [4, SIDE, SIDE, SIDE]}


def test_same_weights_and_data_on_repeats(adapter, model):
    again = adapter.build()
    first, second = model.state_dict(), again.state_dict()
    assert list(first) == list(second) and all(first[k].equal(second[k]) for k in first)
    inputs = adapter.sample_batch(1)
    np.testing.assert_array_equal(inputs["input__0"], adapter.sample_batch(1)["input__0"])
    np.testing.assert_array_equal(
        run_pytorch(model, adapter.io_spec(), inputs)["output__0"],
        run_pytorch(again, adapter.io_spec(), inputs)["output__0"],
    )
    a, b = next(adapter.batches(3, 3, seed=5)), next(adapter.batches(3, 3, seed=5))
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(a.inputs["input__0"], next(adapter.batches(3, 3, seed=6)).inputs["input__0"])
    assert [len(b.labels) for b in adapter.batches(5, 2)] == [2, 2, 1]


def test_checkpoint_round_trip(adapter, model, tmp_path):
    import torch

    # perturb the weights so the round trip cannot pass by rebuilding the seeded initial weights
    trained = adapter.build()
    torch.manual_seed(7)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    plain, wrapped = tmp_path / "nnunet_small.pt", tmp_path / "nnunet_small_wrapped.ckpt"
    torch.save(trained.state_dict(), plain)
    # the {"state_dict": ...} form with a DataParallel prefix loads too
    torch.save({"state_dict": {f"module.{k}": v for k, v in trained.state_dict().items()}}, wrapped)

    batch = adapter.sample_batch(1)
    expected = run_pytorch(trained, adapter.io_spec(), batch)["output__0"]
    for path in (plain, wrapped):
        loaded = NnUNet("small", checkpoint=str(path)).build()
        assert not loaded.training
        np.testing.assert_allclose(
            run_pytorch(loaded, adapter.io_spec(), batch)["output__0"], expected, rtol=1e-5, atol=1e-5
        )
    assert not np.allclose(run_pytorch(model, adapter.io_spec(), batch)["output__0"], expected)


def test_bad_checkpoint_raises_config_error(tmp_path):
    import torch

    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        NnUNet("small", checkpoint=str(tmp_path / "missing.pt")).build()
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read checkpoint") as info:
        NnUNet("small", checkpoint=str(garbage)).build()
    assert "\n" not in str(info.value)
    not_a_dict = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), not_a_dict)
    with pytest.raises(ConfigError, match="not a state dict"):
        NnUNet("small", checkpoint=str(not_a_dict)).build()
    other = _build_module((8, 16, 32), IN_CHANNELS, 5)  # 5 classes instead of 4
    path = tmp_path / "five_classes.pt"
    torch.save(other.state_dict(), path)
    with pytest.raises(ConfigError, match="does not fit") as info:
        NnUNet("small", checkpoint=str(path)).build()
    assert "\n" not in str(info.value)


def _write_case(root, name, shape, seed, label=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((IN_CHANNELS, *shape), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=(1, *shape), dtype=np.uint8)
    np.save(root / f"{name}_x.npy", x)
    if label:
        np.save(root / f"{name}_y.npy", y)
    return x, y


def test_dataloader_reads_the_preprocessed_layout_with_crop_and_pad(tmp_path):
    # case a: D cropped (40 -> 32), H padded (30 -> 32), W kept; case b: already 32^3
    xa, ya = _write_case(tmp_path, "BraTS_001", (40, 30, SIDE), seed=1)
    xb, yb = _write_case(tmp_path, "BraTS_002", (SIDE, SIDE, SIDE), seed=2)
    np.save(tmp_path / "BraTS_001_meta.npy", np.zeros(3))  # the preprocessing's other files are ignored
    adapter = NnUNet("small", data_dir=str(tmp_path))

    batches = list(adapter.batches(10, 4))
    assert len(batches) == 1  # the first n_samples cases, no repeats
    x, y = batches[0].inputs["input__0"], batches[0].labels
    assert x.shape == (2, 4, SIDE, SIDE, SIDE) and x.dtype == np.float32
    assert y.shape == (2, SIDE, SIDE, SIDE) and y.dtype == np.uint8
    # center crop of D: rows 4..35; center pad of H: one zero row before, one after
    np.testing.assert_array_equal(x[0, :, :, 1:31, :], xa[:, 4:36])
    assert not x[0, :, :, 0].any() and not x[0, :, :, 31].any()
    np.testing.assert_array_equal(y[0, :, 1:31, :], ya[0, 4:36])
    assert not y[0, :, 0].any() and not y[0, :, 31].any()
    np.testing.assert_array_equal(x[1], xb)
    np.testing.assert_array_equal(y[1], yb[0])

    assert [len(b.labels) for b in adapter.batches(2, 1)] == [1, 1]
    assert len(next(adapter.batches(1, 4)).labels) == 1
    np.testing.assert_array_equal(adapter.sample_batch(1)["input__0"][0], x[0])


def test_center_crop_or_pad_odd_sizes():
    volume = np.arange(5 * 3 * 4, dtype=np.float32).reshape(1, 5, 3, 4)
    out = center_crop_or_pad(volume, 4)
    assert out.shape == (1, 4, 4, 4)
    np.testing.assert_array_equal(out[0, :, 0:3, :], volume[0, 0:4])  # crop 5 -> 4 starts at 0; pad 3 -> 4 adds after
    assert not out[0, :, 3].any()


def test_dataloader_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a folder"):
        next(NnUNet("small", data_dir=str(tmp_path / "nowhere")).batches(1, 1))
    with pytest.raises(ConfigError, match="no preprocessed cases"):
        next(NnUNet("small", data_dir=str(tmp_path)).batches(1, 1))
    _write_case(tmp_path, "a", (SIDE, SIDE, SIDE), seed=1)
    _write_case(tmp_path, "b", (SIDE, SIDE, SIDE), seed=2, label=False)
    with pytest.raises(ConfigError, match="have labels"):
        next(NnUNet("small", data_dir=str(tmp_path)).batches(2, 2))

    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    _write_case(unlabelled, "c", (SIDE, SIDE, SIDE), seed=3, label=False)
    assert next(NnUNet("small", data_dir=str(unlabelled)).batches(1, 1)).labels is None

    wrong = tmp_path / "three_channels"
    wrong.mkdir()
    np.save(wrong / "d_x.npy", np.zeros((3, SIDE, SIDE, SIDE), dtype=np.float32))
    with pytest.raises(ConfigError, match=r"\[4, D, H, W\]"):
        next(NnUNet("small", data_dir=str(wrong)).batches(1, 1))

    mismatch = tmp_path / "mismatch"
    mismatch.mkdir()
    np.save(mismatch / "e_x.npy", np.zeros((4, 8, 8, 8), dtype=np.float32))
    np.save(mismatch / "e_y.npy", np.zeros((1, 8, 8, 9), dtype=np.uint8))
    with pytest.raises(ConfigError, match="does not match"):
        next(NnUNet("small", data_dir=str(mismatch)).batches(1, 1))


def test_dice_on_hand_made_arrays(adapter):
    labels = np.zeros((1, 4, 4, 4), dtype=np.uint8)
    labels[0, :2] = 1
    labels[0, 2:, :2] = 2
    labels[0, 2:, 2:, :2] = 3
    assert adapter.dice_per_class(labels, labels) == {1: 1.0, 2: 1.0, 3: 1.0}
    assert adapter.metric(labels, labels) == 1.0

    disjoint = np.zeros_like(labels)
    disjoint[labels == 1], disjoint[labels == 2], disjoint[labels == 3] = 2, 3, 1
    assert adapter.dice_per_class(disjoint, labels) == {1: 0.0, 2: 0.0, 3: 0.0}
    assert adapter.metric(disjoint, labels) == 0.0

    # class 3 absent from both: 1.0; class 1 half predicted: 2*16/(16+32); class 2 exact
    only12 = np.where(labels == 3, 0, labels).astype(np.uint8)
    half = only12.copy()
    half[0, :2, :2] = 0
    scores = adapter.dice_per_class(half, only12)
    assert scores == pytest.approx({1: 2 * 16 / 48, 2: 1.0, 3: 1.0})
    assert adapter.metric(half, only12) == pytest.approx((2 / 3 + 1 + 1) / 3)

    # per case, then averaged over cases: a perfect case and a disjoint one give 0.5; a [D, H, W] array is one case
    two = dice_per_class(np.concatenate([labels, disjoint]), np.concatenate([labels, labels]))
    assert two == {1: 0.5, 2: 0.5, 3: 0.5}
    assert dice_per_class(labels[0], labels[0]) == {1: 1.0, 2: 1.0, 3: 1.0}
    with pytest.raises(ValueError, match="differ in shape"):
        dice_per_class(labels, labels[0])


def test_defaults():
    gpu = NnUNet("full").defaults("gpu")
    assert gpu.formats == ["ts-script", "onnx"]
    assert (gpu.max_batch_size, gpu.model_instances, gpu.preferred_batch_sizes, gpu.max_queue_delay_us) == (
        4,
        1,
        [2, 4],
        1,
    )
    assert gpu.offline_batch_sizes == [1, 2, 4] and gpu.online_concurrency == list(range(1, 9))
    for size in ("full", "small"):
        d = NnUNet(size).defaults("cpu")
        assert d.formats == ["ts-script", "onnx"]
        assert max(d.offline_batch_sizes + d.preferred_batch_sizes) <= d.max_batch_size
    small = NnUNet("small").defaults("cpu")
    assert (small.max_batch_size, small.offline_batch_sizes, small.accuracy_samples) == (4, [1, 2, 4], 8)


def test_export_ts_script_and_onnx_pass_correctness(adapter, model, artifacts):
    from tbench.stages.correctness import check_artifacts, require_passed

    assert [a.format for a in artifacts] == [Format.TS_SCRIPT, Format.ONNX]
    results = check_artifacts(adapter, model, artifacts, atol=1e-3, rtol=1e-3)
    assert [r.format for r in results] == [Format.TS_SCRIPT, Format.ONNX]
    require_passed(results)
    assert all(o.passed and o.max_abs_err < 1e-3 for r in results for o in r.outputs)


@pytest.mark.e2e
def test_served_inference_matches_the_module(adapter, model, artifacts, tmp_path):
    import tritonclient.grpc as grpcclient

    from tbench.stages.accuracy import infer_triton
    from tbench.triton.process_server import EmbeddedServer
    from tbench.triton.repository import ServingConfig, write_repository

    artifact = artifacts[0]  # ts-script, the guide's format (TorchScript inside the python backend here)
    write_repository(tmp_path / "repo", ServingConfig("nnunet", 4, [4], 1000, 1), artifact)
    inputs = adapter.sample_batch(2, seed=11)
    with EmbeddedServer(tmp_path / "repo", tmp_path / "tritonserver.log") as server:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)
        try:
            got = infer_triton(client, "nnunet", adapter.io_spec(), inputs)
        finally:
            client.close()
    want = run_pytorch(model, adapter.io_spec(), inputs)
    assert got["output__0"].shape == (2, NUM_CLASSES, SIDE, SIDE, SIDE)
    np.testing.assert_allclose(got["output__0"], want["output__0"], atol=1e-3, rtol=0)
