"""Recomputing an MV from whole inputs: the rows of the MV and of each of its state
tables over its leaves' rows, and, for a created MV, their difference from what
they held, appended as the epoch's Δs.

Invariants:

* ``contents`` of leaf rows ``V`` is what the incremental rules leave after
  taking in ``V`` from empty: ``Q(V)`` for the MV (hidden columns included) and,
  for each state table, what its operator's module says it keeps. The snapshot
  strategy's phase 1 builds an MV's first rows with it; ``recompute`` builds a
  created MV's rows at an epoch with it.
* ``recompute`` in epoch ``e`` appends to each state table kept (a join side not
  kept stays so: ``join.py``), and returns as the
  MV's Δ, the consolidated difference between its rows at ``e-1`` and the
  ``contents`` of its leaves at ``e``: downstream MVs, sinks and time travel see
  exactly the changelog an incremental epoch would have written (``changelog``).
  The difference is a keyed comparison run by Spark (one exchange per relation,
  no collect): its cost is a scan of the leaves and of the MV's own relations. A
  relation compared whole whose changelog nothing reads (``Rewrite``) is not
  compared: its rows are written as its new base, and no Δ is kept.
  Rows that are one leaf's rows one by one take that leaf's change, mapped, as
  their difference — except in a repair (``ALTER ... RECOMPUTE``), which trusts
  nothing a relation holds and compares them whole too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..sql.planner import JOIN_KEY, WINDOW_PART
from ..storage.catalog import Relation
from ..storage.relation_store import RelationStore
from ..storage.schema import OP, names_sql
from . import aggregate, join, project, union, window
from .change import Change, Emit
from .changelog import consolidate, union_all
from .keys import SCAN_ROWS
from .mv import stage_input_rows

__all__ = ["Target", "leaf_part", "contents", "recompute", "mapped_change", "difference",
           "Replace", "Rewrite", "REWRITE_MAPPED_FRACTION"]


@dataclass(frozen=True)
class Target:
    """The rows one relation holds over whole inputs."""

    rel: Relation
    #: the relation's columns (no ``_vnode``)
    rows: DataFrame
    #: the columns whose hash is a row's vnode (empty: the relation's key)
    dist: tuple[str, ...]
    #: about how many rows it holds; None: one per group of an aggregate (known once
    #: its state's write observed them, else estimated)
    rows_hint: int | None
    #: an aggregate MV's input rows, from which its groups can be estimated
    stage_rows: DataFrame | None = None
    #: the leaf whose rows these are row by row (``leaf_part``: a join side's state,
    #: the stage's state over one leaf, the rows of a filter/project); None: rows
    #: of several leaves' rows together (a join's, a group's, a window's)
    leaf: int | None = None
    #: the rows keep the partitions of one leaf's rows as read, and each row the
    #: vnode of the leaf row it comes from (``project.keeps_leaf_vnodes``: a
    #: filter/project's, or an inner join's whose other sides are small and
    #: broadcast): a rewrite writes them as read, with no exchange
    as_read: bool = False


def leaf_part(mv: Relation, states: Sequence[Relation], leaf: int, rows: DataFrame) -> DataFrame:
    """What rows of leaf ``leaf`` contribute, computed per leaf (a snapshot job's
    chunk): a join side's state rows, the aggregate's or the window functions'
    input rows, a UNION ALL branch's rows, or (filter/project) the MV's rows."""
    plan = mv.plan
    assert plan is not None
    if plan.branches:
        return union.project_branch(plan, leaf, rows).select(*[c.name for c in mv.columns])
    if plan.join is not None:
        return join.side_rows(plan, leaf, rows, states[leaf])
    projected = project.project(plan, [rows])
    if plan.agg is not None or plan.window is not None:
        return stage_input_rows(plan, states[-1], projected)
    return projected.select(*[c.name for c in mv.columns])


def contents(mv: Relation, leaves: Sequence[Relation], states: Sequence[Relation],
             parts: Callable[[int, Relation], DataFrame],
             leaf_rows: Sequence[int]) -> list[Target]:
    """The rows of the state tables an operator keeps (first) and of the MV (last)
    over whole inputs; ``parts(i, rel)``: leaf ``i``'s ``leaf_part``, with ``rel``'s
    columns (the relation ``leaf_part`` gives rows of: the join side's or the stage's
    state table, or the MV); ``leaf_rows[i]``: about how many rows leaf ``i`` holds."""
    plan = mv.plan
    assert plan is not None
    targets: list[Target] = []
    staged = plan.agg is not None or plan.window is not None
    stage_rows: DataFrame | None = None
    mv_rows: DataFrame | None = None
    mv_hint: int | None = None
    mv_leaf: int | None = None
    input_rows = max(leaf_rows, default=0)
    mv_as_read = False
    if plan.join is not None:
        sides = []
        for side, state in enumerate(states[:2]):
            rows = parts(side, state)
            targets.append(Target(state, rows, (JOIN_KEY,), leaf_rows[side], leaf=side))
            sides.append(rows.select(*[c.name for c in leaves[side].columns]))
        large = [i for i, n in enumerate(leaf_rows) if n > SCAN_ROWS]
        if not staged and len(large) == 1 and project.keeps_leaf_vnodes(mv, leaves, large[0]):
            # the small side broadcast: the large side's rows keep their partitions
            small = 1 - large[0]
            sides[small] = F.broadcast(sides[small])
            mv_as_read = True
        joined = project.project(plan, sides)
        if staged:
            stage_rows = stage_input_rows(plan, states[-1], joined)
        else:
            mv_rows, mv_hint = joined.select(*[c.name for c in mv.columns]), input_rows
    elif staged:
        stage_rows = parts(0, states[-1])
    else:  # filter/project, or a UNION ALL: one leaf's rows after another's
        mv_rows = union_all([parts(leaf, mv) for leaf in range(len(leaf_rows))])
        mv_hint = sum(leaf_rows)
        mv_leaf = 0 if len(leaf_rows) == 1 else None
        mv_as_read = mv_leaf is not None and project.keeps_leaf_vnodes(mv, leaves, 0)
    dist: tuple[str, ...] = ()
    if stage_rows is not None:
        state = states[-1]
        if plan.agg is not None:
            mv_rows = aggregate.evaluate(mv, plan, stage_rows)
        else:
            mv_rows, mv_hint = window.evaluate_window(mv, plan, stage_rows), input_rows
            dist = (WINDOW_PART,)  # an MV of window functions is distributed by partition
        if plan.agg is None or aggregate.keeps_input(plan.agg):
            targets.append(Target(state, stage_rows, (state.key[0],), input_rows,
                                  leaf=None if plan.join is not None else 0))
    assert mv_rows is not None
    targets.append(Target(mv, mv_rows, dist, mv_hint,
                          stage_rows if plan.agg is not None else None, mv_leaf,
                          mv_as_read and not staged))
    return targets


#: a relation whose rows are one leaf's rows one by one, and whose leaf's change is
#: at least this share of its rows, is rewritten whole (when nothing reads its
#: changelog), not given that change mapped: a Δ about its size costs more to apply
REWRITE_MAPPED_FRACTION = 0.5

#: a repair's write of a relation whose files at ``e-1`` are damaged: its rows at ``e``
#: (columns + ``_vnode``) in place of every file, and its Δ, for the relations that
#: read it in ``e`` (``EpochAppends.replace``)
Replace = Callable[[Relation, DataFrame, DataFrame], None]
#: a recompute's write of a relation whose changelog nothing reads: its rows at ``e``
#: (columns + ``_vnode``) as its new base, no comparison made and no Δ kept, written
#: as read when the flag says so (``Target.as_read``); False when it is read (or
#: small): its difference is appended (``EpochAppends.rewrite_unread``)
Rewrite = Callable[[Relation, DataFrame, bool], bool]


def recompute(store: RelationStore, mv: Relation, leaves: Sequence[Relation],
              states: Sequence[Relation], leaf_rows: Sequence[DataFrame],
              changes: Sequence[Change | None], leaf_counts: Sequence[int], epoch: int,
              emit: Emit, rows_hint: int, whole: bool = False,
              rows_before: Callable[[], Sequence[DataFrame]] | None = None,
              replace: Replace | None = None,
              rewrite: Rewrite | None = None) -> DataFrame | None:
    """Recompute a created MV in ``epoch`` from its leaves' rows at ``epoch``
    (``leaf_rows``, about ``leaf_counts`` rows each; ``changes``: each leaf's change
    this epoch): append each state table's difference from ``epoch - 1`` (``emit``)
    and return the MV's (its Δ, not written; None: none); ``rows_hint``: about how
    many rows each difference holds.

    Unless ``whole`` (a repair: what a relation holds is not trusted), rows that are a
    leaf's rows one by one (``Target.leaf``) differ from ``epoch - 1`` by exactly their
    leaf's change mapped row by row: that is their difference, at the cost of the
    change, not of a comparison of the whole relation.

    In a repair, a relation whose data files at ``epoch - 1`` are damaged (deleted or
    truncated by hand: ``RelationStore.damaged``) is not read: its rows at ``epoch - 1``
    are what the MV held then, ``contents`` over the leaves' rows at ``epoch - 1``
    (``rows_before()``), so its difference is the change an incremental epoch would
    have written; its rows at ``epoch`` are written in place of every file
    (``replace``), and None stands for its difference here (it was written).

    Otherwise a relation compared whole whose changelog nothing reads (``rewrite``
    takes it) is not compared at all: its rows are written as its new base, and
    None stands for its difference; so is one a change maps to when the change is
    about its size (``REWRITE_MAPPED_FRACTION``)."""
    targets = contents(mv, leaves, states,
                       lambda i, _rel: leaf_part(mv, states, i, leaf_rows[i]), leaf_counts)
    deltas: list[DataFrame | None] = []
    before: list[Target] | None = None
    if whole:
        rewrite = None  # a repair compares every relation, and writes what it must

    # a join side's state not kept stays so: its rows are still its leaf's (join.py)
    unkept = set() if mv.plan is None or mv.plan.join is None else {
        state.id for state, kept in zip(states, join.kept_sides(store, mv.plan, states, epoch),
                                        strict=False) if not kept}
    for i, target in enumerate(targets):
        if target.rel.id in unkept:
            deltas.append(None)
            continue
        if (whole and replace is not None and rows_before is not None
                and store.damaged(target.rel.stored, epoch - 1)):
            if before is None:
                before = _before(mv, leaves, states, rows_before(), leaf_counts)
            rel, names = target.rel, [c.name for c in target.rel.columns]
            rows = target.rows.selectExpr(*names_sql(names))
            replace(rel, _placed(target),
                    consolidate(before[i].rows.selectExpr(*names_sql(names)), rows, names,
                                rel.key, target.dist or None))
            deltas.append(None)
            continue
        if target.leaf is None or whole:
            if rewrite is not None and rewrite(target.rel, _placed(target), target.as_read):
                deltas.append(None)  # written whole: nothing reads its changelog
                continue
            deltas.append(difference(store, target, epoch))
            continue
        change = changes[target.leaf]
        if (change is not None and rewrite is not None
                and rows_hint >= REWRITE_MAPPED_FRACTION * target.rel.row_count
                and rewrite(target.rel, _placed(target), target.as_read)):
            deltas.append(None)  # a change about its size: its rows written whole
            continue
        deltas.append(None if change is None else mapped_change(mv, states, target, change))
    for target, delta in zip(targets[:-1], deltas[:-1], strict=True):
        if delta is not None:
            emit(target.rel, delta, rows_hint)
    return deltas[-1]


def _placed(target: Target) -> DataFrame:
    """``target``'s rows with their vnodes (columns + ``_vnode``): a new base's rows."""
    rel, names = target.rel, [c.name for c in target.rel.columns]
    return consolidate(None, target.rows.selectExpr(*names_sql(names)), names, rel.key,
                       target.dist or None).drop(OP)


def _before(mv: Relation, leaves: Sequence[Relation], states: Sequence[Relation],
            leaf_rows: Sequence[DataFrame], leaf_counts: Sequence[int]) -> list[Target]:
    """``contents`` over the leaves' rows at ``e-1``: what the MV and its state tables
    held then."""
    return contents(mv, leaves, states,
                    lambda i, _rel: leaf_part(mv, states, i, leaf_rows[i]), leaf_counts)


def mapped_change(mv: Relation, states: Sequence[Relation], target: Target,
                  change: Change) -> DataFrame:
    """The changelog of rows that are leaf ``target.leaf``'s rows one by one, from
    that leaf's change."""
    leaf = target.leaf
    assert leaf is not None
    names = [c.name for c in target.rel.columns]

    def rows(of: DataFrame) -> DataFrame:
        return leaf_part(mv, states, leaf, of).selectExpr(*names_sql(names))
    picked = change.mapped(rows)
    return consolidate(picked.before, picked.after, names, target.rel.key,
                       target.dist or None, picked.fresh)


def difference(store: RelationStore, target: Target, epoch: int) -> DataFrame:
    """The changelog that turns ``target``'s relation at ``epoch - 1`` into its rows."""
    rel = target.rel
    names = [c.name for c in rel.columns]
    old = store.snapshot(rel.stored, epoch - 1, bulk=True).selectExpr(*names_sql(names))
    return consolidate(old, target.rows.selectExpr(*names_sql(names)), names, rel.key,
                       target.dist or None)
