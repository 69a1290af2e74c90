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

import uuid
from collections.abc import Callable

from pyspark.sql import SparkSession
from sqlglot import exp

from ..errors import SparkfillError
from ..storage.schema import user_struct

__all__ = ["name_outputs"]


def _first_select(query: exp.Expr) -> exp.Select | None:
    while isinstance(query, exp.SetOperation | exp.Subquery):
        query = query.this
    return query if isinstance(query, exp.Select) else None


def _unnamed(item: exp.Expr) -> bool:
    return not isinstance(item, exp.Alias | exp.Column | exp.Star)


def name_outputs(spark: SparkSession, query: exp.Expr,
                 resolve: Callable[[str], object]) -> exp.Expr:
    """``query`` (a copy when changed) with its unnamed outputs named as Spark names
    them; ``resolve``: a relation's ``LeafInfo`` by name."""
    select = _first_select(query)
    if select is None or not any(_unnamed(i) for i in select.expressions):
        return query
    probe = query.copy()
    views: list[str] = []
    try:
        for table in list(probe.find_all(exp.Table)):
            if isinstance(table.this, exp.Func) or table.args.get("db"):
                continue
            try:
                info = resolve(table.name)
            except SparkfillError:
                continue  # a CTE's name
            columns = [c for c in info.columns if not c.hidden]  # type: ignore[attr-defined]
            view = f"__sf_names_{uuid.uuid4().hex[:12]}"
            spark.createDataFrame([], user_struct(columns)).createOrReplaceTempView(view)
            views.append(view)
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.alias_or_name)))
            table.set("this", exp.to_identifier(view))
        try:
            names = spark.sql(probe.sql(dialect="spark")).columns
        except Exception:  # noqa: BLE001 - the planner reports the query's own error
            return query
    finally:
        for view in views:
            spark.catalog.dropTempView(view)
    named = query.copy()
    target = _first_select(named)
    assert target is not None
    if len(names) != len(target.expressions):
        return query
    target.set("expressions", [
        exp.alias_(item, name, quoted=True) if _unnamed(item) else item
        for item, name in zip(target.expressions, names, strict=True)])
    return named
