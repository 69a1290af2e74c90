"""Window functions: ``... OVER (PARTITION BY ...)`` over the row stage's rows.

Invariant: after epoch ``e`` the window functions' state table holds their input
rows, keyed ``(partition JSON, row key)`` and distributed by partition, and the
MV's rows are keyed the same way. Only the partitions the epoch's changes touch
are evaluated again: their input rows (the state's rows at ``e-1``, looked up by
the touched partitions and pruned to their vnodes, with the Δ applied), against
their MV rows at ``e-1`` (a keyed read of the MV).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from ..sql.planner import WINDOW_PART, MvPlan
from ..storage.catalog import Relation
from ..storage.relation_store import Appended, RelationStore
from ..storage.schema import names_sql, quoted
from .change import apply_delta
from .changelog import consolidate
from .keys import group_json_sql, touched_partitions

__all__ = ["window_input_rows", "window_change", "evaluate_window"]


def window_input_rows(plan: MvPlan, state: Relation, rows: DataFrame) -> DataFrame:
    """Row-stage rows as rows of the window's state table (with their partition)."""
    assert plan.window is not None
    types = {c.name: c.type for c in state.columns}
    return rows.selectExpr(
        f"{group_json_sql(plan.window.partition, types)} AS {WINDOW_PART}",
        *[quoted(c.name) for c in state.columns if c.name != WINDOW_PART])


def window_change(store: RelationStore, mv: Relation, plan: MvPlan, state: Relation,
                  written: Appended | None, epoch: int) -> DataFrame | None:
    """Window functions: the touched partitions' input rows (the state's rows at
    ``e-1`` with the Δ applied) evaluated again, against their MV rows at ``e-1``
    (a keyed read: the MV is keyed by partition first). ``written``: the row
    stage's change as appended to the state table this epoch (None: no change)."""
    if written is None:
        return None
    cols = [c.name for c in state.columns]
    touched = touched_partitions([written], WINDOW_PART)
    old_input = store.lookup(state.stored, epoch - 1, touched,
                             vnodes=written.vnodes).selectExpr(*names_sql(cols))
    new_input = apply_delta(old_input, written.delta, state)
    names = [c.name for c in mv.columns]
    old = store.lookup(mv.stored, epoch - 1, touched,
                       vnodes=written.vnodes).selectExpr(*names_sql(names))
    return consolidate(old, evaluate_window(mv, plan, new_input), names, mv.key,
                       (WINDOW_PART,))


def evaluate_window(mv: Relation, plan: MvPlan, rows: DataFrame) -> DataFrame:
    """The MV's rows over whole partitions of input ``rows`` (the state's columns)."""
    assert plan.window is not None
    types = {c.name: c.type for c in mv.columns}
    outputs = [f"CAST(({sql}) AS {types[name]}) AS {quoted(name)}"
               for name, sql in plan.window.outputs]
    return rows.selectExpr(*outputs, WINDOW_PART, *[quoted(k) for k in plan.row_key]
                           ).selectExpr(*names_sql(c.name for c in mv.columns))
