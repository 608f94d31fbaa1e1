"""TensorRT's optimisation profile and INT8 calibration set (request/trt_profiles.py), on golden inputs: no TensorRT."""

import numpy as np
import pytest

from tbench.core.errors import ConfigError, ConversionError
from tbench.core.iospec import IoSpec, TensorSpec
from tbench.request.trt_profiles import (
    calibration_batches,
    check_calibration_samples,
    default_calibration_samples,
    describe,
    fit,
    opt_batch_size,
    optimisation_profile,
    shaped_inputs,
)

IMAGE = IoSpec(
    inputs=[TensorSpec(name="image", dtype="float32", shape=[3, 8, 8])],
    outputs=[TensorSpec(name="logits", dtype="float32", shape=[10])],
)
TOKENS = IoSpec(
    inputs=[TensorSpec(name="ids", dtype="int64", shape=[-1]), TensorSpec(name="mask", dtype="int64", shape=[-1])],
    outputs=[TensorSpec(name="y", dtype="float32", shape=[-1, 4])],
)
MEL = IoSpec(
    inputs=[TensorSpec(name="mel", dtype="float32", shape=[-1, 80, -1])],
    outputs=[TensorSpec(name="wave", dtype="float32", shape=[-1])],
)


@pytest.mark.parametrize(
    "grid, max_batch, opt",
    [
        ([1, 2, 4, 8, 16, 32, 64, 128], 128, 64),  # resnet50's guide grid: half of the max is in the grid
        ([1, 3, 5, 7], 8, 3),  # the largest grid batch at most half the max
        ([256, 512, 1024, 2048, 4096, 8192, 16384, 32768], 32768, 16384),  # dlrm's
        ([64, 128], 128, 64),
        ([100], 128, 64),  # nothing in the grid at most half: half the max
        ([], 8, 4),
        ([1], 1, 1),
    ],
)
def test_opt_batch_is_the_largest_grid_batch_up_to_half_the_max(grid, max_batch, opt):
    assert opt_batch_size(grid, max_batch) == opt


def test_static_inputs_get_batch_1_opt_max_and_their_shape():
    profile = optimisation_profile(IMAGE, {"image": [3, 8, 8]}, max_batch_size=16, opt_batch=8)
    (p,) = profile.inputs
    assert (p.name, p.min, p.opt, p.max) == ("image", [1, 3, 8, 8], [8, 3, 8, 8], [16, 3, 8, 8])
    assert (profile.opt_batch, profile.max_batch) == (8, 16)
    assert describe(profile) == ["image: min 1x3x8x8, opt 8x3x8x8, max 16x3x8x8"]


def test_a_dynamic_dim_is_pinned_to_the_samples_size_by_default():
    profile = optimisation_profile(TOKENS, {"ids": (128,), "mask": (128,)}, max_batch_size=8, opt_batch=4)
    assert profile.shapes("min") == {"ids": [1, 128], "mask": [1, 128]}
    assert profile.shapes("opt") == {"ids": [4, 128], "mask": [4, 128]}
    assert profile.shapes("max") == {"ids": [8, 128], "mask": [8, 128]}


def test_user_ranges_set_dynamic_dims_per_input():
    shapes = {"ids": [[16], [128], [512]], "mask": [[16], [64], [256]]}
    profile = optimisation_profile(TOKENS, {"ids": [32], "mask": [32]}, max_batch_size=8, opt_batch=4, shapes=shapes)
    assert [(p.min, p.opt, p.max) for p in profile.inputs] == [
        ([1, 16], [4, 128], [8, 512]),
        ([1, 16], [4, 64], [8, 256]),
    ]


def test_several_dynamic_dims_of_one_input_with_static_ones_between():
    profile = optimisation_profile(
        MEL,
        {"mel": [2, 80, 100]},
        max_batch_size=4,
        opt_batch=2,
        shapes={"mel": [[1, 80, 16], [2, 80, 400], [2, 80, 1000]]},
    )
    assert profile.shapes("opt") == {"mel": [2, 2, 80, 400]} and profile.shapes("max") == {"mel": [4, 2, 80, 1000]}
    pinned = optimisation_profile(MEL, {"mel": [2, 80, 100]}, max_batch_size=4, opt_batch=2)
    assert pinned.shapes("min") == {"mel": [1, 2, 80, 100]}


@pytest.mark.parametrize(
    "spec, shapes, message",
    [
        (TOKENS, {"idz": [[1], [2], [3]]}, "--trt-shape idz: no such input; the inputs are ids, mask"),
        (
            IMAGE,
            {"image": [[3, 8, 8]] * 3},
            r"--trt-shape image: the input has no dynamic dim \(shape 3x8x8\); its profile is its shape",
        ),
        (TOKENS, {"ids": [[16], [128]]}, r"--trt-shape ids: give three shapes, MIN,OPT,MAX \(got 2\)"),
        (
            TOKENS,
            {"ids": [[16, 1], [128, 1], [512, 1]]},
            r"--trt-shape ids: 16x1 has 2 dims; the input's non-batch shape -1 \(-1: dynamic\) has 1",
        ),
        (TOKENS, {"ids": [[128], [16], [512]]}, "--trt-shape ids: axis 1 needs 1 <= MIN <= OPT <= MAX, got 128,16,512"),
        (TOKENS, {"ids": [[0], [16], [512]]}, "axis 1 needs 1 <= MIN"),
        (
            MEL,
            {"mel": [[1, 64, 16], [2, 64, 400], [2, 64, 1000]]},
            "--trt-shape mel: axis 2 is static \\(80\\); give 80",
        ),
    ],
)
def test_invalid_ranges_are_refused_in_one_line(spec, shapes, message):
    sample = {t.name: [max(d, 1) for d in t.shape] for t in spec.inputs}
    with pytest.raises(ConfigError, match=message) as err:
        optimisation_profile(spec, sample, max_batch_size=8, opt_batch=4, shapes=shapes)
    assert "\n" not in str(err.value)


def test_the_opt_batch_must_lie_in_the_batch_range():
    with pytest.raises(ConfigError, match="1 <= opt batch <= max batch, got 16 and 8"):
        optimisation_profile(IMAGE, {"image": [3, 8, 8]}, max_batch_size=8, opt_batch=16)


def test_calibration_set_size_defaults_and_lower_bound():
    assert default_calibration_samples(64) == 512 and default_calibration_samples(16384) == 16384
    check_calibration_samples(64, 64)
    with pytest.raises(
        ConfigError,
        match="a calibration set of 10 samples is less than one calibration batch \\(64, "
        "the TensorRT profile's opt batch\\); give --calibration-samples 64 or more",
    ):
        check_calibration_samples(10, 64)


def _numbered(spec, n_samples, batch, length=None):
    """Source batches whose every value is its sample's index, so order and cuts are visible."""
    for start in range(0, n_samples, batch):
        idx = np.arange(start, min(start + batch, n_samples), dtype=np.float64)
        yield {
            t.name: np.broadcast_to(
                idx.reshape(-1, *[1] * len(t.shape)), (len(idx), *[length if d == -1 else d for d in t.shape])
            ).copy()
            for t in spec.inputs
        }


def test_calibration_batches_have_the_opt_shape_and_dtype_in_source_order():
    profile = optimisation_profile(IMAGE, {"image": [3, 8, 8]}, max_batch_size=16, opt_batch=8)
    batches = list(calibration_batches(_numbered(IMAGE, 40, 3), IMAGE, profile, n_samples=36))
    assert len(batches) == 4  # 36 // 8: the 4 samples short of a fifth batch are dropped
    for i, b in enumerate(batches):
        assert b["image"].shape == (8, 3, 8, 8) and b["image"].dtype == np.float32 and b["image"].flags.c_contiguous
        assert b["image"][:, 0, 0, 0].tolist() == list(range(8 * i, 8 * i + 8))  # re-batched from 3s, in order


def test_calibration_stops_where_the_source_ends():
    profile = optimisation_profile(IMAGE, {"image": [3, 8, 8]}, max_batch_size=8, opt_batch=4)
    batches = list(calibration_batches(_numbered(IMAGE, 10, 4), IMAGE, profile, n_samples=512))
    assert len(batches) == 2  # 10 samples: two whole batches, the last 2 samples dropped
    assert list(calibration_batches(_numbered(IMAGE, 10, 4), IMAGE, profile, n_samples=3)) == []


def test_calibration_fits_dynamic_dims_to_the_opt_shape():
    shapes = {"ids": [[4], [6], [16]], "mask": [[8], [12], [16]]}
    profile = optimisation_profile(TOKENS, {"ids": [10], "mask": [10]}, max_batch_size=4, opt_batch=2, shapes=shapes)
    (batch,) = calibration_batches(_numbered(TOKENS, 2, 2, length=10), TOKENS, profile, n_samples=2)
    assert batch["ids"].shape == (2, 6) and batch["ids"].dtype == np.int64  # cut from 10
    assert batch["mask"].shape == (2, 12) and batch["mask"][1].tolist() == [1] * 10 + [0, 0]  # zero-padded from 10


def test_fit_refuses_a_static_dim_that_differs():
    with pytest.raises(ConversionError, match="for image has 4 on axis 2, which the io spec fixes at 8$"):
        fit(np.zeros((2, 3, 4, 8)), IMAGE.inputs[0], [3, 8, 8])


def test_build_inputs_repeat_the_sample_rows_to_each_profile_shape():
    profile = optimisation_profile(
        TOKENS,
        {"ids": [4], "mask": [4]},
        max_batch_size=5,
        opt_batch=2,
        shapes={"ids": [[2], [4], [6]], "mask": [[2], [4], [6]]},
    )
    sample = {"ids": np.array([[1, 2, 3, 4], [5, 6, 7, 8]]), "mask": np.ones((2, 4), dtype=np.int64)}
    biggest = shaped_inputs(sample, TOKENS, profile.shapes("max"))
    assert biggest["ids"].tolist() == [[1, 2, 3, 4, 0, 0], [5, 6, 7, 8, 0, 0]] * 2 + [[1, 2, 3, 4, 0, 0]]
    assert shaped_inputs(sample, TOKENS, profile.shapes("min"))["ids"].tolist() == [[1, 2]]
