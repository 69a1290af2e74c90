"""A bounded cache of values that never change under their keys (a file's footer,
a table version's file list): it keeps the ``limit`` most recently used entries.

Invariant: at most ``limit`` entries; ``get`` of a key makes it the most recently
used; ``put`` beyond ``limit`` forgets the least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Values by key, the ``limit`` most recently used kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)
        return value

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The value held for ``key``, or ``build()``'s, then held."""
        found = self.get(key)
        return found if found is not None else self.put(key, build())

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
