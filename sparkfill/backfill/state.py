"""Backfill: turning an upstream's snapshot plus its live changes into the
changelog of a creating materialized view — the state and the rule every
strategy shares.

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
``Done(rows)`` — persisted with the epoch. ``leaf_change`` is steps 2 and 3 (the
leaf's change for the epoch), ``ScanResult`` what a strategy's epoch returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame

from ..dataflow.change import Change
from ..storage.catalog import Relation
from ..storage.keyrange import Position
from ..storage.meta_store import ProgressRow
from ..storage.relation_store import IS_BEFORE, IS_LIVE, RelationStore
from ..storage.schema import names_sql
from ..storage.spark_files import ONE_TASK_ROWS

__all__ = [
    "NotStarted", "InProgress", "Done", "BackfillState", "state_to_row", "state_from_rows",
    "rows_done", "leaf_change", "Held", "held_rows", "held_rows_in", "ScanResult",
    "DRIVER_HELD_ROWS",
]

#: a leaf whose files hold at most this many rows has a few groups' held rows (a lost
#: min/max found again in it) read on the driver: pyarrow reads 1,000,000 rows in
#: about a tenth of a second, where Spark's scan is a job and its plan (about 1.5 s)
DRIVER_HELD_ROWS = 2_000_000


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


def leaf_change(upstream: Relation, delta_u: DataFrame | None,
                covered_before: SparkColumn, covered_after: SparkColumn,
                chunk: DataFrame | None) -> Change | None:
    """The change of a leaf's visible rows this epoch: the upstream's changes to
    keys covered after this epoch, plus the chunk (newly covered keys) read from
    the previous snapshot.

    Before-images count only where the MV already holds the key
    (``covered_before``); after-images count where the key is covered after this
    epoch (``covered_after``); chunk rows count unless the epoch changed their key,
    as the change's ``fresh`` rows (no other image shares their keys).
    """
    if delta_u is None and chunk is None:
        return None
    up_cols = names_sql([c.name for c in upstream.columns])
    fresh = None
    if chunk is not None:
        if delta_u is not None:
            chunk = chunk.join(delta_u.selectExpr(*names_sql(upstream.key)).distinct(),
                               list(upstream.key), "left_anti")
        fresh = chunk.selectExpr(*up_cols)
    if delta_u is None:
        assert fresh is not None
        return Change(None, fresh)
    changes = delta_u  # the images' plans are built when a consumer reads them
    return Change(lambda: changes.where(IS_BEFORE).where(covered_before).selectExpr(*up_cols),
                  lambda: changes.where(IS_LIVE).where(covered_after).selectExpr(*up_cols),
                  fresh)


@dataclass(frozen=True)
class Held:
    """The rows of a leaf an MV held before an epoch: the leaf's snapshot at ``epoch``
    where ``covered`` (over its columns and ``_vnode``; None: every row). An aggregate
    reads them only to find a min/max that a retraction took away; a join side whose
    state is not kept reads them as that state. ``empty``: ``covered`` holds no row
    (the backfill has not reached the leaf), so they are known to be none."""

    epoch: int
    covered: SparkColumn | None = None
    empty: bool = False


def held_rows(store: RelationStore, leaf: Relation, held: Held,
              narrow: str | None = None) -> DataFrame:
    """The rows ``held`` names, as ``leaf``'s columns: a small leaf's read as a few
    rows (merged in the read's own job), a large one's as bulk work. ``narrow``: a
    condition over the leaf's columns that every row the caller keeps passes
    (``RelationStore.snapshot``'s)."""
    small = leaf.row_count <= ONE_TASK_ROWS
    rows = store.snapshot(leaf.stored, held.epoch, few=small, bulk=not small,
                          narrow=narrow)
    if held.covered is not None:
        rows = rows.where(held.covered)
    return rows.selectExpr(*names_sql([c.name for c in leaf.columns]))


def held_rows_in(store: RelationStore, leaf: Relation, held: Held, column: str,
                 values: Sequence[object]) -> DataFrame | None:
    """The rows ``held`` names whose ``column`` holds one of ``values``, read on the
    driver (``RelationStore.rows_in_on_driver``) when the leaf's files hold at most
    ``DRIVER_HELD_ROWS`` rows; None — read them by ``held_rows`` — otherwise, or
    when ``held`` is a part of the leaf (a backfill's)."""
    if held.covered is not None:
        return None
    return store.rows_in_on_driver(leaf.stored, held.epoch, column, values, DRIVER_HELD_ROWS)


@dataclass
class ScanResult:
    change: Change | None
    state: BackfillState
    pinned_epoch: int | None
    chunk_rows: int
    cached: list[DataFrame]
    #: progress rows to persist, when the strategy keeps more than one position
    progress_rows: list[ProgressRow] | None = None
    #: what the MV held of the leaf before this epoch (None: the leaf's rows at ``e-1``)
    held: Held | None = None
