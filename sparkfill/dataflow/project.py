"""Filter/project: the row stage, over one leaf or over a recomputed join.

Invariant: the stage is linear and keeps no state — its change is the filtered,
projected before-images against the filtered, projected after-images, so
``rows(e) = project(V(e))`` with nothing read but the change itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlglot
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from sqlglot import exp

from ..sql.planner import MvPlan
from ..storage.catalog import Relation
from ..storage.schema import names_sql, quoted
from .change import WEIGHT, Change

__all__ = ["filter_project", "project", "row_change", "keeps_leaf_vnodes"]


def filter_project(df: DataFrame, where: str | None,
                   rows: Sequence[tuple[str, str]], keep: Sequence[str] = ()) -> DataFrame:
    """``SELECT sql AS name, ..., keep FROM df [WHERE where]`` from a plan's strings."""
    if where:
        df = df.where(where)
    return df.selectExpr(*[f"{sql} AS {quoted(name)}" for name, sql in rows],
                         *names_sql(keep))


def project(plan: MvPlan, inputs: Sequence[DataFrame], keep: Sequence[str] = (),
            merge: bool = False) -> DataFrame:
    """The row stage over ``inputs`` (a leaf's rows, or a join's two sides);
    ``merge``: join by sort-merge, not by broadcast (both sides small, each one
    partition: no exchange, where a broadcast would be a Spark job of its own)."""
    if plan.join is None:
        df = inputs[0].alias(plan.leaves[0].alias)
    else:
        left = inputs[0].alias(plan.leaves[0].alias)
        right = inputs[1].alias(plan.leaves[1].alias)
        if merge:
            right = right.hint("merge")
        df = left.join(right, F.expr(plan.join.on), plan.join.how)
    return filter_project(df, plan.where, plan.rows, keep)


def row_change(plan: MvPlan, change: Change | None) -> Change | None:
    """The row stage's change over one leaf: its change's before- and after-images
    (and its signed rows), each filtered and projected."""
    if change is None:
        return None
    rows = change.mapped(lambda rows: project(plan, [rows]))
    if change.has_signed_rows():
        rows.signed = lambda: project(plan, [_signed_rows(change)], keep=[WEIGHT])
    return rows


def _signed_rows(change: Change) -> DataFrame:
    signed = change.signed_rows()
    assert signed is not None
    return signed


def keeps_leaf_vnodes(mv: Relation, leaves: Sequence[Relation], side: int = 0) -> bool:
    """Whether each row of ``mv`` (a filter/project over its leaves, or over an inner
    join of them) lies in the vnode of the row of leaf ``side`` it comes from: the
    MV's key is that leaf's key, column for column, passed through unchanged (same
    values, same types), so the vnode hash of one is the vnode hash of the other."""
    plan = mv.plan
    leaf = leaves[side]
    if plan is None or plan.agg is not None or plan.window is not None or plan.branches \
            or len(mv.key) != len(leaf.key) \
            or (plan.join is not None and plan.join.how != "inner"):
        return False
    alias = plan.leaves[side].alias
    others = {c.name for i, lf in enumerate(leaves) if i != side for c in lf.columns}
    sql_of = dict(plan.rows)
    mv_types = {c.name: c.type for c in mv.columns}
    leaf_types = {c.name: c.type for c in leaf.columns}
    for mine, theirs in zip(mv.key, leaf.key, strict=True):
        if mine not in sql_of:
            return False
        try:
            ref = sqlglot.parse_one(sql_of[mine], read="spark")
        except sqlglot.errors.ParseError:
            return False
        if not isinstance(ref, exp.Column) or ref.name != theirs \
                or mv_types.get(mine) != leaf_types.get(theirs):
            return False
        if plan.join is not None and ref.table != alias \
                and (ref.table or theirs in others):
            return False  # another side's column, or a name both sides have
    return True
