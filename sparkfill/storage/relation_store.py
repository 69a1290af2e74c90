"""The relation store: every relation is a Delta table of log and base files.

Invariants:
- *log* files (``log/e<epoch>-*``) hold one epoch's consolidated changelog, or
  (``log/m<epoch>-*``) the rows of such files merged, every row kept with its epoch;
  *base* files (``base/c<epoch>-*``) hold the live rows as of compaction epoch
  ``c``. A file holds a contiguous range of vnodes and carries min/max statistics
  on ``_vnode``, ``_epoch`` and the first key column, so range reads prune files.
  A file written by Spark holds ``file_row_groups`` ranges of ``target_file_rows``
  rows in row groups of a fifth of a range, each within about one range, so a read
  restricted to vnodes (filtered on ``_vnode``) skips the others' row groups; a
  file written by the driver is one row group, sorted by ``(_vnode, pk)``.
- ``snapshot(e)`` = base@c merged with log rows in ``(c, e]``: the latest change
  per key wins, deletes drop the key. It reads the Delta version the meta store
  recorded for ``e``, never anything above the committed epoch.
- ``append(e, Δ)`` is idempotent: the commit records ``e`` as a Delta application
  transaction, and a retried append of ``e`` is skipped. An append is one Spark
  job: the rows per ``_op`` and the vnodes it touched are observed while it is
  written (a small Δ is brought to the driver as Arrow and written there, a large
  one by the executors; a large one of insertions only, written as read, takes its
  rows and the vnodes its files span from their footers instead), and the epoch
  reads its Δ back from the written files (a
  plan of one leaf, nothing cached). An empty Δ commits nothing. A Δ already
  written as the epoch's log files elsewhere (a placed first load, ``dml``) is
  linked in, with what its write observed, instead of written again.
- Compaction swaps all files for new base files (a fold), or the log files for
  one log file of the same rows (a merge), in one Delta commit. An epoch of a
  relation whose changelog no later epoch reads may do the same in place of an
  append (``rewrite``): its rows at that epoch as its new base, its Δ not kept (the
  readers of that epoch read it from the Δ's plan). A retry of the epoch that
  appends instead finds that base (``Appended.rewritten``).
- A base of at least ``keyed_copy_min_rows`` rows, of a relation whose key's first
  column is of an integer or string type, gets *keyed copies* once a lookup of a few keys has read
  it (``write_keyed_copies``, after the epoch commits): beside each base file, its
  rows sorted by key in row groups of ``keyed_group_rows`` (``keyed-<name>``), and,
  once all are written, the folder's copies recorded in the meta store. A lookup
  then reads the base through them, only the row groups whose key range holds a key
  of the file's vnodes (every other read, and every scan, reads the base files). A
  copy is derived data: one that cannot be read makes the lookup read the base
  files, and vacuum removes it with its file.
- Every file written is registered as pending before Spark writes it, so a crash
  leaves nothing that recovery cannot find and remove.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Field as DeltaField
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from ..dataflow.statement import sql_over
from ..errors import DamagedFile
from . import object_files
from .keyrange import Position, gt, values_in_sql, vnode_in_sql
from .lru import LruCache
from .meta_store import MetaStore
from .object_files import arrow_file_stats
from .schema import (
    EPOCH,
    HASHED_KEY_WIDTHS,
    OP,
    VNODE,
    VNODE_COUNT,
    Column,
    arrow_type,
    names_sql,
    normalize_type_name,
    physical_arrow_schema,
    physical_struct,
    quoted,
    vnode_each,
)
from .spark_files import (
    WrittenFile,
    empty_frame,
    one_task_if_few,
    parquet_stats,
    read_parquet,
    row_group_ranges,
    spark_native,
    write_parquet,
)
from .warehouse import Warehouse

__all__ = ["RelationStore", "StoredRelation", "DataFile", "Appended", "APP_ID", "LIVE_OPS",
           "BEFORE_OPS", "OPS", "IS_LIVE", "IS_BEFORE", "KEY_VALUES", "LOCAL_WRITE_ROWS",
           "retracts", "compaction_epoch", "delta_metrics", "Observed", "PREPARED_OBSERVED",
           "cast_sql"]

APP_ID = "sparkfill"
_log = logging.getLogger(__name__)
#: a Δ with at most this many distinct first-key values brings them to the driver
#: (observed in its write), so the lookups they drive are filters, not broadcast jobs
KEY_VALUES = 10_000
#: a Δ expected to hold at most this many rows is brought to the driver as Arrow and
#: written there (still one Spark job, without Spark's file-commit protocol, which
#: costs more than the rows of a small Δ); a larger one is written by the executors
LOCAL_WRITE_ROWS = 20_000
#: what the write of prepared files observed (``delta_metrics``' values), beside them
PREPARED_OBSERVED = "_sf_observed.json"
#: row groups per file of a Spark write to a local warehouse (``RelationStore.file_row_groups``)
FILE_ROW_GROUPS = 10
#: rows per row group of a keyed copy: a lookup of C random keys reads about C times
#: this many rows (500: 3% of 16M rows for 1,000 keys), whatever the relation's size
KEYED_GROUP_ROWS = 500
#: the footers of keyed copies the driver keeps parsed, in column chunks (a row group
#: of a column; about 860 bytes each in memory, measured: a 16M-row relation's copies
#: in 500-row groups of 8 columns hold 256,000): the driver reads a copy's row groups
#: without parsing its footer again, 0.1-0.2 s an epoch at 16M rows ("Stop 82")
KEYED_FOOTER_CHUNKS = 320_000
#: a base of at least this many rows gets keyed copies when a lookup reads it (below
#: it, Spark's scan of the base costs less than the copies' job)
KEYED_COPY_MIN_ROWS = 500_000
#: the prefix of a keyed copy's name (beside its base file)
KEYED_PREFIX = "keyed-"
#: the meta store's record that a base folder's files have keyed copies (+ its URI)
KEYED_RECORD = "keyed_copies:"
#: a log of at most this many rows that has too many files is merged into one log
#: file on the driver (every row kept); a larger log is folded into base
MERGE_LOG_ROWS = 100_000
LIVE_OPS = ("+", "U+")
BEFORE_OPS = ("-", "U-")
OPS = ("+", "-", "U-", "U+")
#: the same as SQL conditions (one Py4J round trip, where a Column built in Python
#: is several per value)
IS_LIVE = f"{OP} IN {LIVE_OPS!r}"
IS_BEFORE = f"{OP} IN {BEFORE_OPS!r}"


def keyable(rel: StoredRelation) -> bool:
    """Whether ``rel``'s base files can have keyed copies: a key whose first column
    is of an integer or string type (its values pruned by row-group statistics and
    sent to the executors as JSON)."""
    return bool(rel.key) and normalize_type_name(rel.key_columns[0].type) in HASHED_KEY_WIDTHS


def keyed_copy_uri(uri: str) -> str:
    """The URI of the keyed copy of the base file ``uri``: beside it."""
    head, _, name = uri.rpartition("/")
    return f"{head}/{KEYED_PREFIX}{name}"


def retracts(counts: dict[str, int]) -> bool:
    """Whether a changelog with these rows per ``_op`` holds a before-image."""
    return any(op in counts for op in BEFORE_OPS)


@dataclass(frozen=True)
class StoredRelation:
    """What the store needs to know of a relation."""

    id: int
    name: str
    dir: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    #: what messages call it (``Relation.label``; its name when not given) and how a
    #: damaged data file of it is repaired
    label: str = ""
    repair: str = ""

    @property
    def key_columns(self) -> list[Column]:
        by_name = {c.name: c for c in self.columns}
        return [by_name[k] for k in self.key]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


@dataclass(frozen=True)
class VnodeSpan:
    """The vnodes a read keeps: those in ``[lo, hi]`` and, when given, in the sorted
    ``wanted``."""

    lo: int
    hi: int
    wanted: tuple[int, ...] | None

    def overlaps(self, vmin: int, vmax: int) -> bool:
        """Whether a file or row group of vnodes ``[vmin, vmax]`` can hold one."""
        lo, hi = max(self.lo, vmin), min(self.hi, vmax)
        if lo > hi:
            return False
        if self.wanted is None:
            return True
        i = bisect.bisect_left(self.wanted, lo)
        return i < len(self.wanted) and self.wanted[i] <= hi


@dataclass(frozen=True)
class DataFile:
    path: str  # relative to the table directory
    uri: str
    rows: int
    kind: str  # "base" | "log"
    size: int  # bytes
    vnode_min: int
    vnode_max: int
    epoch_min: int
    epoch_max: int
    #: the range of the first key column (None: unknown, e.g. a type without stats)
    key_min: Any = None
    key_max: Any = None

    @property
    def compaction_epoch(self) -> int:
        """A base file's compaction epoch, from its folder (``base/c<epoch>-``), not from
        its statistics (a file without them must not move where log rows start)."""
        assert self.kind == "base", self.path
        return int(self.path.split("/", 2)[1][1:].split("-", 1)[0])

    @property
    def folder_uri(self) -> str:
        """The URI of the folder that holds the file (a compaction's, an append's)."""
        return self.uri.rpartition("/")[0]

    def may_hold(self, first_keys: Sequence[Any]) -> bool:
        """Whether a value of the sorted ``first_keys`` lies in this file's key range."""
        if self.key_min is None or self.key_max is None:
            return True
        try:
            i = bisect.bisect_left(first_keys, self.key_min)
            return i < len(first_keys) and first_keys[i] <= self.key_max
        except TypeError:  # values of another type than the statistics: no pruning
            return True

    def meets(self, key_ranges: Mapping[int, tuple[Any, Any]]) -> bool:
        """Whether a vnode of this file has a range in ``key_ranges`` (per vnode, the
        least and greatest first-key value looked up) that meets the file's key range."""
        for vnode, (lo, hi) in key_ranges.items():
            if not self.vnode_min <= vnode <= self.vnode_max:
                continue
            if self.key_min is None or self.key_max is None or lo is None or hi is None:
                return True
            try:
                if lo <= self.key_max and hi >= self.key_min:
                    return True
            except TypeError:  # values of another type than the statistics
                return True
        return False


class Observed(NamedTuple):
    """What a changelog's write observed of its rows: the rows per ``_op``, the vnodes
    it touched, the distinct values of its first key column (when asked for and at
    most ``KEY_VALUES``) and how many distinct values that column holds (exact when
    the values are known, else Spark's estimate; None: not asked for)."""

    counts: dict[str, int]
    vnodes: tuple[int, ...]
    keys: tuple[Any, ...] | None
    key_count: int | None


@dataclass(frozen=True)
class Appended:
    """One epoch's changelog of a relation as it was written: the Delta version that
    holds it, what its write observed of its rows (``Observed``: rows per ``_op``,
    the vnodes it touched, the first key column's distinct values and their count,
    when asked for), and the changelog read back from its files (columns,
    ``_vnode``, ``_op``), built when first asked for: a Δ nothing reads this epoch
    (an MV's, appended with the epoch's flush) costs no frame."""

    version: int
    observed: Observed
    read_back: Callable[[], DataFrame] = field(repr=False, compare=False)
    #: found on a retry: an earlier attempt of the epoch wrote the relation's rows as
    #: its new base (``rewrite``) in place of its changelog; ``counts`` then holds only
    #: ``+``, the rows written, and there is no changelog to read back
    rewritten: bool = False

    @cached_property
    def delta(self) -> DataFrame:
        return self.read_back()

    @property
    def counts(self) -> dict[str, int]:
        return self.observed.counts

    @property
    def vnodes(self) -> tuple[int, ...]:
        return self.observed.vnodes

    @property
    def keys(self) -> tuple[Any, ...] | None:
        """The distinct values of the first key column (a state table's distribution
        key), at most ``KEY_VALUES``; None: not known on the driver (look them up from
        ``delta``)."""
        return self.observed.keys

    @property
    def key_count(self) -> int | None:
        """About how many distinct values the first key column holds (a state table's
        touched groups, join keys or partitions); None: not observed."""
        return self.observed.key_count

    @property
    def rows(self) -> int:
        return sum(self.counts.values())


class RelationStore:
    def __init__(
        self,
        spark: SparkSession,
        warehouse: Warehouse,
        meta: MetaStore,
        target_file_rows: int = 50_000,
        file_row_groups: int | None = None,
        max_log_files: int = 16,
        log_fraction: float = 1.0,
        min_compact_rows: int = 10_000,
    ) -> None:
        self.spark = spark
        self.warehouse = warehouse
        #: the URI of the folder holding every relation's Delta table
        self.root = warehouse.join("relations")
        self.meta = meta
        #: the rows of a range of vnodes written together: what a read of a few
        #: vnodes reads at least
        self.target_file_rows = target_file_rows
        #: row groups per file of a Spark write (each Spark task writing a file costs
        #: about as much as 25,000 rows: 20 files take 2.4x the time of 2 for the same
        #: 1M rows, bench/RESULTS.md "Stop 43"); the row groups of a file hold about
        #: consecutive vnode ranges, so a vnode-restricted read still skips the rest.
        #: One on object storage, whose reader reads whole files
        self.file_row_groups = (file_row_groups if file_row_groups is not None
                                else FILE_ROW_GROUPS if spark_native(warehouse) else 1)
        self.max_log_files = max_log_files
        self.log_fraction = log_fraction
        self.min_compact_rows = min_compact_rows
        #: a fold into a base of at least this many live rows writes keyed copies
        self.keyed_copy_min_rows = KEYED_COPY_MIN_ROWS
        #: rows per row group of a keyed copy
        self.keyed_group_rows = KEYED_GROUP_ROWS
        #: the base folders known to have keyed copies (recorded in the meta store)
        self._keyed_folders: set[str] = set()
        #: the relations (by folder) whose base a lookup read without keyed copies
        #: since the last ``write_keyed_copies``: the epoch's housekeeping writes them
        self.copies_wanted: set[str] = set()
        #: each keyed copy's row groups as (first keys, last keys, rows), from its
        #: footer (files never change)
        self._keyed_groups: LruCache[str, tuple[list[Any], list[Any], list[int]]] = (
            LruCache(4096))
        #: keyed copies' footers as parsed, weighed in column chunks (files never change)
        self._keyed_footers: LruCache[str, pq.FileMetaData] = LruCache(
            KEYED_FOOTER_CHUNKS, lambda md: md.num_row_groups * md.num_columns)
        self._files_cache: LruCache[tuple[str, int], list[DataFile]] = LruCache(256)
        #: the (rows, first vnode, last vnode) of each row group of the files of more
        #: than one, from their footers (files never change)
        self._row_groups: LruCache[str, tuple[tuple[int, int, int], ...]] = LruCache(4096)
        #: each relation's table as last opened at its latest version, brought up to
        #: date (its new log entries read) when used again: opening a table reads its
        #: checkpoint and log, which an epoch would do ~10-20 times
        self._latest: dict[str, DeltaTable] = {}
        #: object-store files found whole once (``check_files``)
        self._verified: set[str] = set()
        #: rows in the files each read selected since the last reset, per reader
        #: (the relation whose Δ the read served)
        self.rows_read: dict[str, int] = defaultdict(int)
        self.reader = ""
        #: Spark jobs the epoch loop ran (a running count): every write, collect, count
        #: and broadcast of its reads and of the operators and scans above it adds here
        self.spark_jobs = 0
        #: every read merges base and log in its own job (``merging_reads``)
        self.merged_reads = False

    # --- tables ---------------------------------------------------------------------------

    @contextmanager
    def merging_reads(self, on: bool) -> Iterator[None]:
        """With ``on``, every ``snapshot`` inside merges base and log in the read's own
        job (a window over both), never by an anti-join of the base with the log's
        keys: a filter put over the rows then runs above the merge, on live rows
        only. Spark pushes a filter below an anti-join, so one that raises on a base
        row the log replaced or deleted would fail a query whose live rows all pass;
        an epoch whose query raised on its rows runs again so, before the MV is
        counted failed (``EpochCoordinator._isolate``)."""
        previous, self.merged_reads = self.merged_reads, on
        try:
            yield
        finally:
            self.merged_reads = previous

    @contextmanager
    def reading_for(self, reader: str) -> Iterator[None]:
        """Attribute the rows the reads inside select to ``reader``."""
        previous, self.reader = self.reader, reader
        try:
            yield
        finally:
            self.reader = previous

    def path(self, rel: StoredRelation) -> str:
        """The URI of the relation's Delta table."""
        return f"{self.root}/{rel.dir}"

    def _table(self, rel: StoredRelation, version: int | None = None) -> DeltaTable:
        """``rel``'s Delta table at ``version`` (None: its latest, which only the
        epoch loop's thread asks for)."""
        if version is not None:
            return self.warehouse.delta(self.path(rel), version)
        dt = self._latest.get(rel.dir)
        if dt is None:
            dt = self._latest[rel.dir] = self.warehouse.delta(self.path(rel))
        else:
            dt.update_incremental()
        return dt

    def create(self, dir_: str, columns: Sequence[Column]) -> int:
        path = f"{self.root}/{dir_}"
        self._latest.pop(dir_, None)
        self.warehouse.rmtree(path)
        self.warehouse.create_delta(path, physical_arrow_schema(columns))
        return 0

    def add_columns(self, rel: StoredRelation) -> None:
        """Add to ``rel``'s Delta table the columns of ``rel`` it lacks (an MV switched
        to a new definition; a no-op once added). Files written before hold no such
        column: read in ``rel``'s columns, it is NULL there."""
        dt = self._table(rel)
        have = {f.name.lower() for f in dt.schema().fields}
        new = [DeltaField.from_arrow(f) for f in physical_arrow_schema(rel.columns)
               if f.name.lower() not in have]
        if new:
            dt.alter.add_columns(new)
            dt.update_incremental()

    def delete(self, dir_: str) -> None:
        self._latest.pop(dir_, None)
        self.warehouse.rmtree(f"{self.root}/{dir_}")

    def latest_version(self, rel: StoredRelation) -> int:
        return int(self._table(rel).version())

    def files(self, rel: StoredRelation, version: int) -> list[DataFile]:
        cache_key = (rel.dir, version)
        cached = self._files_cache.get(cache_key)
        if cached is not None:
            return cached
        table_path = self.path(rel)
        dt = self._table(rel, version)
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        files = [
            DataFile(
                path=a["path"],
                uri=f"{table_path}/{a['path']}",
                rows=int(a["num_records"] or 0),
                size=int(a["size_bytes"]),
                kind="base" if a["path"].startswith("base/") else "log",
                vnode_min=int(_stat(a, "min", VNODE, 0)),
                vnode_max=int(_stat(a, "max", VNODE, 255)),
                epoch_min=int(_stat(a, "min", EPOCH, 0)),
                epoch_max=int(_stat(a, "max", EPOCH, 2**62)),
                key_min=a.get(f"min.{rel.key[0]}"),
                key_max=a.get(f"max.{rel.key[0]}"),
            )
            for a in actions
        ]
        files.sort(key=lambda f: (f.kind, f.vnode_min, f.path))
        return self._files_cache.put(cache_key, files)

    def files_at(self, rel: StoredRelation, epoch: int) -> list[DataFile]:
        version = self.meta.version_at(rel.id, epoch)
        if version is None:
            return []
        return self.files(rel, version)

    # --- reads ----------------------------------------------------------------------------

    def check_files(self, rel: StoredRelation, files: Sequence[DataFile]) -> None:
        """Raise ``DamagedFile`` naming the relation and the file unless each of
        ``files`` is there with the size its commit recorded, or at least ends as a
        whole Parquet file does: one deleted, truncated, or overwritten by something
        else by hand would fail a Spark job later with an error that names neither.
        (A Parquet file rewritten by hand is read: its rows are what VERIFY finds
        and RECOMPUTE repairs.) A local file is checked at every read (a stat); an
        object store's once per process (a request; its files never change)."""
        damage = self._damage(rel, files)
        if damage is not None:
            raise DamagedFile(damage)

    def _damage(self, rel: StoredRelation, files: Sequence[DataFile]) -> str | None:
        """What is wrong with the first damaged one of ``files`` (None: none is)."""
        for f in files:
            if f.uri in self._verified:
                continue
            size = self.warehouse.file_size(f.uri)
            if size == f.size:
                if not self.warehouse.is_local:
                    if len(self._verified) >= 100_000:  # bounded: checked again later
                        self._verified.clear()
                    self._verified.add(f.uri)
                continue
            if size is not None and self.warehouse.is_parquet_file(f.uri, size):
                continue  # rewritten by hand: read as it is
            what = rel.label or f"relation {rel.name!r}"
            found = ("is missing" if size is None else
                     f"holds {size} bytes where its commit recorded {f.size}, and is not a "
                     "whole Parquet file (truncated or overwritten)")
            return f"{what}: its data file {f.uri} {found}; {rel.repair or 'restore the file'}"
        return None

    def damaged(self, rel: StoredRelation, epoch: int) -> bool:
        """Whether a data file of ``rel`` at committed ``epoch`` is damaged
        (``check_files``): its rows at ``epoch`` cannot be read."""
        return self._damage(rel, self.files_at(rel, epoch)) is not None

    def _read(self, rel: StoredRelation, files: Sequence[DataFile],
              bulk: bool = False, within: VnodeSpan | None = None) -> DataFrame:
        """The rows of ``files``; ``bulk``: they feed work in proportion to their
        number (a backfill's chunk), so they keep one task per file split even when
        few (a small read is otherwise one partition: see ``read_parquet``);
        ``within``: the vnodes the caller's filter keeps, so only the row groups that
        can hold them are read (and counted as read)."""
        schema = physical_struct(rel.columns)
        if not files:
            return empty_frame(self.spark, schema)
        self.check_files(rel, files)
        rows = sum(self._rows_within(f, within) for f in files)
        self.rows_read[self.reader or rel.name] += rows
        return read_parquet(self.spark, self.warehouse, schema, [f.uri for f in files],
                            None if bulk else rows, immutable=True)

    @property
    def row_group_rows(self) -> int:
        """The rows of a row group of a Spark write: a fifth of a range of vnodes. The
        rows of a range are not sorted, so each of its row groups spans the range's
        vnodes, and one may straddle two ranges; a read of one range then reads its
        own row groups and at most two straddling ones, about 1.1-1.4x its rows (with
        row groups of half a range, 1.4x measured: bench/RESULTS.md "Stop 43")."""
        return max(1, self.target_file_rows // 5)

    def _grouped(self, f: DataFile) -> bool:
        """Whether ``f`` is a file of several row groups that a vnode filter prunes."""
        return f.rows > self.row_group_rows and spark_native(self.warehouse)

    def _rows_within(self, f: DataFile, within: VnodeSpan | None) -> int:
        """The rows of ``f`` a read keeping the vnodes ``within`` reads: the rows of
        its row groups whose vnode range holds one of them (Spark skips the others
        by their statistics); all of them for a file of one row group."""
        if within is None or not self._grouped(f):
            return f.rows
        groups = self._row_groups.get_or_build(
            f.uri, lambda: row_group_ranges(self.warehouse, f.uri, VNODE))
        return sum(n for n, lo, hi in groups if within.overlaps(lo, hi))

    def snapshot(
        self,
        rel: StoredRelation,
        epoch: int,
        after: Position | None = None,
        vnode_hi: int | None = None,
        vnodes: Sequence[int] | None = None,
        files: Sequence[DataFile] | None = None,
        first_keys: Sequence[Any] | None = None,
        where: SparkColumn | str | None = None,
        vnode_rows: bool = True,
        few: bool = False,
        bulk: bool = False,
        keys: Sequence[Any] | None = None,
        key_vnodes: Sequence[tuple[int, Any]] | None = None,
        key_ranges: Mapping[int, tuple[Any, Any]] | None = None,
        semi: DataFrame | None = None,
        narrow: str | None = None,
        guarded: bool = False,
    ) -> DataFrame:
        """Live rows at ``epoch`` (columns + ``_vnode``), restricted to keys above
        ``after``, vnodes ``<= vnode_hi`` and vnodes in ``vnodes``; only the files
        whose vnode range can hold such rows are read. ``files``: the relation's
        files at ``epoch``, when the caller resolved them (no meta-store access).
        ``first_keys`` (sorted): a lookup's values of the first key column; files
        whose key range holds none of them are skipped too (the caller still
        filters the rows by its keys). ``where``: a narrow filter of the rows (a
        lookup of a few keys); base and log rows then merge in the read's own job,
        not through a broadcast of the log's keys. ``vnode_rows=False``: ``vnodes``
        select files only (a lookup by keys, whose rows lie in their own vnodes: a
        row filter by vnode would repeat the key filter at a cost). ``few``: the rows
        read are few though unfiltered (a small relation read whole): they merge in
        the read's own job too. ``bulk``: the rows feed work in proportion to their
        number (a backfill's chunk): read in one task per file split, however few.
        ``keys``: the first-key values a lookup keeps (``where`` keeps no others): base
        files with keyed copies are read through them (``_read_keyed``; ``key_vnodes``:
        the vnode of each, which a key of several columns needs). ``key_ranges``: a
        lookup of many keys, per vnode the range of their first column: files that meet
        none are skipped. ``semi``: the keys a lookup of many keeps (key columns; a key
        may repeat): base and log rows of other keys are dropped by a broadcast
        semi-join as they are read, and the rest merge in the read's own job.
        ``narrow``: a condition (SQL over the relation's columns, any of them) that
        every row the caller keeps passes: base rows that fail it are dropped as they
        are read, the rest merge with the whole log in the read's own job (one
        exchange of both: the log is read once, and no broadcast of its keys is a
        job of its own), and the merged rows are filtered by it too. ``guarded``: the
        rows are for a query no epoch can run again merged by key (a user's read,
        ``Engine.read``; a snapshot job's chunk): where base rows not replaced by
        the log are kept by an anti-join, they pass a filter Spark cannot push a
        caller's filter below (it is not deterministic, though always true), so a
        caller's filter never runs on a base row the log replaced or deleted."""
        files = self.files_at(rel, epoch) if files is None else list(files)
        base_epoch = compaction_epoch(files)
        if first_keys is not None:
            files = [f for f in files if f.may_hold(first_keys)]
        if key_ranges is not None:
            files = [f for f in files if f.meets(key_ranges)]
        lo_v = after.vnode if after is not None else 0
        hi_v = vnode_hi if vnode_hi is not None else 255
        selected = [f for f in files if f.vnode_max >= lo_v and f.vnode_min <= hi_v]
        # the rows' filter: SQL texts (one ``where`` for all of them) and Columns
        conds: list[str | SparkColumn] = []
        if after is not None:
            conds.append(gt(after, rel.key_columns))
        if vnode_hi is not None:
            conds.append(f"{VNODE} <= {int(vnode_hi)}")
        within = VnodeSpan(lo_v, hi_v, None)
        if vnodes is not None:
            wanted = sorted(set(vnodes))
            within = VnodeSpan(lo_v, hi_v, tuple(wanted))
            selected = [f for f in selected if within.overlaps(f.vnode_min, f.vnode_max)]
            # a lookup's keys already keep only rows of their vnodes; the filter is
            # for Spark to skip the row groups of other vnodes in a file of several
            if vnode_rows or not wanted or any(self._grouped(f) for f in selected):
                conds.append(vnode_in_sql(wanted) if wanted else "FALSE")
        if where is not None:
            conds.append(where)
        out_cols = names_sql([*rel.column_names, VNODE])
        base = [f for f in selected if f.kind == "base"]
        log = [f for f in selected if f.kind == "log"]
        keyed = (self._read_keyed(rel, base, keys, key_vnodes)
                 if keys is not None and base else None)
        base_rows = _filtered(keyed if keyed is not None
                              else self._read(rel, base, bulk, within), [*conds, narrow])
        if semi is not None:
            self.spark_jobs += 1  # the keys' broadcast, when the read runs
            base_rows = base_rows.join(F.broadcast(semi), list(rel.key), "left_semi")
        if not log:
            return base_rows.selectExpr(*out_cols)
        log_df = _filtered(self._read(rel, log, bulk, within),
                           [*conds, _epochs_within(log, base_epoch, epoch)])
        if semi is not None:
            log_df = log_df.join(F.broadcast(semi), list(rel.key), "left_semi")
        # a relation of few rows in its files merges in the read's own job too (and
        # every relation, in an epoch run again with ``merging_reads``): a filter the
        # caller puts over the rows then runs above the merge, never on a base row the
        # log replaced (Spark pushes a filter below an anti-join, and a filter that
        # raises on such a row, say a cast of a value deleted since the fold, would
        # fail a query whose live rows all pass)
        few = (few or self.merged_reads or where is not None or semi is not None
               or narrow is not None or sum(f.rows for f in selected) <= LOCAL_WRITE_ROWS)
        merged = base_rows.unionByName(log_df) if few and base else log_df
        # the latest change per key (over base and log when few), kept where live
        live = latest_per_key(merged, list(rel.key),
                              IS_LIVE if narrow is None else f"{IS_LIVE} AND ({narrow})",
                              out_cols)
        if not base or few:
            return live
        # the base rows the log did not replace: an anti-join with the log's keys (the
        # keys its latest rows hold)
        unchanged = base_rows.join(F.broadcast(log_df.selectExpr(*names_sql(rel.key))),
                                   list(rel.key), "left_anti")
        if guarded:
            unchanged = unchanged.where("spark_partition_id() >= 0")
        self.spark_jobs += 1  # the broadcast, when the read runs
        return unchanged.selectExpr(*out_cols).unionByName(live)

    def lookup(self, rel: StoredRelation, epoch: int, keys: Sequence[Any] | DataFrame,
               vnodes: Sequence[int] | None = None,
               first_keys: Sequence[Any] | None = None,
               files: Sequence[DataFile] | None = None) -> DataFrame:
        """Live rows at ``epoch`` whose first key column holds one of ``keys``: values
        known on the driver (a filter of the read, no job of its own) or a frame of
        them in that column (a broadcast semi-join, one job). ``vnodes``: theirs, so
        only the files of those vnodes are read. ``files``: as ``snapshot``'s."""
        column = rel.key[0]
        if not isinstance(keys, DataFrame):
            if not keys:
                return self.snapshot(rel, epoch, files=[])
            where = values_in_sql(column, keys)
            if where is not None:
                return self.snapshot(rel, epoch, vnodes=vnodes, first_keys=first_keys,
                                     where=where, vnode_rows=False, files=files, keys=keys)
            keys = self.spark.createDataFrame([(k,) for k in keys], [column])
        self.spark_jobs += 1  # the broadcast of the keys
        return self.snapshot(rel, epoch, vnodes=vnodes, first_keys=first_keys,
                             vnode_rows=False, files=files).join(
            F.broadcast(keys.select(column)), column, "left_semi")

    def _read_keyed(self, rel: StoredRelation, files: Sequence[DataFile],
                    keys: Sequence[Any],
                    key_vnodes: Sequence[tuple[int, Any]] | None = None) -> DataFrame | None:
        """The rows of the base ``files`` whose first key column holds one of ``keys``
        (some rows of other keys too: the caller filters), read from their keyed
        copies: each file is given the keys of its vnodes, and only the copy's row
        groups whose key range holds one of them are read (and counted as read), by a
        ``mapInArrow`` task. ``key_vnodes``: the (vnode, first-key value) of each key
        looked up, which a key of several columns needs (a key of one is hashed
        here). None when a file has no keyed copy, the keys' vnodes are not known,
        or a copy's footer cannot be read, and for a base of fewer than
        ``keyed_copy_min_rows`` rows (the caller reads the base files); a large base
        without copies then wants them."""
        if not keyable(rel) or sum(f.rows for f in files) < self.keyed_copy_min_rows:
            return None  # (a small base is scanned: no meta-store query for it)
        try:
            if key_vnodes is None:
                if len(rel.key) > 1:
                    return None
                wanted = sorted(set(keys))
                vnodes = vnode_each(wanted, rel.key_columns[0].type)
                if vnodes is None:
                    return None
                by_vnode = sorted(zip(vnodes, wanted, strict=True))
            else:
                by_vnode = sorted(set(key_vnodes))
        except TypeError:
            return None
        # (only a lookup that knows its keys' vnodes asks for copies)
        if not all(self._has_copies(f.folder_uri) for f in files):
            self.copies_wanted.add(rel.dir)
            return None
        work: list[tuple[str, list[int], str]] = []
        rows = 0
        for f in files:
            file_keys = _keys_of_file(by_vnode, f)
            if not file_keys:
                continue
            found = self._copy_groups(rel, f, file_keys)
            if found is None:
                return None
            groups, group_rows = found
            if groups:
                rows += group_rows
                work.append((keyed_copy_uri(f.uri), groups, json.dumps(file_keys)))
        self.rows_read[self.reader or rel.name] += rows
        schema = physical_struct(rel.columns)
        if not work:
            return empty_frame(self.spark, schema)
        reader = object_files.keyed_reader(self.warehouse.storage_options, rel.key[0],
                                           to_arrow_schema(schema))
        object_files.ship_by_value()
        return self.spark.createDataFrame(
            work, "uri string, groups array<int>, keys string").mapInArrow(reader, schema)

    def _copy_groups(self, rel: StoredRelation, f: DataFile,
                     file_keys: Sequence[Any]) -> tuple[list[int], int] | None:
        """Of the keyed copy of the base file ``f``, the row groups whose key range
        holds one of the sorted ``file_keys`` and their rows. None when the copy's
        footer cannot be read: its folder's copies are then forgotten (the caller
        reads the base files) and written again after the epoch."""
        uri = keyed_copy_uri(f.uri)
        try:
            firsts, lasts, counts = self._keyed_groups_of(rel, uri)
        except (OSError, ValueError, pa.ArrowException) as err:
            _log.warning("%s: keyed copy %s unreadable (%s); reading the base files, "
                         "and writing the folder's copies again", rel.name, uri, err)
            self._keyed_folders.discard(f.folder_uri)
            with self.meta.transaction() as conn:
                self.meta.forget(conn, KEYED_RECORD + f.folder_uri)
            self.copies_wanted.add(rel.dir)
            return None
        # the copy is sorted by its first key column: its row groups' ranges ascend,
        # and the groups that hold a value are consecutive (several, when a key of
        # several columns repeats the value across a group's end)
        groups = sorted({i for k in file_keys
                         for i in range(bisect.bisect_left(lasts, k),
                                        bisect.bisect_right(firsts, k))})
        return groups, sum(counts[i] for i in groups)

    def _keyed_groups_of(self, rel: StoredRelation,
                         uri: str) -> tuple[list[Any], list[Any], list[int]]:
        """A keyed copy's row groups as (first keys, last keys, rows), from its footer
        (cached: files never change); ``ValueError`` when a row group has no key
        statistics."""
        found = self._keyed_groups.get(uri)
        if found is not None:
            return found
        md = self._keyed_footers.put(uri, self.warehouse.parquet_metadata(uri))
        idx = [md.schema.column(i).name for i in range(md.num_columns)].index(rel.key[0])
        firsts, lasts, counts = [], [], []
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(idx).statistics
            if st is None or not st.has_min_max:
                raise ValueError(f"row group {rg} has no statistics of {rel.key[0]!r}")
            firsts.append(st.min)
            lasts.append(st.max)
            counts.append(md.row_group(rg).num_rows)
        return self._keyed_groups.put(uri, (firsts, lasts, counts))

    def changelog(self, rel: StoredRelation, after_epoch: int, upto_epoch: int) -> DataFrame:
        """Log rows with ``after_epoch < _epoch <= upto_epoch`` (the log store)."""
        files = [f for f in self.files_at(rel, upto_epoch)
                 if f.kind == "log" and f.epoch_max > after_epoch and f.epoch_min <= upto_epoch]
        return _filtered(self._read(rel, files), [_epochs_within(files, after_epoch, upto_epoch)])

    def estimate_rows_by_vnode(self, rel: StoredRelation, epoch: int,
                               live_rows: int | None = None) -> list[float]:
        """Live rows per vnode estimated from file statistics (uniform within a
        file), scaled to ``live_rows`` when it is known: log files repeat keys."""
        est = [0.0] * 256
        for f in self.files_at(rel, epoch):
            span = max(1, f.vnode_max - f.vnode_min + 1)
            share = f.rows / span
            for v in range(max(0, f.vnode_min), min(255, f.vnode_max) + 1):
                est[v] += share
        total = sum(est)
        if live_rows is not None and total > 0:
            est = [x * live_rows / total for x in est]
        return est

    # --- writes ---------------------------------------------------------------------------

    def vnode_ranges(self, rows: int) -> int:
        """The ranges of vnodes a Spark write of about ``rows`` rows places them in."""
        return min(256, max(1, math.ceil(rows / self.target_file_rows)))

    def place_by_vnode_range(self, df: DataFrame, rows: int) -> tuple[DataFrame, str] | None:
        """``df`` (with ``_vnode``) in the partitions an append of about ``rows`` rows
        writes (``vnode_ranges(rows)`` ranges of vnodes, placed by id) and the SQL of
        its range column, or None when the write would place it another way. A window
        partitioned by that column first (then by the key) runs in these partitions
        without an exchange of its own, and an append told ``placed`` writes them
        as they are: the rows of a load are shuffled once, not twice."""
        n_ranges = self.vnode_ranges(rows)
        if n_ranges == 1 or rows <= LOCAL_WRITE_ROWS or not hasattr(df, "repartitionById"):
            return None
        return df.repartitionById(n_ranges, F.expr(range_id_sql(n_ranges))), \
            range_id_sql(n_ranges)

    def _write_files(self, rel: StoredRelation, df: DataFrame, subdir: str, rows: int,
                     register: bool = True, observation: Observation | None = None,
                     key_column: str | None = None, count_column: str | None = None,
                     placed: bool = False, as_read: bool = False,
                     written_files: list[WrittenFile] | None = None,
                     ) -> list[AddAction | RemoveAction]:
        """Write ``df`` as Parquet files of vnode ranges under ``subdir`` (one Spark job;
        with ``observation``, the written rows are counted per ``_op`` and their vnodes
        (and the distinct values of ``count_column``, and the values themselves of
        ``key_column``) collected in the same job). The rows are placed in ranges of
        vnodes of about ``target_file_rows`` rows each (at most 256: one vnode each at
        the finest), and ``file_row_groups`` consecutive ranges are written as one
        file, in row groups of ``row_group_rows``: a row group spans about one range,
        so a read of a few vnodes skips the other row groups, while the write pays
        for a tenth of the files. The rows are not sorted (a sort would cost a fifth
        of the write). ``placed``: ``df`` is already in those ranges
        (``place_by_vnode_range`` of the same ``rows``). ``as_read``: each partition
        of ``df`` already holds a few contiguous vnodes (rows that keep the vnodes of
        the files they were read from): a file each, as they are, no exchange (a
        file's statistics bound its vnodes, whatever its partition held).
        ``written_files``: gets the files written, with their statistics."""
        table_path = self.path(rel)
        out = f"{table_path}/{subdir}"
        n_ranges = self.vnode_ranges(rows)
        n_files = max(1, math.ceil(n_ranges / self.file_row_groups))
        if as_read or placed:
            ordered, sampled = df, False
        else:
            ordered, sampled = _by_vnode_range(df, n_ranges, rel.key)
        if n_files < n_ranges and not as_read:
            # consecutive ranges into one file each, in order (no second shuffle)
            ordered = ordered.coalesce(n_files)
        schema = physical_struct(rel.columns)
        ordered = ordered.selectExpr(*[cast_sql(f) for f in schema.fields])
        if observation is not None:
            # after the exchange: a range partitioner's sampling job does not run it
            ordered = ordered.observe(observation, *delta_metrics(key_column, count_column))
        if register:
            self.meta.add_pending_dir(rel.id, out)
        written = write_parquet(ordered, self.warehouse, out, [VNODE, EPOCH, rel.key[0]],
                                row_group_rows=self.row_group_rows)
        if register:  # the epoch loop's writes (a snapshot job's run beside it)
            self.spark_jobs += 2 if sampled else 1  # a range partitioner samples first
        if written_files is not None:
            written_files.extend(written)
        now_ms = int(time.time() * 1000)
        return [_add_action(table_path, f, now_ms) for f in written]

    def _arrow_rows(self, rel: StoredRelation, df: DataFrame, epoch: int) -> pa.Table:
        """A small changelog's rows on the driver as Arrow, in ``rel``'s physical schema
        with ``_epoch`` = ``epoch`` (one Spark job)."""
        return _with_epoch(self._arrow_rows_raw(rel, df), epoch)

    def _arrow_rows_raw(self, rel: StoredRelation, df: DataFrame) -> pa.Table:
        """A small changelog's rows on the driver as Arrow, in ``rel``'s physical schema
        but ``_epoch`` (one Spark job)."""
        # the row as one struct (one SQL text: a classic session sends a list of
        # them one element per round trip), its fields made columns on the driver
        casts = ", ".join(cast_sql(f) for f in _collected_fields(rel))
        rows = df.selectExpr(f"struct({casts}) AS _sf_row").toArrow()
        self.spark_jobs += 1
        return pa.Table.from_struct_array(rows["_sf_row"])

    def _arrow_rows_many(self, parts: Sequence[tuple[Sequence[T.StructField], DataFrame]],
                         ) -> list[pa.Table]:
        """The rows of several small frames (changelogs of different relations, each
        with its relation's collected fields, and any other small frame with its own)
        on the driver, each as a table of its ``fields``, in one Spark job: a union of
        one row shape with a column per (part, field), NULL outside its part. Each
        part's row is selected as one struct (expanded after the union): one SQL text
        per part, where a list of a text per column would cost a classic session a
        Py4J round trip per column and part."""
        def slot(i: int, k: int) -> str:
            return f"_sf{i}_{k}"

        selected = []
        for i, (_, df) in enumerate(parts):
            cols = [f"{i} AS _sf_part"]
            for m, (fs, _) in enumerate(parts):
                for k, f in enumerate(fs):
                    value = quoted(f.name) if m == i else "NULL"
                    cols.append(f"CAST({value} AS {f.dataType.simpleString()}) AS {slot(m, k)}")
            selected.append(df.selectExpr(f"struct({', '.join(cols)}) AS _sf_row"))
        union = selected[0]
        for other in selected[1:]:
            union = union.unionAll(other)
        table = union.selectExpr("_sf_row.*").toArrow()
        self.spark_jobs += 1
        return [table.filter(pc.equal(table["_sf_part"], i))
                .select([slot(i, k) for k in range(len(fs))])
                .rename_columns([f.name for f in fs])
                for i, (fs, _) in enumerate(parts)]

    def _write_arrow(self, rel: StoredRelation, table: pa.Table, subdir: str,
                     key_column: str | None, keep_empty: bool = False,
                     ) -> tuple[list[AddAction | RemoveAction], Observed]:
        """Write a Δ's rows brought to the driver, sorted by ``(_vnode, key)`` here, as
        Parquet files of at most ``target_file_rows`` rows under ``subdir`` (none
        when it is empty, unless ``keep_empty``: then one file of no rows). Returns
        their add actions and, as ``_observed``, its rows per ``_op``, its vnodes and
        the distinct values of ``key_column``."""
        if not table.num_rows and not keep_empty:
            return [], Observed({}, (), None, None)
        table = table.cast(physical_arrow_schema(rel.columns)).sort_by(
            [(VNODE, "ascending"), *[(k, "ascending") for k in rel.key]])
        ops = {v["values"]: v["counts"] for v in pc.value_counts(table[OP]).to_pylist()}
        # the values delta_metrics would observe; key values as Spark would collect
        # them: not timestamps (time zones differ)
        values: dict[str, Any] = {f"op{i}": ops.get(op) for i, op in enumerate(OPS)}
        values["vnodes"] = pc.unique(table[VNODE]).to_pylist()
        if key_column is not None:
            values["key_count"] = pc.count_distinct(table[key_column]).as_py()
            if not pa.types.is_timestamp(table[key_column].type):
                values["key_values"] = pc.unique(table[key_column]).to_pylist()
        table_path = self.path(rel)
        out = f"{table_path}/{subdir}"
        self.meta.add_pending_dir(rel.id, out)
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = []
        n_files = max(1, math.ceil(table.num_rows / self.target_file_rows))
        per_file = math.ceil(table.num_rows / n_files)
        for i in range(n_files):
            part = f"{out}/part-{i:05d}-{uuid.uuid4().hex}.snappy.parquet"
            rows = table.slice(i * per_file, per_file)
            size = self.warehouse.write_parquet(rows, part)
            stats = arrow_file_stats(rows, [VNODE, EPOCH, rel.key[0]])
            actions.append(_add_action(table_path, WrittenFile(part, size, stats), now_ms))
        return actions, _observed(values)

    def append(self, rel: StoredRelation, epoch: int, delta: DataFrame | None,
               rows_hint: int, collect_keys: bool = False,
               placed: bool = False, prepared: Sequence[str] = (),
               as_read: bool = False, inserts: bool = False,
               rows: pa.Table | None = None) -> Appended | None:
        """Append one epoch's changelog (columns + ``_vnode`` + ``_op``) in one Spark
        job; None when it is empty (nothing is committed). ``rows``: the changelog
        as rows on the driver already (``delta`` is then not read): written from
        there, no Spark job. ``rows_hint``: about how
        many rows it holds (it sets the number of files). ``collect_keys``: bring the
        first key column's distinct values to the driver (``Appended.keys``) when
        there are at most ``KEY_VALUES``. ``placed``: ``delta`` is in the partitions
        of ``place_by_vnode_range(rows_hint)``. ``as_read``: each of ``delta``'s
        partitions holds rows of a few contiguous vnodes (as read from files of vnode
        ranges): each is written as a file, with no exchange; with ``inserts`` (its
        rows are all insertions), what it holds is read from the files' footers, not
        observed by an aggregate over its rows. ``prepared``: ``delta`` is the rows
        of these directories' files, written already as this relation's log files of
        ``epoch`` (a placed first load, ``dml``): they are linked in, no row is
        written. Idempotent per epoch: a retried append finds the files the first one
        committed."""
        dt = self._table(rel)
        if (done := self._committed_append(dt, rel, epoch, collect_keys)) is not None:
            return done[0]
        subdir = self._log_subdir(epoch)
        if prepared:
            actions, observed = self._link_prepared(rel, prepared, subdir)
            return self._commit_append(dt, rel, epoch, subdir, actions, observed)
        # the set is collected whole: only for a Δ expected small
        key_column = rel.key[0] if collect_keys and rows_hint <= 5 * KEY_VALUES else None
        if rows is not None:
            actions, observed = self._write_arrow(rel, _with_epoch(rows, epoch), subdir,
                                                  rel.key[0] if collect_keys else None)
        elif delta is None:
            raise ValueError("an append needs its changelog as a frame or as rows")
        elif rows_hint <= LOCAL_WRITE_ROWS:
            actions, observed = self._write_arrow(
                rel, self._arrow_rows(rel, delta, epoch), subdir,
                rel.key[0] if collect_keys else None)
        elif as_read and inserts and not collect_keys:
            files: list[WrittenFile] = []
            actions = self._write_files(rel, delta.withColumn(EPOCH, F.lit(epoch)), subdir,
                                        rows_hint, as_read=True, written_files=files)
            observed = _observed(inserts_observed(files))
        else:
            observation = Observation(f"sf_append_{uuid.uuid4().hex}")
            actions = self._write_files(rel, delta.withColumn(EPOCH, F.lit(epoch)), subdir,
                                        rows_hint, observation=observation,
                                        key_column=key_column,
                                        count_column=rel.key[0] if collect_keys else None,
                                        placed=placed, as_read=as_read)
            observed = _observed(observation.get)
        return self._commit_append(dt, rel, epoch, subdir, actions, observed)

    def append_many(self, items: Sequence[tuple[StoredRelation, DataFrame]], epoch: int,
                    checks: Mapping[int, tuple[DataFrame, Callable[[], DataFrame]]]
                    | None = None) -> list[Appended | None]:
        """``append`` of several small changelogs (each expected to hold at most
        ``LOCAL_WRITE_ROWS`` rows) of different relations for ``epoch``: their rows
        come to the driver in one Spark job, then each is written and committed as
        ``append`` would. ``checks[i]``: item ``i``'s changelog is a guess, and a
        small frame whose rows (collected in the same job) say it was wrong, with
        the changelog to take then (collected in a job of its own). Idempotent per
        relation and epoch, as ``append``."""
        results: list[Appended | None] = [None] * len(items)
        todo: list[tuple[int, DeltaTable]] = []
        for i, (rel, _) in enumerate(items):
            dt = self._table(rel)
            if (done := self._committed_append(dt, rel, epoch, False)) is not None:
                results[i] = done[0]
            else:
                todo.append((i, dt))
        if not todo:
            return results
        checks = checks or {}
        checked = [i for i, _ in todo if i in checks]
        tables = self._arrow_rows_many(
            [(_collected_fields(items[i][0]), items[i][1]) for i, _ in todo]
            + [(checks[i][0].schema.fields, checks[i][0]) for i in checked])
        rows = dict(zip([i for i, _ in todo], tables[:len(todo)], strict=True))
        for i, found in zip(checked, tables[len(todo):], strict=True):
            if found.num_rows:  # the guess was wrong: its changelog built anew
                rows[i] = self._arrow_rows_raw(items[i][0], checks[i][1]())
        for i, dt in todo:
            rel = items[i][0]
            subdir = self._log_subdir(epoch)
            actions, observed = self._write_arrow(rel, _with_epoch(rows[i], epoch), subdir, None)
            results[i] = self._commit_append(dt, rel, epoch, subdir, actions, observed)
        return results

    @staticmethod
    def _log_subdir(epoch: int) -> str:
        return f"log/e{epoch:010d}-{uuid.uuid4().hex[:8]}"

    def _committed_append(self, dt: DeltaTable, rel: StoredRelation, epoch: int,
                          collect_keys: bool) -> tuple[Appended | None] | None:
        """The append of ``epoch`` an earlier attempt committed to ``rel``'s table
        ``dt``, as a 1-tuple (its changelog may be empty: None inside); None when
        there was none."""
        if (txn := dt.transaction_version(APP_ID)) is not None and txn >= epoch:
            return (self._appended(rel, epoch, int(dt.version()), collect_keys),)
        return None

    def _commit_append(self, dt: DeltaTable, rel: StoredRelation, epoch: int, subdir: str,
                       actions: list[AddAction | RemoveAction],
                       observed: Observed) -> Appended | None:
        """Commit the files an append wrote under ``subdir`` as ``epoch``'s Delta
        version of ``rel``'s table ``dt`` (None, and nothing committed, when they hold
        no row)."""
        counts = observed.counts
        table_path = self.path(rel)
        out = f"{table_path}/{subdir}"
        if not sum(counts.values()):
            self.warehouse.rmtree(out)
            self.meta.remove_pending_dir(out)
            return None
        dt.create_write_transaction(
            actions, mode="append", schema=dt.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(APP_ID, epoch, int(time.time() * 1000))]),
        )
        self.meta.remove_pending_dir(out)
        files = [f"{table_path}/{a.path}" for a in actions if isinstance(a, AddAction)]
        rows = sum(counts.values())
        return Appended(self._committed_version(rel), observed,
                        lambda: self._read_delta(rel, files, rows))

    def _appended(self, rel: StoredRelation, epoch: int, version: int,
                  collect_keys: bool) -> Appended | None:
        """The append of ``epoch`` that an earlier attempt committed (recovery)."""
        prefix = f"log/e{epoch:010d}-"
        files = self.files(rel, version)
        written = [f for f in files if f.path.startswith(prefix)]
        if not written and _rewritten_by(files, epoch):
            # the epoch's first attempt rewrote the relation (a choice a retry may not
            # make again; an append of ``epoch`` leaves log files of it, a fold runs
            # after the commit): its rows at ``epoch`` are there, its changelog is not
            return Appended(version, Observed({"+": sum(f.rows for f in files)},
                                              tuple(range(VNODE_COUNT)), None, None),
                            _no_changelog, rewritten=True)
        if not written:
            return None
        delta = self._read_delta(rel, [f.uri for f in written], sum(f.rows for f in written))
        key = rel.key[0] if collect_keys else None
        stats = delta.agg(*delta_metrics(key, key)).collect()[0].asDict()
        self.spark_jobs += 1
        return Appended(version, _observed(stats), lambda: delta)

    def _read_delta(self, rel: StoredRelation, uris: Sequence[str], rows: int) -> DataFrame:
        """A written changelog of ``rows`` rows read back from its files (not counted as
        a state read)."""
        return (read_parquet(self.spark, self.warehouse, physical_struct(rel.columns), uris,
                             rows)
                .selectExpr(*names_sql([*rel.column_names, VNODE, OP])))

    def prepare_files(self, rel: StoredRelation, epoch: int, rows_df: DataFrame,
                      rows_hint: int, tag: str, count_column: str | None = None,
                      ) -> tuple[list[dict[str, Any]], Observed]:
        """Write live rows (columns + ``_vnode``) as ``+`` log files of ``epoch`` that
        no commit references yet (no meta-store access: safe off the epoch loop's
        thread), in one Spark job that counts them; ``rows_hint``: about how many
        there are (it sets the number of files); ``count_column``: a column whose
        distinct values the write estimates too. Returns the files' add actions,
        for ``commit_files``, and what the write observed."""
        subdir = f"log/e{epoch:010d}-{tag}-{uuid.uuid4().hex[:8]}"
        df = rows_df.withColumn(EPOCH, F.lit(epoch)).withColumn(OP, F.lit("+"))
        observation = Observation(f"sf_prepare_{uuid.uuid4().hex}")
        actions = self._write_files(rel, df, subdir, rows_hint, register=False,
                                    observation=observation, count_column=count_column)
        return ([{"path": a.path, "size": a.size, "stats": a.stats} for a in actions
                 if isinstance(a, AddAction)], _observed(observation.get))

    def commit_files(self, rel: StoredRelation, epoch: int,
                     files: Sequence[dict[str, Any]]) -> int:
        """Commit prepared files as the relation's append of ``epoch`` (idempotent per
        epoch, like ``append``); returns the Delta version that holds them."""
        dt = self._table(rel)
        if (txn := dt.transaction_version(APP_ID)) is not None and txn >= epoch:
            return int(dt.version())
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f["path"], int(f["size"]), {}, now_ms, True, f["stats"]) for f in files]
        dt.create_write_transaction(
            actions, mode="append", schema=dt.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(APP_ID, epoch, now_ms)]))
        return self._committed_version(rel)

    def rewrite(self, rel: StoredRelation, epoch: int, rows_df: DataFrame,
                old_rows: int, as_read: bool = False) -> tuple[int, dict[str, int]]:
        """The relation's live rows at ``epoch`` (columns + ``_vnode``; about
        ``old_rows`` of them, its rows at ``epoch - 1``) written as its base at
        ``epoch``, replacing every file in one Delta commit (idempotent per epoch,
        as ``append``; the files it replaces wait for vacuum, so earlier epochs stay
        readable). Returns the version and rows per ``_op`` as the epoch's counts:
        ``+`` the rows written, ``-`` the ``old_rows`` they replace. ``as_read``: each
        partition of ``rows_df`` holds a few contiguous vnodes (the rows keep those of
        the files they were read from): a file each, no exchange (``_write_files``)."""
        dt = self._table(rel)
        if (txn := dt.transaction_version(APP_ID)) is not None and txn >= epoch:
            version = int(dt.version())
            files = self.files(rel, version)
            # written before a crash: the same rows (not when the epoch's first attempt
            # appended a Δ instead, and failed later: a repair of damaged files that
            # follows it replaces every file)
            if _rewritten_by(files, epoch):
                return version, {"+": sum(f.rows for f in files), "-": old_rows}
        subdir = f"base/c{epoch:010d}-{uuid.uuid4().hex[:8]}"
        df = rows_df.withColumn(EPOCH, F.lit(epoch)).withColumn(OP, F.lit("+"))
        observation = Observation(f"sf_rewrite_{uuid.uuid4().hex}")
        actions = self._marked_base(rel, subdir, self._write_files(
            rel, df, subdir, max(1, old_rows), observation=observation, as_read=as_read))
        replaced = self.files_at(rel, epoch - 1)
        now_ms = int(time.time() * 1000)
        dt.create_write_transaction(
            actions, mode="overwrite", schema=dt.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(APP_ID, epoch, now_ms)]))
        version = self._committed_version(rel)
        with self.meta.transaction() as conn:
            self.meta.add_removed_files(conn, rel.id, epoch, [f.path for f in replaced])
            conn.execute("DELETE FROM pending_dirs WHERE dir = ?",
                         (f"{self.path(rel)}/{subdir}",))
        return version, {"+": _observed(observation.get).counts.get("+", 0), "-": old_rows}

    def compaction_due(self, rel: StoredRelation, epoch: int) -> str | None:
        """What the relation's files as of committed ``epoch`` need: ``"fold"`` (its
        log into base: the log holds many rows against the base), ``"merge"`` (its
        log's many small files into one: an epoch's file each, and each file is a
        task and a footer read for every read of the relation), or None."""
        files = self.files_at(rel, epoch)
        log = [f for f in files if f.kind == "log"]
        if not log:
            return None
        log_rows = sum(f.rows for f in log)
        base_rows = sum(f.rows for f in files if f.kind == "base")
        if log_rows > max(self.min_compact_rows, self.log_fraction * base_rows):
            return "fold"
        if len(log) < self.max_log_files:
            return None
        return "merge" if log_rows <= MERGE_LOG_ROWS else "fold"

    def merge_log(self, rel: StoredRelation, epoch: int) -> int:
        """Merge the log files as of committed ``epoch`` into one log file, on the
        driver, in one Delta commit that removes the files it merged. Every row is
        kept with its ``_epoch`` and ``_op``: a snapshot as of any epoch, and the log
        store's reads between epochs, see the same rows as before (a base is not
        rewritten: the cost is the log's rows, not the relation's)."""
        version = self.meta.version_at(rel.id, epoch)
        assert version is not None
        log = [f for f in self.files(rel, version) if f.kind == "log"]
        self.check_files(rel, log)
        schema = physical_arrow_schema(rel.columns)
        rows = pa.concat_tables([self.warehouse.read_parquet(f.uri).select(schema.names)
                                 .cast(schema) for f in log])
        subdir = f"log/m{epoch:010d}-{uuid.uuid4().hex[:8]}"
        actions, _ = self._write_arrow(rel, rows, subdir, None)
        dt = self._table(rel)
        now_ms = int(time.time() * 1000)
        actions += [RemoveAction(f.path, False, now_ms, f.size) for f in log]
        dt.create_write_transaction(actions, mode="append", schema=dt.schema())
        return self._record_rewrite(rel, epoch, subdir, log)

    def compact(self, rel: StoredRelation, epoch: int, live_rows: int) -> int:
        """Fold log into base as of committed ``epoch`` in one Delta commit. A log that
        already is a base — every file written by ``epoch`` alone, holding only the
        ``live_rows`` live rows (a relation first filled by that epoch: a load, a
        blocking backfill) — is adopted as it is: its files are linked under
        ``base/`` (no Spark job) instead of rewritten."""
        version = self.meta.version_at(rel.id, epoch)
        assert version is not None
        old_files = self.files(rel, version)
        subdir = f"base/c{epoch:010d}-{uuid.uuid4().hex[:8]}"
        # (and in files that are not small: about as many as a rewrite would make, or
        # of a quarter of the target each — a first fill sized by its upstream's rows;
        # a small Δ that was split by its upstream's size is rewritten, cheaply, into
        # fewer)
        if (_is_base_of(old_files, epoch, live_rows)
                and (len(old_files) <= 2 * math.ceil(live_rows / self.target_file_rows)
                     or 4 * live_rows >= len(old_files) * self.target_file_rows)):
            actions = self._link_as_base(rel, old_files, subdir)
        elif live_rows <= LOCAL_WRITE_ROWS:
            # a small relation: its rows to the driver and written there, as a small
            # Δ is (a Spark write's file-commit protocol costs more than its rows); read
            # and merged there too, with no Spark job, when its files hold few rows
            rows = (self._live_rows_on_driver(rel, epoch, old_files)
                    if sum(f.rows for f in old_files) <= MERGE_LOG_ROWS else None)
            if rows is None:
                snap = self.snapshot(rel, epoch, few=True).withColumn(OP, F.lit("+"))
                rows = self._arrow_rows(rel, snap, epoch)
            actions, _ = self._write_arrow(rel, rows, subdir, None)
        else:
            snap = (self.snapshot(rel, epoch).withColumn(EPOCH, F.lit(epoch))
                    .withColumn(OP, F.lit("+")))
            actions = self._write_files(rel, snap, subdir, live_rows)
        actions = self._marked_base(rel, subdir, actions)
        dt = self._table(rel)
        dt.create_write_transaction(actions, mode="overwrite", schema=dt.schema())
        return self._record_rewrite(rel, epoch, subdir, old_files)

    def _marked_base(self, rel: StoredRelation, subdir: str,
                     actions: list[AddAction | RemoveAction]) -> list[AddAction | RemoveAction]:
        """``actions`` of a base written under ``subdir``, with a file of no rows
        there when they add none (every row was deleted): the base's folder is what
        says where the log starts (``compaction_epoch``), and a relation of no file
        would read as never compacted — a sink synced up to an earlier epoch would
        then find no change since and keep the rows the fold deleted."""
        if any(isinstance(a, AddAction) for a in actions):
            return actions
        empty, _ = self._write_arrow(rel, physical_arrow_schema(rel.columns).empty_table(),
                                     subdir, None, keep_empty=True)
        return [*actions, *empty]

    def _live_rows_on_driver(self, rel: StoredRelation, epoch: int,
                             files: Sequence[DataFile]) -> pa.Table | None:
        """``snapshot(epoch)`` of ``files`` (``rel``'s at ``epoch``) read and merged on
        the driver with pyarrow, as a changelog of insertions (``_epoch`` = ``epoch``,
        ``_op`` = ``+``): the base rows, and the log rows above the base's epoch up to
        ``epoch``, of which each key's last change (highest epoch, ``U+`` after
        ``U-``) is kept if it is live. None for a key the driver does not compare
        (``_driver_foldable``) or that holds a NULL."""
        if not _driver_foldable(rel):
            return None
        schema = physical_arrow_schema(rel.columns)
        rows = _live_merged(rel, [(f, self.warehouse.read_parquet(f.uri)) for f in files],
                            compaction_epoch(files), epoch)
        if rows is None:
            return None
        m = rows.num_rows
        return (rows.set_column(schema.get_field_index(EPOCH), schema.field(EPOCH),
                                pa.repeat(pa.scalar(epoch, pa.int64()), m))
                .set_column(schema.get_field_index(OP), schema.field(OP),
                            pa.repeat(pa.scalar("+"), m)))

    def rows_of_keys_on_driver(self, rel: StoredRelation, epoch: int,
                               files: Sequence[DataFile], key_vnodes: Sequence[tuple[int, Any]],
                               max_rows: int) -> pa.Table | None:
        """The live rows at ``epoch`` (``rel``'s columns, in its physical types) whose
        one-column key holds one of the keys of ``key_vnodes`` (each key's (vnode,
        value)), read and merged on the driver with pyarrow: of ``files`` (``rel``'s at
        ``epoch``) only those whose vnode and key ranges can hold one; of a base file
        with a keyed copy only the copy's row groups whose key range holds one of the
        file's keys, as ``_read_keyed`` reads it; of any other file only the row groups
        whose statistics can hold one. A large base without copies wants them, as a
        lookup by Spark does. None — the caller asks Spark — when the driver does not
        compare ``rel``'s keys (``_driver_foldable``), when those row groups hold more
        than ``max_rows`` rows, or when a file cannot be read (Spark's read then
        reports it as it does); ``DamagedFile`` as ``snapshot``."""
        if len(rel.key) != 1 or not _driver_foldable(rel):
            return None
        by_vnode = sorted(set(key_vnodes))
        keys = sorted({k for _, k in by_vnode})
        within = VnodeSpan(0, 255, tuple(sorted({v for v, _ in by_vnode})))
        wanted = [f for f in files if f.may_hold(keys)
                  and within.overlaps(f.vnode_min, f.vnode_max)]
        copied = self._copied(rel, files)
        reads: list[tuple[DataFile, list[int] | None, int]] = []
        for f in wanted:
            found = self._copy_groups(rel, f, _keys_of_file(by_vnode, f)) \
                if copied and f.kind == "base" else None
            reads.append((f, None, self._rows_within(f, within)) if found is None
                         else (f, *found))
        if sum(rows for *_, rows in reads) > max_rows:
            return None
        self.check_files(rel, wanted)
        key = rel.key[0]
        filters = [(key, "in", keys), (VNODE, "in", list(within.wanted or ()))]
        key_set = pa.array(keys)
        read = []
        try:
            for f, groups, _ in reads:
                if groups is None:
                    rows = self.warehouse.read_parquet(f.uri, filters)
                elif groups:
                    uri = keyed_copy_uri(f.uri)
                    footer = self._keyed_footers.get_or_build(
                        uri, partial(self.warehouse.parquet_metadata, uri))
                    rows = self.warehouse.read_row_groups(uri, groups, footer)
                    rows = rows.filter(pc.is_in(rows[key],
                                                value_set=key_set.cast(rows[key].type)))
                else:
                    continue
                read.append((f, rows))
        except (OSError, ValueError, pa.ArrowException) as err:
            _log.warning("%s: a file read on the driver failed (%s); reading it by Spark",
                         rel.name, err)
            return None
        self.rows_read[self.reader or rel.name] += sum(rows for *_, rows in reads)
        merged = _live_merged(rel, read, compaction_epoch(files), epoch)
        return None if merged is None else merged.select(rel.column_names)

    def rows_in_on_driver(self, rel: StoredRelation, epoch: int, column: str,
                          values: Sequence[Any], max_rows: int) -> DataFrame | None:
        """The live rows at ``epoch`` (``rel``'s columns) whose ``column`` holds one of
        ``values`` (none NULL), read and merged on the driver with pyarrow, as a frame
        of the driver's rows: of the base only those rows (its row groups whose
        statistics can hold one), the log whole (a row's last change may move it into
        or out of them), merged by key as a snapshot merges, then filtered. For a few
        groups' rows of a relation not laid out by group (an aggregate's lost min/max
        found again in its leaf), where Spark would scan it in a job of its own. None
        — the caller asks Spark — when the driver does not merge ``rel``'s keys or
        compare ``column`` as Spark does (integers and strings only), when its files
        hold more than ``max_rows`` rows, or when one cannot be read there;
        ``DamagedFile`` as ``snapshot``."""
        types = {c.name: arrow_type(c.type) for c in rel.columns}
        kind = types.get(column)
        if (not values or kind is None or not _driver_foldable(rel)
                or not (pa.types.is_integer(kind) or pa.types.is_string(kind))
                or any(pa.types.is_nested(t) for t in types.values())
                or any(v is None for v in values)):
            return None
        files = self.files_at(rel, epoch)
        if sum(f.rows for f in files) > max_rows:
            return None
        self.check_files(rel, files)
        wanted = pa.array(sorted(set(values)), type=kind)
        read = []
        try:
            for f in files:
                rows = self.warehouse.read_parquet(
                    f.uri, [(column, "in", wanted.to_pylist())] if f.kind == "base" else None)
                read.append((f, rows))
        except (OSError, ValueError, pa.ArrowException) as err:
            _log.warning("%s: a file read on the driver failed (%s); reading it by Spark",
                         rel.name, err)
            return None
        self.rows_read[self.reader or rel.name] += sum(rows.num_rows for _, rows in read)
        merged = _live_merged(rel, read, compaction_epoch(files), epoch)
        if merged is None:
            return None
        kept = merged.filter(pc.is_in(merged[column], value_set=wanted))
        frame = self.spark.createDataFrame(kept.select(rel.column_names)).selectExpr(
            *[f"CAST({quoted(c.name)} AS {c.type}) AS {quoted(c.name)}" for c in rel.columns])
        return one_task_if_few(frame, kept.num_rows)

    def _copied(self, rel: StoredRelation, files: Sequence[DataFile]) -> bool:
        """Whether a lookup of a few keys reads ``rel``'s base ``files`` through their
        keyed copies: a keyable base of ``keyed_copy_min_rows`` rows or more whose
        folders all have copies. One that lacks them wants them (written after the
        epoch commits)."""
        base = [f for f in files if f.kind == "base"]
        if not keyable(rel) or sum(f.rows for f in base) < self.keyed_copy_min_rows:
            return False
        if all(self._has_copies(folder) for folder in {f.folder_uri for f in base}):
            return True
        self.copies_wanted.add(rel.dir)
        return False

    def _has_copies(self, folder_uri: str) -> bool:
        """Whether the base folder ``folder_uri``'s files have keyed copies."""
        if folder_uri in self._keyed_folders:
            return True
        if self.meta.get(KEYED_RECORD + folder_uri) is None:
            return False
        self._keyed_folders.add(folder_uri)
        return True

    def write_keyed_copies(self, rel: StoredRelation, epoch: int) -> int:
        """Write the keyed copies of ``rel``'s base files at committed ``epoch`` that
        have none (one Spark job of ``mapInArrow`` tasks), then record their folders
        in the meta store. A crash between leaves copies unrecorded: written again
        next time, and removed with their files by vacuum either way. Returns the
        copies written."""
        self.copies_wanted.discard(rel.dir)
        if not keyable(rel):
            return 0
        base = [f for f in self.files_at(rel, epoch)
                if f.kind == "base" and not self._has_copies(f.folder_uri)]
        if not base:
            return 0
        writer = object_files.keyed_copy_writer(self.warehouse.storage_options, rel.key[0],
                                                self.keyed_group_rows)
        object_files.ship_by_value()
        self.spark.createDataFrame([(f.uri, keyed_copy_uri(f.uri)) for f in base],
                                   "src string, dst string").mapInArrow(
            writer, object_files.KEYED_WRITTEN_SCHEMA).collect()
        self.spark_jobs += 1
        for f in base:  # a copy written again (its first was lost): its footer read anew
            self._keyed_groups.discard(keyed_copy_uri(f.uri))
            self._keyed_footers.discard(keyed_copy_uri(f.uri))
        folders = sorted({f.folder_uri for f in base})
        with self.meta.transaction() as conn:
            for folder in folders:
                self.meta.put(conn, KEYED_RECORD + folder, "1")
        self._keyed_folders.update(folders)
        return len(base)

    def remove_file(self, rel: StoredRelation, path: str) -> None:
        """Remove a data file no version still read references (``path``: relative to
        the table), and its keyed copy."""
        uri = f"{self.path(rel)}/{path}"
        self.warehouse.rmtree(uri)
        if path.startswith("base/"):
            self.warehouse.rmtree(keyed_copy_uri(uri))

    def _record_rewrite(self, rel: StoredRelation, epoch: int, subdir: str,
                        replaced: Sequence[DataFile]) -> int:
        """After a compaction's commit: committed ``epoch`` reads the new version, the
        ``replaced`` files wait for vacuum, the written ``subdir`` is no longer
        pending. Returns the new version."""
        new_version = self._committed_version(rel)
        with self.meta.transaction() as conn:
            self.meta.set_version(conn, rel.id, epoch, new_version)
            self.meta.add_removed_files(conn, rel.id, epoch, [f.path for f in replaced])
            conn.execute("DELETE FROM pending_dirs WHERE dir = ?",
                         (f"{self.path(rel)}/{subdir}",))
        return new_version

    def _link_as_base(self, rel: StoredRelation, files: Sequence[DataFile],
                      subdir: str) -> list[AddAction | RemoveAction]:
        """Link (or, where the filesystem cannot, copy) ``files`` under ``subdir`` as
        base files (statistics from their footers); the log paths stay readable by earlier
        versions until vacuumed."""
        self.check_files(rel, files)
        return self._link_files(rel, [(f.uri, f"part-{i:05d}-{Warehouse.name_of(f.path)}")
                                      for i, f in enumerate(files)], subdir)

    def _link_files(self, rel: StoredRelation, sources: Sequence[tuple[str, str]],
                    subdir: str) -> list[AddAction | RemoveAction]:
        """Link (or copy) each ``(uri, name)`` of ``sources`` as ``subdir/name`` of the
        relation's table, registered as pending first; their add actions, with
        statistics from their footers."""
        table_path = self.path(rel)
        out = f"{table_path}/{subdir}"
        self.meta.add_pending_dir(rel.id, out)
        self.warehouse.makedirs(out)
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = []
        for uri, name in sources:
            target = f"{out}/{name}"
            self.warehouse.link_or_copy(uri, target)
            stats = parquet_stats(self.warehouse, target, [VNODE, EPOCH, rel.key[0]])
            actions.append(_add_action(table_path, WrittenFile(target, self.warehouse.size(target),
                                                               stats), now_ms))
        return actions

    def _link_prepared(self, rel: StoredRelation, dirs: Sequence[str], subdir: str,
                       ) -> tuple[list[AddAction | RemoveAction], Observed]:
        """Link (or copy) the Parquet files of ``dirs`` under ``subdir`` (statistics
        from their footers), and what their write observed (``delta_metrics``'
        values, in each directory's ``PREPARED_OBSERVED``)."""
        values: dict[str, Any] = {}
        sources: list[tuple[str, str]] = []
        for d in dirs:
            text = self.warehouse.read_text(f"{d}/{PREPARED_OBSERVED}")
            if text is None:
                raise FileNotFoundError(f"{d}: no {PREPARED_OBSERVED} beside its files")
            for name, value in json.loads(text).items():
                if name == "vnodes":
                    values[name] = sorted({*values.get(name, ()), *value})
                else:
                    values[name] = (values.get(name) or 0) + (value or 0)
            sources += [(uri, Warehouse.name_of(uri)) for uri in self.warehouse.part_files(d)]
        return self._link_files(rel, sources, subdir), _observed(values)

    def reset(self, rel: StoredRelation) -> int:
        """Remove every file of a relation in one commit (a restarted job)."""
        dt = self._table(rel)
        dt.create_write_transaction([], mode="overwrite", schema=dt.schema())
        return self._committed_version(rel)

    def _committed_version(self, rel: StoredRelation) -> int:
        """The table's latest version after a commit; writes a checkpoint when due."""
        dt = self._table(rel)
        version = int(dt.version())
        if version > 0 and version % CHECKPOINT_EVERY == 0:
            dt.create_checkpoint()
        return version

    # --- recovery and cleanup -------------------------------------------------------------

    def referenced(self, rel: StoredRelation) -> set[str]:
        dt = self._table(rel)
        return {f"{self.path(rel)}/{a}" for a in
                pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()}

    def remove_unreferenced_dir(self, rel: StoredRelation, dir_: str) -> None:
        refs = self.referenced(rel)
        if not any(r.startswith(dir_ + "/") for r in refs):
            self.warehouse.rmtree(dir_)


def range_id_sql(n_ranges: int) -> str:
    """The SQL of the range of vnodes (``0 <= id < n_ranges``) a row is placed in."""
    return f"CAST(FLOOR({VNODE} * {int(n_ranges)} / 256) AS INT)"


def _by_vnode_range(df: DataFrame, n_files: int, key: Sequence[str]) -> tuple[DataFrame, bool]:
    """``df`` in ``n_files`` partitions, each a contiguous range of vnodes (with the
    keys, when there are more files than vnodes), and whether placing them runs a
    sampling job. One file: coalesced. Up to 256 files: partition ``p`` holds vnodes
    ``[256p/n, 256(p+1)/n)``, placed by id (vnodes are hashes: even ranges hold about
    even rows), so Spark computes ``df`` once, where a range partitioner's sampling
    job would compute it twice. Beyond that, or on a Spark without ``repartitionById``
    (before 4.1): range-partitioned by ``(_vnode, key)``, sampled."""
    if n_files == 1:
        return df.coalesce(1), False
    if n_files <= 256 and hasattr(df, "repartitionById"):
        return df.repartitionById(n_files, F.expr(range_id_sql(n_files))), False
    return df.repartitionByRange(n_files, VNODE, *key), True


def last_rows_per_key(rows: pa.Table, key: Sequence[str], order: Sequence[str]) -> pa.Table:
    """``latest_per_key`` on the driver: each key's last row of ``rows`` by ``order``
    (ascending), the rows sorted by key. Key columns hold no NULL."""
    rows = rows.sort_by([(c, "ascending") for c in [*key, *order]])
    n = rows.num_rows
    if n < 2:
        return rows
    ends = [pc.not_equal(rows[k].slice(0, n - 1), rows[k].slice(1)) for k in key]
    last = ends[0]
    for other in ends[1:]:
        last = pc.or_(last, other)
    return rows.filter(pa.concat_arrays([pa.chunked_array(last).combine_chunks(),
                                         pa.array([True])]))


def _keys_of_file(by_vnode: Sequence[tuple[int, Any]], f: DataFile) -> list[Any]:
    """The sorted keys of the sorted (vnode, key) pairs ``by_vnode`` that fall in the
    vnodes of ``f``."""
    lo = bisect.bisect_left(by_vnode, (f.vnode_min,))
    hi = bisect.bisect_left(by_vnode, (f.vnode_max + 1,))
    return sorted({k for _, k in by_vnode[lo:hi]})


def _live_merged(rel: StoredRelation, read: Sequence[tuple[DataFile, pa.Table]],
                 base_epoch: int, epoch: int) -> pa.Table | None:
    """The live rows at ``epoch`` of the rows ``read`` from ``rel``'s files (each
    with its file), in its physical schema: the base rows, and the log rows above
    ``base_epoch`` (the base's epoch among all of its files) up to ``epoch``, of
    which each key's last change (highest epoch, ``U+`` after ``U-``) is kept if it
    is live, as ``snapshot`` merges them (a column a file lacks, added after it was
    written, is NULL). None when a key holds a NULL."""
    schema = physical_arrow_schema(rel.columns)
    parts = []
    for f, rows in read:
        # (a column the file lacks, added after it was written, is NULL)
        rows = object_files.conformed(rows, schema, set(rows.column_names))
        if f.kind == "base":  # each key once, below every log row kept
            rank = pa.repeat(pa.scalar(2 * base_epoch + 1, pa.int64()), rows.num_rows)
        else:
            at = rows[EPOCH]
            rows = rows.filter(pc.and_(pc.greater(at, base_epoch), pc.less_equal(at, epoch)))
            rank = pc.add(pc.multiply(rows[EPOCH], 2),
                          pc.cast(pc.not_equal(rows[OP], "U-"), pa.int64()))
        parts.append(rows.append_column("_sf_rank", rank))
    if not parts:
        return schema.empty_table()
    rows = pa.concat_tables(parts)
    if any(rows[k].null_count for k in rel.key):
        return None
    rows = last_rows_per_key(rows, rel.key, ["_sf_rank"])
    return rows.filter(pc.is_in(rows[OP], pa.array(["+", "U+"]))).drop_columns(["_sf_rank"])


def _driver_foldable(rel: StoredRelation) -> bool:
    """Whether the driver merges ``rel``'s rows by key (``_live_rows_on_driver``): its
    key columns are of types pyarrow sorts and compares as Spark does (no floating
    point: NaN; nothing nested)."""
    types = {c.name: arrow_type(c.type) for c in rel.columns}
    return all(not (pa.types.is_floating(types[k]) or pa.types.is_nested(types[k]))
               for k in rel.key)


def compaction_epoch(files: Sequence[DataFile]) -> int:
    """The epoch of the base among ``files`` (0: none): the log rows above it are the
    changes a snapshot merges into it."""
    return max((f.compaction_epoch for f in files if f.kind == "base"), default=0)


def _is_base_of(files: Sequence[DataFile], epoch: int, live_rows: int) -> bool:
    """Whether ``files`` already are the base of a relation at ``epoch``: all log
    files of ``epoch`` alone (so the relation was empty before it: its changelog
    holds no retraction and each key once) whose rows are exactly the live rows."""
    return (bool(files) and all(f.kind == "log" and f.epoch_min == f.epoch_max == epoch
                                for f in files)
            and sum(f.rows for f in files) == live_rows)


def latest_per_key(log_df: DataFrame, key: list[str], where: str,
                   columns: Sequence[str]) -> DataFrame:
    """The last change of each key (highest epoch, and ``U+`` after ``U-``) where it
    passes ``where``, as the SQL texts ``columns``: one statement (one analysis)."""
    order = f"{EPOCH} DESC, CASE WHEN {OP} = 'U-' THEN 0 ELSE 1 END DESC"
    rank = (f"row_number() OVER (PARTITION BY {', '.join(names_sql(key))} ORDER BY {order})"
            " AS _sf_rn")
    return sql_over(f"SELECT {', '.join(columns)} FROM (SELECT *, {rank} FROM {{_sf_log}})"
                    f" WHERE _sf_rn = 1 AND ({where})", {"_sf_log": log_df})


def _filtered(df: DataFrame, conds: Sequence[str | SparkColumn | None]) -> DataFrame:
    """``df`` where every one of ``conds`` holds (None: no condition): the SQL texts as
    one ``where`` (one driver call, one analysis), then each Column."""
    texts = [c for c in conds if isinstance(c, str)]
    if texts:
        df = df.where(" AND ".join(f"({t})" for t in texts))
    for cond in conds:
        if cond is not None and not isinstance(cond, str):
            df = df.where(cond)
    return df


def delta_metrics(key_column: str | None = None,
                   count_column: str | None = None) -> list[Any]:
    """Rows per ``_op``, the distinct vnodes of a changelog and, with ``key_column``,
    that column's distinct values, with ``count_column`` an estimate of how many
    distinct values it holds, as aggregate columns."""
    metrics = [*[F.expr(f"sum(CAST({OP} = '{op}' AS BIGINT)) AS op{i}")
                 for i, op in enumerate(OPS)],
               F.expr(f"collect_set({VNODE}) AS vnodes")]
    if key_column is not None:
        metrics.append(F.expr(f"collect_set(`{key_column}`) AS key_values"))
    if count_column is not None:
        metrics.append(F.expr(f"approx_count_distinct(`{count_column}`) AS key_count"))
    return metrics


def inserts_observed(files: Sequence[WrittenFile]) -> dict[str, Any]:
    """What ``delta_metrics`` would observe of a changelog of insertions only, written
    as ``files`` with statistics of ``_vnode``: its rows (from the files' footers) and
    the vnodes its files' ranges span, a superset of those it touched (a reader prunes
    by them, so more is safe). No Spark work: a bulk write skips the observation's
    aggregate over every row it writes."""
    vnodes: set[int] = set()
    for f in files:
        lo = f.stats.get("minValues", {}).get(VNODE)
        hi = f.stats.get("maxValues", {}).get(VNODE)
        vnodes.update(range(VNODE_COUNT) if lo is None or hi is None
                      else range(int(lo), int(hi) + 1))
    return {"op0": sum(f.rows for f in files), "vnodes": sorted(vnodes)}


def _rewritten_by(files: Sequence[DataFile], epoch: int) -> bool:
    """Whether ``files`` (a relation's, at ``epoch`` or during it) are all a base that
    ``epoch`` wrote: a rewrite in place of its append (``rewrite``)."""
    return all(f.kind == "base" and f.compaction_epoch == epoch for f in files)


def _no_changelog() -> DataFrame:
    raise AssertionError("a rewritten epoch keeps no changelog: read the difference of "
                         "its snapshots")


def _observed(values: dict[str, Any]) -> Observed:
    counts = {op: int(values.get(f"op{i}") or 0) for i, op in enumerate(OPS)}
    keys = values.get("key_values")
    known = None if keys is None or len(keys) > KEY_VALUES else tuple(keys)
    # exact when the values themselves are known, else the write's estimate
    count = len(known) if known is not None else values.get("key_count")
    return Observed({op: n for op, n in counts.items() if n},
                    tuple(sorted(int(v) for v in values.get("vnodes") or ())), known,
                    None if count is None else int(count))


def _epochs_within(files: Sequence[DataFile], after: int, upto: int) -> str | None:
    """The filter (SQL) that keeps the log rows of ``files`` with ``after < _epoch <=
    upto``: none when the files' statistics already bound their epochs so (a literal
    that changes every epoch would be compiled into new code every epoch)."""
    if all(after < f.epoch_min and f.epoch_max <= upto for f in files):
        return None
    return f"{EPOCH} > {int(after)} AND {EPOCH} <= {int(upto)}"


def _collected_fields(rel: StoredRelation) -> list[T.StructField]:
    """The physical fields a changelog brought to the driver is collected with: all
    but ``_epoch``, which ``_with_epoch`` sets there."""
    return [f for f in physical_struct(rel.columns).fields if f.name != EPOCH]


def _with_epoch(table: pa.Table, epoch: int) -> pa.Table:
    """``table`` with its ``_epoch`` column (before ``_op``, the last) set on the driver:
    a literal in the plan would be compiled into new code every epoch."""
    return table.add_column(table.num_columns - 1, pa.field(EPOCH, pa.int64()),
                            pa.repeat(pa.scalar(epoch, pa.int64()), table.num_rows))


def _add_action(table_path: str, written: WrittenFile, now_ms: int) -> AddAction:
    """The Delta add action of a written data file of the table at ``table_path``."""
    relative = written.uri[len(table_path.rstrip("/")) + 1:]
    return AddAction(relative, written.size, {}, now_ms, True,
                     json.dumps(written.stats, default=str))


def _stat(action: dict[str, Any], which: str, col: str, default: int) -> Any:
    value = action.get(f"{which}.{col}")
    return default if value is None else value


def cast_sql(field: T.StructField) -> str:
    """``CAST(column AS type) AS column`` as SQL text (one driver call for a whole
    row, where a Column per field costs several)."""
    name = quoted(field.name)
    return f"CAST({name} AS {field.dataType.simpleString()}) AS {name}"


#: a Delta checkpoint every this many versions keeps loading a table's log short
CHECKPOINT_EVERY = 50
