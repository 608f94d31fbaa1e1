"""DLRM and DCNv2 in TensorFlow/Keras 3 on Criteo-style features: our own implementation.

Both models are served as a Triton ensemble of two parts that share weights with the whole Keras model:

* sparse (`<model>_sparse`, a TF SavedModel): `categorical_features` int64 [26] -> `embeddings` float32 [26, dim],
  one embedding lookup per table, stacked. Ids are folded into each table with a floor modulo first (as hashing
  would), so any id a client sends (perf_analyzer's random data included) is safe.
* dense (`<model>_dense`, ONNX; ONNX then TensorRT on a GPU profile): `numerical_features` float32 [13] and
  `embeddings` -> `output` float32 [1], the click probability.

DLRM's dense part: bottom MLP (ReLU) on the numericals to `dim`, dot interaction of the 27 vectors (the strictly lower
triangle of their Gram matrix, taken with a gather of fixed indices so tf2onnx exports it as a plain Gather), concat
with the bottom MLP output, top MLP (ReLU, last layer linear), sigmoid. DCNv2's dense part (stacked structure):
concat(numericals, flattened embeddings) -> full-rank cross layers x_{l+1} = x0 * (x_l W + b) + x_l -> deep MLP
(ReLU) -> 1-unit logit -> sigmoid.

Embedding tables are placed by the reference guide's rule (`model_adapters.embedding_placement`): the smallest tables
that fit under `memory_threshold_gb` go to the GPU, the rest stay in host memory. Device annotations are written only
when TensorFlow sees a GPU.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator

import numpy as np

from model_adapters import register
from model_adapters.base import Batch, ModelAdapter, ModelPart, ServingDefaults
from model_adapters.criteo import (
    NUM_CATEGORICAL,
    NUM_NUMERICAL,
    PRESETS,
    CriteoPreset,
    frame_inputs,
    parquet_batches,
    synthetic_frame,
)
from model_adapters.embedding_placement import GIB, Placement, place_tables, placement_summary, placement_table_md
from tbench.core.errors import ConfigError
from tbench.core.iospec import IoSpec, TensorSpec

MEMORY_FRACTION = 0.6  # at most this share of the machine's memory goes to embedding tables
DEFAULT_THRESHOLD_GB = 16.0  # the guide's default GPU memory for embedding tables, with a GPU


@functools.cache
def keras_layers():
    """The custom Keras layers, defined on first use so importing this module does not import TensorFlow."""
    import keras
    from keras import ops

    def device_scope(device: str | None):
        import contextlib

        import tensorflow as tf

        return tf.device(device) if device else contextlib.nullcontext()

    @keras.saving.register_keras_serializable(package="tbench_recommenders")
    class TableLookup(keras.layers.Layer):
        """The embedding of categorical feature `index`: column `index` of the (batch, 26) ids, folded into the
        table's rows, looked up -> (batch, 1, dim). With a device the table and the lookup live there."""

        def __init__(
            self, index: int, rows: int, dim: int, device: str | None = None, seed: int | None = None, **kwargs
        ):
            super().__init__(**kwargs)
            self.index, self.rows, self.dim, self.device_name, self.seed = index, rows, dim, device, seed

        def build(self, input_shape):
            bound = math.sqrt(1.0 / self.rows)  # the DLRM reference's uniform(-sqrt(1/n), sqrt(1/n))
            with device_scope(self.device_name):
                self.table = self.add_weight(
                    shape=(self.rows, self.dim),
                    name="table",
                    initializer=keras.initializers.RandomUniform(-bound, bound, seed=self.seed),
                )

        def call(self, ids):
            with device_scope(self.device_name):
                column = ops.mod(ids[:, self.index : self.index + 1], self.rows)
                return ops.take(self.table, column, axis=0)

        def compute_output_shape(self, input_shape):
            return (input_shape[0], 1, self.dim)

        def get_config(self):
            return {
                **super().get_config(),
                "index": self.index,
                "rows": self.rows,
                "dim": self.dim,
                "device": self.device_name,
                "seed": self.seed,
            }

    @keras.saving.register_keras_serializable(package="tbench_recommenders")
    class DotInteraction(keras.layers.Layer):
        """DLRM's interaction: [bottom, the strictly lower triangle of the Gram matrix of (bottom, embeddings...)]."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)

        def call(self, inputs):
            bottom, embeddings = inputs
            vectors = ops.concatenate([ops.expand_dims(bottom, 1), embeddings], axis=1)  # (batch, n, dim)
            n = vectors.shape[1]
            gram = ops.matmul(vectors, ops.transpose(vectors, (0, 2, 1)))  # (batch, n, n)
            rows, cols = np.tril_indices(n, k=-1)
            # a Gather of fixed flat indices, not a boolean mask: static shapes, and tf2onnx converts it plainly
            pairs = ops.take(ops.reshape(gram, (-1, n * n)), (rows * n + cols).astype("int32"), axis=1)
            return ops.concatenate([bottom, pairs], axis=1)

        def compute_output_shape(self, input_shapes):
            (batch, dim), (_, tables, _) = input_shapes
            n = tables + 1
            return (batch, dim + n * (n - 1) // 2)

    @keras.saving.register_keras_serializable(package="tbench_recommenders")
    class CrossLayer(keras.layers.Layer):
        """DCNv2's full-rank cross layer on [x0, x_l]: x0 * (x_l W + b) + x_l."""

        def __init__(self, seed: int | None = None, **kwargs):
            super().__init__(**kwargs)
            self.seed = seed

        def build(self, input_shapes):
            width = input_shapes[0][-1]
            self.kernel = self.add_weight(
                shape=(width, width),
                name="kernel",
                initializer=keras.initializers.VarianceScaling(
                    1.0, mode="fan_avg", distribution="untruncated_normal", seed=self.seed
                ),
            )
            self.bias = self.add_weight(shape=(width,), name="bias", initializer="zeros")

        def call(self, inputs):
            x0, x = inputs
            return x0 * (ops.matmul(x, self.kernel) + self.bias) + x

        def compute_output_shape(self, input_shapes):
            return input_shapes[1]

        def get_config(self):
            return {**super().get_config(), "seed": self.seed}

    import types

    return types.SimpleNamespace(TableLookup=TableLookup, DotInteraction=DotInteraction, CrossLayer=CrossLayer)


def gpu_visible() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


class _Recommender(ModelAdapter):
    """What DLRM and DCNv2 share: the Criteo inputs, the sparse part, placement, data, metric and defaults."""

    framework = "tensorflow"
    metric_name = "AUC"
    sizes = ("tiny", "small", "4B", "22B")
    default_size = "small"
    options = {
        "memory_threshold_gb": "GPU memory for embedding tables in GB; the smallest tables that fit go to "
        "the GPU (default 16 with a GPU, 0 without)"
    }

    def __init__(
        self,
        size: str | None = None,
        checkpoint: str | None = None,
        data_dir: str | None = None,
        options: dict | None = None,
    ):
        super().__init__(size=size, checkpoint=checkpoint, data_dir=data_dir, options=options)
        self._threshold_option()  # a bad value fails here, before anything is built

    @property
    def preset(self) -> CriteoPreset:
        return PRESETS[self.size]

    # -- placement and memory -------------------------------------------------------------------------------------

    def _threshold_option(self) -> float | None:
        raw = self.model_options.get("memory_threshold_gb")
        if raw is None:
            return None
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = float("nan")
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"option memory_threshold_gb must be a number of GB >= 0, got {raw!r}")
        return value

    def placement(self, gpu: bool | None = None) -> Placement:
        """Where each embedding table goes (GB read as GiB, 2^30 bytes); everything on the CPU without a GPU."""
        gpu = gpu_visible() if gpu is None else gpu
        threshold = self._threshold_option()
        if threshold is None:
            threshold = DEFAULT_THRESHOLD_GB if gpu else 0.0
        return place_tables(
            self.preset.table_rows, self.preset.dim, int(threshold * GIB), bytes_per_value=4, gpu_available=gpu
        )

    def report_notes(self) -> list[str]:
        """The guide's placement rule as a GPU node applies it under the threshold; what runs where here."""
        decided = self.placement(gpu=True)
        lines = ["### Embedding tables", "", f"{placement_summary(decided)}."]
        if not gpu_visible():
            lines += [
                "No GPU is visible here, so every table runs on the CPU; the table shows what a GPU node would place."
            ]
        return lines + ["", placement_table_md(decided), ""]

    def check_resources(self) -> None:
        """Refuse a preset whose tables would not fit in host memory, before anything is allocated."""
        import psutil

        # the machine's total memory, not what happens to be free this second: the same preset passes or fails
        # the same way on the same machine
        total = psutil.virtual_memory().total
        if (need := self.preset.embedding_bytes(4)) > MEMORY_FRACTION * total:
            fits = [s for s in self.sizes if PRESETS[s].embedding_bytes(4) <= MEMORY_FRACTION * total]
            raise ConfigError(
                f"{self.name} size {self.size} needs {need / GIB:.1f} GiB for its embedding tables and this machine "
                f"has {total / GIB:.1f} GiB of memory (at most {MEMORY_FRACTION:.0%} of it for tables); "
                f"use --size {' or '.join(fits) or 'tiny'}, or a node with the memory"
            )

    # -- the model --------------------------------------------------------------------------------------------------

    def _dense_layer(self, keras, units: int, seeds, name: str, activation: str | None = "relu"):
        # the DLRM reference's init: weights N(0, sqrt(2 / (fan_in + fan_out))), biases N(0, sqrt(1 / fan_out))
        return keras.layers.Dense(
            units,
            activation=activation,
            name=name,
            kernel_initializer=keras.initializers.VarianceScaling(
                1.0, mode="fan_avg", distribution="untruncated_normal", seed=next(seeds)
            ),
            bias_initializer=keras.initializers.RandomNormal(0.0, math.sqrt(1.0 / units), seed=next(seeds)),
        )

    def _sparse_model(self, keras, seeds):
        custom = keras_layers()
        preset = self.preset
        devices = [None] * NUM_CATEGORICAL
        if gpu_visible():
            placement = self.placement(gpu=True)
            devices = ["/GPU:0" if t.device == "gpu" else "/CPU:0" for t in placement.tables]
        ids = keras.Input((NUM_CATEGORICAL,), dtype="int64", name="categorical_features")
        vectors = [
            custom.TableLookup(i, rows, preset.dim, device=devices[i], seed=next(seeds), name=f"embedding_{i}")(ids)
            for i, rows in enumerate(preset.table_rows)
        ]
        embeddings = keras.layers.Concatenate(axis=1, name="embeddings")(vectors)
        return keras.Model(ids, embeddings, name="sparse")

    def _dense_model(self, keras, seeds):
        raise NotImplementedError

    def build(self):
        self.check_resources()  # before any table exists
        import keras

        from model_adapters.resnet50_tf import load_weights

        # every initializer gets its own explicit seed (see resnet50_tf): two builds give the same weights
        seeds = itertools.count(1)
        sparse = self._sparse_model(keras, seeds)
        dense = self._dense_model(keras, seeds)
        numerical = keras.Input((NUM_NUMERICAL,), dtype="float32", name="numerical_features")
        categorical = keras.Input((NUM_CATEGORICAL,), dtype="int64", name="categorical_features")
        model = keras.Model([numerical, categorical], dense([numerical, sparse(categorical)]), name=self.name)
        if self.checkpoint:
            load_weights(model, self.checkpoint)
        return model

    # -- io and parts -----------------------------------------------------------------------------------------------

    def _numerical_spec(self) -> TensorSpec:
        return TensorSpec(name="numerical_features", dtype="float32", shape=[NUM_NUMERICAL])

    def _embeddings_spec(self) -> TensorSpec:
        return TensorSpec(name="embeddings", dtype="float32", shape=[NUM_CATEGORICAL, self.preset.dim])

    def io_spec(self) -> IoSpec:
        return IoSpec(
            inputs=[
                self._numerical_spec(),
                TensorSpec(name="categorical_features", dtype="int64", shape=[NUM_CATEGORICAL]),
            ],
            outputs=[TensorSpec(name="output", dtype="float32", shape=[1])],
        )

    def sparse_io_spec(self) -> IoSpec:
        return IoSpec(
            inputs=[TensorSpec(name="categorical_features", dtype="int64", shape=[NUM_CATEGORICAL])],
            outputs=[self._embeddings_spec()],
        )

    def dense_io_spec(self) -> IoSpec:
        return IoSpec(
            inputs=[self._numerical_spec(), self._embeddings_spec()],
            outputs=[TensorSpec(name="output", dtype="float32", shape=[1])],
        )

    def part_formats(self) -> dict[str, list[str]]:
        # the guides serve the dense part as a TensorRT engine; where no engine can be built or served, as ONNX
        return {"sparse": ["tf-savedmodel"], "dense": ["trt", "onnx"] if self.profile == "gpu" else ["onnx"]}

    def parts(self, module) -> list[ModelPart]:
        """The sparse and dense sub-models of `module` (the same layer objects, so the same weights)."""
        formats = self.part_formats()
        return [
            ModelPart("sparse", module.get_layer("sparse"), self.sparse_io_spec(), formats["sparse"]),
            ModelPart("dense", module.get_layer("dense"), self.dense_io_spec(), formats["dense"]),
        ]

    # -- data and metric --------------------------------------------------------------------------------------------

    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """Parquet files (`data_dir/*.parquet`, file-name order) when a dataset is given, else synthetic samples."""
        if self.data_dir:
            for inputs, labels in parquet_batches(self.data_dir, self.preset, n_samples, batch_size):
                yield Batch(inputs=inputs, labels=labels)
            return
        rng = np.random.default_rng(seed)
        for start in range(0, n_samples, batch_size):
            inputs, labels = frame_inputs(
                synthetic_frame(min(batch_size, n_samples - start), self.preset, rng), self.preset
            )
            yield Batch(inputs=inputs, labels=labels)

    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(outputs["output"], dtype=np.float32).reshape(-1)

    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float:
        from model_adapters.ranking_metrics import auc

        return auc(predictions, labels)

    def defaults(self, profile: str) -> ServingDefaults:
        if profile == "gpu":  # the reference guide's parameters; it measures the offline scenario only
            return ServingDefaults(
                max_batch_size=32768,
                model_instances=1,
                preferred_batch_sizes=[32768],
                max_queue_delay_us=1000,
                offline_batch_sizes=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
                online_concurrency=[1],  # unused: the guide has no online scenario
                accuracy_samples=16384,
                accuracy_batch_size=4096,
                formats=["tf-savedmodel"],  # the whole model, the framework reference; the ensemble uses parts()
                online_batch_size=1024,  # only if a user asks for the online scenario
                scenarios=["offline"],
            )
        return ServingDefaults(
            max_batch_size=2048,
            model_instances=1,
            preferred_batch_sizes=[1024, 2048],
            max_queue_delay_us=2000,
            offline_batch_sizes=[64, 256, 1024, 2048],
            online_concurrency=[1],
            accuracy_samples=4096,
            accuracy_batch_size=512,
            formats=["tf-savedmodel"],
            online_batch_size=256,
            scenarios=["offline"],
        )


@register
class DLRM(_Recommender):
    name = "dlrm"
    # the small preset's Keras forward pass at batch 1024 took 55 ms (~18.6k samples/s) on the 2-core development
    # CPU (batch 2048: 70 ms): a perf_analyzer window of 16384 samples is about 1 s there

    def _dense_model(self, keras, seeds):
        preset = self.preset
        numerical = keras.Input((NUM_NUMERICAL,), dtype="float32", name="numerical_features")
        embeddings = keras.Input((NUM_CATEGORICAL, preset.dim), dtype="float32", name="embeddings")
        x = numerical
        for k, units in enumerate(preset.bottom_mlp):
            x = self._dense_layer(keras, units, seeds, f"bottom_mlp_{k}")(x)
        x = keras_layers().DotInteraction(name="interaction")([x, embeddings])
        for k, units in enumerate(preset.top_mlp):
            last = k == len(preset.top_mlp) - 1
            x = self._dense_layer(keras, units, seeds, "logit" if last else f"top_mlp_{k}", None if last else "relu")(x)
        output = keras.layers.Activation("sigmoid", name="output")(x)
        return keras.Model([numerical, embeddings], output, name="dense")


@register
class DCNv2(_Recommender):
    name = "dcnv2"
    # the small preset's Keras forward pass at batch 1024 took 170 ms (~6k samples/s; the 1677-wide cross layers
    # dominate) on the 2-core development CPU (batch 2048: 233 ms): a window of 6144 samples is about 1 s there

    def _dense_model(self, keras, seeds):
        preset = self.preset
        numerical = keras.Input((NUM_NUMERICAL,), dtype="float32", name="numerical_features")
        embeddings = keras.Input((NUM_CATEGORICAL, preset.dim), dtype="float32", name="embeddings")
        x0 = keras.layers.Concatenate(axis=1, name="cross_input")(
            [numerical, keras.layers.Flatten(name="flat_embeddings")(embeddings)]
        )
        x = x0
        for k in range(preset.cross_layers):
            x = keras_layers().CrossLayer(seed=next(seeds), name=f"cross_{k}")([x0, x])
        for k, units in enumerate(preset.deep_mlp):
            x = self._dense_layer(keras, units, seeds, f"deep_mlp_{k}")(x)
        x = self._dense_layer(keras, 1, seeds, "logit", activation=None)(x)
        output = keras.layers.Activation("sigmoid", name="output")(x)
        return keras.Model([numerical, embeddings], output, name="dense")
