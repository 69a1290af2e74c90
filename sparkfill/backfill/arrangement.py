"""Arrangement backfill: one backfill position per vnode.

Invariant: with ``covered(P)`` the keys whose vnode is done, or at or below its
vnode's position in progress ``P``, after every epoch
``MV(e) = Q(U(e) ∩ covered(P_e))``. Each epoch reads, from ``snapshot(e-1)``, the
next rows of a set of *active* vnodes (at most a quota each, so a chunk is a
bounded number of rows), in as many Spark tasks as the job's parallelism; a
vnode whose read came back short of its quota is done. Progress is per vnode —
``NotStarted``, ``InProgress(pos, rows)``, ``Done(rows)`` — so it does not depend
on how many tasks read it: the parallelism can change between epochs and after
a restart. When the next pending vnodes fit the budget whole (bounded by the rows
of the files that can hold them), a chunk is those files read as they are: no
ordering by key, no shuffle, no cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..dataflow.change import Change
from ..storage.catalog import Relation
from ..storage.keyrange import Position, covered, position_struct
from ..storage.meta_store import ProgressRow
from ..storage.relation_store import DataFile, RelationStore
from ..storage.schema import VNODE, VNODE_COUNT
from .state import BackfillState, Done, InProgress, NotStarted, leaf_change

__all__ = ["VnodeProgress", "ArrangementScan", "ArrangementResult"]


@dataclass(frozen=True)
class VnodeProgress:
    """The backfill state of each of the 256 vnodes."""

    states: tuple[BackfillState, ...]

    @staticmethod
    def new() -> VnodeProgress:
        return VnodeProgress(tuple(NotStarted() for _ in range(VNODE_COUNT)))

    @staticmethod
    def from_rows(rows: Sequence[ProgressRow]) -> VnodeProgress:
        states: list[BackfillState] = [NotStarted() for _ in range(VNODE_COUNT)]
        for r in rows:
            if not 0 <= r.vnode < VNODE_COUNT:
                continue
            if r.state == "in_progress":
                states[r.vnode] = InProgress(Position.from_json(r.pos), r.rows)
            elif r.state == "done":
                states[r.vnode] = Done(r.rows)
        return VnodeProgress(tuple(states))

    def to_rows(self, mv_id: int, since: VnodeProgress | None = None,
                leaf: int = 0) -> list[ProgressRow]:
        """Rows of the vnodes that changed since ``since`` (all when None)."""
        rows = []
        for v, s in enumerate(self.states):
            if since is not None and since.states[v] == s:
                continue
            if isinstance(s, InProgress):
                rows.append(ProgressRow(mv_id, leaf, v, "in_progress", s.pos.to_json(), s.rows,
                                        None))
            elif isinstance(s, Done):
                rows.append(ProgressRow(mv_id, leaf, v, "done", None, s.rows, None))
            else:
                rows.append(ProgressRow(mv_id, leaf, v, "not_started", None, 0, None))
        return rows

    @property
    def rows_done(self) -> int:
        return sum(0 if isinstance(s, NotStarted) else s.rows for s in self.states)

    @property
    def vnodes_done(self) -> int:
        return sum(isinstance(s, Done) for s in self.states)

    @property
    def is_done(self) -> bool:
        return self.vnodes_done == VNODE_COUNT

    def covered(self, upstream: Relation) -> F.Column:
        done = [v for v, s in enumerate(self.states) if isinstance(s, Done)]
        positions = {v: s.pos.key for v, s in enumerate(self.states)
                     if isinstance(s, InProgress) and s.pos.key is not None}
        return covered(done, positions, upstream.stored.key_columns)


#: read whole vnodes when the next ones fit the budget (off: every chunk by quota)
WHOLE_VNODES = True


def choose_whole(progress: VnodeProgress, files: Sequence[DataFile], budget: int) -> list[int]:
    """The next pending vnodes, in order, that a chunk of at most ``budget`` rows can
    read whole: the rows of every file whose vnode range meets them (a bound on their
    live rows, whatever the estimate says) fit the budget. None when the first pending
    vnode's files alone do not."""
    chosen: list[int] = []
    met: set[int] = set()
    bound = 0
    for v, s in enumerate(progress.states):
        if isinstance(s, Done):
            continue
        new = [i for i, f in enumerate(files)
               if i not in met and f.vnode_min <= v <= f.vnode_max]
        extra = sum(files[i].rows for i in new)
        if bound + extra > budget:
            break
        chosen.append(v)
        met.update(new)
        bound += extra
    return chosen


def choose_active(progress: VnodeProgress, estimate: Sequence[float], budget: int,
                  parallelism: int) -> list[int]:
    """The vnodes to read this epoch: pending vnodes in order until their estimated
    remaining rows cover the budget, and at least ``parallelism`` of them."""
    active: list[int] = []
    acc = 0.0
    for v, s in enumerate(progress.states):
        if isinstance(s, Done):
            continue
        remaining = max(1.0, estimate[v] - (s.rows if isinstance(s, InProgress) else 0))
        active.append(v)
        acc += remaining
        if acc >= budget * 1.25 and len(active) >= parallelism:
            break
    return active


@dataclass
class ArrangementResult:
    change: Change | None
    progress: VnodeProgress
    chunk_rows: int
    cached: list[DataFrame]


class ArrangementScan:
    def __init__(self, spark: SparkSession, store: RelationStore) -> None:
        self.spark = spark
        self.store = store

    def run(self, upstream: Relation, progress: VnodeProgress, budget: int,
            parallelism: int, delta_u: DataFrame | None, epoch: int) -> ArrangementResult:
        cached: list[DataFrame] = []
        new_progress, chunk, n = progress, None, 0
        if budget > 0 and not progress.is_done:
            new_progress, chunk, n, cached = self._read(upstream, progress, budget,
                                                        parallelism, epoch - 1)
        change = leaf_change(upstream, delta_u, progress.covered(upstream),
                             new_progress.covered(upstream), chunk)
        return ArrangementResult(change, new_progress, n, cached)

    def _read(self, upstream: Relation, progress: VnodeProgress, budget: int,
              parallelism: int, epoch: int,
              ) -> tuple[VnodeProgress, DataFrame, int, list[DataFrame]]:
        """Read the next rows of the active vnodes of ``snapshot(epoch)``; returns the
        new progress, the chunk, its rows and what the read cached (to release)."""
        up = upstream.stored
        files = self.store.files_at(up, epoch)
        whole = choose_whole(progress, files, budget) if WHOLE_VNODES else []
        if whole:
            return (*self._read_whole(upstream, progress, whole, epoch, files), [])
        estimate = self.store.estimate_rows_by_vnode(up, epoch, upstream.row_count)
        active = choose_active(progress, estimate, budget, parallelism)
        quota = max(1, math.ceil(budget / len(active)))
        rows = self.store.snapshot(up, epoch, vnodes=active, bulk=True)
        started = {v: s.pos.key for v in active
                   if isinstance(s := progress.states[v], InProgress) and s.pos.key is not None}
        if started:
            rows = rows.where(~covered([], started, up.key_columns))
        order = Window.partitionBy(VNODE).orderBy(*up.key)
        chunk = (rows.repartition(max(1, parallelism), VNODE)
                 .withColumn("_sf_rn", F.row_number().over(order))
                 .where(F.col("_sf_rn") <= quota).drop("_sf_rn")
                 .persist(StorageLevel.MEMORY_AND_DISK))
        stats = {int(r["v"]): (int(r["n"]), r["last"]) for r in chunk.groupBy(
            F.col(VNODE).alias("v")).agg(F.count(F.lit(1)).alias("n"),
                                         F.max(position_struct(up.key_columns)).alias("last"),
                                         ).collect()}
        self.store.spark_jobs += 1
        states = list(progress.states)
        total = 0
        for v in active:
            n_v, last = stats.get(v, (0, None))
            total += n_v
            before = states[v]
            done_rows = 0 if isinstance(before, NotStarted) else before.rows
            if n_v < quota:
                states[v] = Done(done_rows + n_v)
            else:
                key = tuple(last[f"k{i}"] for i in range(len(up.key)))
                states[v] = InProgress(Position(v, key), done_rows + n_v)
        return VnodeProgress(tuple(states)), chunk, total, [chunk]

    def _read_whole(self, upstream: Relation, progress: VnodeProgress, whole: Sequence[int],
                    epoch: int, files: Sequence[DataFile],
                    ) -> tuple[VnodeProgress, DataFrame, int]:
        """Read the rest of each of the vnodes ``whole`` from ``snapshot(epoch)``: their
        files, no shuffle and no cache; the rows per vnode, for progress, are counted
        by a job that reads the vnode column alone."""
        up = upstream.stored
        chunk = self.store.snapshot(up, epoch, vnodes=whole, files=files, bulk=True)
        started = {v: s.pos.key for v in whole
                   if isinstance(s := progress.states[v], InProgress) and s.pos.key is not None}
        if started:
            chunk = chunk.where(~covered([], started, up.key_columns))
        counts = {int(r[0]): int(r[1])
                  for r in chunk.groupBy(VNODE).count().collect()}
        self.store.spark_jobs += 1
        states = list(progress.states)
        for v in whole:
            before = states[v]
            states[v] = Done((0 if isinstance(before, NotStarted) else before.rows)
                             + counts.get(v, 0))
        return VnodeProgress(tuple(states)), chunk, sum(counts.values())
