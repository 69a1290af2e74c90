"""The default backfill strategies: one position over the whole key order.

Invariant: the rule of ``state.py`` with a single position ``pos`` per leaf;
``no_shuffle`` reads chunks of ``snapshot(e-1)`` in ``(_vnode, pk...)`` order,
``blocking`` the whole snapshot in one epoch (stalling it), ``buffer`` chunks of a
snapshot pinned at the start, while every upstream Δ is held in driver memory
until the last chunk (the baseline whose memory grows). A chunk reads only the
files of the vnodes it can reach (``pick_vnode_hi``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..dataflow.cached import persisted
from ..storage.catalog import Relation
from ..storage.keyrange import END, LAST_VNODE, Position, le, position_struct
from ..storage.relation_store import IS_BEFORE, IS_LIVE, RelationStore
from ..storage.schema import OP, VNODE
from .state import (
    BackfillState,
    Done,
    Held,
    InProgress,
    NotStarted,
    ScanResult,
    leaf_change,
    rows_done,
)

__all__ = ["BackfillScan", "pick_vnode_hi", "position_covered"]


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


def position_covered(pos: Position | None, upstream: Relation) -> SparkColumn:
    """Keys at or below a whole-order position."""
    return le(pos, upstream.stored.key_columns)


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
        if limit is None and pos is None and live_rows is not None:
            # the whole snapshot: its rows are the upstream's count at ``epoch`` (the
            # catalog's), so it needs no count job; its consumers each read it (a
            # cache would cost more to build than a read of the files)
            return self.store.snapshot(up, epoch, bulk=True), END, live_rows
        if limit is None:
            chunk = self.store.snapshot(up, epoch, after=pos, bulk=True)
            chunk = persisted(chunk)
            self.store.spark_jobs += 1
            return chunk, END, chunk.count()
        estimate = self.store.estimate_rows_by_vnode(up, epoch, live_rows)
        hi = pick_vnode_hi(estimate, pos, limit)
        snap = self.store.snapshot(up, epoch, after=pos, vnode_hi=hi, bulk=True)
        chunk = persisted(snap.orderBy(VNODE, *up.key).limit(limit))
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
        covered_before = position_covered(pos, upstream)
        change = leaf_change(upstream, delta_u, covered_before,
                             position_covered(new_pos, upstream), chunk)
        if new_pos is not None and new_pos.is_end:
            new_state: BackfillState = Done(done_rows + n)
        elif new_pos is None:
            new_state = NotStarted()
        else:
            new_state = InProgress(new_pos, done_rows + n)
        return ScanResult(change, new_state, pinned_epoch, n, cached,
                          held=Held(epoch - 1, covered_before, empty=pos is None))

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
            return ScanResult(change, new_state, pinned_epoch, n, cached,
                              held=Held(pinned_epoch, position_covered(pos, upstream),
                                        empty=pos is None))
        span = self._span_changelog(upstream, buffer)
        covered_before = position_covered(pos, upstream)
        change = leaf_change(upstream, span, covered_before, F.lit(True), chunk)
        self.buffers.pop(job, None)
        return ScanResult(change, Done(total), pinned_epoch, n, cached,
                          held=Held(pinned_epoch, covered_before, empty=pos is None))

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
        first_before = df.where(f"_sf_e = _sf_first AND {IS_BEFORE}").withColumn(OP, F.lit("-"))
        last_after = df.where(f"_sf_e = _sf_last AND {IS_LIVE}").withColumn(OP, F.lit("+"))
        cols = [c.name for c in upstream.columns] + [VNODE, OP]
        return first_before.select(*cols).unionByName(last_after.select(*cols))

    def buffered_bytes(self) -> int:
        return sum(t.nbytes for tables in self.buffers.values() for t in tables)
