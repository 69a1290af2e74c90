"""Top-N: ``ORDER BY ... LIMIT`` (with ``OFFSET``) over one leaf.

Invariant: the MV holds the first ``offset + limit`` rows of its input in the
order (ties broken by the MV's key); the order names input columns (the MV's own,
which it selects from its input by name, or ORDER BY expressions it does not keep).
It keeps no state table: when its input changed, it reads the leaf's rows at
``e-1`` whole, applies the epoch's Δ, ranks them again and diffs the result
against its own rows at ``e-1``.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from ..storage.catalog import Relation
from ..storage.relation_store import RelationStore
from ..storage.schema import OP, names_sql, quoted
from .change import apply_delta
from .changelog import consolidate
from .project import project

__all__ = ["top_n", "top_rows", "rebuilt_top_n"]


def top_n(store: RelationStore, mv: Relation, leaf: Relation, leaf_delta: DataFrame | None,
          epoch: int) -> DataFrame:
    """A top-N MV's changelog for ``epoch``: its rows recomputed from its input
    (the leaf's rows at ``e-1`` with this epoch's Δ applied), the first
    ``offset + limit`` in the order (ties broken by the MV's key), against its
    rows at ``e-1``. It reads its whole input when that changed."""
    names = [c.name for c in mv.columns]
    rows = leaf_rows(store, leaf, epoch - 1)
    if leaf_delta is not None:
        rows = apply_delta(rows, leaf_delta, leaf)
    new = top_rows(mv, rows)
    old = store.snapshot(mv.stored, epoch - 1).selectExpr(*names_sql(names))
    return consolidate(old, new, names, mv.key)


def leaf_rows(store: RelationStore, leaf: Relation, epoch: int) -> DataFrame:
    """The leaf's rows at committed ``epoch`` (its columns)."""
    return store.snapshot(leaf.stored, epoch).selectExpr(*names_sql([c.name for c in
                                                                      leaf.columns]))


def top_rows(mv: Relation, rows: DataFrame) -> DataFrame:
    """A top-N MV's rows over its input's ``rows``: the first ``offset + limit`` in
    the order, ties broken by the MV's key."""
    plan = mv.plan
    assert plan is not None and plan.topn is not None
    spec = plan.topn
    order = [f"{quoted(c)} {'DESC' if desc else 'ASC'} NULLS {'FIRST' if nf else 'LAST'}"
             for c, desc, nf in spec.order]
    order += [f"{quoted(k)} ASC" for k in mv.key]
    # ranked over the input's rows: the order may name input columns the MV does not
    # keep; the MV's columns are input columns selected by name
    ranked = rows.selectExpr(
        "*", f"row_number() OVER (ORDER BY {', '.join(order)}) AS _sf_rank")
    kept = ranked.where(f"_sf_rank > {spec.offset} AND _sf_rank <= "
                        f"{spec.offset + spec.limit}").drop("_sf_rank")
    return project(plan, [kept]).selectExpr(*names_sql([c.name for c in mv.columns]))


def rebuilt_top_n(store: RelationStore, mv: Relation, leaf: Relation,
                  leaf_delta: DataFrame | None, epoch: int) -> tuple[DataFrame, DataFrame]:
    """A repair of a top-N MV whose files at ``e-1`` are damaged: its rows at ``epoch``
    (columns + ``_vnode``) and its changelog from its rows at ``e-1`` as recomputed
    from its input then (not read)."""
    names = [c.name for c in mv.columns]
    before = leaf_rows(store, leaf, epoch - 1)
    after = before if leaf_delta is None else apply_delta(before, leaf_delta, leaf)
    new = top_rows(mv, after)
    return (consolidate(None, new, names, mv.key).drop(OP),
            consolidate(top_rows(mv, before), new, names, mv.key))
