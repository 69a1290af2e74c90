"""Frames an epoch caches, released however the epoch ends.

An epoch caches a frame that two of its jobs read (a backfill chunk, a rewritten
relation's Δ, an aggregate's groups); a committed epoch releases them after its
commit. An epoch that raises never gets there, and a frame cached inside an operator
that raised is not even returned to it: each would stay in the session's cache (its
memory, and a candidate every later query's plan is matched against) for the life of
the session, once per failed run of the epoch.

Invariant: a frame cached through ``persisted`` while an ``epoch_cache`` scope is
open on this thread is unpersisted by the time that scope is left by an exception.
A scope left normally releases nothing: the epoch releases its frames after its
commit. A frame cached outside any scope (a snapshot job's thread, which keeps its
own) is not recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pyspark import StorageLevel
from pyspark.sql import DataFrame

__all__ = ["epoch_cache", "persisted"]

LOG = logging.getLogger(__name__)

_HELD: ContextVar[list[DataFrame] | None] = ContextVar("sparkfill_epoch_cached",
                                                       default=None)


def persisted(df: DataFrame,
              level: StorageLevel = StorageLevel.MEMORY_AND_DISK) -> DataFrame:
    """``df`` cached at ``level``, and recorded in the open ``epoch_cache`` scope."""
    cached = df.persist(level)
    held = _HELD.get()
    if held is not None:
        held.append(cached)
    return cached


@contextmanager
def epoch_cache() -> Iterator[None]:
    """A scope that releases every frame ``persisted`` in it if it is left by an
    exception (the exception propagates unchanged)."""
    held: list[DataFrame] = []
    token = _HELD.set(held)
    try:
        yield
    except BaseException:
        for df in held:
            try:
                df.unpersist()
            except Exception as exc:  # noqa: BLE001 - the epoch's own error is reported
                LOG.warning("could not release a frame cached by a failed epoch: %s: %s",
                            type(exc).__name__, exc)
        raise
    finally:
        _HELD.reset(token)
