"""The names Spark gives an MV's unnamed output columns, made explicit.

Invariant: the MV's columns are named exactly as Spark names the outputs of its
query (an MV and Spark's batch query have one schema). An item without a name of
its own (``SELECT avg(x), ...``: not a column, not ``AS``) is named by Spark after
its text; the rewrites change that text (internal columns of links), so before
them each such item of the outermost query (of a set operation: its first query)
is given ``AS <the name Spark gives it>``, from Spark's analysis of the original
query over empty relations of the same columns. Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType
from sqlglot import exp

from ..errors import SparkfillError
from ..storage.schema import user_struct
from .probe_views import probe_frame, probe_view, probing

__all__ = ["name_outputs", "SOURCE_SQL"]

#: the key of a parsed query's ``meta`` that holds the text it was parsed from
SOURCE_SQL = "sparkfill_source_sql"


def _first_select(query: exp.Expr) -> exp.Select | None:
    while isinstance(query, exp.SetOperation | exp.Subquery):
        query = query.this
    return query if isinstance(query, exp.Select) else None


def _unnamed(item: exp.Expr) -> bool:
    return not isinstance(item, exp.Alias | exp.Column | exp.Star)


def _leaf_struct(table: exp.Table, resolve: Callable[[str], object]) -> StructType | None:
    """The visible columns of the relation ``table`` names (None: no relation of
    ours, such as a CTE's name or a table function)."""
    if isinstance(table.this, exp.Func) or table.args.get("db"):
        return None
    try:
        info = resolve(table.name)
    except SparkfillError:
        return None  # a CTE's name
    return user_struct([c for c in info.columns if not c.hidden])  # type: ignore[attr-defined]


def _names_from_source(spark: SparkSession, query: exp.Expr,
                       resolve: Callable[[str], object]) -> list[str] | None:
    """Spark's output names of the query as the user wrote it (``query.meta``'s
    ``SOURCE_SQL``, where each relation's name is replaced by an empty frame of its
    columns): a function keeps the name it was called by (``substr``, where sqlglot
    writes ``SUBSTRING``), and Spark names an output after it. None: no source text,
    or a relation whose place in it is not known."""
    text = query.meta.get(SOURCE_SQL)
    if not isinstance(text, str):
        return None
    spans: list[tuple[int, int, str]] = []
    frames: dict[str, DataFrame] = {}
    for table in query.find_all(exp.Table):
        struct = _leaf_struct(table, resolve)
        if struct is None:
            continue
        position = table.this.meta if isinstance(table.this, exp.Identifier) else {}
        start, end = position.get("start"), position.get("end")
        if not isinstance(start, int) or not isinstance(end, int) or \
                text[start:end + 1].strip("`").lower() != table.name.lower():
            return None
        name = f"_sf_n{len(frames)}"
        frames[name] = probe_frame(spark, struct)
        # the relation's own name stays its alias, for the columns it qualifies
        alias = "" if table.alias else " AS `" + table.name.replace("`", "``") + "`"
        spans.append((start, end, "{" + name + "}" + alias))
    if not frames:
        return None
    pieces, at = [], 0
    for start, end, replacement in sorted(spans):
        pieces += [text[at:start].replace("{", "{{").replace("}", "}}"), replacement]
        at = end + 1
    pieces.append(text[at:].replace("{", "{{").replace("}", "}}"))
    try:
        return spark.sql("".join(pieces), {}, **frames).columns
    except Exception:  # noqa: BLE001 - the other way, then the planner, report errors
        return None


def _names_from_tree(spark: SparkSession, query: exp.Expr,
                     resolve: Callable[[str], object]) -> list[str] | None:
    """Spark's output names of ``query`` as sqlglot writes it, over empty views of
    its relations (None: Spark refused it; the planner reports why)."""
    probe = query.copy()
    with probing(spark):
        for table in list(probe.find_all(exp.Table)):
            struct = _leaf_struct(table, resolve)
            if struct is None:
                continue
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.alias_or_name)))
            table.set("this", exp.to_identifier(probe_view(spark, struct)))
        try:
            return spark.sql(probe.sql(dialect="spark")).columns
        except Exception:  # noqa: BLE001 - the planner reports the query's own error
            return None


def name_outputs(spark: SparkSession, query: exp.Expr,
                 resolve: Callable[[str], object]) -> exp.Expr:
    """``query`` (a copy when changed) with its unnamed outputs named as Spark names
    them; ``resolve``: a relation's ``LeafInfo`` by name."""
    select = _first_select(query)
    if select is None or not any(_unnamed(i) for i in select.expressions):
        return query
    names = _names_from_source(spark, query, resolve)
    if names is None:
        names = _names_from_tree(spark, query, resolve)
    if names is None:
        return query
    named = query.copy()
    target = _first_select(named)
    assert target is not None
    if len(names) != len(target.expressions):
        return query
    target.set("expressions", [
        exp.alias_(item, name, quoted=True) if _unnamed(item) else item
        for item, name in zip(target.expressions, names, strict=True)])
    return named
