"""Arrangement backfill: one backfill position per vnode.

Invariant: with ``covered(P)`` the keys whose vnode is done, or at or below its
vnode's position in progress ``P``, after every epoch
``MV(e) = Q(U(e) ∩ covered(P_e))``. Each epoch reads, from ``snapshot(e-1)``, the
next rows of a set of *active* vnodes (at most a quota each, so a chunk is a
bounded number of rows), in as many Spark tasks as the job's parallelism; a
vnode whose read came back short of its quota is done. When the budget holds the
estimated remaining rows of one or more pending vnodes, those are read whole,
without a quota (no shuffle to number their rows), and are done. Progress is per vnode —
``NotStarted``, ``InProgress(pos, rows)``, ``Done(rows)`` — so it does not depend
on how many tasks read it: the parallelism can change between epochs and after
a restart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..dataflow.cached import persisted
from ..dataflow.change import Change
from ..storage.catalog import Relation
from ..storage.keyrange import Position, covered, position_struct
from ..storage.meta_store import ProgressRow
from ..storage.relation_store import RelationStore
from ..storage.schema import VNODE, VNODE_COUNT
from .state import BackfillState, Done, Held, InProgress, NotStarted, leaf_change

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

    @property
    def is_untouched(self) -> bool:
        """No vnode's backfill has begun: the MV holds none of the leaf's rows."""
        return all(isinstance(s, NotStarted) for s in self.states)

    def covered(self, upstream: Relation) -> F.Column:
        done = [v for v, s in enumerate(self.states) if isinstance(s, Done)]
        positions = {v: s.pos.key for v, s in enumerate(self.states)
                     if isinstance(s, InProgress) and s.pos.key is not None}
        return covered(done, positions, upstream.stored.key_columns)


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (whole numbers that sum to it,
    the largest remainders rounded up; equal shares when every weight is zero)."""
    if not weights:
        return []
    w = [max(0.0, x) for x in weights]
    if not any(w):
        w = [1.0] * len(w)
    scale = sum(w)
    exact = [total * x / scale for x in w]
    shares = [math.floor(x) for x in exact]
    for i in sorted(range(len(w)), key=lambda i: shares[i] - exact[i])[:total - sum(shares)]:
        shares[i] += 1
    return shares


def choose_whole(progress: VnodeProgress, estimate: Sequence[float], budget: int) -> list[int]:
    """The pending vnodes, in order, whose estimated remaining rows all fit in the
    budget: read whole (no quota), they are done after this epoch. Empty when the
    first pending vnode alone is estimated above the budget (a small chunk)."""
    whole: list[int] = []
    acc = 0.0
    for v, s in enumerate(progress.states):
        if isinstance(s, Done):
            continue
        acc += max(1.0, estimate[v] - (s.rows if isinstance(s, InProgress) else 0))
        if acc > budget:
            break
        whole.append(v)
    return whole


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
    #: what the MV held of the leaf before this epoch
    held: Held


class ArrangementScan:
    def __init__(self, spark: SparkSession, store: RelationStore) -> None:
        self.spark = spark
        self.store = store

    def run(self, upstream: Relation, progress: VnodeProgress, budget: int,
            parallelism: int, delta_u: DataFrame | None, epoch: int) -> ArrangementResult:
        new_progress, chunk, n, cached = progress, None, 0, False
        if budget > 0 and not progress.is_done:
            new_progress, chunk, n, cached = self._read(upstream, progress, budget,
                                                        parallelism, epoch - 1)
        covered_before = progress.covered(upstream)
        change = leaf_change(upstream, delta_u, covered_before,
                             new_progress.covered(upstream), chunk)
        return ArrangementResult(change, new_progress, n,
                                 [chunk] if chunk is not None and cached else [],
                                 Held(epoch - 1, covered_before, progress.is_untouched))

    def _read(self, upstream: Relation, progress: VnodeProgress, budget: int,
              parallelism: int, epoch: int) -> tuple[VnodeProgress, DataFrame, int, bool]:
        """Read the next rows of the active vnodes of ``snapshot(epoch)``: the new
        progress, the rows, how many, and whether they are cached."""
        up = upstream.stored
        estimate = self.store.estimate_rows_by_vnode(up, epoch, upstream.row_count)
        # vnodes that fit the budget whole are read as they are: no per-vnode quota, so
        # no shuffle and sort to number each vnode's rows, and each is done after it
        active = choose_whole(progress, estimate, budget)
        whole = bool(active)
        if not whole:
            active = choose_active(progress, estimate, budget, parallelism)
        quota = max(1, math.ceil(budget / len(active)))
        rows = self.store.snapshot(up, epoch, vnodes=active, bulk=True)
        started = {v: s.pos.key for v in active
                   if isinstance(s := progress.states[v], InProgress) and s.pos.key is not None}
        if started:
            rows = rows.where(~covered([], started, up.key_columns))
        aggs = [F.count(F.lit(1)).alias("n")]
        if not whole:  # a quota of each vnode: its rows numbered, its last key kept
            order = Window.partitionBy(VNODE).orderBy(*up.key)
            rows = (rows.repartition(max(1, parallelism), VNODE)
                    .withColumn("_sf_rn", F.row_number().over(order))
                    .where(F.col("_sf_rn") <= quota).drop("_sf_rn"))
            aggs.append(F.max(position_struct(up.key_columns)).alias("last"))
        cached = not (whole and len(active) == VNODE_COUNT and not started)
        if not cached:
            # the whole snapshot, in one epoch, read as a blocking CREATE reads it: not
            # cached, each reader of the chunk (the MV's Δ) scans the files, which
            # costs less than a cache of millions of rows (4M rows: 7.1 s to cache,
            # 1.2 s a scan); its rows are the upstream's count at ``epoch`` (the
            # catalog's), so no job counts them, and each vnode's share of the count
            # (progress only) follows the file statistics
            chunk = rows
            shares = apportion(upstream.row_count, [estimate[v] for v in active])
            stats: dict[int, tuple[int, Any]] = {
                v: (n, None) for v, n in zip(active, shares, strict=True)}
        else:
            # cached: numbering a quota's rows is a shuffle and a sort, and vnodes read
            # whole share files with the vnodes not read (each reader would scan them)
            chunk = persisted(rows)
            stats = {int(r["v"]): (int(r["n"]), None if whole else r["last"])
                     for r in chunk.groupBy(F.col(VNODE).alias("v")).agg(*aggs).collect()}
            self.store.spark_jobs += 1
        states = list(progress.states)
        total = 0
        for v in active:
            n_v, last = stats.get(v, (0, None))
            total += n_v
            before = states[v]
            done_rows = 0 if isinstance(before, NotStarted) else before.rows
            if whole or n_v < quota:
                states[v] = Done(done_rows + n_v)
            else:
                key = tuple(last[f"k{i}"] for i in range(len(up.key)))
                states[v] = InProgress(Position(v, key), done_rows + n_v)
        return VnodeProgress(tuple(states)), chunk, total, cached
