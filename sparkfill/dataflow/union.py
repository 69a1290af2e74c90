"""UNION ALL: a filter/project over each branch's own leaf.

Invariant: the MV's changelog is the consolidated difference between the union
of every moved branch's projected before-images and the union of their projected
after-images (each branch's rows carry the MV's key columns); no state.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame

from ..sql.planner import MvPlan
from ..storage.catalog import Relation
from ..storage.schema import names_sql
from .change import Change
from .changelog import consolidate, union_all
from .project import filter_project

__all__ = ["project_branch", "union_delta"]


def project_branch(plan: MvPlan, branch: int, rows: DataFrame) -> DataFrame:
    """A UNION ALL branch's rows (with the MV's key columns) from its leaf's rows."""
    spec = plan.branches[branch]
    return filter_project(rows.alias(plan.leaves[branch].alias), spec.where, spec.rows)


def union_delta(mv: Relation, plan: MvPlan, changes: Sequence[Change | None],
                ) -> DataFrame | None:
    """The MV's changelog from its branches' changes (None: no branch moved)."""
    names = [c.name for c in mv.columns]
    moved = [(i, c) for i, c in enumerate(changes) if c is not None]
    if not moved:
        return None
    picked = names_sql(names)
    leaving = [project_branch(plan, i, c.before).selectExpr(*picked) for i, c in moved
               if c.before is not None]
    after = union_all([project_branch(plan, i, c.arrivals()) for i, c in moved])
    return consolidate(union_all(leaving) if leaving else None, after.selectExpr(*picked),
                       names, mv.key)
