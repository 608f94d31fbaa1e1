"""The Wide & Deep adapter (TensorFlow/Keras, Outbrain features) and the ranking metrics, small size only
(fast, CPU)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from model_adapters.outbrain import SPECS, synthetic_frame, write_parquet_dataset  # noqa: E402
from model_adapters.ranking_metrics import auc, map_at_k  # noqa: E402
from model_adapters.widedeep import OUTPUT, WideDeep, cross_hash  # noqa: E402
from tbench.core.errors import ConfigError
from tbench.core.runtimes import run_keras

SPEC = SPECS["small"]


@pytest.fixture(scope="module")
def adapter():
    return WideDeep("small")


@pytest.fixture(scope="module")
def model(adapter):
    return adapter.build()


def _concat(batches):
    batches = list(batches)
    inputs = {k: np.concatenate([b.inputs[k] for b in batches]) for k in batches[0].inputs}
    return inputs, np.concatenate([b.labels for b in batches])


def test_io_spec_matches_inputs_and_model(adapter, model):
    spec = adapter.io_spec()
    assert spec.input_names() == SPEC.feature_names == [t.name for t in model.inputs]
    assert len(spec.inputs) == 13 + 3 + 13 and spec.output_names() == [OUTPUT] and spec.outputs[0].shape == [1]
    batch = adapter.sample_batch(5)
    assert list(batch) == spec.input_names()
    for t in spec.inputs:
        assert batch[t.name].dtype == t.np_dtype and batch[t.name].shape == (5, *t.shape), t.name
    assert adapter.io_spec().inputs[13].shape == [3] and adapter.input_shapes()["platform"] == [1]


def test_outputs_are_probabilities(adapter, model):
    batch = next(adapter.batches(64, 64, seed=3))
    out = run_keras(model, adapter.io_spec(), batch.inputs)
    assert list(out) == [OUTPUT] and out[OUTPUT].shape == (64, 1) and out[OUTPUT].dtype == np.float32
    assert ((out[OUTPUT] > 0) & (out[OUTPUT] < 1)).all() and out[OUTPUT].std() > 0
    preds = adapter.predict(out)
    assert preds.shape == (64,) and batch.labels.shape == (64, 2) and batch.labels.dtype == np.int64
    assert 0.0 < adapter.metric(preds, batch.labels) <= 1.0


def test_same_weights_on_two_builds(adapter, model):
    random.seed(99)  # others drawing from Python's global RNG in between change nothing
    random.random()
    first, second = model.get_weights(), adapter.build().get_weights()
    assert len(first) == len(second)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_synthetic_displays():
    frame = synthetic_frame(500, SPEC, seed=4)
    sizes = frame.groupby("display_id").size()
    assert sizes.sum() == 500 and sizes.between(2, 12).all()
    assert (frame.groupby("display_id")["clicked"].sum() == 1).all()
    assert (frame["display_id"].diff().dropna() >= 0).all()  # displays are consecutive rows
    hot = np.stack(frame["topic_id_list"].to_numpy())
    assert hot.shape == (500, 3) and hot.dtype == np.int64 and (hot == 0).any() and hot.max() < 4


def test_parquet_round_trip(tmp_path):
    paths = write_parquet_dataset(tmp_path, 50, SPEC, seed=5, files=2)
    assert [p.name for p in paths] == ["part_0.parquet", "part_1.parquet"] and paths[0].parent.name == "valid"
    read, read_labels = _concat(WideDeep("small", data_dir=str(tmp_path)).batches(50, 16))
    synthetic, labels = _concat(WideDeep("small").batches(50, 16, seed=5))
    assert list(read) == list(synthetic)
    for name in read:
        assert read[name].dtype == synthetic[name].dtype and np.array_equal(read[name], synthetic[name]), name
    np.testing.assert_array_equal(read_labels, labels)
    frame = synthetic_frame(50, SPEC, seed=5)
    np.testing.assert_array_equal(read["entity_id_list"], np.stack(frame["entity_id_list"].to_numpy()))
    np.testing.assert_array_equal(read_labels[:, 1], frame["clicked"].to_numpy())
    # fewer samples than the files hold: the first rows, across the file boundary
    first, first_labels = _concat(WideDeep("small", data_dir=str(tmp_path)).batches(30, 7))
    assert first_labels.shape == (30, 2) and np.array_equal(first["ad_id"], synthetic["ad_id"][:30])


def test_out_of_range_ids_are_folded_the_same_in_loader_and_graph(tmp_path, adapter, model):
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = synthetic_frame(8, SPEC, seed=6)
    cards = SPEC.cardinalities
    frame["ad_id"] = frame["ad_id"] + 7 * cards["ad_id"]
    frame["topic_id_list"] = [np.array([cards["topic_id_list"] + 2, 0, 0])] * 8  # and no valid/ subfolder this time
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table, tmp_path / "data.parquet")
    (batch,) = WideDeep("small", data_dir=str(tmp_path)).batches(8, 8)
    np.testing.assert_array_equal(batch.inputs["ad_id"][:, 0], frame["ad_id"].to_numpy() % cards["ad_id"])
    assert (
        batch.inputs["topic_id_list"][:, 0] == 1 + (cards["topic_id_list"] + 1) % (cards["topic_id_list"] - 1)
    ).all()
    assert (batch.inputs["topic_id_list"][:, 1:] == 0).all()
    # the model folds raw ids in its graph exactly as the loader does, and survives extreme ids
    raw = dict(
        batch.inputs,
        ad_id=batch.inputs["ad_id"] + 3 * cards["ad_id"],
        topic_id_list=np.where(
            batch.inputs["topic_id_list"] > 0, batch.inputs["topic_id_list"] + cards["topic_id_list"] - 1, 0
        ),
    )
    spec = adapter.io_spec()
    np.testing.assert_allclose(
        run_keras(model, spec, raw)[OUTPUT], run_keras(model, spec, batch.inputs)[OUTPUT], rtol=1e-6
    )
    extreme = {k: (np.full_like(v, 2**62) if v.dtype == np.int64 else v) for k, v in batch.inputs.items()}
    extreme["platform"][:] = -1
    out = run_keras(model, spec, extreme)[OUTPUT]
    assert ((out > 0) & (out < 1)).all()


def test_multihot_columns_of_any_list_type_become_fixed_matrices():
    import pyarrow as pa

    from model_adapters.outbrain import _multihot_matrix

    fixed = pa.array([[1, 2, 3], None, [4, 0, 0]], type=pa.list_(pa.int64(), 3))
    np.testing.assert_array_equal(_multihot_matrix(fixed, 3), [[1, 2, 3], [0, 0, 0], [4, 0, 0]])
    ragged = pa.chunked_array(
        [
            pa.array([[5], [6, 7, 8, 9], [], None], type=pa.list_(pa.int32())),
            pa.array([[1, None]], type=pa.list_(pa.int32())),
        ]
    )
    np.testing.assert_array_equal(_multihot_matrix(ragged, 3), [[5, 0, 0], [6, 7, 8], [0, 0, 0], [0, 0, 0], [1, 0, 0]])


def test_missing_column_names_it(tmp_path):
    import pyarrow.parquet as pq

    write_parquet_dataset(tmp_path, 20, SPEC, seed=1, files=1)
    path = tmp_path / "valid" / "part_0.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["geo_location_state"]), path)
    with pytest.raises(ConfigError, match="no column 'geo_location_state'") as info:
        next(WideDeep("small", data_dir=str(tmp_path)).batches(20, 8))
    assert "\n" not in str(info.value)


def test_empty_or_missing_folder_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no parquet files"):
        next(WideDeep("small", data_dir=str(tmp_path)).batches(4, 4))
    with pytest.raises(ConfigError, match="does not exist"):
        next(WideDeep("small", data_dir=str(tmp_path / "nowhere")).batches(4, 4))


def test_auc_golden():
    # positives 0.4 and 0.8 against negatives 0.1 and 0.4: 1 + 0.5 (the tie) + 1 + 1 out of 4 pairs
    assert auc([0.1, 0.4, 0.4, 0.8], [0, 0, 1, 1]) == pytest.approx(0.875)
    assert auc([0.9, 0.2, 0.3], [0, 1, 1]) == pytest.approx(0.0)
    assert auc([0.5] * 4, [1, 0, 1, 0]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="both classes"):
        auc([0.1, 0.2], [1, 1])


def test_map_at_12_golden():
    display = np.array([7, 7, 7, 3, 3, 3, 3, 9, 9, 7])  # rows of a display need not be adjacent nor sorted
    scores = np.array([0.9, 0.1, 0.5, 0.2, 0.8, 0.4, 0.7, 0.6, 0.3, 0.2])
    clicked = np.array([1, 0, 0, 0, 0, 1, 0, 0, 0, 0])
    # display 7: its click has the best score (rank 1) -> 1; display 3: its click ranks 3rd (0.8, 0.7, 0.4) -> 1/3;
    # display 9 has no click and is left out
    assert map_at_k(display, scores, clicked) == pytest.approx((1 + 1 / 3) / 2)
    # two clicks at ranks 1 and 3: (1/1 + 2/3) / 2; a click past rank k scores 0
    assert map_at_k([1, 1, 1], [0.9, 0.5, 0.1], [1, 0, 1]) == pytest.approx(5 / 6)
    assert map_at_k([1] * 13, np.linspace(1, 0, 13), [0] * 12 + [1]) == 0.0
    assert map_at_k([1] * 13, np.linspace(1, 0, 13), [0] * 11 + [1, 0]) == pytest.approx(1 / 12)
    with pytest.raises(ValueError, match="click"):
        map_at_k([1, 2], [0.1, 0.2], [0, 0])


def test_metric_uses_display_grouping(adapter):
    labels = np.array([[1, 0], [1, 1], [2, 1], [2, 0]], dtype=np.int64)
    assert adapter.metric(np.array([0.9, 0.1, 0.3, 0.6]), labels) == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert adapter.metric(np.array([0.1, 0.9, 0.6, 0.3]), labels) == pytest.approx(1.0)


def test_crossed_hash_stays_in_range_for_max_ids():
    for spec in SPECS.values():
        cards = spec.cardinalities
        for a, b, buckets in spec.crosses:
            ids_a = np.array([0, 1, cards[a] - 2, cards[a] - 1], dtype=np.int64).repeat(4)
            ids_b = np.tile(np.array([0, 1, cards[b] - 2, cards[b] - 1], dtype=np.int64), 4)
            rng = np.random.default_rng(0)
            ids_a = np.concatenate([ids_a, rng.integers(0, cards[a], 10000)])
            ids_b = np.concatenate([ids_b, rng.integers(0, cards[b], 10000)])
            hashed = np.asarray(cross_hash(ids_a, ids_b, cards[a], cards[b], buckets))
            assert hashed.dtype == np.int64 and hashed.min() >= 0 and hashed.max() < buckets, (a, b)
            assert np.unique(hashed).size > min(buckets, 10000) // 2  # spread over the buckets, not a few
    with pytest.raises(ValueError, match="overflow"):
        cross_hash(np.zeros(1, np.int64), np.zeros(1, np.int64), 10**9, 10**9, 100)


def test_checkpoint_round_trip(adapter, model, tmp_path):
    rng = np.random.default_rng(7)
    trained = adapter.build()
    trained.set_weights([w + rng.normal(0, 0.05, w.shape).astype(w.dtype) for w in trained.get_weights()])
    path = str(tmp_path / "widedeep_small.weights.h5")
    trained.save_weights(path)

    loaded = WideDeep("small", checkpoint=path).build()
    batch = adapter.sample_batch(16)
    spec = adapter.io_spec()
    expected = run_keras(trained, spec, batch)[OUTPUT]
    np.testing.assert_allclose(run_keras(loaded, spec, batch)[OUTPUT], expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(run_keras(model, spec, batch)[OUTPUT], expected)
    with pytest.raises(ConfigError, match="does not fit"):
        WideDeep("full", checkpoint=path).build()


def test_exports_to_savedmodel_and_onnx(adapter, model, tmp_path, monkeypatch):
    import onnx

    from tbench.core.enums import Format
    from tbench.core.runtimes import run_file, source_digest
    from tbench.stages.export import export_model

    monkeypatch.setenv("TBENCH_CACHE_DIR", str(tmp_path / "cache"))
    digest = source_digest("tensorflow", model)
    saved, onnx_file = (export_model(adapter, model, f, tmp_path, digest) for f in (Format.TF_SAVEDMODEL, Format.ONNX))
    graph = onnx.load(onnx_file.path).graph
    # the SavedModel signature lists its inputs by name; Triton matches them by name, so only the set matters
    assert sorted(i.name for i in graph.input) == sorted(SPEC.feature_names) and [o.name for o in graph.output] == [
        OUTPUT
    ]
    spec = adapter.io_spec()
    inputs = adapter.sample_batch(256, seed=11)
    inputs["ad_id"][:3, 0] = [2**40, -5, SPEC.cardinalities["ad_id"]]  # folded in the graph by every runtime
    expected = run_keras(model, spec, inputs)[OUTPUT]
    for artifact in (saved, onnx_file):
        np.testing.assert_allclose(
            run_file(artifact.format, artifact.path, spec, inputs)[OUTPUT], expected, atol=1e-4, rtol=0
        )


def test_defaults():
    gpu, cpu = WideDeep("full").defaults("gpu"), WideDeep("full").defaults("cpu")
    assert (gpu.max_batch_size, gpu.model_instances, gpu.preferred_batch_sizes) == (131072, 2, [131072])
    assert gpu.offline_batch_sizes == [1] + [16384 * i for i in range(1, 9)]
    assert gpu.online_batch_size == 2048 and gpu.online_concurrency == list(range(8, 257, 8))
    small = WideDeep("small").defaults("cpu")
    assert gpu.formats == small.formats == ["tf-savedmodel", "onnx"]
    assert cpu.formats == ["tf-savedmodel"]  # tf2onnx needs more memory than a CPU box has for the full tables
    for d in (gpu, cpu, small):
        assert max(d.offline_batch_sizes + d.preferred_batch_sizes + [d.online_batch_size]) <= d.max_batch_size


def test_adapter_identity():
    assert (WideDeep.name, WideDeep.framework, WideDeep.metric_name, WideDeep.sizes) == (
        "widedeep",
        "tensorflow",
        "MAP@12",
        ("full", "small"),
    )
