"""ResNet-50 v1.5 in TensorFlow/Keras 3: our own implementation (functional API, channels-last).

The same architecture, sizes and initialisation as the PyTorch adapter (`model_adapters.resnet50`):
stride on the 3x3 conv of the bottleneck, a projection shortcut (with stride) where the shape changes,
BatchNorm eps 1e-5, He-normal (fan_out) conv init and zero-init of each block's last BN gamma.
Strided convolutions and the max pool pad explicitly (1 px / 3 px, symmetric) as PyTorch does, rather than
with Keras' "same" padding, which pads stride-2 layers asymmetrically; layer names follow the PyTorch
module names (`layer2_0_conv2`, `layer2_0_downsample_0`, ...).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import warnings
from collections.abc import Iterator

import numpy as np

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from model_adapters.imagenet import folder_batches
from model_adapters.resnet50 import _SIZES, ResNet50
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec

_EXPANSION = 4
_BN_EPS = 1e-5
_BN_MOMENTUM = 0.9  # PyTorch's momentum=0.1 in Keras' convention (only matters for training)


def _build_model(blocks: tuple[int, ...], width: int, side: int, num_classes: int):
    import keras
    from keras import layers

    # every initializer gets its own explicit seed: unseeded ones draw from Python's global RNG, which other threads
    # in the process (Prefect's, for one) also draw from, so two builds could differ
    seeds = itertools.count(1)

    def he_normal():
        # kaiming_normal_(mode="fan_out", nonlinearity="relu"), as the PyTorch adapter initialises its convs
        return keras.initializers.VarianceScaling(
            2.0, mode="fan_out", distribution="untruncated_normal", seed=next(seeds)
        )

    def conv(x, filters, kernel, stride, name, pad=0):
        if pad:
            x = layers.ZeroPadding2D(pad, name=f"{name}_pad")(x)
        return layers.Conv2D(
            filters, kernel, strides=stride, padding="valid", use_bias=False, kernel_initializer=he_normal(), name=name
        )(x)

    def bn(x, name, zero_gamma=False):
        return layers.BatchNormalization(
            epsilon=_BN_EPS,
            momentum=_BN_MOMENTUM,
            gamma_initializer="zeros" if zero_gamma else "ones",
            name=name,
        )(x)

    def bottleneck(x, cin, planes, stride, name):
        cout = planes * _EXPANSION
        identity = x
        if stride != 1 or cin != cout:
            identity = conv(x, cout, 1, stride, f"{name}_downsample_0")
            identity = bn(identity, f"{name}_downsample_1")
        out = layers.ReLU(name=f"{name}_relu1")(bn(conv(x, planes, 1, 1, f"{name}_conv1"), f"{name}_bn1"))
        # v1.5: the stride sits on the 3x3 convolution, not on the first 1x1
        out = conv(out, planes, 3, stride, f"{name}_conv2", pad=1)
        out = layers.ReLU(name=f"{name}_relu2")(bn(out, f"{name}_bn2"))
        # zero-init the last BN of each block so a random-weight network keeps sane activations
        out = bn(conv(out, cout, 1, 1, f"{name}_conv3"), f"{name}_bn3", zero_gamma=True)
        out = layers.Add(name=f"{name}_add")([out, identity])
        return layers.ReLU(name=f"{name}_relu3")(out)

    inputs = keras.Input(shape=(side, side, 3), dtype="float32", name="input")
    x = conv(inputs, width, 7, 2, "conv1", pad=3)
    x = layers.ReLU(name="relu")(bn(x, "bn1"))
    # PyTorch pads the max pool with -inf; after a ReLU zero padding gives the same result
    x = layers.ZeroPadding2D(1, name="maxpool_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, name="maxpool")(x)
    cin = width
    for i, n in enumerate(blocks):
        planes = width * 2**i
        for j in range(n):
            x = bottleneck(x, cin, planes, 2 if (i > 0 and j == 0) else 1, f"layer{i + 1}_{j}")
            cin = planes * _EXPANSION
    x = layers.GlobalAveragePooling2D(name="avgpool")(x)
    # nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias
    bound = 1.0 / np.sqrt(cin)
    logits = layers.Dense(
        num_classes,
        kernel_initializer=keras.initializers.VarianceScaling(
            1.0 / 3.0, mode="fan_in", distribution="uniform", seed=next(seeds)
        ),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound, seed=next(seeds)),
        name="logits",
    )(x)
    return keras.Model(inputs, logits, name="resnet50")


def _mismatch_line(err: Exception) -> str:
    """Keras' load error as one line: how many layers failed, the first one and its shapes."""
    text = str(err)
    count = re.search(r"A total of (\d+) objects could not be loaded", text)
    if not count:
        return next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    layer = re.search(r"for object <\w+ name=([^,>]+)", text)
    shapes = re.search(r"variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))", text)
    line = f"{count.group(1)} layers could not be loaded"
    if layer:
        line += f", first {layer.group(1)}"
        if shapes:
            line += f" (model {shapes.group(1)}, checkpoint {shapes.group(2)})"
    return line


def load_weights(model, path: str) -> None:
    """Our checkpoint format: Keras' `model.save_weights(path)` (a `.weights.h5` file)."""
    if not path.endswith(".weights.h5"):
        raise ConfigError(f"checkpoint {path} is not a Keras weights file (expected a name ending in .weights.h5)")
    if not os.path.isfile(path):
        raise ConfigError(f"cannot read checkpoint {path}: no such file")
    # Keras 3 warns once per layer it skips ("Skipping nested container ...") before it raises on a mismatch;
    # keep those out of the output, and treat any skip as a mismatch even if Keras itself did not raise
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.load_weights(path)
        except OSError as err:
            raise ConfigError(f"cannot read checkpoint {path}: {_mismatch_line(err)}") from err
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"checkpoint {path} does not fit this model: {_mismatch_line(err)}") from err
    skipped = [w for w in caught if "Skipping" in str(w.message)]
    if skipped:
        first = str(skipped[0].message).splitlines()[0].split(":")[0]
        raise ConfigError(f"checkpoint {path} does not fit this model: {len(skipped)} layers skipped ({first})")
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


class ResNet50TF(ModelAdapter):
    name = "resnet50"
    framework = "tensorflow"
    metric_name = "top1"

    @property
    def _dims(self):
        return _SIZES[self.size]

    def build(self):
        blocks, width, side, classes = self._dims
        model = _build_model(blocks, width, side, classes)
        if self.checkpoint:
            load_weights(model, self.checkpoint)
        return model

    def io_spec(self) -> IoSpec:
        _, _, side, classes = self._dims
        return IoSpec(
            inputs=[TensorSpec(name="input", dtype="float32", shape=[side, side, 3])],
            outputs=[TensorSpec(name="output", dtype="float32", shape=[classes])],
        )

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """An ImageNet-layout folder with the standard preprocessing (NHWC); synthetic images and labels without one."""
        _, _, side, classes = self._dims
        if self.data_dir:
            for images, labels in folder_batches(
                self.data_dir, side, classes, n_samples, batch_size, channels_first=False
            ):
                yield Batch(inputs={"input": images}, labels=labels)
            return
        rng = np.random.default_rng(seed)
        for start in range(0, n_samples, batch_size):
            n = min(batch_size, n_samples - start)
            images = rng.standard_normal((n, side, side, 3), dtype=np.float32)
            yield Batch(inputs={"input": images}, labels=rng.integers(0, classes, size=n))

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        return outputs["output"].argmax(axis=1)

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        return float(np.mean(predictions == labels))

    def defaults(self, profile: str) -> ServingDefaults:
        # the same serving numbers as the PyTorch adapter; only the export formats differ, and on GPU the guide's
        # SavedModel runs with TensorFlow's TensorRT accelerator (TF-TRT inside the TensorFlow backend)
        base = ResNet50(size=self.size).defaults(profile)
        return dataclasses.replace(
            base,
            formats=["tf-savedmodel", "onnx"],
            gpu_accelerators={"tf-savedmodel": "tensorrt"} if profile == "gpu" else {},
        )
