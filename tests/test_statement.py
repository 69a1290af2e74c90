"""An operator's rule as one SQL statement (``sparkfill.dataflow.statement``): it reads
the frames it is given where its text names them, keeps other braces literal, and
leaves a persisted input cached; ``consolidate``, built that way, gives the changelog
between two images."""

from __future__ import annotations

import pytest
from pyspark import StorageLevel
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sparkfill.dataflow.changelog import consolidate
from sparkfill.dataflow.statement import sql_over

SCHEMA = StructType([StructField("id", LongType()), StructField("{after}", StringType())])


def test_consolidate_in_one_statement_gives_each_kind_of_change(spark):
    before = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], SCHEMA)
    after = spark.createDataFrame([(2, "b"), (3, "C"), (4, "d")], SCHEMA)
    rows = consolidate(before, after, ["id", "{after}"], ["id"]).collect()
    got = sorted((r["_op"], r["id"], r["{after}"]) for r in rows)
    assert got == [("+", 4, "d"), ("-", 1, "a"), ("U+", 3, "C"), ("U-", 3, "c")]
    assert all(0 <= r["_vnode"] < 256 for r in rows)


def test_a_statement_keeps_literal_braces_and_a_persisted_input_cached(spark):
    frame = spark.createDataFrame([(1, "x")], SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        out = sql_over("SELECT id, `{after}` AS v, '{frame}' AS lit FROM {_sf_frame}",
                       {"_sf_frame": frame})
        assert [tuple(r) for r in out.collect()] == [(1, "x", "{frame}")]
        assert frame.storageLevel == StorageLevel.MEMORY_AND_DISK
    finally:
        frame.unpersist()


def test_without_its_projection_a_classic_view_would_uncache_the_input(spark):
    """The trap ``sql_over`` avoids, shown: pyspark's own DataFrame argument of a
    classic session is a view dropped on return, and the drop uncaches the frame, as
    it does a projection of all its columns (a Spark Connect statement makes no
    view)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        pytest.skip("a Spark Connect statement makes no view: there is no trap to show")
    frame = spark.createDataFrame([(1, "x")], SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        spark.sql("SELECT id FROM {frame}", frame=frame).collect()
        assert frame.storageLevel == StorageLevel(False, False, False, False, 1)
        frame.persist(StorageLevel.MEMORY_AND_DISK)
        spark.sql("SELECT id FROM {frame}", frame=frame.select("*")).collect()
        assert frame.storageLevel == StorageLevel(False, False, False, False, 1)
    finally:
        frame.unpersist()
