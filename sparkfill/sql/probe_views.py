"""The empty relations a planning probes Spark's analysis over.

Invariant: a probe view is a temporary view of an empty relation of exactly one
schema (names, types and nullability); within one planning (``probing``, entered by
the outermost ``plan_chain`` of a statement) each distinct schema has one view, made
at its first probe, and every view is dropped when that planning ends, whether it
succeeds or raises. Within a planning, a probe's text names its views, so one text is
one result: each is computed once (``once``; a probe that raises is not kept).

Planning a query analyses many small probes (a statement's every join, stage and key
pair), each over its leaves' schemas. Made afresh for each probe, the empty relations
and their views were more than half of the planning's Py4J calls: seven TPC-DS
statements made 462 relations (a classic session builds each through an RDD) for 130
distinct schemas, and analysed 108 probe texts twice (bench/RESULTS.md, stop 67).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

__all__ = ["probing", "probe_view", "probe_frame", "once"]


class _ProbeViews:
    """The views of one planning, by their schema's JSON."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.frames: dict[str, DataFrame] = {}
        self.views: dict[str, str] = {}
        self.results: dict[str, Any] = {}

    def frame(self, struct: StructType) -> DataFrame:
        key = struct.json()
        df = self.frames.get(key)
        if df is None:
            df = self.frames[key] = self.spark.createDataFrame([], struct)
        return df

    def view(self, struct: StructType) -> str:
        key = struct.json()
        name = self.views.get(key)
        if name is None:
            name = f"__sf_plan_{uuid.uuid4().hex[:12]}"
            self.frame(struct).createOrReplaceTempView(name)
            self.views[key] = name
        return name

    def drop(self) -> None:
        for name in self.views.values():
            self.spark.catalog.dropTempView(name)
        self.views.clear()
        self.frames.clear()
        self.results.clear()


T = TypeVar("T")

_CURRENT: ContextVar[_ProbeViews | None] = ContextVar("sparkfill_probe_views", default=None)


@contextmanager
def probing(spark: SparkSession) -> Iterator[None]:
    """A planning's scope of probe views: inside one of the same session already,
    nothing more (its views serve); else a new scope whose views are dropped at its
    end."""
    current = _CURRENT.get()
    if current is not None and current.spark is spark:
        yield
        return
    views = _ProbeViews(spark)
    token = _CURRENT.set(views)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        views.drop()


def probe_view(spark: SparkSession, struct: StructType) -> str:
    """The name of a temporary view of an empty relation of ``struct``, valid until
    the enclosing ``probing`` scope ends (the caller holds one)."""
    current = _CURRENT.get()
    assert current is not None and current.spark is spark, "probe_view outside probing()"
    return current.view(struct)


def probe_frame(spark: SparkSession, struct: StructType) -> DataFrame:
    """An empty frame of ``struct``: within a ``probing`` scope, the scope's one frame
    of that schema; outside one, a new frame."""
    current = _CURRENT.get()
    if current is None or current.spark is not spark:
        return spark.createDataFrame([], struct)
    return current.frame(struct)


def once(spark: SparkSession, probe_sql: str, compute: Callable[[], T]) -> T:
    """``compute()``'s result for the probe ``probe_sql`` (a text over this scope's
    views): computed at its first call in a ``probing`` scope and kept until the
    scope ends (not kept when it raises: the next call raises again); outside a
    scope, computed each time."""
    current = _CURRENT.get()
    if current is None or current.spark is not spark:
        return compute()
    if probe_sql not in current.results:
        current.results[probe_sql] = compute()
    return current.results[probe_sql]  # type: ignore[no-any-return]
