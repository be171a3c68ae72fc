"""One registry of named things (advantage estimators, policy losses): a name is registered once, an
unknown name is a ValueError listing the valid ones."""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Things registered by name, in the order of registration. ``what`` names the kind in messages."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> None:
        if name in self._items:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._items[name] = item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.what} {name!r}; valid: {self.names()}") from None

    def names(self) -> list[str]:
        return list(self._items)
