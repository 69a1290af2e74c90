"""Aggregate: GROUP BY (or a global aggregate) over the row stage's rows.

Invariant: after epoch ``e`` the aggregate's state table holds its input rows,
keyed ``(group JSON, row key)`` and distributed by group, when it ``keeps_input``
(else it stays empty: running counts, sums, and min/max found again in the leaf
need only the Δ); the MV's rows are keyed by group JSON. Only the groups the
epoch's changes touch are recomputed: their input rows at ``e-1`` (the state,
looked up by the touched groups and pruned to their vnodes) evaluated against
those rows with the Δ applied — or, for running aggregates, each touched group's
old values (its MV row: a keyed lookup, or the whole MV when it is small and the
state's Δ waits for the epoch's flush) updated by the signed Δ, reading input rows
only for a group that lost its min/max: from the state, or (``extremes = 'leaf'``)
from the rows the MV held of its leaf before the epoch, row-staged. A min/max found
again in the leaf keeps its group's count of rows at the extreme, so it is lost
only when the last of them leaves. Which groups lost one is found by a small collect,
or, for a Δ nothing reads this epoch, guessed as none and checked in the job that
writes the Δ (``Guess``): a wrong guess's Δ is built again, never written. A global
aggregate is one partition: it reads its whole state, and emits its row for empty
input in the job's first epoch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

import sqlglot
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from ..sql.planner import (
    GROUP_KEY,
    GROUP_OF_ROW,
    GROUP_ROWS,
    AggSpec,
    MvPlan,
    running_count_column,
    running_sum_column,
    running_ties_column,
)
from ..storage.catalog import Relation
from ..storage.keyrange import sql_literal, values_in
from ..storage.relation_store import Appended, RelationStore
from ..storage.schema import OP, names_sql, quoted, vnode_sql
from .cached import persisted
from .change import HeldRows, StateDelta, apply_delta, may_retract
from .changelog import AFTER, BEFORE, changelog_sql, consolidate, image_sql
from .keys import (
    SCAN_ROWS,
    group_json_sql,
    normalized_sql,
    read_touched,
    touched_partitions,
)
from .project import project
from .statement import sql_over

__all__ = ["agg_input_rows", "aggregate_change", "aggregate_running", "changed_rows_bound",
           "estimate_groups", "evaluate_counted", "exact_add_sql", "group_values",
           "values_by_extreme", "grouped_values", "keeps_input", "leaf_group_columns",
           "leaf_extremes",
           "with_ties", "FEW_GROUPS", "outputs", "evaluate", "state_may_wait", "LostInput",
           "Guess"]

#: the input rows at ``e-1`` of the groups that lost a min/max, from their JSON,
#: vnodes and group values
LostInput = Callable[[Sequence[str], Sequence[int], Sequence[tuple[object, ...]]], DataFrame]


class Guess(NamedTuple):
    """A running aggregate's changelog built on the guess that no group lost its
    min/max this epoch: ``check`` holds a row for each group that did (none: the
    guess holds, and the changelog is exact); ``instead`` builds the changelog with
    those groups found first (their collect, a Spark job), caching into the list it
    is given what it reads twice; ``held`` is told when the check finds none."""

    check: DataFrame
    instead: Callable[[list[DataFrame]], DataFrame]
    held: Callable[[], None] = lambda: None


def state_may_wait(mv: Relation, plan: MvPlan) -> bool:
    """Whether the aggregate's state Δ may be appended with the epoch's other small
    Δs, after the MV's Δ is computed: a running aggregate over one leaf reads its
    state only for the groups that lost a min/max (found by a job of its own), and
    looks up its old values in the MV, which it reads whole when small."""
    return (plan.agg is not None and plan.agg.running is not None and bool(plan.agg.group)
            and plan.join is None and mv.row_count <= SCAN_ROWS)


def keeps_input(spec: AggSpec) -> bool:
    """Whether the aggregate keeps its input rows in its state table. A global
    aggregate, and one whose values cannot run (``count(DISTINCT)``, a HAVING
    clause, ...), recomputes each touched group from them; a running one over a
    join reads them only for a min/max a retraction takes away. Running counts and
    sums (and SELECT DISTINCT, whose groups are all it keeps), and running min/max
    over one leaf (found again in the leaf's rows), need none: their state table
    stays empty, and a bulk creation writes the MV alone."""
    return spec.running is None or (spec.extremes == "state" and any(
        kind in ("min", "max") for _, kind, _ in spec.running))


def leaf_extremes(spec: AggSpec) -> list[tuple[str, str, str]]:
    """The running min/max found again in the leaf (each keeps its rows at the
    extreme): ``(column, kind, argument column)``."""
    if spec.running is None or spec.extremes != "leaf":
        return []
    return [r for r in spec.running if r[1] in ("min", "max")]


def estimate_groups(rows: DataFrame, column: str = GROUP_OF_ROW) -> int:
    """About how many distinct groups ``rows`` hold (Spark's estimate; one job)."""
    return int(rows.select(F.approx_count_distinct(column)).collect()[0][0] or 0)


def changed_rows_bound(groups: int) -> int:
    """At most about how many rows the MV's changelog holds when the state's Δ
    touched about ``groups`` groups (an estimate, within a few percent): a
    before-image and an after-image per group."""
    return 2 * math.ceil(1.1 * groups) + 16


def agg_input_rows(plan: MvPlan, agg_state: Relation, rows: DataFrame,
                   keep: Sequence[str] = ()) -> DataFrame:
    """Row-stage rows as rows of the aggregate's state table (with their group, and
    the columns ``keep``)."""
    assert plan.agg is not None
    types = {c.name: c.type for c in agg_state.columns}
    group = group_json_sql(plan.agg.group, types)
    return rows.selectExpr(*[f"{group} AS {quoted(c.name)}" if c.name == GROUP_OF_ROW
                             else quoted(c.name) for c in agg_state.columns],
                           *names_sql(keep))


def aggregate_change(store: RelationStore, mv: Relation, plan: MvPlan, agg_state: Relation,
                     written: StateDelta | None, epoch: int, initial: bool,
                     held: HeldRows | None = None,
                     few_groups: bool = False,
                     cached: list[DataFrame] | None = None,
                     guesses: list[Guess] | None = None,
                     saw: Callable[[bool], None] | None = None) -> DataFrame | None:
    """The MV's changelog from ``written``, the row stage's change as appended to the
    aggregate's state table this epoch (None: no change); ``initial``: the job's
    first epoch (a global aggregate emits its row for empty input); ``held``: the
    rows the MV held of its leaf before the epoch, where a lost min/max is found
    again (``extremes = 'leaf'``); ``few_groups``: ``written`` is a bulk Δ of at most
    ``FEW_GROUPS`` groups (estimated); ``cached``: takes the frames it caches (the
    input rows of groups that lost a min/max), for release after the epoch;
    ``guesses``, ``saw``: as ``aggregate_running``'s."""
    assert plan.agg is not None
    spec = plan.agg
    cols = [c.name for c in agg_state.columns]
    delta = None if written is None else written.delta
    names = [c.name for c in mv.columns]
    if not spec.group:
        # a global aggregate: one partition, always one row (before HAVING)
        if delta is None and not initial:
            return None
        old = store.snapshot(mv.stored, epoch - 1).selectExpr(*names_sql(names))
        state = store.snapshot(agg_state.stored, epoch - 1).selectExpr(*names_sql(cols))
        new_input = state if delta is None else apply_delta(state, delta, agg_state)
        return consolidate(old, evaluate(mv, plan, new_input), names, mv.key)
    if written is None:
        return None
    delta = written.delta
    if spec.running is not None:
        cols = [c.name for c in agg_state.columns]

        def lost_input(groups: Sequence[str], vnodes: Sequence[int],
                       values: Sequence[tuple[object, ...]]) -> DataFrame:
            """The input rows at ``e-1`` of the groups that lost a min/max (their JSON,
            vnodes and group values)."""
            if spec.extremes == "state":
                return store.lookup(agg_state.stored, epoch - 1, groups,
                                    vnodes=vnodes).selectExpr(*names_sql(cols))
            assert held is not None, "a min/max found again in the leaf needs its rows"
            # a group of one leaf column: its rows read on the driver where the leaf is
            # small enough (a job and its plan saved)
            columns = leaf_group_columns(plan)
            on_driver = (held.rows_in(columns[0], [v[0] for v in values])
                         if columns is not None and len(columns) == 1
                         and held.rows_in is not None else None)
            if on_driver is not None:
                rows = project(plan, [on_driver])
            else:
                # the groups' values over the leaf's own columns: the read drops the
                # other groups' rows of its base as it reads them, and merges what is
                # left with its log in one job (its rows then pass that filter already)
                narrow = None if columns is None else group_values_in(columns, values)
                rows = project(plan, [held(narrow)])
                if narrow is None and (prefilter := group_values_in(spec.group, values)) \
                        is not None:
                    # by the group columns first: Spark filters the leaf's rows as it
                    # reads them, before each row's group JSON is built
                    rows = rows.where(prefilter)
            in_groups = values_in(GROUP_OF_ROW, groups)
            assert in_groups is not None  # JSON strings
            return agg_input_rows(plan, agg_state, rows).where(in_groups)
        return aggregate_running(store, mv, spec, agg_state, written, epoch, lost_input,
                                 few_groups, cached, guesses, saw)
    assert isinstance(written, Appended)  # only a running aggregate's state waits
    # the state is distributed by group: the Δ's vnodes are the touched groups'
    old_input = store.lookup(agg_state.stored, epoch - 1,
                             touched_partitions([written], GROUP_OF_ROW),
                             vnodes=written.vnodes).selectExpr(*names_sql(cols))
    new_input = apply_delta(old_input, delta, agg_state)
    return consolidate(evaluate(mv, plan, old_input),
                       evaluate(mv, plan, new_input), names, mv.key)


def aggregate_running(store: RelationStore, mv: Relation, spec: AggSpec,
                      agg_state: Relation, written: StateDelta, epoch: int,
                      lost_input: LostInput, few_groups: bool = False,
                      cached: list[DataFrame] | None = None,
                      guesses: list[Guess] | None = None,
                      saw: Callable[[bool], None] | None = None) -> DataFrame:
    """A grouped aggregate kept as running values per group (hidden columns of
    the MV): each touched group's new values are its old ones (a lookup of the
    MV's rows by group) updated by the signed input Δ — counts and exact sums
    add, a min/max takes the arriving extreme. Only a group whose Δ retracts
    its min/max without replacing it reads its input rows at ``e-1``
    (``lost_input``); with ``extremes = 'leaf'`` only one that retracts the last of
    its rows at the extreme. ``few_groups``: the Δ is a bulk one of at most
    ``FEW_GROUPS`` groups; ``cached``: takes the lost groups' input rows, cached (read
    once, though their values and their rows at each extreme both count them).
    ``guesses``: where the Δ may retract an extreme, the changelog returned is the
    one where no group lost it, and ``guesses`` takes the ``Guess`` that checks so
    (without it, the lost groups are collected first: a Spark job of their own);
    ``saw`` is told, each epoch whose Δ could lose a min/max, whether a group did
    (``guessing.GuessPolicy``)."""
    running = spec.running
    assert running is not None
    ties = leaf_extremes(spec)
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
        elif kind in ("sum", "avg"):
            # a leaving value negated, not multiplied by its weight: an int times a
            # decimal(38, s) has scale at most 6 under Spark's precision rules
            parts += [f"sum(CASE WHEN {OP} IN ('+', 'U+') THEN {x} ELSE -{x} END) "
                      f"AS {q(name + '_d')}",
                      f"sum(CASE WHEN {x} IS NOT NULL THEN {weight} END) AS {q(name + '_dn')}"]
        else:
            parts += [f"{kind}(CASE WHEN {weight} > 0 THEN {x} END) AS {q(name + '_in')}",
                      f"{kind}(CASE WHEN {weight} < 0 THEN {x} END) AS {q(name + '_out')}"]
            if (name, kind, arg) in ties:
                # how many arriving (leaving) rows are at the arriving (leaving) extreme
                parts += [f"count(CASE WHEN {weight} > 0 AND {x} = {q('_sf_wi' + name)} "
                          f"THEN 1 END) AS {q(name + '_in_n')}",
                          f"count(CASE WHEN {weight} < 0 AND {x} = {q('_sf_wo' + name)} "
                          f"THEN 1 END) AS {q(name + '_out_n')}"]
    # the Δ's rows, each with its group's arriving and leaving extremes: a bulk Δ of
    # few groups computes them per group first and joins them to its rows by a
    # broadcast (no exchange of the rows); a small one by a window, partitioned as
    # the aggregation that follows groups it
    extremes = [(f"{kind}(CASE WHEN {weight} {sign} 0 THEN {q(arg)} END)", q(prefix + name))
                for name, kind, arg in ties
                for sign, prefix in ((">", "_sf_wi"), ("<", "_sf_wo"))]
    delta_rows = "{_sf_delta}"
    if ties and few_groups:
        per_group = ", ".join(f"{sql} AS {alias}" for sql, alias in extremes)
        delta_rows = (f"(SELECT /*+ BROADCAST(_sf_e) */ _sf_dd.*, _sf_e.* FROM {{_sf_delta}} "
                      f"AS _sf_dd JOIN (SELECT {GROUP_OF_ROW} AS _sf_ekey, {per_group} "
                      f"FROM {{_sf_delta}} GROUP BY {GROUP_OF_ROW}) "
                      f"AS _sf_e ON _sf_dd.{GROUP_OF_ROW} = _sf_e._sf_ekey) AS _sf_dw")
    elif ties:
        windows = ", ".join(f"{sql} OVER (PARTITION BY {GROUP_OF_ROW}) AS {alias}"
                            for sql, alias in extremes)
        delta_rows = f"(SELECT *, {windows} FROM {{_sf_delta}}) AS _sf_dw"
    # the signed Δ per group, left-joined to the touched groups' old values (the MV's
    # rows, distributed by group), each with its whole row as the before-image of the
    # group's change; a sort-merge join: over the one partition of small reads it
    # needs no exchange, where a broadcast of the old values would be a Spark job of
    # its own. SQL text over the frames ``_sf_delta`` and ``_sf_old``, analysed once.
    firsts = [f"first({normalized_sql(g, row_types)}) AS {q(g)}" for g in spec.group]
    hidden = [c for c in mv.columns if c.hidden and c.name != GROUP_KEY]
    old_cols = [q("_sf_old" + c.name) for c in hidden]
    joined = (
        f"SELECT /*+ MERGE(_sf_o) */ _sf_p.*, {', '.join([*old_cols, BEFORE])} FROM "
        f"(SELECT {GROUP_OF_ROW}, {', '.join([*firsts, *parts])} FROM {delta_rows} "
        f"GROUP BY {GROUP_OF_ROW}) AS _sf_p LEFT JOIN (SELECT {GROUP_KEY} AS _sf_okey, "
        + ", ".join([*[f"{q(c.name)} AS {q('_sf_old' + c.name)}" for c in hidden],
                     f"{image_sql(names)} AS {BEFORE}"])
        + f" FROM {{_sf_old}}) AS _sf_o ON _sf_p.{GROUP_OF_ROW} = _sf_o._sf_okey")
    frames = {"_sf_delta": delta,
              "_sf_old": read_touched(store, mv, epoch - 1, [written], GROUP_OF_ROW)}

    def was(column: str) -> str:
        return q(f"_sf_old{column}")

    def d(column: str) -> str:
        return f"coalesce({q(column)}, 0)"

    def new_values_sql(recomputed: bool) -> list[str]:
        """Each group's new hidden values; with ``recomputed``, a group marked
        ``_sf_lost`` takes its min/max from the joined ``_sf_re`` columns."""
        new = [f"coalesce({was(GROUP_ROWS)}, 0) + _sf_d AS {GROUP_ROWS}"]
        for name, kind, arg in running:
            if kind in ("count", "count_if"):
                value = f"coalesce({was(name)}, 0) + {d(name + '_d')}"
            elif kind == "sum":
                non_null = running_count_column(name)
                n = f"(coalesce({was(non_null)}, 0) + {d(name + '_dn')})"
                new.append(f"{n} AS {q(non_null)}")
                total = exact_add_sql(f"coalesce({was(name)}, 0)", d(name + "_d"), types[name])
                value = f"CASE WHEN {n} = 0 THEN NULL ELSE {total} END"
            elif kind == "avg":
                # a decimal avg as Spark evaluates it: its exact sum (typed as its
                # ``sum``) divided by its count as decimal(20, 0), cast to its type
                non_null, summed = running_count_column(name), running_sum_column(name)
                n = f"(coalesce({was(non_null)}, 0) + {d(name + '_dn')})"
                new.append(f"{n} AS {q(non_null)}")
                total = exact_add_sql(f"coalesce({was(summed)}, 0)", d(name + "_d"),
                                      types[summed])
                new.append(f"CAST(CASE WHEN {n} = 0 THEN NULL ELSE {total} END AS "
                           f"{types[summed]}) AS {q(summed)}")
                value = (f"CASE WHEN {n} = 0 THEN NULL ELSE CAST({total} AS {types[summed]}) / "
                         f"CAST({n} AS DECIMAL(20,0)) END")
            elif (name, kind, arg) in ties:
                old, arriving = was(name), q(name + "_in")
                beyond = f"{arriving} {'>' if kind == 'max' else '<'} {old}"
                tie = running_ties_column(name)
                value = f"CASE WHEN {old} IS NULL OR {beyond} THEN {arriving} ELSE {old} END"
                count = (f"CASE WHEN {old} IS NULL OR {beyond} THEN {d(name + '_in_n')} "
                         f"WHEN {arriving} = {old} THEN {rest(name)} + {q(name + '_in_n')} "
                         f"ELSE {rest(name)} END")
                if recomputed:
                    value = f"IF(_sf_lost, {q('_sf_re' + name)}, {value})"
                    count = f"IF(_sf_lost, {q('_sf_re' + tie)}, {count})"
                new.append(f"CAST({count} AS bigint) AS {q(tie)}")
            else:
                extreme = "greatest" if kind == "max" else "least"
                value = f"{extreme}({was(name)}, {q(name + '_in')})"
                if recomputed:
                    value = f"IF(_sf_lost, {q('_sf_re' + name)}, {value})"
            new.append(f"CAST({value} AS {types[name]}) AS {q(name)}")
        return new

    def rest(name: str) -> str:
        """A tied extreme's rows at it that stay: its count less the leaving rows at it
        (leaving values are the group's, so at most the old extreme)."""
        return (f"(coalesce({was(running_ties_column(name))}, 0) - IF(coalesce("
                f"{q(name + '_out')} = {was(name)}, FALSE), {q(name + '_out_n')}, 0))")

    # a group lost its extreme when the Δ retracts a value at it (with ties counted:
    # the last of its rows at it) and brings none at or beyond it
    lost = " OR ".join(
        (f"({was(name)} IS NOT NULL AND {rest(name)} <= 0" if (name, kind, arg) in ties else
         f"(coalesce({q(name + '_out')} {cmp} {was(name)}, FALSE)")
        + f" AND NOT coalesce({q(name + '_in')} {cmp} {was(name)}, FALSE))"
        for name, kind, arg in running if kind in ("min", "max")
        for cmp in [">=" if kind == "max" else "<="])
    group_cols = ", ".join(map(q, spec.group))
    # the groups that lost their extreme (and still have rows)
    lost_sql = (f"SELECT {GROUP_OF_ROW}, {vnode_sql([GROUP_OF_ROW])}, {group_cols} FROM (SELECT "
                f"{GROUP_OF_ROW}, {group_cols}, ({lost}) AS _sf_lost, "
                f"{', '.join(new_values_sql(False))} FROM ({joined}) AS _sf_j) AS _sf_n "
                f"WHERE _sf_lost AND {GROUP_ROWS} > 0") if lost else ""

    def lost_groups() -> list[tuple[str, int, tuple[object, ...]]]:
        """The groups that lost their extreme: a small collect (one Spark job)."""
        store.spark_jobs += 1
        found = [(str(r[0]), int(r[1]), tuple(r[2:]))
                 for r in sql_over(lost_sql, frames).collect()]
        if saw is not None:
            saw(bool(found))
        return found

    def changelog(lost_groups: list[tuple[str, int, tuple[object, ...]]],
                  cached: list[DataFrame] | None) -> DataFrame:
        """The MV's changelog, ``lost_groups`` the groups that lost their extreme."""
        with_lost, on = dict(frames), joined
        if lost_groups:
            # their extremes recomputed from their input rows (the state's rows of
            # those groups with the Δ applied) and joined in beside the running values
            groups = sorted({g for g, _, _ in lost_groups})
            old_input = lost_input(groups, sorted({v for _, v, _ in lost_groups}),
                                   [values for _, _, values in lost_groups])
            in_groups = values_in(GROUP_OF_ROW, groups)
            assert in_groups is not None  # JSON strings
            new_input = apply_delta(old_input, delta.where(in_groups), agg_state)
            if cached is not None:
                # the lost groups' rows are few, but finding them reads the leaf (or
                # the state) by group, not by key: read once, for both the groups'
                # values and their rows at each extreme
                new_input = persisted(new_input)
                cached.append(new_input)
            with_lost["_sf_re"] = group_values(spec, new_input).selectExpr(
                f"{group_json_sql(spec.group, row_types)} AS _sf_rekey",
                *[f"{q(name)} AS {q('_sf_re' + name)}" for name, kind, _ in running
                  if kind in ("min", "max")],
                *[f"{q(running_ties_column(name))} AS "
                  f"{q('_sf_re' + running_ties_column(name))}" for name, _, _ in ties])
            on = (f"SELECT _sf_j.*, _sf_r.*, _sf_r._sf_rekey IS NOT NULL AS _sf_lost "
                  f"FROM ({joined}) AS _sf_j LEFT JOIN {{_sf_re}} AS _sf_r "
                  f"ON _sf_j.{GROUP_OF_ROW} = _sf_r._sf_rekey")
        new_values = (f"SELECT {', '.join([GROUP_OF_ROW, *map(q, spec.group)])}, "
                      f"{', '.join(new_values_sql(bool(lost_groups)))}, {BEFORE} "
                      f"FROM ({on}) AS _sf_j")
        # a group's change: its old row (the before-image) against its new values
        # (none when its last row left); one projection over every touched group, so
        # the plan above computes them once
        live = f"{GROUP_ROWS} > 0"
        rows = outputs_sql(mv, spec, new_values, row_types, carry=(BEFORE,), only_if=live)
        pairs = (f"SELECT {GROUP_KEY}, {BEFORE}, IF({live}, {image_sql(names)}, NULL) "
                 f"AS {AFTER} FROM ({rows}) AS _sf_rows")
        return sql_over(changelog_sql(pairs, names, mv.key), with_lost)

    if not lost or not may_retract(written):  # (an insert-only Δ retracts nothing)
        return changelog([], cached)
    if guesses is None:
        return changelog(lost_groups(), cached)
    # the guess that no group lost its extreme, and the rows that would prove it
    # wrong: checked in the job that writes the changelog (the epoch's flush), where
    # the lost groups' collect would be a job of its own before it
    guesses.append(Guess(sql_over(f"SELECT {GROUP_OF_ROW} FROM ({lost_sql}) AS _sf_l", frames),
                         lambda cached: changelog(lost_groups(), cached),
                         (lambda: saw(False)) if saw is not None else lambda: None))
    return changelog([], cached)


#: at most this many lost groups filter a leaf's rows by their group columns
PREFILTER_GROUPS = 1_000


def group_values_in(columns: Sequence[str], values: Sequence[tuple[object, ...]]) -> str | None:
    """Rows whose ``columns`` hold one of ``values`` (SQL, NULL-safe; None: too many,
    or a value has no literal form here: filter by the groups' JSON alone)."""
    if not values or len(values) > PREFILTER_GROUPS:
        return None
    terms = []
    for row in values:
        parts = []
        for column, value in zip(columns, row, strict=True):
            if value is None:
                parts.append(f"{quoted(column)} IS NULL")
                continue
            literal = sql_literal(value)
            if literal is None:
                return None
            parts.append(f"{quoted(column)} = {literal}")
        terms.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(terms)


def leaf_group_columns(plan: MvPlan) -> list[str] | None:
    """The leaf's columns the group columns are, each as it is (None: one is an
    expression)."""
    assert plan.agg is not None
    sql_of = dict(plan.rows)
    leaf_columns = []
    for group in plan.agg.group:
        sql = sql_of.get(group)
        node = None if sql is None else sqlglot.parse_one(sql, read="spark")
        if not isinstance(node, exp.Column):
            return None
        leaf_columns.append(node.name)
    return leaf_columns


def group_values(spec: AggSpec, rows: DataFrame) -> DataFrame:
    """Per group of ``rows``: the group columns, each aggregate's value and, for a
    running aggregate, the group's rows, each sum's and avg's non-null count, each
    avg's sum and each min's or max's rows at it (``leaf_extremes``)."""
    by_extreme = values_by_extreme(spec, rows)
    if by_extreme is not None:
        return by_extreme
    return with_ties(spec, rows, grouped_values(spec, rows), few=False)


def values_by_extreme(spec: AggSpec, rows: DataFrame) -> DataFrame | None:
    """``group_values`` in one read of ``rows``: aggregated per (group, the extremes'
    argument), then per group, where the extreme is the greatest (least) second key
    and its rows at it are that key's count. None (two reads: ``with_ties``) unless
    each aggregate runs and can be summed up in two steps — a count, count_if, sum of
    integers or decimals, min or max; no avg — and the min/max found again in the
    leaf share one argument column, not a floating-point one (grouping normalizes
    -0.0 and NaN, where ``max`` keeps the value as it was)."""
    running = spec.running
    ties = [t for t in leaf_extremes(spec) if t[2] not in spec.group]
    if running is None or not ties or len({arg for _, _, arg in ties}) != 1 \
            or any(kind == "avg" for _, kind, _ in running) \
            or {name for name, _ in spec.aggs} != {name for name, _, _ in running}:
        return None
    by = ties[0][2]
    types = {f.name: f.dataType for f in rows.schema.fields}
    if isinstance(types[by], T.FloatType | T.DoubleType):
        return None
    q = quoted
    first = ["count(1) AS _sf_c"]
    second = [f"sum(_sf_c) AS {GROUP_ROWS}"]
    for i, (name, kind, arg) in enumerate(running):
        part = f"_sf_p{i}"
        x = q(arg) if arg else "1"
        if kind in ("min", "max") and arg == by:
            # the second key's greatest (least) value, and its rows (NULLs are neither)
            second += [f"{kind}({q(by)}) AS {q(name)}",
                       f"coalesce({kind}_by(_sf_c, {q(by)}), 0) AS "
                       f"{q(running_ties_column(name))}"]
            continue
        if kind in ("min", "max"):
            first.append(f"{kind}({x}) AS {part}")
            second.append(f"{kind}({part}) AS {q(name)}")
            if (name, kind, arg) in leaf_extremes(spec):  # a group column's extreme
                first.append(f"count({x}) AS {part}x")
                second.append(f"sum({part}x) AS {q(running_ties_column(name))}")
        elif kind in ("count", "count_if"):
            first.append(f"{kind}({x}) AS {part}")
            second.append(f"sum({part}) AS {q(name)}")
        else:  # an exact sum, typed as one aggregation types it
            arg_type = types[arg]
            summed = (T.DecimalType(min(38, arg_type.precision + 10), arg_type.scale)
                      if isinstance(arg_type, T.DecimalType) else T.LongType())
            first += [f"sum({x}) AS {part}", f"count({x}) AS {part}n"]
            second += [f"CAST(sum({part}) AS {summed.simpleString()}) AS {q(name)}",
                       f"sum({part}n) AS {q(running_count_column(name))}"]
    # in ``with_ties``' order of columns
    order = [*spec.group, *[name for name, _ in spec.aggs], GROUP_ROWS,
             *[running_count_column(name) for name, kind, _ in running if kind == "sum"],
             *[running_ties_column(name) for name, _, arg in leaf_extremes(spec)
               if arg in spec.group],
             *[running_ties_column(name) for name, _, _ in ties]]
    # one statement (one analysis), not a chain of DataFrame calls
    groups = names_sql(spec.group)
    by_group = f" GROUP BY {', '.join(groups)}" if groups else ""
    inner = (f"SELECT {', '.join([*groups, q(by), *first])} FROM {{_sf_input}}"
             f" GROUP BY {', '.join([*groups, q(by)])}")
    outer = f"SELECT {', '.join([*groups, *second])} FROM ({inner}){by_group}"
    return sql_over(f"SELECT {', '.join(names_sql(order))} FROM ({outer})",
                    {"_sf_input": rows})


def grouped_values(spec: AggSpec, rows: DataFrame) -> DataFrame:
    """``group_values`` but each min's or max's rows at it (one aggregation)."""
    aggs = [F.expr(sql).alias(name) for name, sql in spec.aggs]
    if spec.running is not None:
        aggs.append(F.count(F.lit(1)).alias(GROUP_ROWS))
        aggs += [F.count(F.col(arg)).alias(running_count_column(name))
                 for name, kind, arg in spec.running if kind in ("sum", "avg")]
        aggs += [F.sum(F.col(arg)).alias(running_sum_column(name))
                 for name, kind, arg in spec.running if kind == "avg"]
        # an extreme of a group column: every row of the group with a value is at it
        aggs += [F.count(F.col(arg)).alias(running_ties_column(name))
                 for name, _, arg in leaf_extremes(spec) if arg in spec.group]
    return rows.groupBy(*spec.group).agg(*(aggs or [F.count(F.lit(1)).alias("_sf_n")]))


#: at most this many groups are broadcast to count their rows at each extreme
FEW_GROUPS = 200_000


def with_ties(spec: AggSpec, rows: DataFrame, grouped: DataFrame, few: bool) -> DataFrame:
    """``grouped`` (``grouped_values`` of ``rows``) with each min's or max's rows at
    it. ``few``: ``grouped`` holds at most ``FEW_GROUPS`` groups (computed already):
    it is broadcast, and one pass over ``rows`` counts each group's rows at its
    extremes; else the rows are counted per (group, value), for each extreme, and
    the extreme value's count picked."""
    ties = [t for t in leaf_extremes(spec) if t[2] not in spec.group]
    if not ties:
        return grouped
    keys = [f"_sf_tie_g{i}" for i in range(len(spec.group))]
    names = [running_ties_column(name) for name, _, _ in ties]

    def joined(left: DataFrame, right: DataFrame, how: str) -> DataFrame:
        """``left`` joined to ``right`` (group columns renamed ``keys``) by group."""
        on = [left[g].eqNullSafe(right[k]) for g, k in zip(spec.group, keys, strict=True)]
        return left.join(right, on, how)

    if few:
        extremes = [f"_sf_tie_e{i}" for i in range(len(ties))]
        at_extremes = F.broadcast(grouped.select(*spec.group, *[n for n, _, _ in ties])
                                  .toDF(*keys, *extremes))
        counted = (joined(rows, at_extremes, "inner").groupBy(*keys)
                   .agg(*[F.count(F.when(F.col(arg) == F.col(e), 1)).alias(n)
                          for (_, _, arg), e, n in zip(ties, extremes, names, strict=True)]))
        return joined(grouped, counted, "left").drop(*keys).fillna(0, subset=names)
    for (_, kind, arg), tie in zip(ties, names, strict=True):
        pick = F.max_by if kind == "max" else F.min_by
        at = (rows.where(F.col(arg).isNotNull()).groupBy(*spec.group, arg)
              .agg(F.count(F.lit(1)).alias("_sf_c"))
              .groupBy(*spec.group).agg(pick("_sf_c", arg).alias(tie))
              .toDF(*keys, tie))
        grouped = joined(grouped, at, "left").drop(*keys).fillna(0, subset=[tie])
    return grouped


def exact_add_sql(a: str, b: str, type_sql: str) -> str:
    """``a + b`` (SQL) for two values of the running sum's type, at that type's scale.
    Spark types ``decimal(38, s) + decimal(38, s)`` as ``decimal(38, s - 1)`` when s > 6
    (its precision rules give up a digit of scale for a 39th of precision), where
    its own ``sum`` adds at scale s; so two such values are added as
    ``decimal(37, s)`` (exact: the sum fits 38 digits) while they fit in it, and a
    value beyond that range fails the epoch loudly rather than lose its last digit."""
    m = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", type_sql.strip().lower())
    if m is None or int(m.group(1)) < 38 or int(m.group(2)) <= 6:
        return f"({a} + {b})"
    scale = int(m.group(2))
    narrow = f"decimal(37,{scale})"
    bound = f"1E{37 - scale}BD"
    return (f"(CASE WHEN abs({a}) < {bound} AND abs({b}) < {bound} THEN "
            f"CAST(CAST({a} AS {narrow}) + CAST({b} AS {narrow}) AS {type_sql}) "
            f"ELSE CAST(raise_error('a running sum of {type_sql} reached 10^{37 - scale}: "
            f"beyond it the MV cannot add at scale {scale} as Spark does') AS {type_sql}) END)")


def outputs(mv: Relation, spec: AggSpec, grouped: DataFrame,
            group_types: dict[str, str], carry: Sequence[str] = (),
            only_if: str | None = None) -> DataFrame:
    """The MV's rows (visible outputs, group key, hidden running values) from
    per-group values, and the ``carry`` columns of ``grouped`` as they are.
    ``only_if``: a condition of a group's values; the visible outputs of a group
    that fails it are NULL and never evaluated (a division by a gone group's count
    would fail)."""
    return sql_over(outputs_sql(mv, spec, "SELECT * FROM {_sf_grouped}", group_types,
                                carry, only_if), {"_sf_grouped": grouped})


def outputs_sql(mv: Relation, spec: AggSpec, grouped: str, group_types: dict[str, str],
                carry: Sequence[str] = (), only_if: str | None = None) -> str:
    """``outputs`` as SQL text over the query ``grouped`` (SQL text)."""
    types = {c.name: c.type for c in mv.columns}
    out = [f"CAST(({sql}) AS {types[name]}) AS {quoted(name)}" if only_if is None else
           f"CAST(IF({only_if}, ({sql}), NULL) AS {types[name]}) AS {quoted(name)}"
           for name, sql in spec.outputs]
    key = f"{group_json_sql(spec.group, group_types)} AS {GROUP_KEY}"
    hidden = [f"CAST({quoted(c.name)} AS {c.type}) AS {quoted(c.name)}" for c in mv.columns
              if c.hidden and c.name != GROUP_KEY]
    where = f" WHERE {spec.having}" if spec.having else ""
    return (f"SELECT {', '.join([*out, key, *hidden, *[quoted(c) for c in carry]])} "
            f"FROM ({grouped}) AS _sf_grouped{where}")


def evaluate(mv: Relation, plan: MvPlan, rows: DataFrame) -> DataFrame:
    """The aggregate's output rows over its input ``rows``: the MV's columns."""
    assert plan.agg is not None
    return outputs(mv, plan.agg, group_values(plan.agg, rows),
                   dict(rows.dtypes))


def evaluate_counted(mv: Relation, plan: MvPlan, rows: DataFrame,
                     cached: list[DataFrame]) -> tuple[DataFrame, int]:
    """``evaluate`` of a bulk input, and how many groups it has: the groups' values
    are computed and cached first (one Spark job), so each min's or max's rows at it
    are counted by a broadcast of them when they are few; frames cached go to
    ``cached``."""
    assert plan.agg is not None
    grouped = persisted(grouped_values(plan.agg, rows))
    cached.append(grouped)
    groups = grouped.count()
    values = with_ties(plan.agg, rows, grouped, few=groups <= FEW_GROUPS)
    return outputs(mv, plan.agg, values, dict(rows.dtypes)), groups
