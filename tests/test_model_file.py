"""A user's model file: format detection, io spec, synthetic inputs and its own runtime."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import torch

from tbench.core.enums import Format
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.core.model_file import DEFAULT_DYNAMIC_DIM, detect_format, read_model_file, run_model_file, synthetic_inputs


class Tagger(torch.nn.Module):
    """Two inputs (features [B, S, 8], ids [B, S]) and two outputs ([B, S, 4], [B, 4])."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, features, ids):
        tokens = self.proj(features + self.embed(ids))
        return tokens, tokens.mean(dim=1)


def _spec(tensors: list[TensorSpec]) -> list[tuple[str, str, list[int]]]:
    return [(t.name, t.dtype, t.shape) for t in tensors]


# ---------------------------------------------------------------- ONNX


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "tagger.onnx"
    example = (torch.randn(2, 5, 8), torch.randint(0, 16, (2, 5)))
    torch.onnx.export(
        Tagger().eval(),
        example,
        str(path),
        dynamo=False,
        input_names=["features", "ids"],
        output_names=["tokens", "pooled"],
        dynamic_axes={
            "features": {0: "B", 1: "S"},
            "ids": {0: "B", 1: "S"},
            "tokens": {0: "B", 1: "S"},
            "pooled": {0: "B"},
        },
    )
    return path


def test_onnx_spec_strips_the_dynamic_batch_axis(onnx_path):
    mf = read_model_file(onnx_path)
    assert mf.format is Format.ONNX and mf.batching and mf.int_high == 16
    assert _spec(mf.io_spec.inputs) == [("features", "float32", [-1, 8]), ("ids", "int64", [-1])]
    assert _spec(mf.io_spec.outputs) == [("tokens", "float32", [-1, 4]), ("pooled", "float32", [4])]
    assert mf.input_shapes == {"features": [DEFAULT_DYNAMIC_DIM, 8], "ids": [DEFAULT_DYNAMIC_DIM]}


def test_onnx_shape_overrides_fill_dynamic_dims(onnx_path):
    mf = read_model_file(onnx_path, shapes={"features": [7, 8], "ids": [7]}, int_high=16)
    assert mf.input_shapes == {"features": [7, 8], "ids": [7]}
    data = synthetic_inputs(mf, batch_size=3)
    assert data["features"].shape == (3, 7, 8) and data["features"].dtype == np.float32
    assert data["ids"].shape == (3, 7) and data["ids"].dtype == np.int64
    assert 0 <= data["ids"].min() and data["ids"].max() < 16


@pytest.mark.parametrize(
    "shapes, match",
    [
        ({"features": [7, 9]}, "does not fit the model's shape -1,8"),  # static dim differs
        ({"features": [7]}, "rank and static dims must match"),
        ({"ids": [0]}, "does not fit"),
        ({"feature": [7, 8]}, "unknown input.*feature; the model's inputs are features, ids"),
    ],
)
def test_onnx_bad_shape_overrides_are_config_errors(onnx_path, shapes, match):
    with pytest.raises(ConfigError, match=match):
        read_model_file(onnx_path, shapes=shapes)


def test_onnx_dtype_flags_are_checked(onnx_path):
    with pytest.raises(ConfigError, match="unknown input.*idz"):
        read_model_file(onnx_path, dtypes={"idz": "int64"})
    with pytest.raises(ConfigError, match="contradicts.*declares int64"):
        read_model_file(onnx_path, dtypes={"ids": "int32"})


def test_onnx_runs_like_torch(onnx_path):
    mf = read_model_file(onnx_path, shapes={"features": [5, 8], "ids": [5]})
    data = synthetic_inputs(mf, batch_size=2, seed=1)
    got = run_model_file(mf, data)
    with torch.inference_mode():
        tokens, pooled = Tagger().eval()(torch.from_numpy(data["features"]), torch.from_numpy(data["ids"]))
    assert list(got) == ["tokens", "pooled"]
    np.testing.assert_allclose(got["tokens"], tokens.numpy(), atol=1e-5)
    np.testing.assert_allclose(got["pooled"], pooled.numpy(), atol=1e-5)


def test_onnx_protobuf_without_suffix_is_detected(onnx_path, tmp_path):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(onnx_path.read_bytes())
    assert detect_format(renamed) is Format.ONNX


# ---------------------------------------------------------------- TorchScript


@pytest.fixture(scope="module")
def ts_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("ts") / "tagger.pt"
    torch.jit.save(torch.jit.script(Tagger().eval()), str(path))
    return path


def test_torchscript_without_shapes_names_the_flag(ts_path):
    assert detect_format(ts_path) is Format.TS_SCRIPT
    with pytest.raises(ConfigError, match=r"give --shape NAME:D1,D2,\.\.\. .*for features, ids"):
        read_model_file(ts_path)
    with pytest.raises(ConfigError, match="for ids"):
        read_model_file(ts_path, shapes={"features": [-1, 8]})


def test_torchscript_outputs_are_probed(ts_path):
    mf = read_model_file(ts_path, shapes={"features": [-1, 8], "ids": [-1]}, dtypes={"ids": "int64"})
    assert mf.batching and mf.format is Format.TS_SCRIPT
    assert _spec(mf.io_spec.inputs) == [("features", "float32", [-1, 8]), ("ids", "int64", [-1])]
    # tokens follow the dynamic sequence dim; pooled does not
    assert _spec(mf.io_spec.outputs) == [("output__0", "float32", [-1, 4]), ("output__1", "float32", [4])]
    assert mf.input_shapes == {"features": [DEFAULT_DYNAMIC_DIM, 8], "ids": [DEFAULT_DYNAMIC_DIM]}
    got = run_model_file(mf, synthetic_inputs(mf, batch_size=3))
    assert got["output__0"].shape == (3, DEFAULT_DYNAMIC_DIM, 4) and got["output__1"].shape == (3, 4)


def test_torchscript_probe_failures_are_config_errors(ts_path):
    with pytest.raises(ConfigError, match="failed on synthetic inputs"):
        read_model_file(ts_path, shapes={"features": [5, 8], "ids": [5]})  # ids default to float32


def test_torchscript_io_spec_extra_file_is_the_spec(tmp_path):
    spec = IoSpec(
        inputs=[
            TensorSpec(name="features", dtype="float32", shape=[-1, 8]),
            TensorSpec(name="ids", dtype="int64", shape=[-1]),
        ],
        outputs=[
            TensorSpec(name="output__0", dtype="float32", shape=[-1, 4]),
            TensorSpec(name="output__1", dtype="float32", shape=[4]),
        ],
    )
    path = tmp_path / "tagger.pt"
    torch.jit.save(torch.jit.script(Tagger().eval()), str(path), _extra_files={"io_spec.json": spec.model_dump_json()})
    mf = read_model_file(path, shapes={"ids": [3], "features": [3, 8]})
    assert mf.io_spec == spec and mf.batching
    assert mf.input_shapes == {"features": [3, 8], "ids": [3]}


def test_torch_save_checkpoint_is_not_torchscript(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(Tagger().state_dict(), str(path))
    with pytest.raises(ConfigError, match="torch.save checkpoint, not TorchScript"):
        detect_format(path)


# ---------------------------------------------------------------- TF SavedModel


@pytest.fixture(scope="module")
def savedmodel_path(tmp_path_factory):
    tf = pytest.importorskip("tensorflow")

    class Scorer(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 4], tf.float32, name="x"),
                tf.TensorSpec([None, None], tf.int32, name="ids"),
            ]
        )
        def __call__(self, x, ids):
            return {"scores": tf.matmul(x, self.w), "count": tf.reduce_sum(ids, axis=1)}

    path = tmp_path_factory.mktemp("tf") / "scorer"
    module = Scorer()
    tf.saved_model.save(module, str(path), signatures=module.__call__)
    return path


def test_savedmodel_spec_uses_the_signature_keys(savedmodel_path):
    assert detect_format(savedmodel_path) is Format.TF_SAVEDMODEL
    mf = read_model_file(savedmodel_path, shapes={"ids": [5]}, int_high=10)
    assert mf.batching
    # A SignatureDef maps names to tensors, so a loaded signature lists its inputs sorted by key.
    assert _spec(mf.io_spec.inputs) == [("ids", "int32", [-1]), ("x", "float32", [4])]
    assert sorted(_spec(mf.io_spec.outputs)) == [("count", "int32", []), ("scores", "float32", [2])]
    assert mf.input_shapes == {"ids": [5], "x": [4]}


def test_savedmodel_runs_its_signature(savedmodel_path):
    mf = read_model_file(savedmodel_path, shapes={"ids": [5]}, int_high=10)
    data = synthetic_inputs(mf, batch_size=3)
    got = run_model_file(mf, data)
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_allclose(got["scores"], data["x"] @ w, atol=1e-5)
    np.testing.assert_array_equal(got["count"], data["ids"].sum(axis=1))


def test_savedmodel_without_serving_default(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = tmp_path / "bare"
    tf.saved_model.save(tf.Module(), str(path))
    with pytest.raises(ConfigError, match="no serving_default signature"):
        read_model_file(path)


# ---------------------------------------------------------------- detection errors


def test_missing_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nothing\.onnx does not exist; expected an \.onnx file"):
        detect_format(tmp_path / "nothing.onnx")


def test_text_file_is_a_config_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a model\n")
    with pytest.raises(ConfigError, match="notes.txt is not a model tbench can read.*TorchScript archive"):
        detect_format(path)


def test_directory_without_saved_model_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="directory without saved_model.pb"):
        detect_format(tmp_path)
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"PK")
    with pytest.raises(ConfigError, match=r"Keras file.*model.export\(DIR\)"):
        detect_format(keras_file)


def test_unbatched_model_keeps_full_shapes(tmp_path):
    path = tmp_path / "fixed.onnx"
    torch.onnx.export(
        torch.nn.Linear(3, 2), (torch.randn(4, 3),), str(path), dynamo=False, input_names=["x"], output_names=["y"]
    )
    mf = read_model_file(path)
    assert not mf.batching and mf.input_shapes == {"x": [4, 3]}
    data = synthetic_inputs(mf, batch_size=8)  # batch size is ignored without a batch axis
    assert data["x"].shape == (4, 3)
    assert run_model_file(mf, data)["y"].shape == (4, 2)


def test_a_zipmap_output_is_refused_naming_the_fix(tmp_path):
    """skl2onnx's default classifier output, a sequence of maps, built here with onnx's own helpers."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node(
                "ZipMap", ["probabilities"], ["output_probability"], classlabels_int64s=[0, 1], domain="ai.onnx.ml"
            )
        ],
        "classifier",
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 2])],
        [
            helper.make_value_info(
                "output_probability",
                helper.make_sequence_type_proto(
                    helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
                ),
            )
        ],
    )
    path = tmp_path / "classifier.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]),
        str(path),
    )
    with pytest.raises(
        ConfigError, match=r"output_probability .* sequence of maps \(skl2onnx's ZipMap\).*'zipmap': False"
    ):
        read_model_file(path)


def test_external_data_files_are_listed_and_hashed(tmp_path):
    import onnx
    import torch

    from tbench.core.onnx_files import onnx_external_files
    from tbench.core.runtimes import source_digest

    module = torch.nn.Linear(8, 4).eval()
    torch.onnx.export(module, (torch.randn(1, 8),), str(tmp_path / "inline.onnx"), dynamo=False, input_names=["x"])
    assert onnx_external_files(tmp_path / "inline.onnx") == []
    path = tmp_path / "split.onnx"
    onnx.save_model(
        onnx.load(str(tmp_path / "inline.onnx")),
        str(path),
        save_as_external_data=True,
        location="w.bin",
        size_threshold=0,
    )
    assert onnx_external_files(path) == ["w.bin"]
    before = source_digest("onnx", path)
    data = bytearray((tmp_path / "w.bin").read_bytes())
    data[0] ^= 1  # other weights, the same model file
    (tmp_path / "w.bin").write_bytes(bytes(data))
    assert source_digest("onnx", path) != before


def test_a_torchscript_module_for_one_sample_is_read_without_a_batch_axis(tmp_path):
    class OneSample(torch.nn.Module):
        def forward(self, x):
            return x.view(1, 12).sum(dim=1, keepdim=True)

    class Unbatched(torch.nn.Module):  # takes the --shape as its whole input: a matrix, nothing before it
        def forward(self, x):
            return torch.mm(x.t(), x)

    for module, shape, spec in ((OneSample(), [3, 4], ([1, 3, 4], [1, 1])), (Unbatched(), [5, 2], ([5, 2], [2, 2]))):
        path = tmp_path / f"{type(module).__name__}.pt"
        torch.jit.script(module).save(str(path))
        mf = read_model_file(path, shapes={"x": shape})
        assert not mf.batching and (mf.io_spec.inputs[0].shape, mf.io_spec.outputs[0].shape) == spec
        assert run_model_file(mf, synthetic_inputs(mf, batch_size=4))["output__0"].shape == tuple(spec[1])


@pytest.mark.parametrize(
    "elem_type, fix",
    [(onnx.TensorProto.BFLOAT16, "export it with float16 or float32 at the model's edge")],
    ids=["bf16"],
)
def test_a_dtype_tbench_cannot_feed_is_refused_naming_the_fix(tmp_path, elem_type, fix):
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["o"])],
        "g",
        [helper.make_tensor_value_info("s", elem_type, ["b", 4])],
        [helper.make_tensor_value_info("o", elem_type, ["b", 4])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(ConfigError, match=f"^ONNX tensor s of .* {re.escape(fix)}"):
        read_model_file(path)


def test_the_dims_nobody_sized_are_named_with_the_shape_line_that_sets_them(onnx_path, tmp_path, monkeypatch):
    """A dynamic dim no --shape sets is measured at DEFAULT_DYNAMIC_DIM: the terminal says so before the first point,
    with the --shape line that chooses it (an image net at 16 x 16 once printed 6,381 infer/s and said nothing)."""
    from model_adapters.file_model import ModelFileAdapter
    from tbench.core import progress
    from tbench.stages import sweep

    assert ModelFileAdapter(str(onnx_path)).guessed_shapes == {
        "features": [DEFAULT_DYNAMIC_DIM, 8],
        "ids": [DEFAULT_DYNAMIC_DIM],
    }
    # ids shares its dim (S) with features: sizing one sizes both, and nothing is guessed
    sized = ModelFileAdapter(str(onnx_path), shapes={"features": [7, 8]}, value_ranges={"ids": [0, 15]})
    assert sized.guessed_shapes == {} and sized.file.input_shapes == {"features": [7, 8], "ids": [7]}
    said = []
    monkeypatch.setattr(progress, "warn", said.append)
    sweep.measured_inputs(sized, sized.build(), tmp_path / "perf_input.json")
    assert said == []
    unsized = ModelFileAdapter(str(onnx_path), value_ranges={"ids": [0, 15]})  # the values' own line: test_input_data
    sweep.measured_inputs(unsized, unsized.build(), tmp_path / "perf_input.json")
    assert said == [
        f"dynamic dims no --shape sets are measured as features at [{DEFAULT_DYNAMIC_DIM}, 8], ids at "
        f"[{DEFAULT_DYNAMIC_DIM}]; to choose: --shape features:{DEFAULT_DYNAMIC_DIM},8 "
        f"--shape ids:{DEFAULT_DYNAMIC_DIM}"
    ]


def test_several_shapes_per_input_are_a_sweep_and_shared_dims_move_together(onnx_path):
    from model_adapters.file_model import ModelFileAdapter
    from tbench.core.shape_sets import shape_tags

    swept = ModelFileAdapter(str(onnx_path), shapes={"ids": [32, 64, 128]})
    assert swept.shape_sets == [
        {"ids": [32], "features": [32, 8]},
        {"ids": [64], "features": [64, 8]},
        {"ids": [128], "features": [128, 8]},
    ]
    assert shape_tags(swept.shape_sets) == ["features32x8_ids32", "features64x8_ids64", "features128x8_ids128"]
    at = swept.at_shapes(swept.shape_sets[2])
    assert at.file.input_shapes == {"features": [128, 8], "ids": [128]} and at.sample_batch(2)["ids"].shape == (2, 128)
    assert swept.file.input_shapes["ids"] == [32]  # the adapter itself: the first set
    # an input of rank 2 takes two values per shape
    assert ModelFileAdapter(str(onnx_path), shapes={"features": [16, 8, 32, 8]}).shape_sets[1]["ids"] == [32]


@pytest.mark.parametrize(
    "shapes, refused",
    [
        ({"features": [16, 8, 32]}, "does not split into shapes of features's rank 2"),
        ({"features": [16, 8, 32, 8], "ids": [16, 32, 64]}, "give each as many shapes \\(features 2, ids 3\\)"),
        ({"nope": [3]}, "--shape names unknown input\\(s\\) nope"),
        ({"ids": [16, 7]}, None),
    ],
)
def test_a_shape_sweep_that_does_not_split_is_refused_in_one_line(onnx_path, shapes, refused):
    from model_adapters.file_model import ModelFileAdapter

    if refused is None:  # two shapes of a rank-1 input: a sweep of two sets
        assert len(ModelFileAdapter(str(onnx_path), shapes=shapes).shape_sets) == 2
        return
    with pytest.raises(ConfigError, match=refused) as err:
        ModelFileAdapter(str(onnx_path), shapes=shapes)
    assert "\n" not in str(err.value)
