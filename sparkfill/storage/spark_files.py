"""Spark's reads and writes of Parquet files under a warehouse.

A local warehouse goes through Spark's own Parquet source and writer (the fastest
path on local files); an object store through ``object_files`` (pyarrow on the
executors), which needs no Hadoop connector. Either way a write returns what the
driver needs to commit it — each file's URI, size and statistics — taken from
the write itself or the warehouse's filesystem, never from a local listing of a
remote store.

Invariant: ``read_parquet(files)`` returns exactly the rows of ``files`` in
``schema`` (a read of no file is a frame Spark's optimizer knows to be empty, and a
read of at most ``ONE_TASK_ROWS`` rows is one partition); ``write_parquet`` writes
one file per non-empty partition and reports each file it wrote, in one Spark job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from . import object_files
from .lru import LruCache
from .warehouse import Warehouse

__all__ = ["WrittenFile", "read_parquet", "read_texts", "write_parquet", "parquet_stats",
           "spark_native", "empty_frame", "local_paths", "ONE_TASK_ROWS", "one_task_if_few"]

#: a read of at most this many rows is one partition (one task): a plan over one
#: partition needs no exchange (a single partition satisfies every distribution a
#: join, a group or a window asks for), so a small epoch's query is one stage, not
#: one per join, group and window, each of which costs tens of milliseconds whatever
#: it holds; a larger read keeps one task per file split
ONE_TASK_ROWS = 100_000


@dataclass(frozen=True)
class WrittenFile:
    uri: str
    size: int
    stats: dict[str, Any]

    @property
    def rows(self) -> int:
        return int(self.stats.get("numRecords", 0))


_registered: dict[int, SparkSession] = {}
#: the reads of immutable files (``read_parquet(..., immutable=True)``), the
#: ``READ_CACHE_SIZE`` most recently used: a frame is a plan, not data, so holding one
#: holds no rows
READ_CACHE_SIZE = 512
_reads: LruCache[tuple[int, str, tuple[str, ...]], tuple[SparkSession, DataFrame]] = (
    LruCache(READ_CACHE_SIZE))
EMPTY_CACHE_SIZE = 256
#: the empty frames built per session and schema (``empty_frame``): a frame is
#: immutable, and building one costs a classic session about 35 Py4J round trips
_empty: LruCache[tuple[int, str], tuple[SparkSession, DataFrame]] = LruCache(EMPTY_CACHE_SIZE)
#: characters a Hadoop path glob gives a meaning to: a list of files naming one is
#: passed to Spark file by file
_GLOB_CHARS = frozenset("*?[]{}\\,^")


def spark_native(warehouse: Warehouse) -> bool:
    """Whether Spark's own Parquet source and writer serve ``warehouse``: a local
    one (measured faster there than the pyarrow path, bench/io_bench.py); an object
    store goes through ``object_files``."""
    return warehouse.is_local


def _register(spark: SparkSession) -> None:
    """Register the Arrow data sources with ``spark`` (once per session)."""
    if _registered.get(id(spark)) is spark:
        return
    object_files.ship_by_value()
    spark.dataSource.register(object_files.ArrowParquetSource)
    spark.dataSource.register(object_files.ArrowTextSource)
    _registered[id(spark)] = spark


def empty_frame(spark: SparkSession, schema: T.StructType) -> DataFrame:
    """A frame of no rows in ``schema`` that Spark's optimizer knows is empty (a zero
    limit): a join or union with it folds away instead of running (an empty local
    frame of a classic session is a scan of an RDD, which Spark cannot see through).
    Built once per session and schema."""
    return _held(_empty, (id(spark), schema.json()), spark,
                 lambda: spark.createDataFrame([], schema).limit(0))


def _held(cache: LruCache[Any, tuple[SparkSession, DataFrame]], key: Any, spark: SparkSession,
          build: Callable[[], DataFrame]) -> DataFrame:
    """The frame ``cache`` holds for ``key`` in ``spark`` (``key`` starts with its
    id), built by ``build`` when absent or held for another session of that id."""
    held = cache.get(key)
    if held is None or held[0] is not spark:
        held = cache.put(key, (spark, build()))
    return held[1]


def local_paths(uris: Sequence[str]) -> list[str]:
    """Local files as the path arguments of Spark's Parquet reader, in a few of them.
    A classic session sends a list argument to the JVM one element per round trip, so
    more than three files go as two Hadoop globs ``dir/{a,b,...}`` that name exactly
    them (two, not one: Spark looks for a streaming sink's metadata beside a single
    path, and logs its absence). Files whose names a glob would read otherwise are
    passed one by one."""
    if len(uris) <= 3 or any("://" in u or not _GLOB_CHARS.isdisjoint(u) for u in uris):
        return list(uris)
    half = len(uris) // 2
    return [_glob(uris[:half]), _glob(uris[half:])]


def _glob(uris: Sequence[str]) -> str:
    """A Hadoop glob matching exactly the local files ``uris``."""
    root = os.path.commonpath([os.path.dirname(u) for u in uris]).rstrip("/")
    return root + "/{" + ",".join(u[len(root) + 1:] for u in uris) + "}"


def read_parquet(spark: SparkSession, warehouse: Warehouse, schema: T.StructType,
                 uris: Sequence[str], rows: int | None = None,
                 immutable: bool = False) -> DataFrame:
    """The rows of the Parquet files ``uris`` (none: an empty frame) in ``schema``;
    ``rows``, when the caller knows how many they hold: at most ``ONE_TASK_ROWS``
    are read as one partition. ``immutable``: the files never change under their
    names (a relation's files, each written once under a unique name), so the read's
    frame is built once per session, schema and file list and reused by later epochs:
    building it costs a classic session a file listing and about 13 Py4J round trips
    (50-60 ms), and a steady epoch reads the same unchanged files a dozen times."""
    if not uris:
        return empty_frame(spark, schema)
    if not immutable:
        df = _read_files(spark, warehouse, schema, uris)
    else:
        df = _held(_reads, (id(spark), schema.json(), tuple(uris)), spark,
                   lambda: _read_files(spark, warehouse, schema, uris))
    return one_task_if_few(df, rows)


def one_task_if_few(df: DataFrame, rows: int | None) -> DataFrame:
    """``df`` as one partition when it holds at most ``ONE_TASK_ROWS`` rows (``rows``;
    None: not known): an aggregate or a join over it (and over other single
    partitions) then needs no exchange, which would split its job into a job per
    stage."""
    return df.coalesce(1) if rows is not None and rows <= ONE_TASK_ROWS else df


def _read_files(spark: SparkSession, warehouse: Warehouse, schema: T.StructType,
                uris: Sequence[str]) -> DataFrame:
    if spark_native(warehouse):
        return spark.read.schema(schema).parquet(*local_paths(uris))
    _register(spark)
    return (spark.read.format(object_files.SOURCE_NAME).schema(schema)
            .option("uris", json.dumps(list(uris)))
            .options(**_storage_read_options(warehouse))
            .load())


def _storage_read_options(location: Warehouse) -> dict[str, str]:
    """``location``'s storage options as the options of a read through ``object_files``."""
    return {f"storage.{k.lower()}": v for k, v in location.storage_options.items()}


def read_texts(spark: SparkSession, location: Warehouse, uris: Sequence[str]) -> DataFrame:
    """One row per file of ``uris`` (at least one, all under ``location``): ``file``
    (its name) and ``value`` (its whole text), through Spark's own text source where
    ``spark_native``, else through ``object_files`` with ``location``'s options."""
    if spark_native(location):
        from pyspark.sql import functions as F

        # Spark's file name is URL-encoded; '+' is a literal plus, not a space
        name = F.url_decode(F.regexp_replace(F.col("_metadata.file_name"), r"\+", "%2B"))
        return (spark.read.text(list(uris), wholetext=True)
                .select(name.alias("file"), "value"))
    _register(spark)
    return (spark.read.format(object_files.TEXT_SOURCE_NAME)
            .option("uris", json.dumps(list(uris)))
            .options(**_storage_read_options(location))
            .load())


def write_parquet(df: DataFrame, warehouse: Warehouse, dir_uri: str,
                  stats_columns: Sequence[str],
                  row_group_rows: int | None = None) -> list[WrittenFile]:
    """Write ``df`` under ``dir_uri`` as one snappy Parquet file per partition (rows in
    their order, row groups of at most ``row_group_rows`` rows when given); the files
    written, sorted by URI. A partition without rows leaves no file: an empty file has
    no statistics, and a reader must not guess its range."""
    if spark_native(warehouse):
        spark_writer = df.write.mode("overwrite").option("compression", "snappy")
        if row_group_rows is not None:
            spark_writer = spark_writer.option("parquet.block.row.count.limit",
                                               str(row_group_rows))
        spark_writer.parquet(dir_uri)
        written = [WrittenFile(uri, warehouse.size(uri),
                               parquet_stats(warehouse, uri, stats_columns))
                   for uri in warehouse.part_files(dir_uri)]
    else:
        from pyspark.sql.pandas.types import to_arrow_schema

        writer = object_files.parquet_writer(dir_uri, warehouse.storage_options,
                                             list(stats_columns), to_arrow_schema(df.schema))
        object_files.ship_by_value()
        rows = df.mapInArrow(writer, object_files.WRITTEN_SCHEMA).collect()
        written = [WrittenFile(r["path"], int(r["size"]), json.loads(r["stats"]))
                   for r in rows]
    for empty in [f for f in written if f.rows == 0]:
        warehouse.rmtree(empty.uri)
    return sorted((f for f in written if f.rows > 0), key=lambda f: f.uri)


def row_group_ranges(warehouse: Warehouse, uri: str,
                     column: str) -> tuple[tuple[int, int, int], ...]:
    """Each row group of a Parquet file as (rows, min, max) of an integer ``column``,
    from the footer; (0, 255) where a row group has no statistics (the vnode range
    that holds every row)."""
    md = warehouse.parquet_metadata(uri)
    idx = [md.schema.column(i).name for i in range(md.num_columns)].index(column)
    found = []
    for rg in range(md.num_row_groups):
        st = md.row_group(rg).column(idx).statistics
        lo, hi = (st.min, st.max) if st is not None and st.has_min_max else (0, 255)
        found.append((md.row_group(rg).num_rows, int(lo), int(hi)))
    return tuple(found)


def parquet_stats(warehouse: Warehouse, uri: str, columns: Sequence[str]) -> dict[str, Any]:
    """Delta statistics of a written Parquet file from its footer: rows and, for the
    integer and string ``columns`` with statistics in every row group, min, max and
    null count."""
    md = warehouse.parquet_metadata(uri)
    names = [md.schema.column(i).name for i in range(md.num_columns)]
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for col in columns:
        if col not in names:
            continue
        idx = names.index(col)
        lo = hi = None
        n_null = 0
        ok = True
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(idx).statistics
            if st is None or not st.has_min_max:
                if md.row_group(rg).num_rows:
                    ok = False
                continue
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
            n_null += st.null_count or 0
        if ok and lo is not None and isinstance(lo, int | str):
            mins[col], maxs[col], nulls[col] = lo, hi, n_null
    return {"numRecords": md.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
