"""A bounded cache of values that never change under their keys (a file's footer,
a table version's file list): it keeps the ``limit`` most recently used entries, or,
given a ``weigh``, the most recently used entries whose weights sum to at most
``limit``.

Invariant: the entries' weights (1 each without ``weigh``) sum to at most ``limit``;
``get`` of a key makes it the most recently used; ``put`` beyond ``limit`` forgets
the least recently used first (a value heavier than ``limit`` alone is not kept).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Values by key, the most recently used kept: ``limit`` of them, or as many as
    weigh at most ``limit`` in all by ``weigh``."""

    def __init__(self, limit: int, weigh: Callable[[V], int] | None = None) -> None:
        self.limit = limit
        self._weigh = weigh
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.weight = 0

    def get(self, key: K) -> V | None:
        held = self._items.get(key)
        if held is None:
            return None
        self._items.move_to_end(key)
        return held[0]

    def put(self, key: K, value: V) -> V:
        weight = 1 if self._weigh is None else self._weigh(value)
        old = self._items.pop(key, None)
        if old is not None:
            self.weight -= old[1]
        if weight > self.limit:
            return value
        self._items[key] = (value, weight)
        self.weight += weight
        while self.weight > self.limit:
            self.weight -= self._items.popitem(last=False)[1][1]
        return value

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The value held for ``key``, or ``build()``'s, then held."""
        found = self.get(key)
        return found if found is not None else self.put(key, build())

    def discard(self, key: K) -> None:
        """Forget ``key``'s value, if held."""
        held = self._items.pop(key, None)
        if held is not None:
            self.weight -= held[1]

    def clear(self) -> None:
        self._items.clear()
        self.weight = 0

    def __len__(self) -> int:
        return len(self._items)
