"""Planning a materialized view: from the sqlglot tree of its SELECT to an
``MvPlan`` — leaves, an optional equi-join, a row stage (filter/project), an
optional aggregate stage — with the MV's schema, stream key and state tables.

Invariants: the MV's output names and types come from Spark's own analysis of
the query; every stream key (the MV's and each state table's) is non-null, so
keys compare with plain equality everywhere:

* filter/project over one relation: the upstream's key;
* a join: both sides' keys (for a side an outer join may null-extend — the right
  of a LEFT JOIN, the left of a RIGHT JOIN, both of a FULL JOIN — that side's key
  as one JSON string, ``"{}"`` on a row without a match); an inner join's side
  whose whole key the ON clause equates with the other side's values (each row of
  the other meets at most one of its rows) adds nothing: the other's key is one;
* an aggregate or ``DISTINCT``: ``_sf_k_group``, the group's values as JSON;
* ``UNION ALL``: the branch's number and the branch row's upstream key as JSON.

Every shape this planner cannot maintain incrementally is refused with
``UnsupportedQuery`` naming the construct, before anything is created.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructType,
)
from sqlglot import exp

from ..errors import DataError, SqlError, UnknownRelation, UnsupportedQuery
from ..storage.schema import HIDDEN_PREFIX, Column, normalize_type_name, user_struct
from .probe_views import once, probe_frame, probe_view, probing
from .rewrite import rewrite_query
from .sql_tree import ColumnsOf, conjuncts, from_of, has_star

__all__ = [
    "Leaf", "JoinSpec", "AggSpec", "StateDef", "MvPlan", "PlannedMv", "LeafInfo",
    "plan_materialized_view", "check_supported", "check_supported_top_n", "leaf_tables",
    "rewrite_top_n", "check_shape",
    "explain_plan",
    "NONDETERMINISTIC", "CLOCK_FUNCTIONS", "GROUP_KEY", "JOIN_KEY", "GROUP_OF_ROW", "BRANCH",
    "BRANCH_ROW",
    "Branch", "union_branches", "GROUP_ROWS", "running_count_column", "running_sum_column",
    "running_ties_column",
    "TopNSpec",
    "WindowSpec", "WINDOW_PART",
    "split_top_n",
]

NONDETERMINISTIC = {
    "rand", "random", "randn", "uuid", "now", "current_timestamp", "currenttimestamp",
    "current_date", "currentdate", "current_time", "currenttime", "localtimestamp",
    "monotonically_increasing_id", "spark_partition_id", "input_file_name", "shuffle",
    "current_timezone",
}
#: the non-deterministic functions that read the clock: a processing-time column
#: (``AS PROCTIME()``) is the deterministic way to use the time rows arrive
CLOCK_FUNCTIONS = {
    "now", "current_timestamp", "currenttimestamp", "current_date", "currentdate",
    "current_time", "currenttime", "localtimestamp",
}

#: aggregate functions kept exact under deletes by recomputing a group from its input
SUPPORTED_AGGS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.CountIf,
                  exp.Stddev, exp.StddevPop, exp.StddevSamp, exp.Variance,
                  exp.LogicalAnd, exp.LogicalOr)

#: the MV key of an aggregate: the group's values as JSON
GROUP_KEY = f"{HIDDEN_PREFIX}group"
#: the group of one aggregate input row (state table column, same JSON as GROUP_KEY)
GROUP_OF_ROW = "_sf_gk"
#: the join key of one side's row (state table column): the equi-join values as JSON
JOIN_KEY = "_sf_jk"
#: the partition of a window's input row (state table column) and of an MV row of
#: window functions (the first column of its key): the partition values as JSON
WINDOW_PART = f"{HIDDEN_PREFIX}part"
#: the MV key of a UNION ALL: which branch a row comes from, and its upstream key as JSON
BRANCH = f"{HIDDEN_PREFIX}branch"
BRANCH_ROW = f"{HIDDEN_PREFIX}branch_row"

_CLAUSES = {
    # (an ORDER BY without LIMIT/OFFSET was dropped by ``rewrite_query``; ORDER BY with
    # LIMIT is a top-N, split off by ``split_top_n`` before the shape is checked)
    "limit": "LIMIT without ORDER BY (which rows it keeps is arbitrary; add an ORDER BY "
             "that decides it)",
    "offset": "OFFSET",
    "order": "ORDER BY (an MV is an unordered set; order when you read it)",
    "qualify": "QUALIFY",
    "laterals": "LATERAL VIEW",
    "windows": "WINDOW",
    # (a non-recursive CTE was inlined by ``rewrite_query``)
    "with": "a recursive CTE (WITH RECURSIVE)",
    "with_": "a recursive CTE (WITH RECURSIVE)",
}


@dataclass(frozen=True)
class Leaf:
    """One relation the MV reads, under its alias in the query."""

    alias: str
    relation: str


@dataclass(frozen=True)
class JoinSpec:
    how: str  # "inner" | "left" | "right" | "full"
    on: str  # the whole ON condition, Spark SQL
    #: per side, the Spark SQL expressions (over that side's columns) of the join key,
    #: cast to a common type, so both sides' JSON of equal keys is equal
    key_exprs: tuple[tuple[str, ...], tuple[str, ...]]
    #: per side, the WHERE's conjuncts over that side's columns alone (Spark SQL over
    #: them), on a side no NULLs extend: a row they drop would be dropped after the join
    #: too, so the side's state keeps only the rows they pass (None: every row)
    side_filters: tuple[str | None, str | None] = (None, None)


@dataclass(frozen=True)
class AggSpec:
    group: tuple[str, ...]  # row-stage columns holding the group values
    aggs: tuple[tuple[str, str], ...]  # (column, Spark SQL aggregate over row columns)
    having: str | None  # over group and aggregate columns
    outputs: tuple[tuple[str, str], ...]  # (MV column, Spark SQL over group/agg columns)
    #: running aggregates, kept per group in hidden columns of the MV: (agg column,
    #: kind, argument column) for each aggregate; None: the aggregate recomputes its
    #: touched groups from its input rows instead (HAVING, a global aggregate, or an
    #: aggregate that is not a count, an exact sum, min or max)
    running: tuple[tuple[str, str, str], ...] | None = None
    #: where a running min/max that a retraction took away is found again: "state" —
    #: the aggregate's input rows, kept in its state table; "leaf" — the rows the MV
    #: holds of its one leaf, read only then (no input rows are kept, and each min/max
    #: keeps in a hidden column how many of its group's rows are at it, so a
    #: retraction of one of several equal extremes loses nothing)
    extremes: str = "state"


#: hidden MV column of a running aggregate: the rows of the group
GROUP_ROWS = "_sf_rows"
#: the sides (0 left, 1 right) whose columns a join of each kind may fill with NULLs
NULL_EXTENDED_SIDES: dict[str, frozenset[int]] = {
    "inner": frozenset(), "left": frozenset({1}), "right": frozenset({0}),
    "full": frozenset({0, 1})}


def running_count_column(agg_column: str) -> str:
    """Hidden MV column of a running ``sum`` or ``avg``: the non-null values it adds up."""
    return f"{agg_column}_n"


def running_ties_column(agg_column: str) -> str:
    """Hidden MV column of a running ``min``/``max`` found again from its leaf: how many
    of the group's rows are at the extreme."""
    return f"{agg_column}_x"


def running_sum_column(agg_column: str) -> str:
    """Hidden MV column of a running ``avg``: the sum of its values (as Spark's ``sum``)."""
    return f"{agg_column}_s"


@dataclass(frozen=True)
class StateDef:
    """A state table of the MV: a relation like any other."""

    role: str  # "left" | "right" (join sides) | "agg" (aggregate input)
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    dist_key: tuple[str, ...]


@dataclass(frozen=True)
class Branch:
    """One branch of a ``UNION ALL``: a filter/project over the leaf of the same
    position; ``rows`` end with the MV's key columns (branch number, row key)."""

    where: str | None
    rows: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TopNSpec:
    """``ORDER BY ... LIMIT limit OFFSET offset`` over the row stage's columns."""

    #: (column, descending, nulls first), ties broken by the MV's key
    order: tuple[tuple[str, bool, bool], ...]
    limit: int
    offset: int = 0


@dataclass(frozen=True)
class WindowSpec:
    """Window functions over the row stage's rows, all with one ``PARTITION BY``: a
    partition's outputs are recomputed from its input rows when they change."""

    #: row-stage columns holding the partition values (none: one partition)
    partition: tuple[str, ...]
    #: (MV column, Spark SQL over row-stage columns, window functions included)
    outputs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class MvPlan:
    """``SELECT ... FROM leaves [JOIN] [WHERE] [GROUP BY ... HAVING]``.

    The row stage evaluates ``rows`` over the (joined) leaves after ``where``;
    its key is ``row_key``. Without ``agg`` its rows are the MV's rows.
    """

    leaves: tuple[Leaf, ...]
    join: JoinSpec | None
    where: str | None
    rows: tuple[tuple[str, str], ...]
    row_key: tuple[str, ...]
    agg: AggSpec | None
    states: tuple[str, ...] = ()  # names of the state relations, by role order
    #: a UNION ALL: one branch per leaf (then ``rows``, ``where`` and ``join`` are unused)
    branches: tuple[Branch, ...] = ()
    #: a top-N over the rows (one leaf: the rows before ORDER BY ... LIMIT)
    topn: TopNSpec | None = None
    #: window functions over the rows (then ``agg`` is None)
    window: WindowSpec | None = None

    @property
    def upstreams(self) -> tuple[str, ...]:
        return tuple(leaf.relation for leaf in self.leaves)

    @property
    def upstream(self) -> str:
        return self.leaves[0].relation

    def to_json(self) -> dict[str, Any]:
        return {
            "leaves": [[lf.alias, lf.relation] for lf in self.leaves],
            "join": None if self.join is None else {
                "how": self.join.how, "on": self.join.on,
                "key_exprs": [list(k) for k in self.join.key_exprs],
                "side_filters": list(self.join.side_filters)},
            "where": self.where,
            "rows": [list(r) for r in self.rows],
            "row_key": list(self.row_key),
            "agg": None if self.agg is None else {
                "group": list(self.agg.group), "aggs": [list(a) for a in self.agg.aggs],
                "having": self.agg.having, "outputs": [list(o) for o in self.agg.outputs],
                "running": None if self.agg.running is None else [
                    list(r) for r in self.agg.running],
                "extremes": self.agg.extremes},
            "states": list(self.states),
            "branches": [{"where": b.where, "rows": [list(r) for r in b.rows]}
                         for b in self.branches],
            "topn": None if self.topn is None else {
                "order": [list(o) for o in self.topn.order], "limit": self.topn.limit,
                "offset": self.topn.offset},
            "window": None if self.window is None else {
                "partition": list(self.window.partition),
                "outputs": [list(o) for o in self.window.outputs]},
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> MvPlan:
        j = d.get("join")
        a = d.get("agg")
        return MvPlan(
            leaves=tuple(Leaf(x, y) for x, y in d["leaves"]),
            join=None if j is None else JoinSpec(
                j["how"], j["on"], (tuple(j["key_exprs"][0]), tuple(j["key_exprs"][1])),
                # a plan stored before side filters: its states keep every row
                _side_filters(j.get("side_filters"))),
            where=d["where"],
            rows=tuple((x, y) for x, y in d["rows"]),
            row_key=tuple(d["row_key"]),
            agg=None if a is None else AggSpec(
                tuple(a["group"]), tuple((x, y) for x, y in a["aggs"]), a["having"],
                tuple((x, y) for x, y in a["outputs"]),
                None if a.get("running") is None else tuple(
                    (x, y, z) for x, y, z in a["running"]),
                str(a.get("extremes", "state"))),
            states=tuple(d.get("states", ())),
            branches=tuple(Branch(b["where"], tuple((x, y) for x, y in b["rows"]))
                           for b in d.get("branches", ())),
            topn=None if d.get("topn") is None else TopNSpec(
                tuple((str(c), bool(desc), bool(nf)) for c, desc, nf in d["topn"]["order"]),
                int(d["topn"]["limit"]), int(d["topn"]["offset"])),
            window=None if d.get("window") is None else WindowSpec(
                tuple(d["window"]["partition"]),
                tuple((x, y) for x, y in d["window"]["outputs"])),
        )


@dataclass(frozen=True)
class LeafInfo:
    """What the planner needs to know of a relation a query reads."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]


@dataclass(frozen=True)
class PlannedMv:
    plan: MvPlan
    columns: list[Column]
    key: list[str]
    states: list[StateDef]


# --- checking the shape -------------------------------------------------------------------


def _from_table(select: exp.Select) -> exp.Expr | None:
    from_ = from_of(select)
    return None if from_ is None else from_.this


def union_branches(query: exp.Expr) -> list[exp.Expr]:
    """The branches of a (nested) UNION ALL, left to right; ``[query]`` otherwise."""
    if isinstance(query, exp.Union) and not query.args.get("distinct"):
        return [*union_branches(query.this), *union_branches(query.expression)]
    return [query]


def split_top_n(query: exp.Query) -> tuple[exp.Query, tuple[tuple[int, bool, bool], ...],
                                             int, int] | None:
    """A ``SELECT ... ORDER BY ... LIMIT n [OFFSET m]`` as the query without them and
    the order as (output position, descending, nulls first); None without LIMIT."""
    limit = query.args.get("limit")
    if limit is None or not isinstance(query, exp.Select):
        return None
    order = query.args.get("order")
    if order is None:
        raise UnsupportedQuery(_CLAUSES["limit"] + " in a materialized view")
    def number(node: exp.Expr | None, what: str) -> int:
        value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
        if not isinstance(value, exp.Literal) or value.is_string or not value.this.isdigit():
            raise UnsupportedQuery(f"{what} must be a constant number in a materialized view")
        return int(value.this)
    n = number(limit, "LIMIT")
    m = number(query.args["offset"], "OFFSET") if query.args.get("offset") else 0
    items = query.expressions
    if has_star(query):
        raise UnsupportedQuery("ORDER BY ... LIMIT over SELECT *: name the columns")
    names = [i.alias_or_name.lower() for i in items]
    sqls = [i.unalias().sql(dialect="spark") for i in items]
    keys = []
    for o in order.expressions:
        target = o.this
        if isinstance(target, exp.Literal) and not target.is_string and target.this.isdigit():
            pos = int(target.this) - 1
        elif isinstance(target, exp.Column) and not target.table \
                and target.name.lower() in names:
            pos = names.index(target.name.lower())
        elif target.sql(dialect="spark") in sqls:
            pos = sqls.index(target.sql(dialect="spark"))
        else:
            raise UnsupportedQuery(
                f"ORDER BY {target.sql(dialect='spark')} ... LIMIT in a materialized view must "
                "order by columns of its SELECT list")
        if not 0 <= pos < len(items):
            raise UnsupportedQuery(f"ORDER BY position {pos + 1} is not in the SELECT list")
        desc = bool(o.args.get("desc"))
        nulls_first = o.args.get("nulls_first")
        # Spark's default: NULLs first ascending, last descending
        keys.append((pos, desc, (not desc) if nulls_first is None else bool(nulls_first)))
    inner = query.copy()
    for arg in ("order", "limit", "offset"):
        inner.set(arg, None)
    return inner, tuple(keys), n, m


def check_supported(query: exp.Expr, columns_of: ColumnsOf | None = None) -> exp.Query:
    """The query in the form the planner compiles (``rewrite_query``: the same rows)
    if its shape is supported, else raise ``UnsupportedQuery``; ``columns_of``: the
    relations' column names, to resolve unqualified columns of comma joins."""
    return check_supported_top_n(query, columns_of)[0]


def check_supported_top_n(query: exp.Expr, columns_of: ColumnsOf | None = None,
                          ) -> tuple[exp.Query, tuple[tuple[int, bool, bool], ...] | None,
                                     int, int]:
    """``check_supported`` of a query whose ``ORDER BY ... LIMIT n OFFSET m`` (a top-N)
    is split off: (the query without it, its order by output position or None, n, m)."""
    body, order, n, m = rewrite_top_n(query, columns_of)
    return _check_shape(body), order, n, m


def rewrite_top_n(query: exp.Expr, columns_of: ColumnsOf | None = None,
                  ) -> tuple[exp.Expr, tuple[tuple[int, bool, bool], ...] | None, int, int]:
    """``rewrite_query`` with a top-N split off (see ``check_supported_top_n``); the
    shape is not checked."""
    rewritten = rewrite_query(query, columns_of)
    top_n = split_top_n(rewritten) if isinstance(rewritten, exp.Query) else None
    if top_n is None:
        return rewritten, None, 0, 0
    return top_n


def check_shape(query: exp.Expr) -> exp.Query:
    """The query if the planner compiles its shape, else raise ``UnsupportedQuery``."""
    return _check_shape(query)


def _check_shape(query: exp.Expr) -> exp.Query:
    if isinstance(query, exp.Union):
        if query.args.get("distinct"):  # (a chain of UNIONs only was rewritten)
            raise UnsupportedQuery("UNION (without ALL) mixed with UNION ALL is not supported "
                                   "in an MV; use UNION throughout, or use UNION ALL and "
                                   "SELECT DISTINCT over an MV of it")
        for arg, label in _CLAUSES.items():
            if query.args.get(arg):
                raise UnsupportedQuery(f"{label} is not supported in a materialized view")
        for branch in union_branches(query):
            if isinstance(branch, exp.Subquery):
                branch = branch.unnest()
            if isinstance(branch, exp.Union):
                raise UnsupportedQuery("UNION (without ALL) mixed with UNION ALL is not "
                                       "supported in an MV; use UNION ALL throughout, or "
                                       "UNION throughout")
            select = _check_shape(branch)
            assert isinstance(select, exp.Select)
            if select.args.get("joins") or select.args.get("group") or \
                    select.args.get("distinct") or _aggregates(select):
                raise UnsupportedQuery(
                    "a UNION ALL branch must filter and project one relation (no join, "
                    "aggregate or DISTINCT); create an MV for the branch and union that")
        return query
    if isinstance(query, exp.Except | exp.Intersect):
        raise UnsupportedQuery(f"{type(query).__name__.upper()} is not supported in an MV")
    if not isinstance(query, exp.Select):
        raise UnsupportedQuery(f"an MV must be defined by a SELECT, got {type(query).__name__}")
    for arg, label in _CLAUSES.items():
        if query.args.get(arg):
            raise UnsupportedQuery(f"{label} is not supported in a materialized view")
    source = _from_table(query)
    if source is None:
        raise UnsupportedQuery("an MV must read FROM a table or materialized view")
    joins = query.args.get("joins") or []
    for rel in [source, *[j.this for j in joins]]:
        if not isinstance(rel, exp.Table) or isinstance(rel.this, exp.Func):
            raise UnsupportedQuery("FROM a subquery or a table function is not supported; "
                                   "create an MV for the subquery and select from it")
    for j in joins:
        kind = (j.args.get("kind") or "").upper()
        if kind == "CROSS" or (not j.args.get("on") and not j.args.get("using")):
            raise UnsupportedQuery("a join without ON (cross join) is not supported; "
                                   "join ON equalities of columns")
        if j.args.get("using"):
            raise UnsupportedQuery("JOIN ... USING is not supported; write JOIN ... ON "
                                   "a.col = b.col")
        if kind in ("SEMI", "ANTI") or j.args.get("method"):
            raise UnsupportedQuery(f"{kind or j.args.get('method')} JOIN is not supported")
    if query.args.get("distinct") and (query.args.get("group") or _aggregates(query)):
        raise UnsupportedQuery("SELECT DISTINCT with GROUP BY or aggregates is not supported; "
                               "group by the columns instead")
    for node in query.walk():
        if node is query:
            continue
        if isinstance(node, exp.Window):
            _check_window(query, node)
            continue
        if isinstance(node, exp.Select | exp.Subquery):
            outer = node.parent if isinstance(node.parent, exp.In | exp.Exists) else node
            text = outer.sql(dialect="spark")
            raise UnsupportedQuery(
                f"this subquery cannot be maintained: {text[:200]}"
                f"{'...' if len(text) > 200 else ''}; supported subqueries are [NOT] IN "
                "over an uncorrelated subquery, [NOT] EXISTS correlated by equalities (and "
                "at most one comparison), and scalar subqueries that aggregate, uncorrelated "
                "or correlated by equalities")
        if isinstance(node, exp.AggFunc) and not isinstance(node, SUPPORTED_AGGS) \
                and not isinstance(node.parent, exp.Window):
            raise UnsupportedQuery(
                f"aggregate {node.sql(dialect='spark')} is not supported; supported are "
                "count, count(DISTINCT ...), sum, avg, min, max, count_if, stddev, variance, "
                "bool_and, bool_or")
        if isinstance(node, exp.Func):
            names = {type(node).__name__.lower()}
            if isinstance(node, exp.Anonymous):
                names.add(str(node.name).lower())
            if "session_window" in names or ("window" in names and len(node.expressions) > 2):
                raise UnsupportedQuery(
                    f"{node.sql(dialect='spark')}: Spark's sliding window(), and "
                    "session_window() anywhere but as a GROUP BY item, are not supported; "
                    "for tumbling and hopping windows use TUMBLE(t, col, size) or HOP(t, "
                    "col, slide, size) in FROM")
            bad = names & NONDETERMINISTIC
            if bad:
                hint = "compute the value when you write the row instead"
                if bad & CLOCK_FUNCTIONS:
                    hint = ("for processing time, declare a column filled when each row is "
                            "written, CREATE TABLE t (..., p_time TIMESTAMP AS PROCTIME()), "
                            "and use it (e.g. TUMBLE(t, p_time, INTERVAL '10' SECOND))")
                raise UnsupportedQuery(
                    f"non-deterministic function {sorted(bad)[0]}() cannot be maintained "
                    f"incrementally; {hint}")
    return query


def _check_window(select: exp.Select, window: exp.Window) -> None:
    """A window function sparkfill maintains: in the SELECT list of a query that
    does not group, with the same PARTITION BY as the query's other windows."""
    text = window.sql(dialect="spark")
    if window.find_ancestor(exp.Where, exp.Having, exp.Group, exp.Order, exp.Join) is not None:
        raise UnsupportedQuery(f"a window function outside the SELECT list: {text}")
    if select.args.get("group") or select.args.get("distinct") or _aggregates(select):
        raise UnsupportedQuery(
            f"window function {text} in a query that groups: group in a subquery in FROM "
            "and apply the window over it")
    if isinstance(window.this, exp.AggFunc) and window.this.find(exp.Distinct) is not None:
        raise UnsupportedQuery(f"DISTINCT in a window aggregate is not supported: {text}")
    partitions = {tuple(p.sql(dialect="spark") for p in w.args.get("partition_by") or [])
                  for w in select.find_all(exp.Window)
                  if w.find_ancestor(exp.Select) is select}
    if len(partitions) > 1:
        raise UnsupportedQuery(
            "window functions with different PARTITION BY in one query are not supported; "
            "compute each in a query of its own and join them")


def leaf_tables(select: exp.Select) -> list[exp.Table]:
    """The relations a supported SELECT reads, FROM first."""
    source = _from_table(select)
    assert isinstance(source, exp.Table)
    return [source, *[j.this for j in select.args.get("joins") or []]]


def _aggregates(select: exp.Select) -> list[exp.AggFunc]:
    found: list[exp.AggFunc] = []
    for part in [*select.expressions, select.args.get("having")]:
        if part is None:
            continue
        for node in part.walk():
            if isinstance(node, exp.AggFunc) and not any(
                    isinstance(a, exp.AggFunc | exp.Window) for a in _ancestors(node, part)):
                found.append(node)
    return found


def _ancestors(node: exp.Expr, stop: exp.Expr) -> list[exp.Expr]:
    out = []
    cur = node.parent
    while cur is not None and cur is not stop:
        out.append(cur)
        cur = cur.parent
    if cur is stop and stop is not node:
        out.append(stop)
    return out


# --- planning -----------------------------------------------------------------------------


class _Scope:
    """The leaves of a query and which columns each can resolve."""

    def __init__(self, tables: Sequence[exp.Table], resolve: Callable[[str], LeafInfo]):
        self.leaves: list[tuple[str, LeafInfo]] = []
        seen: set[str] = set()
        for t in tables:
            info = resolve(t.name)
            alias = t.alias_or_name
            if alias.lower() in seen:
                raise SqlError(f"two relations in the query are called {alias!r}; "
                               "give one an alias")
            seen.add(alias.lower())
            self.leaves.append((alias, info))

    def visible(self, i: int) -> list[str]:
        return [c.name for c in self.leaves[i][1].columns if not c.hidden]

    def side_of(self, col: exp.Column) -> int:
        """Which leaf a column reference belongs to."""
        if col.table:
            for i, (alias, _) in enumerate(self.leaves):
                if alias.lower() == col.table.lower():
                    return i
            raise SqlError(f"unknown table alias {col.table!r} in {col.sql(dialect='spark')}")
        hits = [i for i in range(len(self.leaves))
                if col.name.lower() in (c.lower() for c in self.visible(i))]
        if len(hits) != 1:
            raise SqlError(f"column {col.name!r} is "
                           f"{'ambiguous' if hits else 'unknown'}; qualify it with a table")
        return hits[0]


def _expand_stars(select: exp.Select, scope: _Scope) -> list[exp.Expr]:
    items: list[exp.Expr] = []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            for i, (alias, _) in enumerate(scope.leaves):
                items.extend(exp.column(c, table=alias, quoted=True) for c in scope.visible(i))
        elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            i = scope.side_of(exp.column("x", table=item.table))
            alias = scope.leaves[i][0]
            items.extend(exp.column(c, table=alias, quoted=True) for c in scope.visible(i))
        else:
            items.append(item)
    return items


def _analyze(spark: SparkSession, scope: _Scope, select: exp.Select,
             items: Sequence[exp.Expr], where: exp.Expr | None,
             group: Sequence[exp.Expr] | None = None, having: exp.Expr | None = None,
             planned: bool = True) -> StructType:
    """Spark's schema of ``SELECT items FROM leaves [JOIN] WHERE ...`` over empty
    relations with the leaves' visible columns. ``planned``: the probe is planned too
    (False for a probe whose every expression a planned probe of the same query
    holds)."""
    tables: list[exp.Table] = []
    with probing(spark):
        for alias, info in scope.leaves:
            view = probe_view(spark, user_struct([c for c in info.columns if not c.hidden]))
            tables.append(exp.Table(this=exp.to_identifier(view),
                                    alias=exp.TableAlias(this=exp.to_identifier(alias))))
        # no items (a count(*) alone reads no column): probe a constant, for the errors
        probe = exp.select(*([i.copy() for i in items]
                             or [exp.alias_(exp.Literal.number(1), "_sf_probe")])
                           ).from_(tables[0])
        for j, t in zip(select.args.get("joins") or [], tables[1:], strict=False):
            join = j.copy()
            join.set("this", t)
            probe.append("joins", join)
        if where is not None:
            probe = probe.where(where.copy())
        if group:
            probe = probe.group_by(*[g.copy() for g in group])
        if having is not None:
            probe = probe.having(having.copy())
        probe_sql = probe.sql(dialect="spark")
        schema = once(spark, probe_sql, lambda: spark.sql(probe_sql).schema)
        # planned too (EXPLAIN: no rows are computed, so no value of a row, such as a
        # count of 0 divided by, can fail it): planning folds constants, and one that
        # cannot be computed (a string that is no number where a number is needed)
        # fails Spark's query over every snapshot; refused here, with Spark's error
        # (running the probe over its empty relations raises it), not by the first
        # epoch that brings rows
        explain = f"EXPLAIN {probe_sql}"
        explained = once(spark, explain, lambda: spark.sql(explain).collect()[0][0]) \
            if planned else ""
        if str(explained).startswith("Error occurred during query planning"):
            spark.sql(probe_sql).collect()
            raise DataError(f"the query cannot be planned: {str(explained)[:300]}")
        return schema if items else StructType([])


def _column_of(name: str, type_string: str, nullable: bool, hidden: bool = False) -> Column:
    try:
        type_name = normalize_type_name(type_string)
    except SqlError as exc:
        raise UnsupportedQuery(
            f"column {name!r} has type {type_string}, which sparkfill cannot store yet"
        ) from exc
    return Column(name, type_name, nullable, hidden)


def _check_names(names: Sequence[str]) -> None:
    seen: set[str] = set()
    for n in names:
        if n.lower() in seen:
            raise UnsupportedQuery(f"the MV has two columns named {n!r}; give one an alias "
                                   "(AS ...)")
        if n.startswith("_sf_") or n in ("_vnode", "_epoch", "_op"):
            raise SqlError(f"column name {n!r} is reserved; choose another alias")
        seen.add(n.lower())


#: integral types: a cast from one to a wider one keeps distinct values distinct
_INTEGRAL = ("tinyint", "smallint", "int", "bigint")


def _join_spec(spark: SparkSession, scope: _Scope, select: exp.Select,
               ) -> tuple[JoinSpec | None, int | None]:
    """The query's join, and the side of an inner join that each row of the other
    meets at most once (None: neither): its whole key is equated, value for value,
    with the other side's values, so the other side's key alone is a key of the
    join's rows."""
    joins = select.args.get("joins") or []
    if not joins:
        return None, None
    join = joins[0]
    on = join.args["on"]
    # (left, right) key pairs: an expression over one side's columns equal to one over
    # the other's; a constant on the left joins a right side on a constant key (a
    # one-row relation: every left row meets it)
    def side_of(e: exp.Expr) -> int | None:
        cols = list(e.find_all(exp.Column))
        if not cols or e.find(exp.Subquery, exp.AggFunc, exp.Window) is not None:
            return None
        sides = {scope.side_of(c) for c in cols}
        return sides.pop() if len(sides) == 1 else None

    def over_side(e: exp.Expr) -> str:
        """``e`` over its side's own columns (a state table's row)."""
        return e.copy().transform(
            lambda n: exp.column(_leaf_column(scope, n), quoted=True)
            if isinstance(n, exp.Column) else n).sql(dialect="spark")

    pairs: list[tuple[exp.Expr, exp.Expr]] = []
    for c in conjuncts(on):
        if not isinstance(c, exp.EQ):
            continue
        left, right = c.this, c.expression
        sides = (side_of(left), side_of(right))
        if sides == (0, 1):
            pairs.append((left, right))
        elif sides == (1, 0):
            pairs.append((right, left))
        elif isinstance(left, exp.Literal) and sides[1] == 1:
            pairs.append((left, right))
    if not pairs:
        raise UnsupportedQuery(
            f"the join condition {on.sql(dialect='spark')} has no equality between an "
            "expression of each side; non-equi joins are not supported")
    # a common type per key pair, from Spark: both sides' JSON of equal keys is then equal
    probe_items = [exp.alias_(exp.Array(expressions=[a.copy(), b.copy()]), f"k{i}")
                   for i, (a, b) in enumerate(pairs)]
    # the query's own probe (plan_materialized_view's, after this) plans its ON clause
    schema = _analyze(spark, scope, select, probe_items, None, planned=False)
    left_exprs, right_exprs = [], []
    #: per side, its key columns each equated with a value of the other side by a cast
    #: that keeps its distinct values distinct
    equated: tuple[set[str], set[str]] = (set(), set())
    for i, (a, b) in enumerate(pairs):
        common = schema.fields[i].dataType.elementType.simpleString()  # type: ignore[attr-defined]
        types = [None if not isinstance(e, exp.Column) else
                 {c.name: c.type for c in scope.leaves[at][1].columns}.get(
                     _leaf_column(scope, e)) for at, e in ((0, a), (1, b))]
        for eq_side, e in ((0, a), (1, b)):
            own, theirs = types[eq_side], types[1 - eq_side]
            # a string compared with another type may be cast to it ('1' and '01' are
            # one number): only a string equated with a string is taken
            if isinstance(e, exp.Column) and (own != "string" or theirs == "string") and (
                    own == common or (own in _INTEGRAL and common in _INTEGRAL
                                      and _INTEGRAL.index(own) <= _INTEGRAL.index(common))):
                equated[eq_side].add(_leaf_column(scope, e))
        left_exprs.append(f"CAST({a.sql(dialect='spark')} AS {common})"
                          if isinstance(a, exp.Literal)
                          else f"CAST({over_side(a)} AS {common})")
        right_exprs.append(f"CAST({over_side(b)} AS {common})")
    side = (join.args.get("side") or "").upper()
    how = side.lower() if side in ("LEFT", "RIGHT", "FULL") else "inner"
    # the WHERE's conjuncts over one side's columns, on a side no NULLs extend: its
    # state then keeps only the rows they pass (the row stage applies the whole WHERE
    # after the join as well)
    where = select.args.get("where")
    pushed: list[list[str]] = [[], []]
    for c in conjuncts(where.this if where is not None else None):
        try:
            at = side_of(c)
        except SqlError:  # a name that is no side's column (a lambda's variable): kept
            continue
        if at is not None and at not in NULL_EXTENDED_SIDES[how]:
            pushed[at].append(over_side(c))
    filters = tuple(" AND ".join(f"({p})" for p in ps) if ps else None for ps in pushed)
    determined = None
    if how == "inner":
        determined = next((i for i in (1, 0) if scope.leaves[i][1].key
                           and set(scope.leaves[i][1].key) <= equated[i]), None)
    return JoinSpec(how, on.sql(dialect="spark"), (tuple(left_exprs), tuple(right_exprs)),
                    _side_filters(filters)), determined


def _side_filters(value: Sequence[str | None] | None) -> tuple[str | None, str | None]:
    left, right = value if value else (None, None)
    return (left, right)


def _direct_column(item: exp.Expr) -> exp.Column | None:
    ref = item.unalias()
    return ref if isinstance(ref, exp.Column) and not isinstance(ref.this, exp.Star) else None


def plan_materialized_view(
    spark: SparkSession,
    query: exp.Query,
    resolve: Callable[[str], LeafInfo],
    mv_name: str,
) -> PlannedMv:
    """Plan ``query`` (checked by ``check_supported``); ``resolve`` maps a relation
    name to what it holds."""
    if isinstance(query, exp.Union):
        return _plan_union(spark, query, resolve)
    assert isinstance(query, exp.Select)
    select = query
    scope = _Scope(leaf_tables(select), resolve)
    items = _expand_stars(select, scope)
    where = select.args.get("where")
    where_expr = where.this if where is not None else None
    where_sql = where_expr.sql(dialect="spark") if where_expr is not None else None
    join, determined = _join_spec(spark, scope, select)
    group_node = select.args.get("group")
    group_items = list(group_node.expressions) if group_node is not None else []
    having_node = select.args.get("having")
    having = having_node.this if having_node is not None else None
    is_agg = bool(group_items) or bool(select.args.get("distinct")) or bool(_aggregates(select))

    # the MV's visible schema, from Spark's analysis of the whole query
    if select.args.get("distinct"):
        schema = _analyze(spark, scope, select, items, where_expr,
                          group=[i.unalias() for i in items])
    else:
        schema = _analyze(spark, scope, select, items, where_expr, group=group_items, having=having)
    names = [f.name for f in schema.fields]
    _check_names(names)
    visible = [_column_of(f.name, f.dataType.simpleString(), True) for f in schema.fields]

    # the row stage's key: both leaves' keys (the key of a side an outer join may
    # null-extend as one JSON string: "{}" on a null-extended row), but for a side
    # each row of the other meets at most once (its key is a function of the other's)
    row_key_exprs: list[tuple[str, str, str | None]] = []  # (name, sql, type or None=probe)
    for i, (alias, info) in enumerate(scope.leaves):
        if i == determined:
            continue
        prefix = HIDDEN_PREFIX if len(scope.leaves) == 1 else f"{HIDDEN_PREFIX}{alias}_"
        if join is not None and i in NULL_EXTENDED_SIDES[join.how]:
            fields = ", ".join(f"`{alias}`.`{k}` AS k{n}" for n, k in enumerate(info.key))
            row_key_exprs.append((f"{HIDDEN_PREFIX}{alias}", f"to_json(struct({fields}))",
                                  "string"))
            continue
        types = {c.name: c.type for c in info.columns}
        for k in info.key:
            name = k if (k.startswith(HIDDEN_PREFIX) and len(scope.leaves) == 1) \
                else f"{prefix}{k}"
            row_key_exprs.append((name, f"`{alias}`.`{k}`", types[k]))

    states: list[StateDef] = []
    if join is not None:
        for i, role in enumerate(("left", "right")):
            _, info = scope.leaves[i]
            cols = (*info.columns, Column(JOIN_KEY, "string", False, hidden=True))
            states.append(StateDef(role, tuple(cols), (JOIN_KEY, *info.key), (JOIN_KEY,)))

    if any(i.find(exp.Window) for i in items):
        return _plan_window(spark, scope, select, items, names, visible, where_expr, where_sql,
                            join, states, row_key_exprs)

    if not is_agg:
        rows: list[tuple[str, str]] = [(n, i.unalias().sql(dialect="spark"))
                                       for n, i in zip(names, items, strict=True)]
        columns = list(visible)
        key: list[str] = []
        for name, sql, type_ in row_key_exprs:
            chosen = None
            for out, item in zip(names, items, strict=True):
                ref = _direct_column(item)
                if ref is not None and sql == f"`{scope.leaves[scope.side_of(ref)][0]}`." \
                        f"`{_leaf_column(scope, ref)}`":
                    chosen = out
                    break
            if chosen is None:
                chosen = name
                rows.append((name, sql))
                assert type_ is not None
                columns.append(Column(name, type_, False, hidden=True))
            key.append(chosen)
        key_set = set(key)
        columns = [Column(c.name, c.type, c.nullable and c.name not in key_set, c.hidden)
                   for c in columns]
        plan = MvPlan(tuple(Leaf(a, info.name) for a, info in scope.leaves), join, where_sql,
                      tuple(rows), tuple(key), None)
        return PlannedMv(plan, columns, key, states)

    # --- aggregate stage: group values and aggregate arguments become row columns
    if select.args.get("distinct"):
        group_exprs = [i.unalias() for i in items]
    else:
        group_exprs = [_resolve_group_item(g, items) for g in group_items]
    row_exprs: list[tuple[str, exp.Expr]] = []
    group_cols: list[str] = []
    for n, g in enumerate(group_exprs):
        group_cols.append(f"_sf_g{n}")
        row_exprs.append((f"_sf_g{n}", g))
    arg_cols: dict[str, str] = {}
    agg_cols: dict[str, str] = {}
    aggs: list[tuple[str, str]] = []

    def arg_column(e: exp.Expr) -> exp.Expr:
        if isinstance(e, exp.Literal | exp.Star):
            return e
        sql = e.sql(dialect="spark")
        if sql not in arg_cols:
            arg_cols[sql] = f"_sf_x{len(arg_cols)}"
            row_exprs.append((arg_cols[sql], e.copy()))
        return exp.column(arg_cols[sql])

    def agg_column(node: exp.AggFunc) -> exp.Expr:
        sql = node.sql(dialect="spark")
        if sql not in agg_cols:
            rewritten = node.copy()
            for key_, value in list(rewritten.args.items()):
                if isinstance(value, exp.Distinct):
                    value.set("expressions", [arg_column(x) for x in value.expressions])
                elif isinstance(value, exp.Expr) and key_ == "this":
                    rewritten.set(key_, arg_column(value))
                elif isinstance(value, list) and key_ == "expressions":
                    rewritten.set(key_, [arg_column(x) for x in value])
            agg_cols[sql] = f"_sf_a{len(agg_cols)}"
            aggs.append((agg_cols[sql], rewritten.sql(dialect="spark")))
        return exp.column(agg_cols[sql])

    group_sql = {g.sql(dialect="spark"): group_cols[n] for n, g in enumerate(group_exprs)}

    def over_groups(tree: exp.Expr) -> exp.Expr:
        def rewrite(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.AggFunc):
                return agg_column(node)
            sql = node.sql(dialect="spark")
            if sql in group_sql and not isinstance(node, exp.Literal):
                return exp.column(group_sql[sql])
            return node
        return tree.copy().transform(rewrite)

    outputs = [(n, over_groups(i.unalias()).sql(dialect="spark"))
               for n, i in zip(names, items, strict=True)]
    having_sql = over_groups(having).sql(dialect="spark") if having is not None else None
    for _, sql in outputs + ([("", having_sql)] if having_sql else []):
        leftover = [c for c in sqlglot.parse_one(sql, read="spark").find_all(exp.Column)
                    if not c.name.startswith("_sf_")]
        if leftover:
            raise SqlError(f"column {leftover[0].sql(dialect='spark')} must appear in GROUP BY "
                           "or inside an aggregate")

    row_schema, rows, key_cols, state = _row_stage_by_partition(
        spark, scope, select, row_exprs, where_expr, row_key_exprs, "agg", GROUP_OF_ROW)
    states.append(state)
    row_key = tuple(c.name for c in key_cols)
    running = (_running_aggs(row_schema, aggs)
               if having_sql is None and group_cols else None)
    # a running min/max over one leaf finds a lost extreme again in that leaf's rows;
    # over a join (whose rows no relation holds) in the input rows it keeps
    extremes = "leaf" if join is None else "state"
    columns = [*visible, Column(GROUP_KEY, "string", False, hidden=True)]
    if running is not None:
        columns += _running_columns(spark, row_schema, group_cols, aggs, running, extremes)
    plan = MvPlan(tuple(Leaf(a, info.name) for a, info in scope.leaves), join, where_sql,
                  tuple(rows), row_key,
                  AggSpec(tuple(group_cols), tuple(aggs), having_sql, tuple(outputs), running,
                          extremes))
    return PlannedMv(plan, columns, [GROUP_KEY], states)


def _row_stage_by_partition(
    spark: SparkSession, scope: _Scope, select: exp.Select,
    row_exprs: Sequence[tuple[str, exp.Expr]], where_expr: exp.Expr | None,
    row_key_exprs: Sequence[tuple[str, str, str | None]], role: str, part: str,
) -> tuple[StructType, list[tuple[str, str]], list[Column], StateDef]:
    """The row stage of an aggregate or of window functions: ``row_exprs`` and the
    row key as row columns, their types from Spark; and the state table that holds
    the rows by ``part`` (the JSON of a row's group or window partition), keyed
    ``(part, row key)`` and distributed by ``part``. Returns (row schema, row
    columns as (name, SQL), the key's columns, the state table)."""
    row_schema = _analyze(spark, scope, select,
                          [exp.alias_(e.copy(), n) for n, e in row_exprs], where_expr)
    rows = [(n, e.sql(dialect="spark")) for n, e in row_exprs]
    key_cols: list[Column] = []
    for name, sql, type_ in row_key_exprs:
        rows.append((name, sql))
        assert type_ is not None
        key_cols.append(Column(name, type_, False, hidden=True))
    state_cols = (Column(part, "string", False, hidden=True),
                  *[_column_of(f.name, f.dataType.simpleString(), True, hidden=True)
                    for f in row_schema.fields],
                  *key_cols)
    state = StateDef(role, state_cols, (part, *[c.name for c in key_cols]), (part,))
    return row_schema, rows, key_cols, state


def _plan_window(spark: SparkSession, scope: _Scope, select: exp.Select,
                 items: Sequence[exp.Expr], names: Sequence[str], visible: Sequence[Column],
                 where_expr: exp.Expr | None, where_sql: str | None, join: JoinSpec | None,
                 states: list[StateDef],
                 row_key_exprs: Sequence[tuple[str, str, str | None]]) -> PlannedMv:
    """A SELECT list with window functions (all with one PARTITION BY, checked by
    ``_check_window``): the columns it reads and the partition values become row
    columns; a state table holds the rows by partition, and the MV's rows are keyed
    by (partition, row key), so a touched partition's old rows are one keyed read.
    ``row_number()`` breaks ties in its order by the row key: with ties, which row
    gets which number is arbitrary in SQL; an MV must choose the same way each
    time it recomputes a partition."""
    windows = [w for i in items for w in i.find_all(exp.Window)]
    # over the rows of another query's window functions (a link keyed by its own
    # partition and row key): that partition column is part of the row key, renamed
    # beside this query's own
    used = {name for name, _, _ in row_key_exprs}
    renamed: list[tuple[str, str, str | None]] = []
    for name, sql, type_ in row_key_exprs:
        if name == WINDOW_PART:
            while name in used:
                name += "_up"
            used.add(name)
        renamed.append((name, sql, type_))
    row_key_exprs = renamed
    row_exprs: list[tuple[str, exp.Expr]] = []
    part_cols: list[str] = []
    for n, p in enumerate(windows[0].args.get("partition_by") or []):
        part_cols.append(f"_sf_p{n}")
        row_exprs.append((part_cols[-1], p.copy()))
    read: dict[str, str] = {}

    def over_rows(tree: exp.Expr) -> exp.Expr:
        def rewrite(node: exp.Expr) -> exp.Expr:
            if not isinstance(node, exp.Column):
                return node
            sql = node.sql(dialect="spark")
            if sql not in read:
                read[sql] = f"_sf_x{len(read)}"
                row_exprs.append((read[sql], node.copy()))
            return exp.column(read[sql])
        return tree.copy().transform(rewrite)

    key = [name for name, _, _ in row_key_exprs]
    outputs: list[tuple[str, str]] = []
    for name, item in zip(names, items, strict=True):
        out = over_rows(item.unalias())
        for w in out.find_all(exp.Window):
            if isinstance(w.this, exp.RowNumber):
                order = w.args.get("order") or exp.Order(expressions=[])
                order.set("expressions", [*order.expressions,
                                          *[exp.Ordered(this=exp.column(k)) for k in key]])
                w.set("order", order)
        outputs.append((name, out.sql(dialect="spark")))

    _, rows, key_cols, state = _row_stage_by_partition(
        spark, scope, select, row_exprs, where_expr, row_key_exprs, "window", WINDOW_PART)
    states.append(state)
    part = state.columns[0]
    plan = MvPlan(tuple(Leaf(a, info.name) for a, info in scope.leaves), join, where_sql,
                  tuple(rows), tuple(key), None,
                  window=WindowSpec(tuple(part_cols), tuple(outputs)))
    return PlannedMv(plan, [*visible, part, *key_cols], [WINDOW_PART, *key], states)


def _running_aggs(row_schema: StructType, aggs: Sequence[tuple[str, str]],
                  ) -> tuple[tuple[str, str, str], ...] | None:
    """Each aggregate as a running one, ``(column, kind, argument column)``; None when
    one of them cannot run (``count(DISTINCT)``, a sum or an ``avg`` of floating point
    or integer values — Spark adds those as doubles, whose sum depends on the order of
    addition —, ``stddev``, ...). An ``avg`` of decimals runs as its exact sum and
    count."""
    types = {f.name: f.dataType for f in row_schema.fields}
    out = []
    for name, sql in aggs:
        node = sqlglot.parse_one(sql, read="spark")
        arg = node.this
        if node.args.get("expressions") or isinstance(arg, exp.Distinct):
            return None
        arg_col = arg.name if isinstance(arg, exp.Column) else None
        if isinstance(node, exp.Count) and (isinstance(arg, exp.Star) or (
                isinstance(arg, exp.Literal) and not arg.is_string)):
            out.append((name, "count", ""))
        elif arg_col is None or arg_col not in types:
            return None
        elif isinstance(node, exp.Count):
            out.append((name, "count", arg_col))
        elif isinstance(node, exp.CountIf):
            out.append((name, "count_if", arg_col))
        elif isinstance(node, exp.Sum) and isinstance(
                types[arg_col], ByteType | ShortType | IntegerType | LongType | DecimalType):
            out.append((name, "sum", arg_col))
        elif isinstance(node, exp.Avg) and isinstance(types[arg_col], DecimalType):
            out.append((name, "avg", arg_col))
        elif isinstance(node, exp.Max | exp.Min) and not isinstance(
                types[arg_col], MapType | ArrayType | StructType):
            out.append((name, "max" if isinstance(node, exp.Max) else "min", arg_col))
        else:
            return None
    return tuple(out)


def _running_columns(spark: SparkSession, row_schema: StructType, group: Sequence[str],
                     aggs: Sequence[tuple[str, str]],
                     running: Sequence[tuple[str, str, str]],
                     extremes: str) -> list[Column]:
    """The hidden MV columns that keep running aggregates: the group's rows, each
    aggregate's value (typed as Spark types it), each sum's non-null count and, when
    a lost min/max is found again in the leaf, each min's or max's rows at it."""
    types: dict[str, str] = {}
    if aggs:  # SELECT DISTINCT has none: its groups' rows are all it keeps
        sums = [F.sum(F.col(arg)).alias(running_sum_column(name))
                for name, kind, arg in running if kind == "avg"]
        probe = probe_frame(spark, row_schema).groupBy(*group).agg(
            *[F.expr(sql).alias(name) for name, sql in aggs], *sums).schema
        types = {f.name: f.dataType.simpleString() for f in probe.fields}
    cols = [Column(GROUP_ROWS, "bigint", False, hidden=True)]
    for name, kind, _ in running:
        cols.append(_column_of(name, types[name], True, hidden=True))
        if kind == "avg":
            cols.append(_column_of(running_sum_column(name), types[running_sum_column(name)],
                                   True, hidden=True))
        if kind in ("sum", "avg"):
            cols.append(Column(running_count_column(name), "bigint", False, hidden=True))
        if kind in ("min", "max") and extremes == "leaf":
            cols.append(Column(running_ties_column(name), "bigint", False, hidden=True))
    return cols


def _plan_union(spark: SparkSession, query: exp.Union,
                resolve: Callable[[str], LeafInfo]) -> PlannedMv:
    """``branch UNION ALL branch ...``, each branch a filter/project over one leaf.

    The MV's columns are the first branch's names with the types Spark gives the
    whole union; each branch casts its rows to them. A row's key is its branch's
    number and its upstream key as JSON, so equal rows of two branches (or of
    one relation read twice) stay two rows.
    """
    selects = [b.unnest() if isinstance(b, exp.Subquery) else b for b in union_branches(query)]
    scopes, items_of, probes = [], [], []
    with probing(spark):
        for select in selects:
            assert isinstance(select, exp.Select)
            scope = _Scope(leaf_tables(select), resolve)
            scopes.append(scope)
            items_of.append(_expand_stars(select, scope))
            alias, info = scope.leaves[0]
            view = probe_view(spark, user_struct([c for c in info.columns if not c.hidden]))
            probe = exp.select(*[i.copy() for i in items_of[-1]]).from_(
                exp.Table(this=exp.to_identifier(view),
                          alias=exp.TableAlias(this=exp.to_identifier(alias))))
            where = select.args.get("where")
            if where is not None:
                probe = probe.where(where.this.copy())
            probes.append(probe)
        union: exp.Query = probes[0]
        for probe in probes[1:]:
            union = exp.union(union, probe, distinct=False)
        try:
            schema = spark.sql(union.sql(dialect="spark")).schema
        except Exception as exc:  # noqa: BLE001 - Spark's analysis error, reworded
            raise SqlError(f"the branches of the UNION ALL do not fit together: "
                           f"{str(exc).splitlines()[0]}") from exc
    names = [f.name for f in schema.fields]
    _check_names(names)
    types = [f.dataType.simpleString() for f in schema.fields]
    columns = [_column_of(n, t, True) for n, t in zip(names, types, strict=True)]
    branches = []
    for n, (select, scope, items) in enumerate(zip(selects, scopes, items_of, strict=True)):
        alias, info = scope.leaves[0]
        rows = [(name, f"CAST(({item.unalias().sql(dialect='spark')}) AS {type_})")
                for name, item, type_ in zip(names, items, types, strict=True)]
        fields = ", ".join(f"`{alias}`.`{k}` AS k{i}" for i, k in enumerate(info.key))
        rows += [(BRANCH, f"CAST({n} AS INT)"), (BRANCH_ROW, f"to_json(struct({fields}))")]
        where = select.args.get("where")
        branches.append(Branch(None if where is None else where.this.sql(dialect="spark"),
                               tuple(rows)))
    columns += [Column(BRANCH, "int", False, hidden=True),
                Column(BRANCH_ROW, "string", False, hidden=True)]
    leaves = tuple(Leaf(scope.leaves[0][0], scope.leaves[0][1].name) for scope in scopes)
    plan = MvPlan(leaves, None, None, (), (BRANCH, BRANCH_ROW), None,
                  branches=tuple(branches))
    return PlannedMv(plan, columns, [BRANCH, BRANCH_ROW], [])


def _leaf_column(scope: _Scope, ref: exp.Column) -> str:
    """The stored name of the leaf column a reference points at."""
    i = scope.side_of(ref)
    for c in scope.visible(i):
        if c.lower() == ref.name.lower():
            return c
    raise SqlError(f"unknown column {ref.sql(dialect='spark')}")


def _resolve_group_item(g: exp.Expr, items: Sequence[exp.Expr]) -> exp.Expr:
    """A GROUP BY item as an expression: ordinals and output aliases resolved."""
    if isinstance(g, exp.Literal) and not g.is_string:
        n = int(g.this)
        if not 1 <= n <= len(items):
            raise SqlError(f"GROUP BY {n}: the query selects {len(items)} columns")
        return items[n - 1].unalias().copy()
    if isinstance(g, exp.Column) and not g.table:
        for item in items:
            if isinstance(item, exp.Alias) and item.alias.lower() == g.name.lower() \
                    and not isinstance(item.this, exp.Column):
                return item.this.copy()
    return g.copy()


def explain_plan(name: str, plan: MvPlan, key: Sequence[str]) -> str:
    """The operator plan as an indented tree, with keys and state tables."""
    lines: list[str] = []
    states = dict(zip(("left", "right") if plan.join else (), plan.states, strict=False))
    agg_state = plan.states[-1] if plan.agg is not None and plan.states else None
    lines.append(f"Materialize {name}  key=({', '.join(key)})")
    depth = 1
    if plan.topn is not None:
        order = ", ".join(  # NULLS shown where it is not Spark's default
            f"{c}{' DESC' if desc else ''}"
            f"{'' if nf != desc else ' NULLS FIRST' if nf else ' NULLS LAST'}"
            for c, desc, nf in plan.topn.order)
        lines.append("  " * depth + f"TopN  order=({order}) limit={plan.topn.limit}"
                     + (f" offset={plan.topn.offset}" if plan.topn.offset else "")
                     + "  (recomputed from its input when it changes)")
        depth += 1
    if plan.window is not None:
        part = ", ".join(plan.window.partition) or "one partition"
        lines.append("  " * depth + f"Window  partition=({part})  "
                     f"outputs=({', '.join(sql for _, sql in plan.window.outputs)})  "
                     f"state={plan.states[-1] if plan.states else None}  "
                     "(touched partitions recomputed)")
        depth += 1
    if plan.agg is not None:
        aggs = ", ".join(sql for _, sql in plan.agg.aggs) or "-"
        running = "  running values in the MV" if plan.agg.running is not None else ""
        if plan.agg.extremes == "leaf" and any(
                kind in ("min", "max") for _, kind, _ in plan.agg.running or ()):
            running += " (a lost min/max found again in the leaf)"
        lines.append("  " * depth + f"HashAggregate  group=({', '.join(plan.agg.group)}) "
                     f"aggs=({aggs})" + (f" having={plan.agg.having}" if plan.agg.having
                                         else "") + f"  state={agg_state}{running}")
        depth += 1
    lines.append("  " * depth + f"Project  ({', '.join(n for n, _ in plan.rows)})  "
                 f"key=({', '.join(plan.row_key)})")
    depth += 1
    if plan.where:
        lines.append("  " * depth + f"Filter  {plan.where}")
        depth += 1
    if plan.branches:
        lines[-1] = "  " * (depth - 1) + f"UnionAll  key=({', '.join(plan.row_key)})"
        for n, (leaf, branch) in enumerate(zip(plan.leaves, plan.branches, strict=True)):
            cols = ", ".join(name for name, _ in branch.rows)
            lines.append("  " * depth + f"Project  branch {n}  ({cols})")
            if branch.where:
                lines.append("  " * (depth + 1) + f"Filter  {branch.where}")
            lines.append("  " * (depth + 1 + bool(branch.where))
                         + f"BackfillScan {leaf.relation} AS {leaf.alias}")
        return "\n".join(lines)
    if plan.join is not None:
        lines.append("  " * depth + f"HashJoin {plan.join.how.upper()}  on={plan.join.on}")
        depth += 1
        for (alias, rel), role, kept in zip([(lf.alias, lf.relation) for lf in plan.leaves],
                                            ("left", "right"), plan.join.side_filters,
                                            strict=True):
            if kept:
                lines.append("  " * depth + f"Filter  {kept}  (the side's state keeps these)")
            lines.append("  " * (depth + bool(kept)) + f"BackfillScan {rel} AS {alias}  "
                         f"state={states.get(role)}")
    else:
        leaf = plan.leaves[0]
        lines.append("  " * depth + f"BackfillScan {leaf.relation} AS {leaf.alias}")
    return "\n".join(lines)


def parse_query(sql: str) -> exp.Expr:
    try:
        return sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.SqlglotError as exc:  # ParseError, TokenError
        raise SqlError(f"cannot parse query: {exc}") from exc


def unknown(name: str) -> UnknownRelation:
    return UnknownRelation(f"no table or materialized view named {name!r}")
