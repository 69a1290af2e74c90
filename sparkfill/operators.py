"""Operators: from the changes of an MV's leaves in one epoch to the MV's
changelog and the changelogs of its state tables.

Invariant: with ``V_i(e)`` the rows of leaf ``i`` the MV has taken in so far
(all of it once created, the backfilled part while creating), after epoch ``e``

* ``MV(e) = Q(V_1(e), V_2(e))``;
* a join side's state table holds ``V_i(e)``, keyed ``(join key JSON, leaf key)``;
* an aggregate's state table holds its input rows, keyed ``(group JSON, row key)``.

A stateful operator recomputes only the partitions — join keys, groups — that
the epoch's changes touch: the old rows from its state at ``e-1``, the new rows
from that state with the changes applied; the difference of the two is the
output. Reads of a state table are pruned to the touched partitions' vnodes and
filtered by a broadcast of the touched keys, so an epoch's work follows its
changes, not the size of the state (global aggregates, one partition, excepted).

A state table's Δ is appended (``emit``) as soon as it is computed, in one Spark
job that also observes the vnodes it touched; the operator reads it back from
the written files, so no Δ is computed twice and no plan grows down a chain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .catalog import Relation
from .changelog import after_images, before_images, consolidate, union_all
from .planner import GROUP_KEY, GROUP_OF_ROW, JOIN_KEY, MvPlan
from .relation_store import Appended, RelationStore

__all__ = ["Change", "change_of", "DataflowResult", "Emit", "MvDataflow"]


@dataclass
class Change:
    """One epoch's change of a set of rows: ``before`` rows leave, ``after`` rows
    arrive (whole images, at most one per key on each side)."""

    before: DataFrame
    after: DataFrame


def change_of(delta: DataFrame | None, columns: Sequence[str]) -> Change | None:
    """A relation's consolidated changelog as a ``Change`` over ``columns``."""
    if delta is None:
        return None
    return Change(before_images(delta).select(*columns), after_images(delta).select(*columns))


#: appends a state table's Δ for the epoch (``rows_hint``: about how many rows);
#: returns what was written, or None when the Δ was empty
Emit = Callable[[Relation, DataFrame, int], Appended | None]


@dataclass
class DataflowResult:
    #: the MV's own changelog for the epoch (not written yet), None: no change
    delta: DataFrame | None
    #: the epoch the Δs are appended as (a snapshot job catching up: an earlier one)
    tag: int | None = None


def _filter_project(df: DataFrame, where: str | None,
                    rows: Sequence[tuple[str, str]]) -> DataFrame:
    """``SELECT sql AS name, ... FROM df [WHERE where]`` from a plan's strings."""
    if where:
        df = df.where(F.expr(where))
    return df.select(*[F.expr(sql).alias(name) for name, sql in rows])


def _json_key(columns: Sequence[SparkColumn]) -> SparkColumn:
    if not columns:
        return F.lit("{}")
    return F.to_json(F.struct(*[c.alias(f"k{i}") for i, c in enumerate(columns)]))


def _group_json(group: Sequence[str], types: dict[str, str]) -> SparkColumn:
    """A group's values as JSON: the aggregate MV's key and its state's partition."""
    def normalized(name: str) -> SparkColumn:
        col = F.col(name)
        if types.get(name) in ("double", "float"):
            # Spark groups -0.0 with 0.0: their JSON must agree too
            return F.when(col == 0, F.lit(0.0).cast(types[name])).otherwise(col)
        return col
    return _json_key([normalized(g) for g in group])


class MvDataflow:
    """Runs one MV's operators for one epoch."""

    def __init__(self, spark: SparkSession, store: RelationStore) -> None:
        self.spark = spark
        self.store = store

    def run(self, mv: Relation, leaves: Sequence[Relation], states: Sequence[Relation],
            changes: Sequence[Change | None], epoch: int, initial: bool, emit: Emit,
            rows_hint: int) -> DataflowResult:
        """``changes[i]``: leaf ``i``'s change this epoch (None: none); ``initial``:
        the job's first epoch (a global aggregate emits its row for empty input);
        ``emit`` appends a state table's Δ; ``rows_hint``: about how many rows the
        changes hold."""
        plan = mv.plan
        assert plan is not None
        result = DataflowResult(None)
        names = [c.name for c in mv.columns]

        # stage 1: rows — filter/project over one leaf, over each branch of a UNION
        # ALL, or over a recomputed join
        if plan.branches:
            moved = [(i, c) for i, c in enumerate(changes) if c is not None]
            if moved:
                before = union_all([self.project_branch(plan, i, c.before) for i, c in moved])
                after = union_all([self.project_branch(plan, i, c.after) for i, c in moved])
                result.delta = consolidate(before.select(*names), after.select(*names),
                                           names, mv.key)
            return result
        if plan.join is None:
            change = changes[0]
            rows = None if change is None else Change(
                self.project(plan, [change.before]), self.project(plan, [change.after]))
        else:
            rows = self._join(plan, leaves, states[:2], changes, epoch, emit, rows_hint)

        # stage 2: the aggregate, or the rows themselves, become the MV's changelog
        if plan.agg is None:
            if rows is not None:
                result.delta = consolidate(rows.before.select(*names),
                                           rows.after.select(*names), names, mv.key)
            return result
        result.delta = self._aggregate(mv, plan, states[-1], rows, epoch, initial, emit,
                                       rows_hint)
        return result

    # --- row stage ------------------------------------------------------------------------

    def project(self, plan: MvPlan, inputs: Sequence[DataFrame]) -> DataFrame:
        if plan.join is None:
            df = inputs[0].alias(plan.leaves[0].alias)
        else:
            left = inputs[0].alias(plan.leaves[0].alias)
            right = inputs[1].alias(plan.leaves[1].alias)
            df = left.join(right, F.expr(plan.join.on), plan.join.how)
        return _filter_project(df, plan.where, plan.rows)

    @staticmethod
    def project_branch(plan: MvPlan, branch: int, rows: DataFrame) -> DataFrame:
        """A UNION ALL branch's rows (with the MV's key columns) from its leaf's rows."""
        spec = plan.branches[branch]
        return _filter_project(rows.alias(plan.leaves[branch].alias), spec.where, spec.rows)

    def _join(self, plan: MvPlan, leaves: Sequence[Relation], states: Sequence[Relation],
              changes: Sequence[Change | None], epoch: int, emit: Emit, rows_hint: int,
              ) -> Change | None:
        """The join's rows before and after this epoch, for the join keys it touched;
        each side's state table takes that side's change."""
        assert plan.join is not None
        keyed: list[Change | None] = []
        touched: list[DataFrame] = []
        vnodes: set[int] = set()
        for side, change in enumerate(changes):
            state = states[side]
            cols = [col.name for col in state.columns]
            written = None if change is None else emit(state, consolidate(
                self.side_rows(plan, side, change.before, state),
                self.side_rows(plan, side, change.after, state),
                cols, state.key, (JOIN_KEY,)), rows_hint)
            if written is None:
                keyed.append(None)
                continue
            keyed.append(Change(before_images(written.delta).select(*cols),
                                after_images(written.delta).select(*cols)))
            touched.append(written.delta.select(JOIN_KEY))
            vnodes.update(written.vnodes)  # a side's state is distributed by join key
        if not touched:
            return None
        keys = union_all(touched).distinct()
        olds, news = [], []
        for side, state in enumerate(states):
            leaf_cols = [c.name for c in leaves[side].columns]
            old = (self.store.snapshot(state.stored, epoch - 1, vnodes=sorted(vnodes))
                   .join(F.broadcast(keys), JOIN_KEY, "left_semi"))
            self.store.spark_jobs += side == 0  # both sides share one broadcast of the keys
            change = keyed[side]
            new = old if change is None else old.select(*[c.name for c in state.columns]) \
                .join(change.before.select(*state.key).unionByName(
                    change.after.select(*state.key)), list(state.key), "left_anti") \
                .unionByName(change.after)
            olds.append(old.select(*leaf_cols))
            news.append(new.select(*leaf_cols))
        return Change(self.project(plan, olds), self.project(plan, news))

    @staticmethod
    def side_rows(plan: MvPlan, side: int, rows: DataFrame, state: Relation) -> DataFrame:
        """A join side's leaf rows as rows of its state table (with their join key)."""
        assert plan.join is not None
        exprs = [F.expr(e) for e in plan.join.key_exprs[side]]
        return rows.withColumn(JOIN_KEY, _json_key(exprs)).select(
            *[c.name for c in state.columns])

    @staticmethod
    def agg_input_rows(plan: MvPlan, agg_state: Relation, rows: DataFrame) -> DataFrame:
        """Row-stage rows as rows of the aggregate's state table (with their group)."""
        assert plan.agg is not None
        types = {c.name: c.type for c in agg_state.columns}
        return rows.withColumn(GROUP_OF_ROW, _group_json(plan.agg.group, types)).select(
            *[c.name for c in agg_state.columns])

    # --- aggregate stage ------------------------------------------------------------------

    def _aggregate(self, mv: Relation, plan: MvPlan, agg_state: Relation,
                   rows: Change | None, epoch: int, initial: bool, emit: Emit,
                   rows_hint: int) -> DataFrame | None:
        assert plan.agg is not None
        spec = plan.agg
        cols = [c.name for c in agg_state.columns]
        written = None if rows is None else emit(agg_state, consolidate(
            self.agg_input_rows(plan, agg_state, rows.before),
            self.agg_input_rows(plan, agg_state, rows.after),
            cols, agg_state.key, (GROUP_OF_ROW,)), rows_hint)
        delta = None if written is None else written.delta
        names = [c.name for c in mv.columns]
        if not spec.group:
            # a global aggregate: one partition, always one row (before HAVING)
            if delta is None and not initial:
                return None
            old = self.store.snapshot(mv.stored, epoch - 1).select(*names)
            state = self.store.snapshot(agg_state.stored, epoch - 1).select(*cols)
            new_input = state if delta is None else self._apply(state, delta, agg_state)
            return consolidate(old, self.evaluate(mv, plan, new_input), names, mv.key)
        if written is None or delta is None:
            return None
        groups = delta.select(GROUP_OF_ROW).distinct()
        # the state is distributed by group: the Δ's vnodes are the touched groups'
        old_input = (self.store.snapshot(agg_state.stored, epoch - 1, vnodes=written.vnodes)
                     .join(F.broadcast(groups), GROUP_OF_ROW, "left_semi").select(*cols))
        self.store.spark_jobs += 1  # the broadcast of the groups
        new_input = self._apply(old_input, delta, agg_state)
        return consolidate(self.evaluate(mv, plan, old_input),
                           self.evaluate(mv, plan, new_input), names, mv.key)

    @staticmethod
    def _apply(rows: DataFrame, delta: DataFrame, state: Relation) -> DataFrame:
        cols = [c.name for c in state.columns]
        return rows.join(delta.select(*state.key), list(state.key), "left_anti") \
            .unionByName(after_images(delta).select(*cols))

    def evaluate(self, mv: Relation, plan: MvPlan, rows: DataFrame) -> DataFrame:
        """The aggregate's output rows over its input ``rows``: the MV's columns."""
        assert plan.agg is not None
        spec = plan.agg
        aggs = [F.expr(sql).alias(name) for name, sql in spec.aggs] or \
            [F.count(F.lit(1)).alias("_sf_n")]
        grouped = rows.groupBy(*spec.group).agg(*aggs)
        if spec.having:
            grouped = grouped.where(F.expr(spec.having))
        types = {c.name: c.type for c in mv.columns}
        out = [F.expr(sql).cast(types[name]).alias(name) for name, sql in spec.outputs]
        key = _group_json(spec.group, dict(rows.dtypes)).alias(GROUP_KEY)
        return grouped.select(*out, key)
