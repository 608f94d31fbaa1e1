"""ImageNet-layout folders and the standard preprocessing, for both ResNet-50 adapters."""

import numpy as np
import pytest
from PIL import Image

import model_adapters
from model_adapters.imagenet import MEAN, STD, list_samples, preprocess
from tbench.core.errors import ConfigError


@pytest.fixture
def folder(tmp_path):
    """3 classes, 2 JPEGs each, of different sizes and aspect ratios; class c's images are filled with gray level
    80c."""
    root = tmp_path / "val"
    for c, wnid in enumerate(["n01440764", "n01443537", "n01484850"]):
        (root / wnid).mkdir(parents=True)
        for i, size in enumerate([(50, 40), (37, 64)]):
            Image.new("RGB", size, color=(80 * c,) * 3).save(root / wnid / f"ILSVRC2012_val_{c}{i}.JPEG")
    (root / "n01440764" / "notes.txt").write_text("not an image")
    return root


def test_labels_are_sorted_class_folders(folder):
    samples = list_samples(folder, num_classes=10)
    assert [label for _, label in samples] == [0, 0, 1, 1, 2, 2]
    assert all(p.suffix == ".JPEG" for p, _ in samples)


def test_preprocess_resizes_crops_and_normalises(folder):
    path = list_samples(folder, 10)[-1][0]  # gray level 160, 37x64 (portrait)
    image = preprocess(path, side=32)
    assert image.shape == (32, 32, 3) and image.dtype == np.float32
    np.testing.assert_allclose(image, np.broadcast_to((160 / 255 - MEAN) / STD, (32, 32, 3)), atol=0.02)


@pytest.mark.parametrize("framework, shape", [("pytorch", (4, 3, 32, 32)), ("tensorflow", (4, 32, 32, 3))])
def test_adapters_read_the_folder_in_their_layout(folder, framework, shape):
    adapter = model_adapters.get("resnet50", "small", framework=framework, data_dir=str(folder))
    batches = list(adapter.batches(n_samples=5, batch_size=4))
    (name,) = batches[0].inputs
    assert batches[0].inputs[name].shape == shape and len(batches[1].labels) == 1
    assert np.concatenate([b.labels for b in batches]).tolist() == [0, 0, 1, 1, 2]


def test_bad_folders_say_what_is_wrong(tmp_path, folder):
    with pytest.raises(ConfigError, match="is not a folder"):
        list_samples(tmp_path / "missing", 10)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no class subfolders"):
        list_samples(tmp_path / "empty", 10)
    with pytest.raises(ConfigError, match="has 3 classes; the model predicts 2"):
        list_samples(folder, 2)
