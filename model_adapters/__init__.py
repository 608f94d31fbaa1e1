"""Adapters register by name and framework; third parties plug in through the `tbench.model_adapters` entry-point
group.

One (name, framework) has one adapter class: a second class under it is refused (RegistryError, one line naming both
classes), a built-in's or another plugin's alike, so an entry point that duplicates a built-in fails at load, on the
first lookup, rather than silently replacing it. Registering the same class again is a no-op.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from model_adapters.base import Batch, ModelAdapter, ServingDefaults
from tbench.core.errors import ConfigError
from tbench.core.registry import Registry, RegistryError

PLUGIN_GROUP = "tbench.model_adapters"

# (name, framework) -> adapter class: one model can have a PyTorch and a TensorFlow implementation
_REGISTRY: Registry[tuple[str, str], type[ModelAdapter]] = Registry("model adapter")


def register(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    return _REGISTRY.register((cls.name, cls.framework), cls)


def _variants(name: str) -> dict[str, type[ModelAdapter]]:
    """A model's adapter classes by framework, in registration order."""
    return {framework: cls for (n, framework), cls in _REGISTRY.items() if n == name}


def _load_builtin_and_plugins() -> None:
    from model_adapters import dlrm, resnet50  # noqa: F401  (they register themselves)
    from model_adapters.fastpitch import FastPitch
    from model_adapters.nnunet import NnUNet
    from model_adapters.resnet50_tf import ResNet50TF
    from model_adapters.widedeep import WideDeep

    for cls in (ResNet50TF, NnUNet, FastPitch, WideDeep):
        register(cls)

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            register(ep.load())
        except RegistryError as err:
            raise RegistryError(f"entry point {ep.name!r} ({PLUGIN_GROUP}): {err}") from None


def names() -> list[str]:
    _load_builtin_and_plugins()
    return sorted({n for n, _ in _REGISTRY})


def frameworks(name: str) -> list[str]:
    _load_builtin_and_plugins()
    return list(_variants(name))


def get(
    name: str,
    size: str | None = None,
    checkpoint: str | None = None,
    framework: str | None = None,
    data_dir: str | None = None,
    profile: str | None = None,
    options: dict | None = None,
) -> ModelAdapter:
    """The adapter of a model; its first registered framework (PyTorch for the built-ins) unless one is named."""
    _load_builtin_and_plugins()
    variants = _variants(name.strip().lower())
    if not variants:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(names())}")
    chosen = framework.strip().lower() if framework else next(iter(variants))
    if chosen not in variants:
        raise ConfigError(f"model {name!r} has no {chosen} implementation; it has: {', '.join(variants)}")
    adapter = variants[chosen](size=size, checkpoint=checkpoint, data_dir=data_dir, options=options)
    adapter.profile = profile  # a profile may scale the inputs down (e.g. nnunet's volume on the CPU)
    return adapter


__all__ = ["Batch", "ModelAdapter", "ServingDefaults", "get", "names", "register"]
