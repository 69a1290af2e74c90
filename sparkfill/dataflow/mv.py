"""Operators: from the changes of an MV's leaves in one epoch to the MV's
changelog and the changelogs of its state tables.

Invariant: with ``V_i(e)`` the rows of leaf ``i`` the MV has taken in so far
(all of it once created, the backfilled part while creating), after epoch ``e``

* ``MV(e) = Q(V_1(e), V_2(e))``;
* a join side's state table holds ``V_i(e)``, keyed ``(join key JSON, leaf key)``;
* an aggregate's state table holds its input rows, keyed ``(group JSON, row key)``;
* window functions' state table holds their input rows, keyed ``(partition JSON,
  row key)``, and the MV's rows are keyed the same way.

A stateful operator recomputes only the partitions — join keys, groups, window
partitions — that
the epoch's changes touch: the old rows from its state at ``e-1``, the new rows
from that state with the changes applied; the difference of the two is the
output. Reads of a state table are pruned to the touched partitions' vnodes and
filtered by the touched keys — values the state table's write observed, so the
filter is part of the read's own Spark job (a broadcast job only for a Δ with
more than ``KEY_VALUES`` keys) — so an epoch's work follows its changes, not the
size of the state (global aggregates, one partition, excepted).

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

from ..sql.planner import (
    GROUP_KEY,
    GROUP_OF_ROW,
    GROUP_ROWS,
    JOIN_KEY,
    WINDOW_PART,
    AggSpec,
    MvPlan,
    running_count_column,
)
from ..storage.catalog import Relation
from ..storage.keyrange import values_in
from ..storage.relation_store import BEFORE_OPS, LIVE_OPS, Appended, RelationStore
from ..storage.schema import OP, quoted, vnode_expr
from .changelog import (
    AFTER,
    BEFORE,
    after_images,
    before_images,
    changelog_of_pairs,
    consolidate,
    image_sql,
    union_all,
)

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


#: a row's weight in a signed change (+1 arrives, -1 leaves): the join's bilinear rule
WEIGHT = "_sf_w"


def _filter_project(df: DataFrame, where: str | None,
                    rows: Sequence[tuple[str, str]], keep: Sequence[str] = ()) -> DataFrame:
    """``SELECT sql AS name, ..., keep FROM df [WHERE where]`` from a plan's strings."""
    if where:
        df = df.where(F.expr(where))
    return df.select(*[F.expr(sql).alias(name) for name, sql in rows],
                     *[F.col(c) for c in keep])


def _weight() -> SparkColumn:
    """A changelog row's weight: +1 for an after-image, -1 for a before-image."""
    return F.when(F.col(OP).isin(*LIVE_OPS), F.lit(1)).otherwise(F.lit(-1))


def _signed(delta: DataFrame, columns: Sequence[str]) -> DataFrame:
    """A changelog's rows with their weight."""
    return delta.select(*columns, _weight().alias(WEIGHT))


def _net_change(rows: DataFrame, columns: Sequence[str]) -> Change:
    """A signed change summed per distinct row: what remains with weight -1 leaves,
    with +1 arrives (a set-keyed relation's change nets to -1, 0 or +1 per row)."""
    net = rows.groupBy(*columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)
    return Change(net.where(F.col(WEIGHT) < 0).select(*columns),
                  net.where(F.col(WEIGHT) > 0).select(*columns))


def _json_key(columns: Sequence[SparkColumn]) -> SparkColumn:
    if not columns:
        return F.lit("{}")
    return F.to_json(F.struct(*[c.alias(f"k{i}") for i, c in enumerate(columns)]))


def _normalized_sql(name: str, types: dict[str, str]) -> str:
    """A group column as Spark groups it: -0.0 is 0.0 (SQL text)."""
    col = quoted(name)
    if types.get(name) in ("double", "float"):
        return f"CASE WHEN {col} = 0 THEN CAST(0.0 AS {types[name]}) ELSE {col} END"
    return col


def _normalized(name: str, types: dict[str, str]) -> SparkColumn:
    return F.expr(_normalized_sql(name, types))


def _group_json_sql(group: Sequence[str], types: dict[str, str]) -> str:
    """A group's values as JSON: the aggregate MV's key and its state's partition
    (-0.0 and 0.0 are one group: their JSON agrees too), as SQL text."""
    if not group:
        return "'{}'"
    fields = ", ".join(f"'k{i}', {_normalized_sql(g, types)}" for i, g in enumerate(group))
    return f"to_json(named_struct({fields}))"


def _group_json(group: Sequence[str], types: dict[str, str]) -> SparkColumn:
    return F.expr(_group_json_sql(group, types))


def _touched_keys(written: Sequence[Appended], column: str) -> tuple[object, ...] | DataFrame:
    """The distinct ``column`` values of state-table Δs: on the driver when each
    write observed them, else a frame of them."""
    if all(w.keys is not None for w in written):
        return tuple(sorted({k for w in written for k in (w.keys or ())}, key=str))
    return union_all([w.delta.select(column) for w in written]).distinct()


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

        # stage 2: the aggregate, the window functions, or the rows themselves, become
        # the MV's changelog
        if plan.window is not None:
            result.delta = self._window(mv, plan, states[-1], rows, epoch, emit, rows_hint)
            return result
        if plan.agg is None:
            if rows is not None:
                result.delta = consolidate(rows.before.select(*names),
                                           rows.after.select(*names), names, mv.key)
            return result
        result.delta = self._aggregate(mv, plan, states[-1], rows, epoch, initial, emit,
                                       rows_hint)
        return result

    # --- top-N ----------------------------------------------------------------------------

    def top_n(self, mv: Relation, leaf: Relation, leaf_delta: DataFrame | None,
              epoch: int) -> DataFrame:
        """A top-N MV's changelog for ``epoch``: its rows recomputed from its input
        (the leaf's rows at ``e-1`` with this epoch's Δ applied), the first
        ``offset + limit`` in the order (ties broken by the MV's key), against its
        rows at ``e-1``. It reads its whole input when that changed."""
        plan = mv.plan
        assert plan is not None and plan.topn is not None
        spec = plan.topn
        names = [c.name for c in mv.columns]
        cols = [c.name for c in leaf.columns]
        rows = self.store.snapshot(leaf.stored, epoch - 1).select(*cols)
        if leaf_delta is not None:
            rows = self._apply(rows, leaf_delta, leaf)
        order = [f"{quoted(c)} {'DESC' if desc else 'ASC'} NULLS {'FIRST' if nf else 'LAST'}"
                 for c, desc, nf in spec.order]
        order += [f"{quoted(k)} ASC" for k in mv.key]
        ranked = self.project(plan, [rows]).selectExpr(
            "*", f"row_number() OVER (ORDER BY {', '.join(order)}) AS _sf_rank")
        new = ranked.where(f"_sf_rank > {spec.offset} AND _sf_rank <= "
                           f"{spec.offset + spec.limit}").select(*names)
        old = self.store.snapshot(mv.stored, epoch - 1).select(*names)
        return consolidate(old, new, names, mv.key)

    # --- row stage ------------------------------------------------------------------------

    def project(self, plan: MvPlan, inputs: Sequence[DataFrame],
                keep: Sequence[str] = ()) -> DataFrame:
        if plan.join is None:
            df = inputs[0].alias(plan.leaves[0].alias)
        else:
            left = inputs[0].alias(plan.leaves[0].alias)
            right = inputs[1].alias(plan.leaves[1].alias)
            df = left.join(right, F.expr(plan.join.on), plan.join.how)
        return _filter_project(df, plan.where, plan.rows, keep)

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
        written: list[Appended | None] = []
        for side, change in enumerate(changes):
            state = states[side]
            cols = [col.name for col in state.columns]
            written.append(None if change is None else emit(state, consolidate(
                self.side_rows(plan, side, change.before, state),
                self.side_rows(plan, side, change.after, state),
                cols, state.key, (JOIN_KEY,)), rows_hint))
        moved = [w for w in written if w is not None]
        if not moved:
            return None
        if plan.join.how == "inner":
            return self._inner_join_change(plan, leaves, states, written, epoch)
        keys = _touched_keys(moved, JOIN_KEY)
        # each side's state is distributed by join key: the Δs' vnodes are the keys'
        vnodes = sorted({v for w in moved for v in w.vnodes})
        olds, news = [], []
        for side, state in enumerate(states):
            leaf_cols = [c.name for c in leaves[side].columns]
            old = (self.store.lookup(state.stored, epoch - 1, keys, vnodes=vnodes)
                   .select(*[c.name for c in state.columns]))
            mine = written[side]
            new = old if mine is None else self._apply(old, mine.delta, state)
            olds.append(old.select(*leaf_cols))
            news.append(new.select(*leaf_cols))
        return Change(self.project(plan, olds), self.project(plan, news))

    def _inner_join_change(self, plan: MvPlan, leaves: Sequence[Relation],
                           states: Sequence[Relation], written: Sequence[Appended | None],
                           epoch: int) -> Change:
        """The bilinear rule of an inner join, ``Δ(A⋈B) = ΔA⋈B(e-1) + A(e)⋈ΔB``:
        each side's Δ looks up only the other side's rows of the join keys it
        touched (``B`` before this epoch's change, ``A`` after it), and the signed
        terms net per row. No side's unchanged rows of a touched key are read."""
        terms = []
        for side in (0, 1):
            mine = written[side]
            if mine is None:
                continue
            other = 1 - side
            state = states[other]
            state_cols = [c.name for c in state.columns]
            rows = (self.store.lookup(state.stored, epoch - 1, _touched_keys([mine], JOIN_KEY),
                                      vnodes=mine.vnodes).select(*state_cols))
            theirs = written[other]
            if other == 0 and theirs is not None:  # A(e): A(e-1) with ΔA applied
                rows = self._apply(rows, theirs.delta, state)
            inputs = [_signed(mine.delta, [c.name for c in leaves[side].columns]), rows]
            if side == 1:
                inputs.reverse()
            terms.append(self.project(plan, inputs, keep=[WEIGHT]))
        return _net_change(union_all(terms), [name for name, _ in plan.rows])

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
        written = None if rows is None else self._emit_stage_input(plan, agg_state, rows,
                                                                    emit, rows_hint)
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
        if written is None:
            return None
        delta = written.delta
        if spec.running is not None:
            return self._aggregate_running(mv, spec, agg_state, written, epoch)
        # the state is distributed by group: the Δ's vnodes are the touched groups'
        old_input = self.store.lookup(agg_state.stored, epoch - 1,
                                      _touched_keys([written], GROUP_OF_ROW),
                                      vnodes=written.vnodes).select(*cols)
        new_input = self._apply(old_input, delta, agg_state)
        return consolidate(self.evaluate(mv, plan, old_input),
                           self.evaluate(mv, plan, new_input), names, mv.key)

    # --- window stage ---------------------------------------------------------------------

    def _window(self, mv: Relation, plan: MvPlan, state: Relation, rows: Change | None,
                epoch: int, emit: Emit, rows_hint: int) -> DataFrame | None:
        """Window functions: the touched partitions' input rows (the state's rows at
        ``e-1`` with the Δ applied) evaluated again, against their MV rows at ``e-1``
        (a keyed read: the MV is keyed by partition first)."""
        if rows is None:
            return None
        written = self._emit_stage_input(plan, state, rows, emit, rows_hint)
        if written is None:
            return None
        cols = [c.name for c in state.columns]
        touched = _touched_keys([written], WINDOW_PART)
        old_input = self.store.lookup(state.stored, epoch - 1, touched,
                                      vnodes=written.vnodes).select(*cols)
        new_input = self._apply(old_input, written.delta, state)
        names = [c.name for c in mv.columns]
        old = self.store.lookup(mv.stored, epoch - 1, touched,
                                vnodes=written.vnodes).select(*names)
        return consolidate(old, self.evaluate_window(mv, plan, new_input), names, mv.key,
                           (WINDOW_PART,))

    @staticmethod
    def window_input_rows(plan: MvPlan, state: Relation, rows: DataFrame) -> DataFrame:
        """Row-stage rows as rows of the window's state table (with their partition)."""
        assert plan.window is not None
        types = {c.name: c.type for c in state.columns}
        return rows.selectExpr(
            f"{_group_json_sql(plan.window.partition, types)} AS {WINDOW_PART}",
            *[quoted(c.name) for c in state.columns if c.name != WINDOW_PART])

    def _emit_stage_input(self, plan: MvPlan, state: Relation, rows: Change, emit: Emit,
                          rows_hint: int) -> Appended | None:
        """Append the row stage's change to the aggregate's or the window's state table
        (distributed by its first key column, the group or partition)."""
        return emit(state, consolidate(
            self.stage_input_rows(plan, state, rows.before),
            self.stage_input_rows(plan, state, rows.after),
            [c.name for c in state.columns], state.key, state.key[:1]), rows_hint)

    def stage_input_rows(self, plan: MvPlan, state: Relation, rows: DataFrame) -> DataFrame:
        """Row-stage rows as rows of the state table of the aggregate or of the window
        functions (its first key column: the row's group or partition)."""
        return (self.agg_input_rows(plan, state, rows) if plan.agg is not None
                else self.window_input_rows(plan, state, rows))

    def evaluate_stage(self, mv: Relation, plan: MvPlan, rows: DataFrame) -> DataFrame:
        """The MV's rows over whole groups or partitions of that state's ``rows``."""
        return (self.evaluate(mv, plan, rows) if plan.agg is not None
                else self.evaluate_window(mv, plan, rows))

    @staticmethod
    def evaluate_window(mv: Relation, plan: MvPlan, rows: DataFrame) -> DataFrame:
        """The MV's rows over whole partitions of input ``rows`` (the state's columns)."""
        assert plan.window is not None
        types = {c.name: c.type for c in mv.columns}
        outputs = [f"CAST(({sql}) AS {types[name]}) AS {quoted(name)}"
                   for name, sql in plan.window.outputs]
        return rows.selectExpr(*outputs, WINDOW_PART, *[quoted(k) for k in plan.row_key]
                               ).select(*[c.name for c in mv.columns])

    @staticmethod
    def _apply(rows: DataFrame, delta: DataFrame, state: Relation) -> DataFrame:
        cols = [c.name for c in state.columns]
        return rows.join(delta.select(*state.key), list(state.key), "left_anti") \
            .unionByName(after_images(delta).select(*cols))

    def _aggregate_running(self, mv: Relation, spec: AggSpec, agg_state: Relation,
                           written: Appended, epoch: int) -> DataFrame:
        """A grouped aggregate kept as running values per group (hidden columns of
        the MV): each touched group's new values are its old ones (a lookup of the
        MV's rows by group) updated by the signed input Δ — counts and exact sums
        add, a min/max takes the arriving extreme. Only a group whose Δ retracts
        its min/max without replacing it reads its input rows (from the state)."""
        running = spec.running
        assert running is not None
        delta = written.delta
        names = [c.name for c in mv.columns]
        types = {c.name: c.type for c in mv.columns}
        row_types = {c.name: c.type for c in agg_state.columns}
        q = quoted
        # the signed input Δ summed per group, as SQL text (one driver call for all)
        weight = f"(CASE WHEN {OP} IN ('+', 'U+') THEN 1 ELSE -1 END)"
        parts = [f"sum({weight}) AS _sf_d"]
        for name, kind, arg in running:
            x = q(arg) if arg else "1"  # count(*) counts every row
            if kind == "count":
                parts.append(
                    f"sum(CASE WHEN {x} IS NOT NULL THEN {weight} END) AS {q(name + '_d')}")
            elif kind == "count_if":
                parts.append(f"sum(CASE WHEN {x} THEN {weight} END) AS {q(name + '_d')}")
            elif kind == "sum":
                parts += [f"sum({weight} * {x}) AS {q(name + '_d')}",
                          f"sum(CASE WHEN {x} IS NOT NULL THEN {weight} END) AS {q(name + '_dn')}"]
            else:
                parts += [f"{kind}(CASE WHEN {weight} > 0 THEN {x} END) AS {q(name + '_in')}",
                          f"{kind}(CASE WHEN {weight} < 0 THEN {x} END) AS {q(name + '_out')}"]
        firsts = [F.first(_normalized(g, row_types)).alias(g) for g in spec.group]
        partial = delta.groupBy(GROUP_OF_ROW).agg(*firsts, *[F.expr(p) for p in parts])
        # the old values: the MV's rows of the touched groups (distributed by group),
        # each with its whole row as the before-image of the group's change
        hidden = [c for c in mv.columns if c.hidden and c.name != GROUP_KEY]
        touched = written.keys if written.keys is not None else \
            delta.select(F.col(GROUP_OF_ROW).alias(GROUP_KEY)).distinct()
        old = self.store.lookup(mv.stored, epoch - 1, touched, vnodes=written.vnodes)
        joined = partial.join(
            old.selectExpr(f"{GROUP_KEY} AS {GROUP_OF_ROW}",
                           *[f"{q(c.name)} AS {q('_sf_old' + c.name)}" for c in hidden],
                           f"{image_sql(names)} AS {BEFORE}"),
            GROUP_OF_ROW, "left")

        def was(column: str) -> str:
            return q(f"_sf_old{column}")

        def d(column: str) -> str:
            return f"coalesce({q(column)}, 0)"

        def new_values_sql(recomputed: bool) -> list[str]:
            """Each group's new hidden values; with ``recomputed``, a group marked
            ``_sf_lost`` takes its min/max from the joined ``_sf_re`` columns."""
            new = [f"coalesce({was(GROUP_ROWS)}, 0) + _sf_d AS {GROUP_ROWS}"]
            for name, kind, _ in running:
                if kind in ("count", "count_if"):
                    value = f"coalesce({was(name)}, 0) + {d(name + '_d')}"
                elif kind == "sum":
                    non_null = running_count_column(name)
                    n = f"(coalesce({was(non_null)}, 0) + {d(name + '_dn')})"
                    new.append(f"{n} AS {q(non_null)}")
                    value = (f"CASE WHEN {n} = 0 THEN NULL "
                             f"ELSE coalesce({was(name)}, 0) + {d(name + '_d')} END")
                else:
                    extreme = "greatest" if kind == "max" else "least"
                    value = f"{extreme}({was(name)}, {q(name + '_in')})"
                    if recomputed:
                        value = f"IF(_sf_lost, {q('_sf_re' + name)}, {value})"
                new.append(f"CAST({value} AS {types[name]}) AS {q(name)}")
            return new

        # a group lost its extreme when the Δ retracts a value at it and brings none
        # at or beyond it
        lost = " OR ".join(
            f"(coalesce({q(name + '_out')} {cmp} {was(name)}, FALSE) AND NOT "
            f"coalesce({q(name + '_in')} {cmp} {was(name)}, FALSE))"
            for name, kind, _ in running if kind in ("min", "max")
            for cmp in [">=" if kind == "max" else "<="])
        lost_groups: list[tuple[str, int]] = []
        if lost and any(op in written.counts for op in BEFORE_OPS):
            # the groups that lost their extreme (and still have rows): a small collect,
            # only when rows left (an insert-only Δ retracts nothing)
            lost_groups = [(str(r[0]), int(r[1])) for r in joined.selectExpr(
                GROUP_OF_ROW, f"({lost}) AS _sf_lost", *new_values_sql(False)).where(
                f"_sf_lost AND {GROUP_ROWS} > 0").select(
                GROUP_OF_ROW, vnode_expr([GROUP_OF_ROW])).collect()]
            self.store.spark_jobs += 1
        if lost_groups:
            # their extremes recomputed from their input rows (the state's rows of those
            # groups with the Δ applied) and joined in beside the running values
            groups = sorted({g for g, _ in lost_groups})
            cols = [c.name for c in agg_state.columns]
            old_input = self.store.lookup(agg_state.stored, epoch - 1, groups,
                                          vnodes=sorted({v for _, v in lost_groups})
                                          ).select(*cols)
            in_groups = values_in(GROUP_OF_ROW, groups)
            assert in_groups is not None  # JSON strings
            new_input = self._apply(old_input, delta.where(in_groups), agg_state)
            recomputed = self._group_values(spec, new_input).selectExpr(
                f"{_group_json_sql(spec.group, row_types)} AS {GROUP_OF_ROW}",
                "TRUE AS _sf_lost",
                *[f"{q(name)} AS {q('_sf_re' + name)}" for name, kind, _ in running
                  if kind in ("min", "max")])
            joined = joined.join(recomputed, GROUP_OF_ROW, "left").withColumn(
                "_sf_lost", F.coalesce(F.col("_sf_lost"), F.lit(False)))
        value_cols = [GROUP_OF_ROW, *spec.group, GROUP_ROWS,
                      *[c.name for c in hidden if c.name != GROUP_ROWS], BEFORE]
        new_values = joined.selectExpr(GROUP_OF_ROW, *[q(g) for g in spec.group],
                                       *new_values_sql(bool(lost_groups)), BEFORE
                                       ).select(*value_cols)
        # a group's change: its old row (the before-image) against its new values
        # (none when its last row left); one projection over every touched group, so
        # the plan above computes them once
        live = f"{GROUP_ROWS} > 0"
        pairs = self._outputs(mv, spec, new_values, row_types, carry=(BEFORE,),
                              only_if=live).selectExpr(
            GROUP_KEY, BEFORE, f"IF({live}, {image_sql(names)}, NULL) AS {AFTER}")
        return changelog_of_pairs(pairs, names, mv.key)

    @staticmethod
    def _group_values(spec: AggSpec, rows: DataFrame) -> DataFrame:
        """Per group of ``rows``: the group columns, each aggregate's value and, for a
        running aggregate, the group's rows and each sum's non-null count."""
        aggs = [F.expr(sql).alias(name) for name, sql in spec.aggs]
        if spec.running is not None:
            aggs.append(F.count(F.lit(1)).alias(GROUP_ROWS))
            aggs += [F.count(F.col(arg)).alias(running_count_column(name))
                     for name, kind, arg in spec.running if kind == "sum"]
        return rows.groupBy(*spec.group).agg(*(aggs or [F.count(F.lit(1)).alias("_sf_n")]))

    @staticmethod
    def _outputs(mv: Relation, spec: AggSpec, grouped: DataFrame,
                 group_types: dict[str, str], carry: Sequence[str] = (),
                 only_if: str | None = None) -> DataFrame:
        """The MV's rows (visible outputs, group key, hidden running values) from
        per-group values, and the ``carry`` columns of ``grouped`` as they are.
        ``only_if``: a condition of a group's values; the visible outputs of a group
        that fails it are NULL and never evaluated (a division by a gone group's count
        would fail)."""
        if spec.having:
            grouped = grouped.where(spec.having)
        types = {c.name: c.type for c in mv.columns}
        out = [f"CAST(({sql}) AS {types[name]}) AS {quoted(name)}" if only_if is None else
               f"CAST(IF({only_if}, ({sql}), NULL) AS {types[name]}) AS {quoted(name)}"
               for name, sql in spec.outputs]
        key = f"{_group_json_sql(spec.group, group_types)} AS {GROUP_KEY}"
        hidden = [f"CAST({quoted(c.name)} AS {c.type}) AS {quoted(c.name)}" for c in mv.columns
                  if c.hidden and c.name != GROUP_KEY]
        return grouped.selectExpr(*out, key, *hidden, *[quoted(c) for c in carry])

    def evaluate(self, mv: Relation, plan: MvPlan, rows: DataFrame) -> DataFrame:
        """The aggregate's output rows over its input ``rows``: the MV's columns."""
        assert plan.agg is not None
        return self._outputs(mv, plan.agg, self._group_values(plan.agg, rows),
                             dict(rows.dtypes))
