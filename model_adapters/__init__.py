"""Adapters register by name; third parties plug in through the `tbench.model_adapters` entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from tbench.errors import ConfigError

_REGISTRY: dict[str, type[ModelAdapter]] = {}


def register(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin_and_plugins() -> None:
    from model_adapters import resnet50  # noqa: F401  (registers itself)

    for ep in entry_points(group="tbench.model_adapters"):
        register(ep.load())


def names() -> list[str]:
    _load_builtin_and_plugins()
    return sorted(_REGISTRY)


def get(name: str, size: str = "full", checkpoint: str | None = None) -> ModelAdapter:
    _load_builtin_and_plugins()
    try:
        cls = _REGISTRY[name.strip().lower()]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None
    return cls(size=size, checkpoint=checkpoint)


__all__ = ["Batch", "ModelAdapter", "ServingDefaults", "get", "names", "register"]
