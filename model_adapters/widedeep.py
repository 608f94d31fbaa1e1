"""Wide & Deep (TensorFlow 2 / Keras 3) over the Outbrain feature set: our own implementation (functional API).

Inputs are Triton-style, one per feature as the guide serves it: each one-hot feature an int64 [1], each multi-hot
feature an int64 [hotness] (0 = padding), each numerical feature a float32 [1]; the one output `wide_deep_model` is
the click probability, float32 [1].

- Ids are folded into range in the graph (one-hot: id mod cardinality; multi-hot: 1 + (id - 1) mod (cardinality - 1),
  padding masked before folding) exactly as `model_adapters.outbrain` folds the parquet data, so any id a client or
  perf_analyzer sends is a valid lookup rather than a gather error. The remainder is taken twice (see `_floor_mod`):
  tf2onnx turns an integer FloorMod into a truncating remainder, which differs for negative ids.
- Wide: a linear model: one weight per id of every categorical feature (1-dim embeddings; multi-hot summed over the
  non-padding ids), one per bucket of the crossed features, and a bias. Crosses are hashed in the graph with int64
  arithmetic only (pair index a * card_b + b, times a 32-bit odd constant, middle bits kept by a floor division,
  modulo the bucket count): no string ops or tf.strings hashing, which tf2onnx cannot convert. The bound
  card_a * card_b * constant < 2**63 is checked at build time, so nothing overflows.
- Deep: one embedding per categorical feature (full: 128 dims for vocabularies >= 10000, 64 for >= 1000, 32 below,
  so tiny vocabularies such as platform (4) do not carry 128-dim tables; small: 8 for all), multi-hot features the
  mean of their non-padding embeddings, concatenated with the numericals into an MLP (full: 5 x 1024 ReLU as the
  guide's model; small: 2 x 32) and a logit.
- Output: sigmoid(wide + deep). Everything is built from Keras layers and keras.ops (Embedding, masked sums, mod,
  floor_divide), with no tf.feature_column and no ragged tensors, so both keras.export.ExportArchive (SavedModel) and
  tf2onnx convert it. The wide weights start small but non-zero (a trained linear model starts at zero) so that an
  untrained model's output depends on them and the tests can see the wide part.

The full model has 92.4M parameters (370 MB, almost all in the document/ad embedding tables), which is why the CPU
profile does not export it to ONNX by default (see `defaults`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import numpy as np

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from model_adapters.outbrain import SPECS, OutbrainSpec, frame_batch, parquet_batches, synthetic_frame
from model_adapters.ranking_metrics import map_at_k
from model_adapters.resnet50_tf import load_weights
from tbench.core.iospec import IoSpec, TensorSpec

OUTPUT = "wide_deep_model"
_HIDDEN = {"full": (1024,) * 5, "small": (32, 32)}
# Knuth's multiplicative-hash constant (odd, ~2**31.3); the floor division by 2**16 keeps the product's middle bits,
# which depend on every bit of the pair index (a plain `index mod buckets` would collide along regular strides)
_MIX = 2654435761
_SHIFT = 1 << 16


def embedding_dim(size: str, cardinality: int) -> int:
    if size == "small":
        return 8
    return 128 if cardinality >= 10000 else 64 if cardinality >= 1000 else 32


def cross_hash(a, b, card_a: int, card_b: int, buckets: int):
    """Bucket of the pair (a, b), both already folded into range, with int64 keras.ops (works on numpy input too).
    Every operand is non-negative, so tf2onnx's truncating integer Div/Mod agree with TF's floor versions here."""
    from keras import ops

    if card_a * card_b * _MIX >= 2**63:
        raise ValueError(f"crossing {card_a} x {card_b} ids would overflow int64 in the hash")
    index = ops.add(ops.multiply(a, np.int64(card_b)), b)
    return ops.mod(ops.floor_divide(ops.multiply(index, np.int64(_MIX)), np.int64(_SHIFT)), np.int64(buckets))


def _floor_mod(x, n: int):
    """x mod n in [0, n) for any sign of x. tf2onnx lowers an integer FloorMod to Div/Mul/Sub, a truncating remainder
    that is negative for negative x, so the remainder is taken twice: the first lies in (-n, n), the second in
    [0, n)."""
    from keras import ops

    n = np.int64(n)
    return ops.mod(ops.add(ops.mod(x, n), n), n)


def fold_ids(ids, cardinality: int, multihot: bool):
    """keras.ops twin of outbrain.fold_onehot / fold_multihot (padding is masked separately for multi-hot)."""
    from keras import ops

    if multihot:
        return ops.add(_floor_mod(ops.subtract(ids, np.int64(1)), cardinality - 1), np.int64(1))
    return _floor_mod(ids, cardinality)


@functools.cache
def _wide_sum_class():
    import keras

    class WideSum(keras.layers.Layer):
        """The wide part's output: the sum of its per-feature weights plus a bias (Keras has no bias-only layer)."""

        def build(self, input_shape):
            self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias")

        def call(self, terms):
            return keras.ops.sum(terms, axis=1, keepdims=True) + self.bias

    return WideSum


def _build_model(spec: OutbrainSpec, size: str):
    import keras
    from keras import layers, ops

    # every initializer gets its own explicit seed (see resnet50_tf: unseeded ones draw from Python's global RNG)
    seeds = itertools.count(1)

    def wide_init():
        return keras.initializers.RandomNormal(0.0, 0.01, seed=next(seeds))

    def deep_init():
        return keras.initializers.RandomUniform(-0.05, 0.05, seed=next(seeds))  # Keras' Embedding default, seeded

    inputs = {name: keras.Input(shape=(1,), dtype="int64", name=name) for name, _ in spec.onehot}
    inputs |= {name: keras.Input(shape=(hot,), dtype="int64", name=name) for name, _, hot in spec.multihot}
    inputs |= {name: keras.Input(shape=(1,), dtype="float32", name=name) for name in spec.numerical}

    wide, deep, folded = [], [], {}
    for name, card in spec.onehot:
        ids = folded[name] = fold_ids(inputs[name], card, multihot=False)  # (n, 1)
        wide.append(
            layers.Flatten(name=f"wide_{name}_flat")(
                layers.Embedding(card, 1, embeddings_initializer=wide_init(), name=f"wide_{name}")(ids)
            )
        )
        deep.append(
            layers.Flatten(name=f"deep_{name}_flat")(
                layers.Embedding(
                    card, embedding_dim(size, card), embeddings_initializer=deep_init(), name=f"deep_{name}"
                )(ids)
            )
        )
    for name, card, _ in spec.multihot:
        mask = ops.expand_dims(ops.cast(ops.not_equal(inputs[name], np.int64(0)), "float32"), -1)  # (n, hot, 1)
        ids = fold_ids(inputs[name], card, multihot=True)
        weights = layers.Embedding(card, 1, embeddings_initializer=wide_init(), name=f"wide_{name}")(ids)
        wide.append(ops.sum(weights * mask, axis=1))  # (n, 1): a sum over the ids present
        vectors = layers.Embedding(
            card, embedding_dim(size, card), embeddings_initializer=deep_init(), name=f"deep_{name}"
        )(ids)
        # the mean over the ids present; an all-padding row gives zeros (the count is clamped to 1)
        deep.append(ops.sum(vectors * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1.0))
    cards = spec.cardinalities
    for a, b, buckets in spec.crosses:
        bucket = cross_hash(folded[a], folded[b], cards[a], cards[b], buckets)
        wide.append(
            layers.Flatten(name=f"wide_{a}_x_{b}_flat")(
                layers.Embedding(buckets, 1, embeddings_initializer=wide_init(), name=f"wide_{a}_x_{b}")(bucket)
            )
        )
    wide_logit = _wide_sum_class()(name="wide_logit")(layers.Concatenate(name="wide_terms")(wide))

    x = layers.Concatenate(name="deep_features")(deep + [inputs[name] for name in spec.numerical])
    for i, units in enumerate(_HIDDEN[size]):
        x = layers.Dense(
            units,
            activation="relu",
            kernel_initializer=keras.initializers.GlorotUniform(seed=next(seeds)),
            name=f"deep_dense_{i}",
        )(x)
    deep_logit = layers.Dense(
        1, kernel_initializer=keras.initializers.GlorotUniform(seed=next(seeds)), name="deep_logit"
    )(x)

    output = layers.Activation("sigmoid", name=OUTPUT)(layers.Add(name="logit")([wide_logit, deep_logit]))
    return keras.Model([inputs[name] for name in spec.feature_names], output, name="wide_deep")


class WideDeep(ModelAdapter):
    name = "widedeep"
    framework = "tensorflow"
    metric_name = "MAP@12"
    sizes = ("full", "small")

    @property
    def spec(self) -> OutbrainSpec:
        return SPECS[self.size]

    def build(self):
        model = _build_model(self.spec, self.size)
        if self.checkpoint:
            load_weights(model, self.checkpoint)
        return model

    def io_spec(self) -> IoSpec:
        spec = self.spec
        inputs = [TensorSpec(name=n, dtype="int64", shape=[1]) for n, _ in spec.onehot]
        inputs += [TensorSpec(name=n, dtype="int64", shape=[hot]) for n, _, hot in spec.multihot]
        inputs += [TensorSpec(name=n, dtype="float32", shape=[1]) for n in spec.numerical]
        return IoSpec(inputs=inputs, outputs=[TensorSpec(name=OUTPUT, dtype="float32", shape=[1])])

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """The guide's preprocessed validation parquet files in file order; synthetic rows without a data folder.
        Labels are (n, 2) int64 [display_id, clicked]: MAP@12 ranks the ads of each display."""
        if self.data_dir:
            for inputs, labels in parquet_batches(self.data_dir, self.spec, n_samples, batch_size):
                yield Batch(inputs=inputs, labels=labels)
            return
        frame = synthetic_frame(n_samples, self.spec, seed)
        for start in range(0, n_samples, batch_size):
            inputs, labels = frame_batch(frame.iloc[start : start + batch_size], self.spec)
            yield Batch(inputs=inputs, labels=labels)

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(outputs[OUTPUT], dtype=np.float64).reshape(-1)

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        return map_at_k(labels[:, 0], predictions, labels[:, 1], 12)

    def defaults(self, profile: str) -> ServingDefaults:
        if profile == "gpu":  # the reference guide's parameters
            return ServingDefaults(
                max_batch_size=131072,
                model_instances=2,
                preferred_batch_sizes=[131072],
                max_queue_delay_us=1000,  # ours: the guide's batches are full requests, the delay rarely matters
                offline_batch_sizes=[1, 16384, 32768, 49152, 65536, 81920, 98304, 114688, 131072],
                online_concurrency=list(range(8, 257, 8)),
                online_batch_size=2048,
                accuracy_samples=16384,
                accuracy_batch_size=2048,  # the guide's online request size
                formats=["tf-savedmodel", "onnx"],
                gpu_accelerators={"tf-savedmodel": "auto_mixed_precision"},  # the guide's "Automatic FP16"
            )
        # cpu: measured on 2 cores, the full model's forward pass (Keras, eager) takes ~180 ms at batch 1024 and ~100 ms
        # at batch 1 (per-call overhead); as a graph (what the SavedModel serves) ~3 ms at batch 1, ~33 ms at 256,
        # ~110 ms at 1024 and ~420 ms at 4096 (~0.1 ms per sample); windows are sized by time
        # (request.benchmark.Measurement), so the big batches get the minimum 4 requests a window and batch 1 about a
        # second's worth.
        # ONNX only for the small size here: tf2onnx 1.17 freezes and deep-copies the graph with its 370 MB of
        # embedding tables inlined many times over and needed more than the 23 GB this machine has (OOM-killed);
        # a request's formats can still ask for it where memory allows.
        return ServingDefaults(
            max_batch_size=4096,
            model_instances=1,
            preferred_batch_sizes=[1024],
            max_queue_delay_us=2000,
            offline_batch_sizes=[1, 256, 1024, 4096],
            online_concurrency=[1, 2, 4],
            online_batch_size=256,
            accuracy_samples=2048,
            accuracy_batch_size=256,
            formats=["tf-savedmodel", "onnx"] if self.size == "small" else ["tf-savedmodel"],
        )
