"""Planning a materialized view: from the sqlglot tree of its SELECT to an
``MvPlan`` (filter/project over one upstream relation) and its schema.

Invariants: the MV's output names and types come from Spark's own analysis of
the query; the MV's stream key is its upstream's key, kept as hidden columns
when the query does not select it; any shape this planner does not maintain
incrementally is refused with ``UnsupportedQuery`` naming the construct.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlglot import exp

from .errors import SqlError, UnsupportedQuery
from .schema import HIDDEN_PREFIX, Column, normalize_type_name, user_struct

__all__ = [
    "MvPlan", "plan_materialized_view", "check_supported", "from_table", "NONDETERMINISTIC",
]

NONDETERMINISTIC = {
    "rand", "random", "randn", "uuid", "now", "current_timestamp", "currenttimestamp",
    "current_date", "currentdate", "current_time", "currenttime", "localtimestamp",
    "monotonically_increasing_id", "spark_partition_id", "input_file_name", "shuffle",
    "current_timezone",
}

_CLAUSES = {
    "joins": "JOIN (joins come with a later release; for now an MV reads one relation)",
    "group": "GROUP BY (aggregates come with a later release)",
    "having": "HAVING",
    "order": "ORDER BY (an MV is an unordered set; order when you read it)",
    "limit": "LIMIT (an MV keeps every row; apply LIMIT when you read it)",
    "offset": "OFFSET",
    "distinct": "DISTINCT",
    "qualify": "QUALIFY",
    "laterals": "LATERAL VIEW",
    "windows": "WINDOW",
    "with": "WITH (common table expressions)",
    "with_": "WITH (common table expressions)",
}


@dataclass(frozen=True)
class MvPlan:
    """``SELECT outputs FROM upstream AS alias WHERE where``, plus hidden key columns."""

    upstream: str
    alias: str
    where: str | None
    outputs: tuple[tuple[str, str], ...]  # (output column, Spark SQL expression)
    hidden_keys: tuple[tuple[str, str], ...]  # (hidden output column, upstream key column)

    def to_json(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "alias": self.alias, "where": self.where,
                "outputs": [list(o) for o in self.outputs],
                "hidden_keys": [list(h) for h in self.hidden_keys]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> MvPlan:
        return MvPlan(d["upstream"], d["alias"], d["where"],
                      tuple((a, b) for a, b in d["outputs"]),
                      tuple((a, b) for a, b in d["hidden_keys"]))

    def apply(self, rows: DataFrame, columns: Sequence[Column]) -> DataFrame:
        """Evaluate the plan over upstream rows (visible and hidden columns)."""
        df = rows.alias(self.alias)
        if self.where:
            df = df.where(F.expr(self.where))
        exprs = [F.expr(sql).alias(name) for name, sql in self.outputs]
        exprs += [F.col(up).alias(name) for name, up in self.hidden_keys]
        out = df.select(*exprs)
        return out.select(*[F.col(c.name).cast(c.type) for c in columns])


def check_supported(query: exp.Expr) -> exp.Select:
    """Return the SELECT if its shape is supported, else raise ``UnsupportedQuery``."""
    if isinstance(query, exp.Union | exp.Except | exp.Intersect):
        raise UnsupportedQuery(f"{type(query).__name__.upper()} of queries is not supported yet")
    if not isinstance(query, exp.Select):
        raise UnsupportedQuery(f"an MV must be defined by a SELECT, got {type(query).__name__}")
    for arg, label in _CLAUSES.items():
        if query.args.get(arg):
            raise UnsupportedQuery(f"{label} is not supported in a materialized view yet")
    from_ = query.args.get("from_") or query.args.get("from")
    if from_ is None:
        raise UnsupportedQuery("an MV must read FROM one table or materialized view")
    if not isinstance(from_.this, exp.Table) or isinstance(from_.this.this, exp.Func):
        raise UnsupportedQuery("FROM a subquery or a table function is not supported; "
                               "create an MV for the subquery and select from it")
    for node in query.walk():
        if node is query:
            continue
        if isinstance(node, exp.Window):
            raise UnsupportedQuery("window functions (OVER ...) are not supported in an MV")
        if isinstance(node, exp.AggFunc):
            raise UnsupportedQuery(
                f"aggregate function {node.sql(dialect='spark')} is not supported yet "
                "(aggregates come with a later release)")
        if isinstance(node, exp.Select | exp.Subquery):
            raise UnsupportedQuery("subqueries are not supported in an MV")
        if isinstance(node, exp.Func):
            names = {type(node).__name__.lower()}
            if isinstance(node, exp.Anonymous):
                names.add(str(node.name).lower())
            bad = names & NONDETERMINISTIC
            if bad:
                raise UnsupportedQuery(
                    f"non-deterministic function {sorted(bad)[0]}() cannot be maintained "
                    "incrementally; compute the value when you write the row instead")
    return query


def from_table(select: exp.Select) -> exp.Table:
    """The one relation a supported SELECT reads."""
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None or not isinstance(from_.this, exp.Table):
        raise UnsupportedQuery("an MV must read FROM one table or materialized view")
    return from_.this


def _expand_stars(select: exp.Select, alias: str, visible: Sequence[str]) -> list[exp.Expr]:
    items: list[exp.Expr] = []
    for item in select.expressions:
        is_star = isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
        if is_star:
            items.extend(exp.column(c, table=alias, quoted=True) for c in visible)
        else:
            items.append(item)
    return items


def plan_materialized_view(
    spark: SparkSession,
    select: exp.Select,
    upstream_name: str,
    upstream_columns: Sequence[Column],
    upstream_key: Sequence[str],
) -> tuple[MvPlan, list[Column], list[str]]:
    """Plan ``select`` over the upstream; returns the plan, the MV's columns and key."""
    table = from_table(select)
    alias = table.alias_or_name
    visible = [c.name for c in upstream_columns if not c.hidden]
    items = _expand_stars(select, alias, visible)
    where = select.args.get("where")
    where_sql = where.this.sql(dialect="spark") if where is not None else None

    view = f"__sf_plan_{uuid.uuid4().hex[:12]}"
    spark.createDataFrame([], user_struct([c for c in upstream_columns if not c.hidden])) \
        .createOrReplaceTempView(view)
    try:
        probe = exp.select(*[i.copy() for i in items]).from_(
            exp.Table(this=exp.to_identifier(view), alias=exp.TableAlias(
                this=exp.to_identifier(alias))))
        if where is not None:
            probe = probe.where(where.this.copy())
        schema = spark.sql(probe.sql(dialect="spark")).schema
    finally:
        spark.catalog.dropTempView(view)

    names = [f.name for f in schema.fields]
    seen: set[str] = set()
    for n in names:
        if n.lower() in seen:
            raise SqlError(f"the MV has two columns named {n!r}; give one an alias (AS ...)")
        if n.startswith("_sf_") or n in ("_vnode", "_epoch", "_op"):
            raise SqlError(f"column name {n!r} is reserved; choose another alias")
        seen.add(n.lower())
    columns: list[Column] = []
    for f in schema.fields:
        try:
            type_name = normalize_type_name(f.dataType.simpleString())
        except SqlError as exc:
            raise UnsupportedQuery(
                f"MV column {f.name!r} has type {f.dataType.simpleString()}, which sparkfill "
                "cannot store yet") from exc
        columns.append(Column(f.name, type_name, True))
    outputs = tuple((n, i.unalias().sql(dialect="spark"))
                    for n, i in zip(names, items, strict=True))

    by_name = {c.name: c for c in upstream_columns}
    key: list[str] = []
    hidden: list[tuple[str, str]] = []
    for k in upstream_key:
        chosen = None
        for name, item in zip(names, items, strict=True):
            ref = item.unalias()
            if (isinstance(ref, exp.Column) and ref.name.lower() == k.lower()
                    and not by_name[k].hidden):
                chosen = name
                break
        if chosen is None:
            chosen = k if k.startswith(HIDDEN_PREFIX) else f"{HIDDEN_PREFIX}{k}"
            hidden.append((chosen, k))
            columns.append(Column(chosen, by_name[k].type, False, hidden=True))
        key.append(chosen)
    key_set = set(key)
    columns = [Column(c.name, c.type, c.nullable and c.name not in key_set, c.hidden)
               for c in columns]
    plan = MvPlan(upstream_name, alias, where_sql, outputs, tuple(hidden))
    return plan, columns, key


def parse_query(sql: str) -> exp.Expr:
    try:
        return sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise SqlError(f"cannot parse query: {exc}") from exc
