"""One registry style for what tbench looks up by name: model adapters, converters, server modes, search strategies.

A name is registered once: a second, different object under it is refused (RegistryError names both). The same
definition again is not a duplicate: the very same object (a repeated import or registration) is a no-op, and one of
the same module:qualname (its module reloaded) replaces the old one. Names keep their registration order.
Compound names are tuples: adapters by (name, framework), converters by (source, target).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from enum import Enum
from typing import Generic, TypeVar, overload

from tbench.core.errors import ConfigError

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class RegistryError(ConfigError):
    """Two different objects registered under one name."""


def qualified_name(obj: object) -> str:
    """module:qualname of a class or function; of its type for anything else."""
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{target.__module__}:{target.__qualname__}"


def label(name: Hashable) -> str:
    """A name as messages write it: a tuple's parts joined by '/', an enum by its value."""
    parts = name if isinstance(name, tuple) else (name,)
    return "/".join(str(p.value) if isinstance(p, Enum) else str(p) for p in parts)


class Registry(Generic[K, T]):
    """Objects of one kind (T) by name (K: a string, or a tuple for a compound name); `describe` tells definitions
    apart and names them in errors."""

    def __init__(self, kind: str, describe: Callable[[T], str] = qualified_name):
        self.kind, self.describe = kind, describe
        self._items: dict[K, T] = {}

    @overload
    def register(self, name: K) -> Callable[[T], T]: ...

    @overload
    def register(self, name: K, item: T) -> T: ...

    def register(self, name, item=None):
        """Register `item` under `name`; without an item, a decorator that registers what it decorates."""
        if item is None:
            return lambda obj: self.register(name, obj)
        if name in self._items:
            old = self._items[name]
            if old is not item and self.describe(old) != self.describe(item):
                raise RegistryError(
                    f"{self.kind} {label(name)} is registered twice: by {self.describe(old)} "
                    f"and by {self.describe(item)}"
                )
        self._items[name] = item
        return item

    def get(self, name: K) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name is unknown too
            known = ", ".join(label(n) for n in self._items)
            raise ConfigError(f"unknown {self.kind} {label(name)!r}; known: {known}") from None

    __getitem__ = get

    def names(self) -> list[K]:
        return list(self._items)

    def items(self) -> list[tuple[K, T]]:
        return list(self._items.items())

    def values(self) -> list[T]:
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._items
        except TypeError:
            return False

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(label(n) for n in self._items)})"
