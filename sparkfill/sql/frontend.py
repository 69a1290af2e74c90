"""Parsing statements into commands.

Invariant: parsing has no side effects; every statement is either turned into
one command object or refused with ``SqlError`` / ``UnsupportedQuery`` before
anything is executed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

from ..errors import SqlError, UnsupportedQuery
from ..options import sample_fraction, validate_option
from ..storage.schema import Column, normalize_type_name
from .output_names import SOURCE_SQL
from .rewrite import time_windows_to_derived
from .sql_tree import conjuncts

__all__ = [
    "Command", "CreateTable", "CreateMaterializedView", "Drop", "SetOption", "Show",
    "AlterMaterializedView", "RecomputeMaterializedView", "SwapMaterializedViews", "CancelJobs",
    "CreateSink", "DropSink",
    "InsertValues", "Update", "Delete", "Query", "Explain", "Verify", "parse_statement",
]


class Command:
    """A parsed statement."""


@dataclass
class CreateTable(Command):
    name: str
    columns: list[Column]
    key: list[str]
    if_not_exists: bool = False
    #: ``WITH (connector = ..., ...)``: a source table's options (validated by sources)
    options: dict[str, Any] = field(default_factory=dict)
    #: the processing-time column (``col TIMESTAMP AS PROCTIME()``), if any
    proctime: str | None = None


@dataclass
class CreateMaterializedView(Command):
    name: str
    options: dict[str, Any]
    query_sql: str
    query: exp.Expr
    if_not_exists: bool = False
    #: ``CREATE OR REPLACE``: an existing MV of that name switches to this query once
    #: the query is built online beside it
    or_replace: bool = False


@dataclass
class Drop(Command):
    kind: str  # "table" | "mv"
    name: str
    if_exists: bool = False


@dataclass
class SetOption(Command):
    name: str
    value: Any  # None: DEFAULT


@dataclass
class AlterMaterializedView(Command):
    name: str
    option: str
    value: Any  # None: DEFAULT


@dataclass
class RecomputeMaterializedView(Command):
    """``ALTER MATERIALIZED VIEW name RECOMPUTE``: rebuild it from its upstreams."""

    name: str


@dataclass
class SwapMaterializedViews(Command):
    """``ALTER MATERIALIZED VIEW a SWAP WITH b``: the two MVs exchange definitions."""

    name: str
    other: str


@dataclass
class CancelJobs(Command):
    names: list[str]


@dataclass
class Show(Command):
    what: str  # "tables" | "materialized views" | "jobs" | "sinks"


@dataclass
class CreateSink(Command):
    name: str
    source: str  # the MV (or table) it writes out
    options: dict[str, Any]
    if_not_exists: bool = False


@dataclass
class DropSink(Command):
    name: str
    if_exists: bool = False


@dataclass
class InsertValues(Command):
    table: str
    columns: list[str] | None
    values_sql: str


@dataclass
class Update(Command):
    table: str
    assignments: list[tuple[str, str]]
    where_sql: str | None


@dataclass
class Delete(Command):
    table: str
    where_sql: str | None


def keys_pinned(where_sql: str, key: Sequence[str]) -> int | None:
    """At most how many keys a WHERE can match when it pins every key column to
    literals (``k = 1``, ``k IN (1, 2)``, under AND); None when it does not."""
    def terms(expr: exp.Expr) -> list[exp.Expr]:  # an AND's, through parentheses
        expr = expr.unnest() if isinstance(expr, exp.Paren) else expr
        parts = conjuncts(expr)
        return [t for p in parts for t in terms(p)] if len(parts) > 1 else parts

    counts: dict[str, int] = {}
    for conjunct in terms(sqlglot.parse_one(where_sql, read="spark")):
        if isinstance(conjunct, exp.EQ) and isinstance(conjunct.expression, exp.Column) \
                and isinstance(conjunct.this, exp.Literal):  # 1 = k
            conjunct = exp.EQ(this=conjunct.expression, expression=conjunct.this)
        if isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column) \
                and isinstance(conjunct.expression, exp.Literal):
            column, n = conjunct.this.name.lower(), 1
        elif isinstance(conjunct, exp.In) and isinstance(conjunct.this, exp.Column) \
                and not conjunct.args.get("query") and conjunct.expressions \
                and all(isinstance(e, exp.Literal) for e in conjunct.expressions):
            column, n = conjunct.this.name.lower(), len(conjunct.expressions)
        else:
            continue
        counts[column] = min(n, counts.get(column, n))
    if not all(k.lower() in counts for k in key):
        return None
    return math.prod(counts[k.lower()] for k in key)


@dataclass
class Query(Command):
    tree: exp.Expr
    tables: list[str] = field(default_factory=list)


@dataclass
class Explain(Command):
    statement: CreateMaterializedView


@dataclass
class ExplainExisting(Command):
    """``EXPLAIN MATERIALIZED VIEW name``: the stored plan of an existing MV."""

    name: str


@dataclass
class Verify(Command):
    name: str
    as_of: int | None = None
    #: ``SAMPLE p``: the fraction of rows checked (None: all)
    sample: float | None = None


_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?P<rest>CREATE\s+(OR\s+REPLACE\s+)?MATERIALIZED\s+VIEW"
                      r"\s.*)$",
                      re.IGNORECASE | re.DOTALL)
_EXPLAIN_EXISTING = re.compile(
    r"^\s*EXPLAIN\s+MATERIALIZED\s+VIEW\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)\s*;?\s*$",
    re.IGNORECASE)
_VERIFY = re.compile(
    r"^\s*VERIFY\s+MATERIALIZED\s+VIEW\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
    r"(\s+AS\s+OF\s+(?:EPOCH\s+)?(?P<epoch>\d+))?"
    r"(\s+SAMPLE\s+(?P<sample>[0-9]*\.?[0-9]+)\s*(?P<percent>PERCENT|%)?)?\s*;?\s*$",
    re.IGNORECASE)
_CREATE_MV = re.compile(
    r"^\s*CREATE\s+(?P<orr>OR\s+REPLACE\s+)?MATERIALIZED\s+VIEW\s+"
    r"(?P<ine>IF\s+NOT\s+EXISTS\s+)?"
    r"(?P<name>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)\s*(?P<rest>.*)$",
    re.IGNORECASE | re.DOTALL,
)
_SET = re.compile(r"^\s*SET\s+(?P<name>[A-Za-z_][A-Za-z0-9_.]*)\s*(=|TO)\s*(?P<value>.+?)\s*;?\s*$",
                  re.IGNORECASE | re.DOTALL)
_ALTER = re.compile(
    r"^\s*ALTER\s+MATERIALIZED\s+VIEW\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)\s+SET\s+"
    r"(?P<option>[A-Za-z_][A-Za-z0-9_]*)\s*(=|TO)\s*(?P<value>.+?)\s*;?\s*$",
    re.IGNORECASE | re.DOTALL)
_RECOMPUTE = re.compile(
    r"^\s*ALTER\s+MATERIALIZED\s+VIEW\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)\s+"
    r"RECOMPUTE\s*;?\s*$", re.IGNORECASE)
_SWAP = re.compile(
    r"^\s*ALTER\s+MATERIALIZED\s+VIEW\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)\s+"
    r"SWAP\s+WITH\s+(?P<other>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)\s*;?\s*$", re.IGNORECASE)
_CANCEL = re.compile(r"^\s*CANCEL\s+JOBS?\s+(?P<names>.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_SHOW = re.compile(r"^\s*SHOW\s+(?P<what>TABLES|MATERIALIZED\s+VIEWS|JOBS|SINKS)\s*;?\s*$",
                   re.IGNORECASE)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*|`[^`]+`"
_CREATE_SINK = re.compile(
    r"^\s*CREATE\s+SINK\s+(?P<ine>IF\s+NOT\s+EXISTS\s+)?(?P<name>" + _IDENT + r")\s+FROM\s+"
    r"(?P<source>" + _IDENT + r")\s*(?P<rest>.*?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_DROP_SINK = re.compile(r"^\s*DROP\s+SINK\s+(?P<ie>IF\s+EXISTS\s+)?(?P<name>" + _IDENT
                        + r")\s*;?\s*$", re.IGNORECASE)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s", re.IGNORECASE)


def _literal(text: str) -> Any:
    """The value of an option literal: a quoted string, a number, a word, or DEFAULT."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.upper() == "DEFAULT":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _split_options(body: str, validate: Any = validate_option) -> dict[str, Any]:
    options: dict[str, Any] = {}
    parts: list[str] = []
    start = 0
    for i, ch, depth in _unquoted(body):
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    for part in parts:
        if not part.strip():
            continue
        if "=" not in part:
            raise SqlError(f"bad option {part.strip()!r}: expected name = value")
        name, value = part.split("=", 1)
        key = name.strip().lower()
        options[key] = validate(key, _literal(value))
    return options


def _connector_option(name: str, value: Any) -> Any:
    """Connector options (sources, sinks) are validated by their connector."""
    return value


def _with_clause(rest: str, what: str) -> tuple[dict[str, Any], str]:
    """Options of a leading ``WITH (...)`` in ``rest`` and the text after it."""
    m = re.match(r"\s*WITH\s*\(", rest, re.IGNORECASE)
    if not m:
        return {}, rest
    close = _matching_paren(rest, m.end() - 1)
    options = _split_options(rest[m.end():close], _connector_option)
    if any(v is None for v in options.values()):
        raise SqlError(f"{what}: DEFAULT is not an option value here")
    return options, rest[close + 1:]


def _split_table_options(sql: str) -> tuple[str, dict[str, Any]]:
    """``CREATE TABLE t (...) WITH (...)``: the statement without its WITH clause,
    and the clause's options."""
    open_at = sql.find("(")
    if open_at < 0:
        return sql, {}
    try:
        close = _matching_paren(sql, open_at)
    except SqlError:
        return sql, {}  # the parser reports the broken column list
    options, tail = _with_clause(sql[close + 1:], "CREATE TABLE ... WITH")
    if not options:
        return sql, {}
    if tail.strip().strip(";").strip():
        raise SqlError(f"unexpected text after WITH (...): {tail.strip()[:40]!r}")
    return sql[:close + 1], options


def _unquoted(text: str, start: int = 0,
              quotes: str = "'\"") -> Iterator[tuple[int, str, int]]:
    """Each character of ``text`` from ``start`` outside quotes: its index, itself,
    and the parentheses open before it (counted from ``start``)."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in quotes:
            quote = ch
        else:
            yield i, ch, depth
            depth += (ch == "(") - (ch == ")")


def _matching_paren(text: str, open_at: int) -> int:
    for i, ch, depth in _unquoted(text, open_at):
        if ch == ")" and depth == 1:
            return i
    raise SqlError("unbalanced parentheses in WITH (...)")


def _parse_create_mv(m: re.Match[str]) -> CreateMaterializedView:
    name = m.group("name").strip("`")
    rest = m.group("rest")
    options: dict[str, Any] = {}
    with_m = re.match(r"WITH\s*\(", rest, re.IGNORECASE)
    if with_m:
        close = _matching_paren(rest, with_m.end() - 1)
        options = _split_options(rest[with_m.end():close])
        rest = rest[close + 1:]
    as_m = re.match(r"\s*AS\s+(?P<query>.+)$", rest, re.IGNORECASE | re.DOTALL)
    if not as_m:
        raise SqlError("expected CREATE MATERIALIZED VIEW name [WITH (option = value, ...)] "
                       "AS SELECT ...")
    query_sql = as_m.group("query").strip().rstrip(";")
    try:
        query = sqlglot.parse_one(query_sql, read="spark")
    except sqlglot.errors.SqlglotError as exc:  # a ParseError, or a TokenError (a quote
        # or comment left open)
        raise SqlError(f"cannot parse the query of materialized view {name!r}: {exc}") from exc
    query.meta[SOURCE_SQL] = query_sql  # Spark names unnamed outputs after this text
    or_replace = bool(m.group("orr"))
    if or_replace and m.group("ine"):
        raise SqlError("CREATE OR REPLACE MATERIALIZED VIEW and IF NOT EXISTS exclude each "
                       "other: use one")
    return CreateMaterializedView(name, options, query_sql, query, bool(m.group("ine")),
                                  or_replace)


_GENERATED_AS = re.compile(r"\bAS\s+(?=[A-Za-z_][A-Za-z0-9_]*\s*\()", re.IGNORECASE)


def _parenthesize_generated(sql: str) -> str:
    """``col TYPE AS f(...)`` in a CREATE TABLE's column list as ``col TYPE AS
    (f(...))``, the form the parser reads as a generated column (RisingWave's
    ``p_time TIMESTAMP AS PROCTIME()`` has no parentheses)."""
    open_at = sql.find("(")
    if open_at < 0:
        return sql
    try:
        close = _matching_paren(sql, open_at)
    except SqlError:
        return sql  # the parser reports the broken column list
    body, out, pos = sql[open_at:close + 1], [], 0
    for m in _GENERATED_AS.finditer(body):
        if m.start() < pos or _depth(body, m.start()) != 1:
            continue  # inside a call (CAST(x AS DECIMAL(10, 2)))
        call_open = body.index("(", m.end())
        try:
            call_close = _matching_paren(body, call_open)
        except SqlError:
            return sql
        out.append(body[pos:m.end()] + "(" + body[m.end():call_close + 1] + ")")
        pos = call_close + 1
    out.append(body[pos:])
    return sql[:open_at] + "".join(out) + sql[close + 1:]


def _depth(text: str, at: int) -> int:
    """The parentheses open at ``text[at]`` (outside quotes and backticks)."""
    depth = 0
    for _, ch, before in _unquoted(text[:at], quotes="'\"`"):
        depth = before + (ch == "(") - (ch == ")")
    return depth


def _unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _is_proctime(node: exp.Expr) -> bool:
    node = _unparen(node)
    return (isinstance(node, exp.Anonymous) and str(node.name).lower() == "proctime"
            and not node.expressions)


def _parse_create_table(tree: exp.Create) -> CreateTable:
    schema = tree.this
    if not isinstance(schema, exp.Schema):
        raise SqlError("CREATE TABLE needs a column list: CREATE TABLE t (col TYPE, ..., "
                       "PRIMARY KEY (cols))")
    if tree.args.get("expression") is not None:
        raise UnsupportedQuery("CREATE TABLE ... AS SELECT is not supported; "
                               "use CREATE MATERIALIZED VIEW")
    name = schema.this.name
    columns: list[Column] = []
    key: list[str] = []
    proctime: list[str] = []
    for item in schema.expressions:
        if isinstance(item, exp.ColumnDef):
            col_name = item.name
            kind = item.args.get("kind")
            constraints = item.args.get("constraints") or []
            generated = [c.args.get("kind") for c in constraints if isinstance(
                c.args.get("kind"), exp.ComputedColumnConstraint
                | exp.GeneratedAsIdentityColumnConstraint | exp.GeneratedAsRowColumnConstraint)]
            for g in generated:
                if not (isinstance(g, exp.ComputedColumnConstraint) and _is_proctime(g.this)):
                    form = (f"AS {_unparen(g.this).sql(dialect='spark')}"
                            if isinstance(g, exp.ComputedColumnConstraint)
                            else g.sql(dialect="spark"))
                    raise UnsupportedQuery(
                        f"table {name!r}, column {col_name!r}: the generated column "
                        f"{form!r} is not supported; the one generated "
                        f"column is a processing-time column, {col_name} TIMESTAMP AS "
                        "PROCTIME()")
            if generated:
                proctime.append(col_name)
            if kind is None and not generated:
                raise SqlError(f"column {col_name!r} of table {name!r} has no type")
            type_name = ("timestamp" if kind is None
                         else normalize_type_name(kind.sql(dialect="spark")))
            if generated and type_name != "timestamp":
                raise SqlError(f"table {name!r}, column {col_name!r}: a processing-time "
                               f"column (AS PROCTIME()) is a TIMESTAMP, not "
                               f"{type_name.upper()}")
            not_null = False
            for constraint in constraints:
                ckind = constraint.args.get("kind")
                if isinstance(ckind, exp.NotNullColumnConstraint):
                    not_null = not ckind.args.get("allow_null")
                elif isinstance(ckind, exp.PrimaryKeyColumnConstraint):
                    key.append(col_name)
                    not_null = True
            # the engine fills a processing-time column: never null, never given
            columns.append(Column(col_name, type_name, not not_null or bool(generated)))
        elif isinstance(item, exp.PrimaryKey):
            key.extend(e.name for e in item.expressions)
        else:
            raise UnsupportedQuery(f"table element {item.sql(dialect='spark')!r} is not supported")
    if not columns:
        raise SqlError(f"table {name!r} has no columns")
    names = [c.name.lower() for c in columns]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SqlError(f"table {name!r} has duplicate column(s) {sorted(dup)}")
    if not key:
        raise SqlError(f"table {name!r} needs a PRIMARY KEY (every relation has a key)")
    by_lower = {c.name.lower(): c.name for c in columns}
    resolved = []
    for k in key:
        if k.lower() not in by_lower:
            raise SqlError(f"PRIMARY KEY column {k!r} is not a column of table {name!r}")
        resolved.append(by_lower[k.lower()])
    if len(proctime) > 1:
        raise SqlError(f"table {name!r} has more than one processing-time column "
                       f"(AS PROCTIME()): {', '.join(proctime)}; declare one")
    if proctime and proctime[0] in resolved:
        raise SqlError(f"table {name!r}: the processing-time column {proctime[0]!r} "
                       "(AS PROCTIME()) cannot be part of the PRIMARY KEY: the engine "
                       "changes it whenever the row is written")
    key_set = set(resolved)
    columns = [Column(c.name, c.type, c.nullable and c.name not in key_set) for c in columns]
    for c in columns:
        if c.name.startswith("_sf_") or c.name in ("_vnode", "_epoch", "_op"):
            raise SqlError(f"column name {c.name!r} is reserved")
    return CreateTable(name, columns, resolved, bool(tree.args.get("exists")),
                       proctime=proctime[0] if proctime else None)


def _tables_of(tree: exp.Expr) -> list[str]:
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    names = []
    for t in tree.find_all(exp.Table):
        if t.name and t.name.lower() not in ctes and t.name not in names:
            names.append(t.name)
    return names


def _table_name(node: Any, statement: str) -> str:
    """The name of the relation ``statement`` targets: a table's name, not any other
    expression the parser found there (``DELETE t WHERE ...`` reads as a boolean)."""
    if not isinstance(node, exp.Table) or not node.name:
        shown = node.sql(dialect="spark") if isinstance(node, exp.Expr) else repr(node)
        raise SqlError(f"{statement} needs the name of a relation, not {shown[:60]!r}")
    return str(node.name)


def parse_statement(sql: str) -> Command:
    if not isinstance(sql, str):
        raise SqlError(f"a statement is a string, not {type(sql).__name__}")
    if not sql.strip():
        raise SqlError("empty statement")
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:  # Spark and the files take UTF-8 only
        raise SqlError(f"the statement is not valid Unicode text: {sql[exc.start]!r} at "
                       f"position {exc.start} (a lone surrogate) in "
                       f"{sql[max(0, exc.start - 30):exc.start + 30]!r}") from None
    m = _EXPLAIN.match(sql)
    if m:
        inner = _CREATE_MV.match(m.group("rest"))
        if inner is None:  # no name, or one that is no identifier ('x', a symbol)
            raise SqlError("EXPLAIN CREATE MATERIALIZED VIEW needs the name of a relation "
                           "(letters, digits and _, or in backquotes) before its query, not "
                           f"{m.group('rest')[:80]!r}")
        return Explain(_parse_create_mv(inner))
    m = _EXPLAIN_EXISTING.match(sql)
    if m:
        return ExplainExisting(m.group("name").strip("`"))
    m = _VERIFY.match(sql)
    if m:
        sample = None
        if m.group("sample") is not None:
            value = float(m.group("sample")) / (100 if m.group("percent") else 1)
            sample = sample_fraction(value)
        return Verify(m.group("name").strip("`"),
                      None if m.group("epoch") is None else int(m.group("epoch")), sample)
    m = _CREATE_MV.match(sql)
    if m:
        return _parse_create_mv(m)
    m = _RECOMPUTE.match(sql)
    if m:
        return RecomputeMaterializedView(m.group("name").strip("`"))
    m = _SWAP.match(sql)
    if m:
        return SwapMaterializedViews(m.group("name").strip("`"), m.group("other").strip("`"))
    m = _ALTER.match(sql)
    if m:
        option = m.group("option").lower()
        return AlterMaterializedView(m.group("name").strip("`"), option,
                                     validate_option(option, _literal(m.group("value"))))
    m = _CANCEL.match(sql)
    if m:
        names = [n.strip().strip("`") for n in m.group("names").split(",") if n.strip()]
        return CancelJobs(names)
    m = _CREATE_SINK.match(sql)
    if m:
        options, tail = _with_clause(m.group("rest"), "CREATE SINK")
        if tail.strip():
            raise SqlError("expected CREATE SINK name FROM mv WITH (connector = 'delta', "
                           "path = '...')")
        return CreateSink(m.group("name").strip("`"), m.group("source").strip("`"), options,
                          bool(m.group("ine")))
    m = _DROP_SINK.match(sql)
    if m:
        return DropSink(m.group("name").strip("`"), bool(m.group("ie")))
    if re.match(r"^\s*(CREATE|DROP)\s+SINK\b", sql, re.IGNORECASE):
        raise SqlError("expected CREATE SINK [IF NOT EXISTS] name FROM mv WITH (connector = "
                       "'delta', path = '...') or DROP SINK [IF EXISTS] name")
    table_options: dict[str, Any] = {}
    if _CREATE_TABLE.match(sql):
        sql, table_options = _split_table_options(sql)
        sql = _parenthesize_generated(sql)
    m = _SHOW.match(sql)
    if m:
        return Show(" ".join(m.group("what").lower().split()))
    m = _SET.match(sql)
    if m:
        name = m.group("name").lower()
        return SetOption(name, validate_option(name, _literal(m.group("value"))))
    try:
        trees = sqlglot.parse(sql, read="spark")
    except sqlglot.errors.SqlglotError as exc:  # ParseError, TokenError
        raise SqlError(f"cannot parse statement: {exc}") from exc
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise SqlError("give one statement at a time")
    tree = trees[0]
    if isinstance(tree, exp.Create):
        kind = str(tree.args.get("kind") or "").upper()
        if kind == "TABLE":
            table = _parse_create_table(tree)
            table.options = table_options
            return table
        raise UnsupportedQuery(f"CREATE {kind} is not supported; use CREATE TABLE or "
                               "CREATE MATERIALIZED VIEW")
    if isinstance(tree, exp.Drop):
        kind = str(tree.args.get("kind") or "").upper()
        tables = tree.args.get("tables") or [tree.this]
        if len(tables) != 1:
            raise SqlError("DROP one relation at a time")
        name = _table_name(tables[0], f"DROP {kind}".strip())
        if kind == "TABLE":
            return Drop("table", name, bool(tree.args.get("exists")))
        if kind == "VIEW" and tree.args.get("materialized"):
            return Drop("mv", name, bool(tree.args.get("exists")))
        raise UnsupportedQuery(f"DROP {kind} is not supported; use DROP TABLE or "
                               "DROP MATERIALIZED VIEW")
    if isinstance(tree, exp.Insert):
        target = tree.this
        columns = None
        if isinstance(target, exp.Schema):
            columns = [e.name for e in target.expressions]
            target = target.this
        values = tree.args.get("expression")
        if not isinstance(values, exp.Values):
            raise UnsupportedQuery("only INSERT INTO t [(cols)] VALUES (...) is supported; "
                                   "use Engine.insert(table, dataframe) for query results")
        return InsertValues(_table_name(target, "INSERT INTO"), columns,
                            values.sql(dialect="spark"))
    if isinstance(tree, exp.Update):
        if tree.args.get("from") or tree.args.get("from_"):
            raise UnsupportedQuery("UPDATE ... FROM is not supported")
        assignments = []
        for eq in tree.expressions:
            if not isinstance(eq, exp.EQ) or not isinstance(eq.this, exp.Column):
                raise SqlError(f"bad SET item {eq.sql(dialect='spark')!r}")
            assignments.append((eq.this.name, eq.expression.sql(dialect="spark")))
        where = tree.args.get("where")
        return Update(_table_name(tree.this, "UPDATE"), assignments,
                      None if where is None else where.this.sql(dialect="spark"))
    if isinstance(tree, exp.Delete):
        where = tree.args.get("where")
        return Delete(_table_name(tree.this, "DELETE FROM"),
                      None if where is None else where.this.sql(dialect="spark"))
    if isinstance(tree, exp.Query):
        # a query runs on Spark as written, TUMBLE and HOP (not Spark's) as their definition
        tree = time_windows_to_derived(tree)
        return Query(tree, _tables_of(tree))
    if isinstance(tree, exp.Command):
        raise UnsupportedQuery(f"statement {sql.strip().split()[0].upper()} ... is not supported")
    raise UnsupportedQuery(f"statement {type(tree).__name__.upper()} is not supported")
