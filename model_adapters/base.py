"""What every model adapter provides; the pipeline reads nothing model-specific elsewhere."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from tbench.core.iospec import IoSpec


@dataclass(frozen=True)
class ServingDefaults:
    """A reference guide's parameters as data; one instance per profile."""

    max_batch_size: int
    model_instances: int
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    offline_batch_sizes: list[int]
    online_concurrency: list[int]
    accuracy_samples: int = 64
    accuracy_batch_size: int = 8  # samples per request of the accuracy stage (recommenders: thousands)
    formats: list[str] = field(default_factory=lambda: ["onnx", "ts-trace"])
    measurement: dict = field(default_factory=dict)  # Measurement fields this model changes on this profile
    gpu_accelerators: dict[str, str] = field(default_factory=dict)  # format -> Triton GPU execution accelerator
    online_batch_size: int = 1  # samples per request in the online scenario (recommenders send thousands)
    scenarios: list[str] = field(default_factory=lambda: ["offline", "online"])  # what the guide measures


@dataclass
class ModelPart:
    """One composing model of an ensemble: a framework model sharing weights with the whole, its io spec and the
    formats it is exported to (the first one is served). Parts are listed in execution order; a part's inputs are
    the ensemble's inputs or earlier parts' outputs, matched by tensor name."""

    name: str  # the Triton model is `<model>_<name>`
    module: object
    io_spec: IoSpec
    formats: list[str]


@dataclass
class Batch:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None


class ModelAdapter(ABC):
    """A model, its io spec, its data, its metric and its guide's defaults."""

    name: str
    framework: str  # "pytorch" | "tensorflow" | a Format value for a user's model file
    metric_name: str | None  # None: no labels, so accuracy compares served outputs with the source's only
    sizes: tuple[str, ...] = ("full", "small")
    default_size: str = "full"
    options: dict[str, str] = {}  # model-specific options this adapter takes: name -> description
    given_samples = None  # tbench.input_data.InputSamples (--input-data): what every stage draws from instead
    # False: axis 0 is not a batch axis (a file exported at a fixed batch); served with max_batch_size 0, every request
    # is one call of the model at its own shapes, and batches() yields those shapes
    batching: bool = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "batches" in cls.__dict__:  # each adapter's own batches, with the user's input data first when given
            cls.batches = _given_samples_first(cls.__dict__["batches"])

    def __init__(
        self,
        size: str | None = None,
        checkpoint: str | None = None,
        data_dir: str | None = None,
        options: dict | None = None,
    ):
        from tbench.core.errors import ConfigError

        size = size or self.default_size
        if size not in self.sizes:
            raise ConfigError(f"unknown size {size!r} for model {self.name!r}; known: {', '.join(self.sizes)}")
        unknown = sorted(set(options or {}) - set(self.options))
        if unknown:
            known = ", ".join(self.options) or "none"
            raise ConfigError(f"unknown option {unknown[0]!r} for model {self.name!r}; it takes: {known}")
        self.size = size
        self.checkpoint = checkpoint
        self.data_dir = data_dir  # the dataset as the guide's preprocessing leaves it; synthetic data when None
        self.model_options = dict(options or {})
        self.profile: str | None = None  # set once a request is resolved: a profile may scale the inputs down

    @abstractmethod
    def build(self):
        """The framework model in inference mode, weights loaded from the checkpoint if one was given."""

    @abstractmethod
    def io_spec(self) -> IoSpec: ...

    @abstractmethod
    def batches(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """Dataset samples (synthetic when no dataset is given), in batches."""

    @abstractmethod
    def predict(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        """Turn model outputs into the predictions the metric compares."""

    @abstractmethod
    def metric(self, predictions: np.ndarray, labels: np.ndarray) -> float: ...

    @abstractmethod
    def defaults(self, profile: str) -> ServingDefaults: ...

    @property
    def is_ensemble(self) -> bool:
        return type(self).parts is not ModelAdapter.parts

    def parts(self, module) -> list[ModelPart] | None:
        """An ensemble's composing models, built from (and sharing weights with) `module`; None: a single model."""
        return None

    def part_formats(self) -> dict[str, list[str]]:
        """An ensemble's parts' formats by part name (the first is served), known before the model is built (the
        request's precision is checked against them); {} for a single model."""
        return {}

    def check_resources(self) -> None:  # noqa: B027 - an optional hook: by default every machine can hold the model
        """Refuse, with one line and before anything is built, a model this machine cannot hold."""

    def report_notes(self) -> list[str]:
        """Markdown lines the report adds under the configuration (e.g. an ensemble's embedding placement)."""
        return []

    def input_shapes(self) -> dict[str, list[int]]:
        """Concrete non-batch shape per input (dynamic dims as the data has them), for perf_analyzer's --shape."""
        return {name: list(value.shape[1:]) for name, value in self.sample_batch(1).items()}

    @property
    def guessed_shapes(self) -> dict[str, list[int]]:
        """Inputs whose dynamic dims nobody sized, at the shape they are measured: none for an adapter, whose shapes
        are its model's own (a model file's may be: model_adapters.file_model)."""
        return {}

    @property
    def guessed_values(self) -> dict[str, str]:
        """Integer inputs whose synthetic values nobody ranged, as 'LO..HI (why)': none for an adapter, whose data is
        its model's own (a model file's may be: model_adapters.file_model)."""
        return {}

    @property
    def shape_sets(self) -> list[dict[str, list[int]]]:
        """The shape sets a run measures one after another (a --shape sweep of a model file); one set by default:
        {} (the model's own shapes)."""
        return [{}]

    def at_shapes(self, shapes: dict[str, list[int]]) -> ModelAdapter:
        """This adapter at one of its shape sets."""
        return self

    def reproduce_expr(self) -> str:
        """Python that rebuilds this adapter, for the reproduce scripts next to each conversion."""
        return (
            f"model_adapters.get({self.name!r}, {self.size!r}, {self.checkpoint!r}, framework={self.framework!r}, "
            f"data_dir={self.data_dir!r}, profile={self.profile!r}, options={self.model_options or None!r})"
            + (f".use_input_data({self.given_samples.path!r})" if self.given_samples is not None else "")
        )

    def use_input_data(self, path: str) -> ModelAdapter:
        """Draw every batch from the user's samples at `path` (see tbench/input_data.py), checked against the io spec
        here; they have no labels, so the accuracy stage compares outputs only. Returns the adapter."""
        from tbench.core.input_data import load_input_data

        self.given_samples = load_input_data(path, self.io_spec(), default_shapes=self.input_shapes)
        return self

    def rejected_inputs(self, what: str, error_line: str, inputs: dict[str, np.ndarray]) -> str:
        """One line for a model that failed on `inputs` (from sample_batch) in its own runtime: what failed, on which
        data, the runtime's error, and what to try."""
        if self.given_samples is not None:
            return f"{what} failed on the input data from {self.given_samples.path}: {error_line}"
        return f"{what} failed on its sample inputs: {error_line}"

    def sample_batch(self, batch_size: int, seed: int = 1234) -> dict[str, np.ndarray]:
        return next(self.batches(batch_size, batch_size, seed=seed)).inputs


def _given_samples_first(batches):
    @functools.wraps(batches)
    def wrapper(self, n_samples: int, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        if self.given_samples is None:
            return batches(self, n_samples, batch_size, seed)
        # the same samples from the first one on, whatever the seed: every stage sends the user's data in order
        if not self.batching:  # each sample is a whole request at the model's own shapes
            return (Batch(inputs=self.given_samples.one(i)) for i in range(n_samples))
        return (Batch(inputs=inputs) for inputs in self.given_samples.batches(n_samples, batch_size))

    return wrapper
