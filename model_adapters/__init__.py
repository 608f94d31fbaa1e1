"""Adapters register by name; third parties plug in through the `tbench.model_adapters` entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from tbench.errors import ConfigError

# name -> framework -> adapter class: one model can have a PyTorch and a TensorFlow implementation
_REGISTRY: dict[str, dict[str, type[ModelAdapter]]] = {}


def register(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    _REGISTRY.setdefault(cls.name, {})[cls.framework] = cls
    return cls


def _load_builtin_and_plugins() -> None:
    from model_adapters import dlrm, resnet50  # noqa: F401  (they register themselves)
    from model_adapters.fastpitch import FastPitch
    from model_adapters.nnunet import NnUNet
    from model_adapters.resnet50_tf import ResNet50TF
    from model_adapters.widedeep import WideDeep

    for cls in (ResNet50TF, NnUNet, FastPitch, WideDeep):
        register(cls)

    for ep in entry_points(group="tbench.model_adapters"):
        register(ep.load())


def names() -> list[str]:
    _load_builtin_and_plugins()
    return sorted(_REGISTRY)


def frameworks(name: str) -> list[str]:
    _load_builtin_and_plugins()
    return list(_REGISTRY.get(name, {}))


def get(name: str, size: str | None = None, checkpoint: str | None = None, framework: str | None = None,
        data_dir: str | None = None, profile: str | None = None, options: dict | None = None) -> ModelAdapter:
    """The adapter of a model; its first registered framework (PyTorch for the built-ins) unless one is named."""
    _load_builtin_and_plugins()
    try:
        variants = _REGISTRY[name.strip().lower()]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None
    chosen = framework.strip().lower() if framework else next(iter(variants))
    if chosen not in variants:
        raise ConfigError(f"model {name!r} has no {chosen} implementation; it has: {', '.join(variants)}")
    adapter = variants[chosen](size=size, checkpoint=checkpoint, data_dir=data_dir, options=options)
    adapter.profile = profile  # a profile may scale the inputs down (e.g. nnunet's volume on the CPU)
    return adapter


__all__ = ["Batch", "ModelAdapter", "ServingDefaults", "get", "names", "register"]
