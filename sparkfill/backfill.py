"""Backfill: turning an upstream's snapshot plus its live changes into the
changelog of a creating materialized view.

Invariant (all strategies): after epoch ``e`` commits, with ``R(e)`` the key
range backfilled so far, ``MV(e) = Q(U(e) ∩ R(e))``; once the job is done,
``MV(e) = Q(U(e))``. Per epoch, for position ``pos`` (end of what is done):

1. read the next chunk of ``snapshot(e-1)`` above ``pos``: rows in ``(pos, pos']``;
2. emit them as inserts;
3. forward ``Δ_e(U)`` rows with key ``<= pos'``; drop the rest (a later snapshot
   holds them);
4. commit ``pos'`` with the epoch; a chunk that ran out before its limit at the
   last vnode means ``pos' = END``: the job is done.

Progress is explicit state — ``NotStarted``, ``InProgress(pos, rows)``,
``Done(rows)`` — persisted with the epoch.

Strategies: ``no_shuffle`` (one position over the whole key order, chunks of
``snapshot(e-1)``), ``blocking`` (the whole snapshot in one epoch, stalling it),
``buffer`` (chunks of a snapshot pinned at the start, while every upstream Δ is
held in driver memory until the last chunk: the baseline whose memory grows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .changelog import after_images, before_images
from .operators import Change
from .storage.catalog import Relation
from .storage.keyrange import END, LAST_VNODE, Position, le, position_struct
from .storage.meta_store import ProgressRow
from .storage.relation_store import BEFORE_OPS, LIVE_OPS, RelationStore
from .storage.schema import OP, VNODE

__all__ = [
    "NotStarted", "InProgress", "Done", "BackfillState", "state_to_row", "state_from_rows",
    "ScanResult", "BackfillScan", "leaf_change", "pick_vnode_hi",
]


@dataclass(frozen=True)
class NotStarted:
    pass


@dataclass(frozen=True)
class InProgress:
    pos: Position
    rows: int


@dataclass(frozen=True)
class Done:
    rows: int


BackfillState = NotStarted | InProgress | Done

#: the whole key order has one position, stored under this vnode number
WHOLE_ORDER = -1


def state_to_row(mv_id: int, state: BackfillState, pinned_epoch: int | None,
                 leaf: int = 0) -> ProgressRow:
    if isinstance(state, NotStarted):
        return ProgressRow(mv_id, leaf, WHOLE_ORDER, "not_started", None, 0, pinned_epoch)
    if isinstance(state, InProgress):
        return ProgressRow(mv_id, leaf, WHOLE_ORDER, "in_progress", state.pos.to_json(),
                           state.rows, pinned_epoch)
    return ProgressRow(mv_id, leaf, WHOLE_ORDER, "done", None, state.rows, pinned_epoch)


def state_from_rows(rows: Sequence[ProgressRow]) -> tuple[BackfillState, int | None]:
    if not rows:
        return NotStarted(), None
    r = rows[0]
    if r.state == "in_progress":
        return InProgress(Position.from_json(r.pos), r.rows), r.pinned_epoch
    if r.state == "done":
        return Done(r.rows), r.pinned_epoch
    return NotStarted(), r.pinned_epoch


def rows_done(state: BackfillState) -> int:
    return 0 if isinstance(state, NotStarted) else state.rows


def pick_vnode_hi(rows_by_vnode: Sequence[float], pos: Position | None, limit: int) -> int:
    """The last vnode a chunk of ``limit`` rows above ``pos`` needs to read,
    estimated from file statistics (with a margin), so a chunk reads only the
    files of the vnodes it can reach."""
    if pos is None:
        start = 0
    else:
        start = pos.vnode if pos.key is not None else pos.vnode + 1
    acc = 0.0
    for v in range(min(start, LAST_VNODE), LAST_VNODE + 1):
        acc += rows_by_vnode[v]
        if acc >= limit * 1.25:
            return v
    return LAST_VNODE


def leaf_change(upstream: Relation, delta_u: DataFrame | None,
                covered_before: SparkColumn, covered_after: SparkColumn,
                chunk: DataFrame | None) -> Change | None:
    """The change of a leaf's visible rows this epoch: the upstream's changes to
    keys covered after this epoch, plus the chunk (newly covered keys) read from
    the previous snapshot.

    Before-images count only where the MV already holds the key
    (``covered_before``); after-images count where the key is covered after this
    epoch (``covered_after``); chunk rows count unless the epoch changed their key.
    """
    if delta_u is None and chunk is None:
        return None
    up_cols = [c.name for c in upstream.columns]
    afters: list[DataFrame] = []
    before: DataFrame | None = None
    if delta_u is not None:
        before = before_images(delta_u).where(covered_before).select(*up_cols)
        afters.append(after_images(delta_u).where(covered_after).select(*up_cols))
    if chunk is not None:
        if delta_u is not None:
            chunk = chunk.join(delta_u.select(*upstream.key).distinct(), list(upstream.key),
                               "left_anti")
        afters.append(chunk.select(*up_cols))
    after = afters[0]
    for extra in afters[1:]:
        after = after.unionByName(extra)
    return Change(after.limit(0) if before is None else before, after)


def position_covered(pos: Position | None, upstream: Relation) -> SparkColumn:
    """Keys at or below a whole-order position."""
    return le(pos, upstream.stored.key_columns)


@dataclass
class ScanResult:
    change: Change | None
    state: BackfillState
    pinned_epoch: int | None
    chunk_rows: int
    cached: list[DataFrame]
    #: progress rows to persist, when the strategy keeps more than one position
    progress_rows: list[ProgressRow] | None = None


class BackfillScan:
    """Runs one epoch of a creating MV's backfill scan."""

    def __init__(self, spark: SparkSession, store: RelationStore) -> None:
        self.spark = spark
        self.store = store
        #: buffer strategy: the upstream changes held in memory, per MV
        self.buffers: dict[tuple[int, int], list[pa.Table]] = {}

    def forget(self, mv_id: int) -> None:
        """Drop what the buffer strategy holds for an MV (cancelled or restarted)."""
        for k in [k for k in self.buffers if k[0] == mv_id]:
            del self.buffers[k]

    def _chunk(self, upstream: Relation, epoch: int, pos: Position | None,
               limit: int | None, live_rows: int | None = None,
               ) -> tuple[DataFrame | None, Position | None, int]:
        """Read the next chunk of ``snapshot(epoch)`` above ``pos``; ``live_rows``
        (the upstream's row count at ``epoch``, when known) sharpens the estimate
        of how many vnodes the chunk needs."""
        if limit == 0:
            return None, pos, 0
        up = upstream.stored
        if limit is None:
            chunk = self.store.snapshot(up, epoch, after=pos)
            chunk = chunk.persist(StorageLevel.MEMORY_AND_DISK)
            self.store.spark_jobs += 1
            return chunk, END, chunk.count()
        estimate = self.store.estimate_rows_by_vnode(up, epoch, live_rows)
        hi = pick_vnode_hi(estimate, pos, limit)
        snap = self.store.snapshot(up, epoch, after=pos, vnode_hi=hi)
        chunk = snap.orderBy(VNODE, *up.key).limit(limit).persist(StorageLevel.MEMORY_AND_DISK)
        stats = chunk.agg(F.count(F.lit(1)).alias("n"),
                          F.max(position_struct(up.key_columns)).alias("last")).collect()[0]
        self.store.spark_jobs += 1
        n = int(stats["n"])
        if n >= limit:
            last = stats["last"]
            new_pos = Position(int(last["v"]),
                               tuple(last[f"k{i}"] for i in range(len(up.key))))
        else:
            new_pos = Position(hi, None)
        return chunk, new_pos, n

    def run(self, mv: Relation, leaf: int, upstream: Relation, state: BackfillState,
            pinned_epoch: int | None, limit: int | None, delta_u: DataFrame | None,
            epoch: int) -> ScanResult:
        assert mv.options is not None
        strategy = mv.options.strategy
        if isinstance(state, Done):  # a finished leaf: all of its changes flow
            change = leaf_change(upstream, delta_u, F.lit(True), F.lit(True), None)
            return ScanResult(change, state, pinned_epoch, 0, [])
        pos = state.pos if isinstance(state, InProgress) else None
        done_rows = rows_done(state)
        if strategy == "buffer":
            return self._run_buffer((mv.id, leaf), upstream, state, pinned_epoch, limit,
                                    delta_u, epoch)
        chunk_limit = None if strategy == "blocking" else limit
        chunk, new_pos, n = self._chunk(upstream, epoch - 1, pos, chunk_limit,
                                        upstream.row_count)
        cached = [chunk] if chunk is not None else []
        change = leaf_change(upstream, delta_u, position_covered(pos, upstream),
                             position_covered(new_pos, upstream), chunk)
        if new_pos is not None and new_pos.is_end:
            new_state: BackfillState = Done(done_rows + n)
        elif new_pos is None:
            new_state = NotStarted()
        else:
            new_state = InProgress(new_pos, done_rows + n)
        return ScanResult(change, new_state, pinned_epoch, n, cached)

    def _run_buffer(self, job: tuple[int, int], upstream: Relation, state: BackfillState,
                    pinned_epoch: int | None, limit: int | None, delta_u: DataFrame | None,
                    epoch: int) -> ScanResult:
        if isinstance(state, NotStarted) or pinned_epoch is None:
            pinned_epoch = epoch - 1
            self.buffers[job] = []
        buffer = self.buffers.setdefault(job, [])
        if delta_u is not None:
            buffer.append(delta_u.withColumn("_sf_e", F.lit(epoch)).toArrow())
        pos = state.pos if isinstance(state, InProgress) else None
        chunk, new_pos, n = self._chunk(upstream, pinned_epoch, pos, limit)
        cached = [chunk] if chunk is not None else []
        total = rows_done(state) + n
        if new_pos is None or not new_pos.is_end:
            change = None
            if chunk is not None:
                change = leaf_change(upstream, None, F.lit(False), F.lit(True), chunk)
            new_state: BackfillState = (NotStarted() if new_pos is None
                                        else InProgress(new_pos, total))
            return ScanResult(change, new_state, pinned_epoch, n, cached)
        span = self._span_changelog(upstream, buffer)
        change = leaf_change(upstream, span, position_covered(pos, upstream), F.lit(True),
                             chunk)
        self.buffers.pop(job, None)
        return ScanResult(change, Done(total), pinned_epoch, n, cached)

    def _span_changelog(self, upstream: Relation, buffer: list[pa.Table]) -> DataFrame | None:
        """One changelog from the pinned snapshot to now: per key, the before-image
        of its first change and the after-image of its last."""
        if not buffer:
            return None
        table = pa.concat_tables(buffer)
        if table.num_rows == 0:
            return None
        df = self.spark.createDataFrame(table)
        key = list(upstream.key)
        bounds = df.groupBy(*key).agg(F.min("_sf_e").alias("_sf_first"),
                                      F.max("_sf_e").alias("_sf_last"))
        df = df.join(bounds, key)
        first_before = df.where((F.col("_sf_e") == F.col("_sf_first"))
                                & F.col(OP).isin(*BEFORE_OPS)).withColumn(OP, F.lit("-"))
        last_after = df.where((F.col("_sf_e") == F.col("_sf_last"))
                              & F.col(OP).isin(*LIVE_OPS)).withColumn(OP, F.lit("+"))
        cols = [c.name for c in upstream.columns] + [VNODE, OP]
        return first_before.select(*cols).unionByName(last_after.select(*cols))

    def buffered_bytes(self) -> int:
        return sum(t.nbytes for tables in self.buffers.values() for t in tables)
