"""DML: validating, staging and applying inserts, upserts and deletes.

Invariants:
- A DML call either raises (and stages nothing) or returns after its rows are
  durable: a Parquet file (or a directory of them) in ``staging/dml`` under the
  warehouse, registered in the meta store by its URI. A file is complete before it
  is registered (locally written under a temporary name, fsynced and renamed; on an
  object store one PUT); files no registered batch names are removed on open.
- Staged batches apply exactly once, in call order: within an epoch the last
  change of a key (highest ``(seq, idx)``) wins.
- A table's Δ for epoch ``e`` is the consolidated difference between its
  snapshot at ``e-1`` and that snapshot with the staged changes applied.
- A first load (a Spark DataFrame of upserts into a table that is empty, with
  nothing staged, when it is called) is staged *placed*: already as the table's
  log files of the next epoch ``e`` (one row per key, the last; in vnode order;
  ``_epoch`` = ``e``, ``_op`` = ``+``), under a name ending ``.e<e>.placed``, with
  what an append would have observed of it beside them. If it is the table's only
  batch when epoch ``e`` applies it and the table is still empty, the epoch links
  its files into the table as they are (no second pass over the rows); otherwise it
  is read as staged upserts like any other batch.
- An UPDATE that sets no key column stages each key it matches once, from the
  table's rows at the committed epoch ``c``, under a name ending ``.e<c>.update``
  (``.e<c>.whole`` with no WHERE: every key the table held at ``c``). An epoch that
  applies such a batch alone takes its rows as the keys' latest (no window over the
  key); one whose rows at ``e-1`` are those of ``c`` and holds a ``whole`` batch
  keeps no old row when it writes the table's rows at ``e`` whole (each was touched).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..dataflow.changelog import consolidate
from ..errors import DataError, UnknownColumn
from .catalog import Relation
from .keyrange import values_in_sql
from .meta_store import MetaStore, StagedBatch
from .relation_store import (
    KEY_VALUES,
    PREPARED_OBSERVED,
    DataFile,
    RelationStore,
    cast_sql,
    inserts_observed,
    last_rows_per_key,
)
from .schema import (
    EPOCH,
    OP,
    VNODE,
    VNODE_COUNT,
    arrow_type,
    names_sql,
    physical_struct,
    quoted,
    spark_type,
    vnode_each,
    vnode_expr,
    vnode_sql,
    vnodes_of,
)
from .spark_files import WrittenFile, read_parquet, write_parquet
from .warehouse import Warehouse

__all__ = ["DmlStager", "TableDelta", "table_delta", "UPSERT", "DELETE"]

#: a statement's batch (an UPDATE's or DELETE's rows) of at most this many rows is
#: staged from the driver (``DmlStager.stage``'s ``small``)
DRIVER_STAGE_ROWS = 20_000
#: a table's change is computed on the driver (``_change_on_driver``) when the row
#: groups that may hold its keys' old rows hold at most this many rows (read there with
#: pyarrow; through a large base's keyed copies, 1,000 random keys read about 265,000
#: rows of 1M and 500,000 of 16M: bench/RESULTS.md, stop 76)
DRIVER_CHANGE_ROWS = 600_000
#: a change of at most this share of a table's rows (and more than ``KEY_VALUES``
#: keys) meets its rows by a semi-join below the merge of base and log
SEMI_FRACTION = 0.25
UPSERT = "U"
DELETE = "D"
SEQ = "_sf_seq"
IDX = "_sf_idx"
KIND = "_sf_kind"
#: a staged row's first failed check (never written)
PROBLEM = "_sf_problem"
#: a placed batch (a first load staged as the table's log files of the epoch in its
#: name): ``<seq>-<id>.e<epoch>.placed``
PLACED = re.compile(r"\.e(\d{10})\.placed$")
#: at most this many files per placed batch (a Spark write task each)
PLACED_FILES = 26
#: a placed load's column of the file a row goes to (a range of vnodes)
_FILE = "_sf_file"


#: a batch of an UPDATE that sets no key column, staged from the table's rows at a
#: committed epoch: each key at most once (``<seq>-<id>.e<epoch>.update``) and, with
#: no WHERE, every key the table held at that epoch (``<seq>-<id>.e<epoch>.whole``)
UPDATED = re.compile(r"\.e(\d{10})\.(update|whole)$")


def placed_epoch(path: str) -> int | None:
    """The epoch a placed batch's files are written for; None for another batch."""
    m = PLACED.search(path)
    return None if m is None else int(m.group(1))


def updated_at(path: str) -> tuple[int, bool] | None:
    """For a batch of an UPDATE that sets no key column: the epoch whose rows it was
    staged from, and whether it updates every row the table held then; else None."""
    m = UPDATED.search(path)
    return None if m is None else (int(m.group(1)), m.group(2) == "whole")


def _stage_struct(rel: Relation) -> T.StructType:
    fields = [T.StructField(c.name, spark_type(c.type), True) for c in rel.columns]
    fields += [T.StructField(SEQ, T.LongType(), True), T.StructField(IDX, T.LongType(), True),
               T.StructField(KIND, T.StringType(), True)]
    return T.StructType(fields)


class DmlStager:
    def __init__(self, spark: SparkSession, meta: MetaStore, warehouse: Warehouse,
                 store: RelationStore | None = None) -> None:
        self.spark = spark
        self.meta = meta
        self.warehouse = warehouse
        #: the tables' store: with it, a first load is staged placed
        self.store = store
        #: the URI of the staged batches' directory
        self.dir = warehouse.join("staging", "dml")
        warehouse.makedirs(self.dir)

    # --- validation -----------------------------------------------------------------------

    @staticmethod
    def _check_columns(rel: Relation, given: Sequence[str], kind: str) -> None:
        known = {c.name.lower(): c.name for c in rel.columns}
        for name in given:
            if name.lower() not in known and kind == UPSERT:
                raise UnknownColumn(
                    f"table {rel.name!r} has no column {name!r} "
                    f"(columns: {', '.join(c.name for c in rel.columns)})")
        lowered = {g.lower() for g in given}
        if kind == UPSERT and rel.proctime is not None and rel.proctime.lower() in lowered:
            raise DataError(
                f"table {rel.name!r}: column {rel.proctime!r} is its processing time (AS "
                "PROCTIME()), which the engine fills with the epoch's time when it writes the "
                "row; it cannot be written: leave it out")
        missing = [k for k in rel.key if k.lower() not in lowered]
        if missing:
            raise DataError(f"rows for table {rel.name!r} lack key column(s) {missing}")
        if kind == UPSERT:
            for c in rel.columns:
                if not c.nullable and c.name.lower() not in lowered:
                    raise DataError(f"table {rel.name!r}: NOT NULL column {c.name!r} is missing")

    def _arrow_batch(self, rel: Relation, rows: Any, kind: str) -> pa.Table:
        import pandas as pd

        if isinstance(rows, pd.DataFrame):
            given = [str(c) for c in rows.columns]
            self._check_columns(rel, given, kind)
            lookup = {g.lower(): g for g in given}

            def values(name: str) -> Any:
                return rows[lookup[name.lower()]] if name.lower() in lookup else None
            n = len(rows)
        else:
            if isinstance(rows, Mapping):
                rows = [rows]
            if not isinstance(rows, Sequence) or isinstance(rows, str | bytes):
                raise DataError(f"rows for table {rel.name!r} must be a list of dicts, a pandas "
                                f"DataFrame or a Spark DataFrame, got {type(rows).__name__}")
            given_set: dict[str, str] = {}
            for i, row in enumerate(rows):
                if not isinstance(row, Mapping):
                    raise DataError(f"table {rel.name!r}, row {i}: expected a dict, "
                                    f"got {type(row).__name__}")
                for k in row:
                    given_set.setdefault(str(k).lower(), str(k))
            self._check_columns(rel, list(given_set.values()), kind)
            n = len(rows)

            def values(name: str) -> Any:
                actual = given_set.get(name.lower())
                return None if actual is None else [r.get(actual) for r in rows]

        columns = rel.columns if kind == UPSERT else [
            c for c in rel.columns if c.name in rel.key]
        arrays = []
        for c in columns:
            t = arrow_type(c.type)
            vals = values(c.name)
            if vals is None:
                arrays.append(pa.nulls(n, type=t))
                continue
            try:
                arrays.append(pa.array(vals, type=t, from_pandas=True))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                raise self._type_error(rel, c.name, c.type, list(vals), t) from None
            if not c.nullable and arrays[-1].null_count:
                idx = pc.index(pc.is_null(arrays[-1]), True).as_py()
                what = "key" if c.name in rel.key else "NOT NULL"
                raise DataError(f"table {rel.name!r}, row {idx}: {what} column {c.name!r} is null")
        table = pa.table(arrays, names=[c.name for c in columns])
        if kind == DELETE:
            for c in rel.columns:
                if c.name not in rel.key:
                    table = table.append_column(c.name, pa.nulls(n, type=arrow_type(c.type)))
            table = table.select([c.name for c in rel.columns])
        return table

    @staticmethod
    def _type_error(rel: Relation, col: str, type_name: str, vals: list[Any],
                    t: pa.DataType) -> DataError:
        for i, v in enumerate(vals):
            try:
                pa.array([v], type=t, from_pandas=True)
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                return DataError(f"table {rel.name!r}, row {i}, column {col!r}: value {v!r} "
                                 f"is not a valid {type_name.upper()}")
        return DataError(f"table {rel.name!r}, column {col!r}: values are not valid "
                         f"{type_name.upper()}")

    def _spark_columns(self, rel: Relation, df: DataFrame, kind: str,
                       ) -> tuple[list[Column], Column | None, list[str]]:
        """The columns that make ``df``'s rows staged rows of ``rel`` (``_stage_struct``
        less its sequence number), the column naming each row's first failed check
        (None when its values need no check), and ``df``'s columns given."""
        given = [c for c in df.columns if c not in (KIND, IDX)]
        self._check_columns(rel, given, kind)
        lookup = {g.lower(): g for g in given}
        exprs = []
        checks = []
        for c in rel.columns:
            target = spark_type(c.type)
            if c.name.lower() not in lookup or (kind == DELETE and c.name not in rel.key):
                exprs.append(F.lit(None).cast(target).alias(c.name))
                continue
            src = df.schema[lookup[c.name.lower()]]
            col = F.col(f"`{src.name}`")
            if src.dataType == target:
                converted = col
            else:
                converted = F.try_cast(col, target) if hasattr(F, "try_cast") else \
                    F.expr(f"try_cast(`{src.name}` AS {c.type})")
                checks.append((f"value is not a valid {c.type.upper()}", c.name,
                               col.isNotNull() & converted.isNull()))
            if not c.nullable:
                what = "key column" if c.name in rel.key else "NOT NULL column"
                null = converted.isNull()
                if c.name not in rel.key and KIND in df.columns:
                    null = null & (F.col(KIND) == F.lit(UPSERT))  # a delete holds its key
                checks.append((f"{what} is null", c.name, null))
            exprs.append(converted.alias(c.name))
        kind_col = F.col(KIND) if KIND in df.columns else F.lit(kind)
        idx_col = F.col(IDX) if IDX in df.columns else F.monotonically_increasing_id()
        staged = [*exprs, kind_col.alias(KIND), idx_col.cast("long").alias(IDX)]
        if not checks:
            return staged, None, given
        flags = [F.when(cond, F.lit(f"{name}: {msg}")) for msg, name, cond in checks]
        return staged, F.coalesce(*flags).alias(PROBLEM), given

    @staticmethod
    def _bad_row(rel: Relation, df: DataFrame, problem: Column, given: Sequence[str],
                 ) -> DataError:
        """The error naming a row of ``df`` that fails its check ``problem`` (a job)."""
        probe = df.select(problem, *[F.col(f"`{g}`").cast("string").alias(g) for g in given])
        bad = probe.where(F.col(PROBLEM).isNotNull()).limit(1).collect()
        row = bad[0].asDict() if bad else {}
        return DataError(f"table {rel.name!r}, column {row.pop(PROBLEM, '?')} (row {row})")

    def _spark_batch(self, rel: Relation, df: DataFrame, kind: str,
                     ) -> tuple[DataFrame, Callable[[], None] | None]:
        """``df`` as staged rows of ``rel``, and, when its values need checking, a call
        that raises ``DataError`` naming a bad row once the rows were written."""
        staged, problem, given = self._spark_columns(rel, df, kind)
        if problem is None:
            return df.select(*staged), None
        # the rows are checked while they are written (counted by an observation of
        # the write's own job); only a batch with a bad row runs a second job, to
        # name one
        counted = Observation(f"sf_dml_{uuid.uuid4().hex}")
        out = (df.select(*staged, problem)
               .observe(counted, F.count(F.col(PROBLEM)).alias("bad")).drop(PROBLEM))

        def reject_bad_rows() -> None:
            if (counted.get or {}).get("bad"):
                raise self._bad_row(rel, df, problem, given)

        return out, reject_bad_rows

    def _small_spark_batch(self, rel: Relation, df: DataFrame, kind: str) -> pa.Table | None:
        """``df``'s rows as staged rows of ``rel`` (``_stage_struct`` less its sequence
        number) on the driver, when it holds at most ``DRIVER_STAGE_ROWS``; None when
        it holds more (one job either way, which stops once it has read one row more).
        Raises ``DataError`` naming a bad row."""
        staged, problem, given = self._spark_columns(rel, df, kind)
        rows = df.select(*staged, *([] if problem is None else [problem])) \
            .limit(DRIVER_STAGE_ROWS + 1).toArrow()
        if rows.num_rows > DRIVER_STAGE_ROWS:
            return None
        if problem is not None:
            if rows[PROBLEM].null_count < rows.num_rows:
                raise self._bad_row(rel, df, problem, given)
            rows = rows.drop_columns([PROBLEM])
        fields = [pa.field(c.name, arrow_type(c.type)) for c in rel.columns]
        return rows.select([*(c.name for c in rel.columns), IDX, KIND]).cast(
            pa.schema([*fields, pa.field(IDX, pa.int64()), pa.field(KIND, pa.string())]))

    # --- staging --------------------------------------------------------------------------

    def stage(self, rel: Relation, rows: Any, kind: str,
              updated_from: tuple[int, bool] | None = None, small: bool = False) -> int:
        """Validate and durably stage rows; returns the number of rows staged.
        ``updated_from``: ``rows`` is an UPDATE's that sets no key column, from the
        table's rows at that epoch, of every row then or not (``updated_at``).
        ``small``: ``rows``, a Spark DataFrame the engine built (a statement's), likely
        holds at most ``DRIVER_STAGE_ROWS``: it is brought to the driver and staged
        from there, as a list of rows is (one small job, no file-commit protocol),
        unless it holds more."""
        if isinstance(rows, list | tuple) and not rows:
            return 0
        seq = self.meta.next_dml_seq()
        name = f"{seq:012d}-{uuid.uuid4().hex[:8]}"
        if updated_from is not None:  # ``updated_at``
            name += f".e{updated_from[0]:010d}.{'whole' if updated_from[1] else 'update'}"
        wh = self.warehouse
        given: int | None = None  # a placed batch's rows given (its keys' repeats too)
        if isinstance(rows, DataFrame):
            load_epoch = self._first_load_epoch(rel, rows, kind)
            table = (self._small_spark_batch(rel, rows, kind)
                     if small and load_epoch is None else None)
            if table is not None:
                return self._stage_on_driver(rel, table, seq, name)
            batch, reject_bad_rows = self._spark_batch(rel, rows, kind)
            batch = batch.withColumn(SEQ, F.lit(seq).cast("long"))
            if load_epoch is not None:  # (an UPSERT's: never an UPDATE's)
                path = f"{self.dir}/{name}.e{load_epoch:010d}.placed"
                written, given = self._write_placed(rel, batch, path, load_epoch)
            else:
                path = f"{self.dir}/{name}"
                written = write_parquet(
                    batch.selectExpr(*names_sql(_stage_struct(rel).fieldNames())), wh, path,
                    [])
            if reject_bad_rows is not None:
                try:
                    reject_bad_rows()
                except DataError:
                    wh.rmtree(path)  # never registered: the warehouse is as it was
                    raise
            count = sum(f.rows for f in written)
        else:
            table = self._arrow_batch(rel, rows, kind)
            count = table.num_rows
            table = table.append_column(IDX, pa.array(range(count), pa.int64()))
            table = table.append_column(KIND, pa.array([kind] * count, pa.string()))
            return self._stage_on_driver(rel, table, seq, name)
        if count == 0:
            wh.rmtree(path)
            return 0
        self.meta.stage_dml(StagedBatch(seq, rel.id, path, count))
        return count if given is None else given

    def _stage_on_driver(self, rel: Relation, table: pa.Table, seq: int, name: str) -> int:
        """Stage ``table`` (staged rows less their sequence number) as one Parquet file
        written by the driver, its footer noting the batch's keys; returns its rows."""
        count = table.num_rows
        if count == 0:
            return 0
        table = table.add_column(len(rel.columns), SEQ, pa.array([seq] * count, pa.int64()))
        table = table.replace_schema_metadata(_first_keys_metadata(rel, table))
        wh = self.warehouse
        # a batch of an UPDATE keeps the name's suffix (``updated_at``)
        path = f"{self.dir}/{name}" + ("" if UPDATED.search(name) else ".parquet")
        if wh.is_local:
            # never a partial file under the final name: write, fsync, rename (a
            # local warehouse's URIs are absolute paths)
            tmp = f"{self.dir}/.{name}.tmp"
            wh.write_parquet(table, tmp, fsync=True)
            os.replace(tmp, path)
        else:  # an object store's PUT is atomic and durable once it returns
            wh.write_parquet(table, path, fsync=True)
        self.meta.stage_dml(StagedBatch(seq, rel.id, path, count))
        return count

    def _first_load_epoch(self, rel: Relation, df: DataFrame, kind: str) -> int | None:
        """The epoch a Spark DataFrame of upserts into ``rel`` is staged placed for (the
        next one), when it is a first load: the table holds no rows at the committed
        epoch and has no batch staged; None otherwise. Only into a local warehouse
        (its files are linked into the table) and a table without a processing-time
        column (its value is the applying epoch's)."""
        store = self.store
        if (store is None or kind != UPSERT or KIND in df.columns or rel.proctime is not None
                or not self.warehouse.is_local or not hasattr(df, "repartitionById")):
            return None
        committed = self.meta.committed_epoch
        if any(b.rel_id == rel.id for b in self.meta.staged()) or \
                store.files_at(rel.stored, committed):
            return None
        return committed + 1

    def _write_placed(self, rel: Relation, batch: DataFrame, path: str,
                      epoch: int) -> tuple[list[WrittenFile], int]:
        """Write the staged upserts ``batch`` under ``path`` as ``rel``'s log files of
        ``epoch``: the last row of each key (highest ``_sf_idx``: call order), placed by
        vnode and sorted by key within it (one shuffle and the sort that picks the
        last row), in at most ``PLACED_FILES`` files of consecutive vnodes, in the
        store's row groups; and beside them what an append observes of a Δ (rows per
        ``_op``, vnodes). Returns the files written and how many rows were given
        (repeated keys included)."""
        assert self.store is not None
        key = [quoted(k) for k in rel.key]
        files = max(1, min(PLACED_FILES,
                           int(self.spark.conf.get("spark.sql.shuffle.partitions") or 1)))
        counted = Observation(f"sf_load_{uuid.uuid4().hex}")
        # one shuffle partition per file, of consecutive vnodes: a partition per vnode
        # coalesced into files would set up the window below once per vnode
        rows = (batch.observe(counted, F.count(F.lit(1)).alias("n"))
                .withColumn(VNODE, F.expr(vnode_sql(key)))
                .withColumn(_FILE, F.expr(f"CAST({VNODE} * {files} DIV {VNODE_COUNT} AS INT)"))
                .repartitionById(files, F.col(_FILE)))
        # partitioned by the file first: the shuffle above satisfies it (no exchange);
        # the vnode next, so that a file's rows are sorted by vnode, then by key
        order = Window.partitionBy(F.col(_FILE), F.col(VNODE), *[F.col(k) for k in key]) \
            .orderBy(F.col(IDX).desc())
        latest = (rows.withColumn("_sf_rn", F.row_number().over(order))
                  .where(F.col("_sf_rn") == 1)
                  .withColumn(EPOCH, F.lit(epoch).cast("long")).withColumn(OP, F.lit("+")))
        out = latest.selectExpr(*[cast_sql(f) for f in physical_struct(rel.columns).fields])
        written = write_parquet(out, self.warehouse, path, [VNODE, EPOCH, rel.key[0]],
                                row_group_rows=self.store.row_group_rows)
        if written:  # upserts only: what an append observes, from the files' footers
            self.warehouse.write_text(f"{path}/{PREPARED_OBSERVED}",
                                      json.dumps(inserts_observed(written)))
        # the call's count: the rows given, repeated keys included
        return written, int((counted.get or {}).get("n") or 0)

    def remove_orphans(self) -> None:
        """Delete staged files no unapplied batch refers to."""
        live = {b.path for b in self.meta.staged()}
        for uri in self.warehouse.list(self.dir):
            if uri not in live:
                self.warehouse.rmtree(uri)

    def remove_applied(self, paths: Sequence[str]) -> None:
        for uri in paths:
            self.warehouse.rmtree(uri)


def _batch_files(warehouse: Warehouse, b: StagedBatch) -> list[str]:
    """The ``part-*.parquet`` files of a batch staged by Spark (a directory)."""
    parts = warehouse.part_files(b.path)
    if not parts:
        raise FileNotFoundError(f"staged DML batch {b.seq} ({b.rows} rows): no Parquet "
                                f"file at {b.path}")
    return parts


def _staged_files(warehouse: Warehouse, batches: Sequence[StagedBatch],
                  ) -> tuple[list[str], bool]:
    """The Parquet files of ``batches``, and whether each batch is one file (staged by
    the driver; a batch staged by Spark is a directory of ``part-*.parquet`` files)."""
    files: list[str] = []
    single = True
    for b in batches:
        if warehouse.is_file(b.path):
            files.append(b.path)
            continue
        single = False
        files += _batch_files(warehouse, b)
    return files, single


def _read_staged(spark: SparkSession, warehouse: Warehouse, rel: Relation,
                 batches: Sequence[StagedBatch]) -> tuple[DataFrame, list[str], bool]:
    """The staged rows of ``batches`` (in ``_stage_struct``), their files other than
    placed batches', and whether those are each one file. A placed batch's rows (its
    keys' last rows, as log files) are read as upserts of its sequence number."""
    placed = [b for b in batches if placed_epoch(b.path) is not None]
    others = [b for b in batches if placed_epoch(b.path) is None]
    files, single = _staged_files(warehouse, others)
    struct = _stage_struct(rel)
    parts = [read_parquet(spark, warehouse, struct, files, sum(b.rows for b in others))] \
        if others else []
    for b in placed:
        parts.append(read_parquet(spark, warehouse, physical_struct(rel.columns),
                                  _batch_files(warehouse, b), b.rows).selectExpr(
            *names_sql([c.name for c in rel.columns]), f"CAST({b.seq} AS BIGINT) AS {SEQ}",
            f"CAST(0 AS BIGINT) AS {IDX}", f"'{UPSERT}' AS {KIND}"))
    staged = parts[0]
    for other in parts[1:]:
        staged = staged.unionAll(other)
    return staged, files, single and not placed


class TableDelta(NamedTuple):
    """A table's changelog for an epoch, whether it is already in the partitions its
    append writes (``RelationStore.place_by_vnode_range``), and the placed batch
    directories whose files are that changelog, written (the append links them in)."""

    #: None: the changelog is ``rows`` (computed on the driver, no plan)
    delta: DataFrame | None
    placed: bool = False
    prepared: tuple[str, ...] = ()
    #: the table's rows at the epoch (columns + ``_vnode``), built when asked for: a
    #: rewrite of the table in place of the append reads them, not ``delta`` (which
    #: then is computed only if an MV reads it)
    rows_at: Callable[[], DataFrame] | None = None
    #: the changelog as rows on the driver (the table's columns, ``_vnode``, ``_op``),
    #: where it was computed there (``_new_keys_on_driver``)
    rows: pa.Table | None = None


def table_delta(spark: SparkSession, store: RelationStore, rel: Relation,
                batches: Sequence[StagedBatch], prev_epoch: int,
                proctime_us: int | None = None) -> TableDelta:
    """The consolidated changelog of ``rel`` for the staged ``batches``. Every row
    they write holds ``proctime_us`` (the epoch's processing time, microseconds
    since the Unix epoch) in the table's processing-time column, if it has one.

    Into an empty table (a first load) the staged rows are shuffled once: placed in
    the vnode ranges their append writes, where the last change of each key is
    found too (all rows of a key share its vnode), not by key and then by range."""
    key = list(rel.key)
    cols = [c.name for c in rel.columns]
    rows = sum(b.rows for b in batches)
    before = store.files_at(rel.stored, prev_epoch)
    if (len(batches) == 1 and placed_epoch(batches[0].path) == prev_epoch + 1 and not before
            and rel.proctime is None):
        # a first load staged placed for this epoch: its files are the changelog
        b = batches[0]
        delta = read_parquet(spark, store.warehouse, physical_struct(rel.columns),
                             _batch_files(store.warehouse, b), b.rows).selectExpr(
            *names_sql([*cols, VNODE, OP]))
        return TableDelta(delta, prepared=(b.path,))
    if before and (rows_here := _change_on_driver(store, rel, batches, before,
                                                  prev_epoch)) is not None:
        return TableDelta(None, rows=rows_here)
    staged, files, single = _read_staged(spark, store.warehouse, rel, batches)
    placed = None if before else store.place_by_vnode_range(
        staged.withColumn(VNODE, F.expr(vnode_sql([quoted(k) for k in key]))), rows)
    by_key = names_sql(key)
    if placed is not None:
        staged = placed[0]
        by_key = [placed[1], *by_key]
    updated = [updated_at(b.path) for b in batches]
    upsert = f"{KIND} = {UPSERT!r}"
    if len(batches) == 1 and updated[0] is not None:
        # an UPDATE's rows alone: each key once
        new = staged.where(upsert).selectExpr(*names_sql(cols))
    else:
        # each key's last staged row (call order: sequence, then position in its call)
        rank = (f"row_number() OVER (PARTITION BY {', '.join(by_key)} "
                f"ORDER BY {SEQ} DESC, {IDX} DESC) AS _sf_rn")
        new = staged.selectExpr("*", rank).where(f"_sf_rn = 1 AND {upsert}").selectExpr(
            *names_sql(cols))
    # an UPDATE of every row at ``prev_epoch`` touched every key: none is left as it was
    every_key = (prev_epoch, True) in updated
    if rel.proctime is not None:
        if proctime_us is None:
            raise ValueError(f"table {rel.name!r} has a processing-time column: the epoch's "
                             "processing time is needed")
        # one literal for every row the epoch writes (staged with NULL there)
        now = F.timestamp_micros(F.lit(int(proctime_us)))
        new = new.select(*[now.alias(c) if c == rel.proctime else F.col(quoted(c))
                           for c in cols])
    # an empty table (a first load): every row is an insert; no old rows to look up,
    # no images to pair
    old = (_old_rows(store, rel, batches, files, single, staged.selectExpr(*names_sql(key)),
                     prev_epoch, before) if before else None)

    def rows_at() -> DataFrame:
        """The rows at the epoch: the untouched rows at ``prev_epoch`` (none after an
        UPDATE of every row) and each touched key's latest upsert."""
        upserted = new.withColumn(VNODE, F.expr(vnode_sql([quoted(k) for k in key])))
        if every_key:
            return upserted
        kept = store.snapshot(rel.stored, prev_epoch, files=before, bulk=True).join(
            staged.selectExpr(*names_sql(key)), key, "left_anti")
        return kept.selectExpr(*names_sql([*cols, VNODE])).unionByName(upserted)
    return TableDelta(consolidate(old, new, cols, key), placed is not None,
                      rows_at=rows_at if before else None)


def _change_on_driver(store: RelationStore, rel: Relation, batches: Sequence[StagedBatch],
                      before: Sequence[DataFile], prev_epoch: int) -> pa.Table | None:
    """The changelog of ``batches`` computed on the driver, without Spark, when every
    batch was staged by the driver (one file noting its keys) into a table without a
    processing-time column, of a one-column key whose vnodes the driver hashes and
    whose values it compares as Spark does, and when the old rows of the batches'
    keys lie in files (``before``: the table's at ``prev_epoch``) of at most
    ``DRIVER_CHANGE_ROWS`` rows in all (by their vnode and key ranges; none for new
    keys). Each key's last staged row is paired with its old row, as ``consolidate``
    pairs them: a ``+`` for a new key, a ``-`` for a deleted one, ``U-``/``U+`` for
    one whose row changed, nothing for a row written as it was or a delete of a key
    the table did not hold. None where any of that does not hold: the changelog is
    then computed by Spark. (A steady stream of small DML: its epoch's table change
    costs no Spark job and no plan.)"""
    if rel.proctime is not None or len(rel.key) != 1 or any(
            placed_epoch(b.path) is not None for b in batches):
        return None
    wh = store.warehouse
    files = [b.path for b in batches]
    if not all(f.endswith(".parquet") and wh.is_file(f) for f in files):
        return None  # a batch staged by Spark: a directory of files
    keys = _staged_first_keys(wh, files)
    key = rel.key[0]
    key_type = next(c.type for c in rel.columns if c.name == key)
    each = None if keys is None else vnode_each(keys, key_type)
    if keys is None or each is None:
        return None
    vnode_of = dict(zip(keys, each, strict=True))
    cols = [c.name for c in rel.columns]
    old = store.rows_of_keys_on_driver(rel.stored, prev_epoch, before,
                                       list(zip(each, keys, strict=True)), DRIVER_CHANGE_ROWS)
    if old is None:
        return None
    staged = pa.concat_tables([wh.read_parquet(f).select([*cols, SEQ, IDX, KIND])
                               for f in files], promote_options="permissive")
    if staged[key].null_count:
        return None
    # each key's last change (call order: sequence, then position in its call)
    latest = last_rows_per_key(staged, [key], [SEQ, IDX])
    new = latest.filter(pc.equal(latest[KIND], UPSERT)).select(cols).cast(old.schema)
    return _paired_changelog(old, new, key, vnode_of)


def _paired_changelog(old: pa.Table, new: pa.Table, key: str,
                      vnode_of: dict[Any, int]) -> pa.Table:
    """The changelog turning the rows ``old`` into ``new`` (each a key at most once,
    in one schema), as ``consolidate`` makes it: the columns, ``_vnode`` (the key's,
    from ``vnode_of``) and ``_op``. Rows are equal as Spark's ``<=>`` finds them:
    NULLs equal, and NaN equal to NaN."""
    o = old.append_column("_sf_o", pa.array(range(old.num_rows), pa.int64()))
    n = new.append_column("_sf_n", pa.array(range(new.num_rows), pa.int64()))
    both = o.select([key, "_sf_o"]).join(n.select([key, "_sf_n"]), key, join_type="inner")
    o_idx, n_idx = both["_sf_o"].combine_chunks(), both["_sf_n"].combine_chunks()
    same = pa.repeat(pa.scalar(True), len(both))
    for c in new.column_names:
        a, b = old[c].take(o_idx), new[c].take(n_idx)
        equal = pc.fill_null(pc.equal(a, b), False)
        if pa.types.is_floating(a.type):
            equal = pc.or_(equal, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
        equal = pc.or_(equal, pc.and_(pc.is_null(a), pc.is_null(b)))
        same = pc.and_(same, equal)
    changed = pc.invert(same)
    gone = pc.invert(pc.is_in(o["_sf_o"], o_idx))
    fresh = pc.invert(pc.is_in(n["_sf_n"], n_idx))
    parts = [(old.filter(gone), "-"), (old.take(pc.filter(o_idx, changed)), "U-"),
             (new.take(pc.filter(n_idx, changed)), "U+"), (new.filter(fresh), "+")]
    return pa.concat_tables([
        rows.append_column(pa.field(VNODE, pa.int32()),
                           pa.array([vnode_of[k] for k in rows[key].to_pylist()], pa.int32()))
        .append_column(pa.field(OP, pa.string()), pa.repeat(pa.scalar(op), rows.num_rows))
        for rows, op in parts])


def _old_rows(store: RelationStore, rel: Relation, batches: Sequence[StagedBatch],
              files: Sequence[str], single: bool, touched: DataFrame, prev_epoch: int,
              before: Sequence[DataFile]) -> DataFrame:
    """The rows of ``rel`` at ``prev_epoch`` (``before``: its files then) whose keys
    the staged ``batches`` (their ``files``; ``touched``: their rows' keys, a key
    repeated where it changed more than once) touch. Only the files of the keys'
    vnodes are read, and of those only the files whose key range holds one (new keys
    above the table's range read nothing): for a batch of at most ``KEY_VALUES`` keys
    by the keys themselves, known from the files' footers when the driver staged
    them, else found by a job; for more, by their range in each vnode (a job whose
    result is at most a row per vnode). Many keys, up to ``SEMI_FRACTION`` of the
    table's rows, meet the table's rows by a broadcast semi-join as they are read,
    before base and log rows merge; more meet the merged snapshot."""
    key, cols = list(rel.key), [c.name for c in rel.columns]
    vnodes: Sequence[int] | None
    first_keys: list[Any] | None
    key_vnodes: list[tuple[int, Any]] | None = None
    ranges: dict[int, tuple[Any, Any]] | None = None
    rows = sum(b.rows for b in batches)
    known = _staged_first_keys(store.warehouse, files) if single else None
    if known is not None:
        # staged from the driver, which noted the keys in the files: no job to find
        # them, and their vnodes hashed here as Spark would
        key_type = next(c.type for c in rel.columns if c.name == key[0])
        vnodes, first_keys = vnodes_of(known, key_type), known
    elif rows <= KEY_VALUES:
        found = touched.select(vnode_expr(key).alias(VNODE), F.col(key[0])).collect()
        key_vnodes = [(int(r[0]), r[1]) for r in found if r[1] is not None]
        vnodes = sorted({int(r[0]) for r in found})
        first_keys = sorted({k for _, k in key_vnodes})
        store.spark_jobs += 1  # the touched keys' collect
    else:
        ranges = key_ranges(touched, key)
        store.spark_jobs += 1  # the key ranges' collect
        vnodes, first_keys = sorted(ranges), None
        if rows <= SEMI_FRACTION * rel.row_count:
            return store.snapshot(rel.stored, prev_epoch, vnodes=vnodes, vnode_rows=False,
                                  files=before, key_ranges=ranges,
                                  semi=touched).selectExpr(*names_sql(cols))
        # keys of a large share of the table (a bulk UPDATE): a merge below the
        # semi-join would shuffle about the whole table; the snapshot merges by a
        # broadcast of its log's keys, and the batch's keys keep its rows after (below)
    if first_keys is not None and len(key) == 1 and len(first_keys) <= KEY_VALUES \
            and values_in_sql(key[0], first_keys) is not None:
        # the keys are known on the driver: a filter of the lookup, no broadcast job
        return store.lookup(rel.stored, prev_epoch, first_keys, vnodes=vnodes,
                            first_keys=first_keys, files=before).selectExpr(*names_sql(cols))
    store.spark_jobs += 1  # the broadcast of the keys
    # a key of several columns: its first column's values, when known, filter the read
    # (and let base files with keyed copies be read through them) before the join
    where = (values_in_sql(key[0], first_keys) if first_keys is not None
             and len(first_keys) <= KEY_VALUES else None)
    return store.snapshot(rel.stored, prev_epoch, vnodes=vnodes, first_keys=first_keys,
                          vnode_rows=False, files=before, where=where,
                          keys=first_keys if where is not None else None,
                          key_vnodes=key_vnodes, key_ranges=ranges).join(
        F.broadcast(touched), key, "left_semi").selectExpr(*names_sql(cols))


def key_ranges(keys: DataFrame, key: Sequence[str]) -> dict[int, tuple[Any, Any]]:
    """Per vnode of the ``keys`` (rows of key columns), the least and greatest value of
    the first key column (None where it is NULL in every row of the vnode; a small
    collect: at most a row per vnode)."""
    first = F.col(quoted(key[0]))
    found = (keys.groupBy(vnode_expr(list(key)).alias(VNODE))
             .agg(F.min(first), F.max(first)).collect())
    return {int(r[0]): (r[1], r[2]) for r in found}


#: the footer entry of a staged file that lists its batch's first-key values
FIRST_KEYS = b"sparkfill.first_keys"


def _first_keys_metadata(rel: Relation, table: pa.Table) -> dict[bytes, bytes]:
    """The sorted distinct values of a one-column key of integers or strings, for the
    staged file's footer, when there are at most ``KEY_VALUES`` (none otherwise)."""
    if len(rel.key) != 1:
        return {}
    column = table[rel.key[0]]
    if not (pa.types.is_integer(column.type) or pa.types.is_string(column.type)):
        return {}
    values = pc.unique(column).drop_null()
    if len(values) > KEY_VALUES:
        return {}
    return {FIRST_KEYS: json.dumps(sorted(values.to_pylist())).encode()}


def _staged_first_keys(warehouse: Warehouse, files: Sequence[str]) -> list[Any] | None:
    """The first-key values of the driver-staged ``files`` from their footers (sorted);
    None when a file did not note them (too many keys)."""
    found: set[Any] = set()
    for uri in files:
        metadata = warehouse.parquet_schema(uri).metadata or {}
        if FIRST_KEYS not in metadata:
            return None
        found.update(json.loads(metadata[FIRST_KEYS]))
    if len(found) > KEY_VALUES:
        return None
    return sorted(found)
