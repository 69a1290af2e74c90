"""Subqueries under an ``OR`` of ``WHERE``, and non-aggregating scalar subqueries,
rewritten into forms the decorrelation (``subqueries.py``) compiles.

Invariant: each rewrite returns exactly the rows of the query it replaces over any
input where Spark's query returns rows (NULLs included).

- ``x IN (SELECT y ...)`` (uncorrelated) or ``EXISTS (SELECT ... WHERE o.c = e
  AND ...)`` (correlated by that one equality: ``e`` over the subquery's
  relations) under an ``OR`` of ``WHERE`` — reached from ``WHERE`` through ``AND``,
  ``OR`` and parentheses only, so that a NULL there rejects the row as FALSE does —
  is a ``LEFT JOIN`` with the subquery's distinct keys (``SELECT DISTINCT y AS
  __sf_k ...``, a derived table ``__sf_or<n>``) on ``x = __sf_or<n>.__sf_k`` (or
  ``o.c = ...``), and the predicate becomes ``__sf_or<n>.__sf_k IS NOT NULL``: TRUE
  when a key matches, where ``IN``/``EXISTS`` is TRUE; else FALSE where they are
  FALSE or NULL (the same in that position). The keys are distinct: no row is
  repeated.
- ``(A AND B)`` as a conjunct of ``WHERE`` is ``A AND B`` (parentheses dropped).
- An uncorrelated scalar subquery ``(Q)`` that is not a single aggregate (a ``DISTINCT``, a
  ``GROUP BY``, a plain projection) and has one column ``c`` returns its one row's
  value, NULL over no rows, and fails over more; it is ``(SELECT CASE WHEN count(*)
  = 1 THEN max(c) END FROM (Q) AS __sf_scalar)``: the same value over none or one
  row (an aggregate subquery, which the decorrelation compiles). Over more rows,
  where Spark's query fails, the MV holds NULL there instead of failing its epoch.
"""

from __future__ import annotations

from sqlglot import exp

from .sql_tree import ColumnsOf, sources_of

__all__ = ["subqueries_under_or", "flatten_where", "scalar_to_aggregate"]


def flatten_where(select: exp.Select) -> None:
    where = select.args.get("where")
    if where is None:
        return
    for paren in list(where.find_all(exp.Paren)):
        parent = paren.parent
        if isinstance(paren.this, exp.And) and (parent is where or isinstance(parent, exp.And)):
            paren.replace(paren.this)


def _positive_under_or(node: exp.Expr, where: exp.Where) -> bool:
    under_or = False
    parent = node.parent
    while parent is not None and parent is not where:
        if isinstance(parent, exp.Or):
            under_or = True
        elif not isinstance(parent, exp.And | exp.Paren):
            return False
        parent = parent.parent
    return parent is where and under_or


def subqueries_under_or(select: exp.Select, counter: list[int]) -> None:
    """The first rule above, on ``select`` in place (``counter``: the next ``<n>``)."""
    where = select.args.get("where")
    if where is None or not select.args.get("from_", select.args.get("from")):
        return
    outer = {s.alias_or_name.lower() for s in sources_of(select)}
    for node in list(where.find_all(exp.In, exp.Exists)):
        if not _positive_under_or(node, where):
            continue
        if isinstance(node, exp.In):
            query = node.args.get("query")
            inner = query.unnest() if isinstance(query, exp.Subquery) else query
            if not isinstance(inner, exp.Select) or len(inner.expressions) != 1 \
                    or node.args.get("expressions"):
                continue
            keys = inner.copy()
            keys.set("expressions", [exp.alias_(inner.expressions[0].unalias().copy(),
                                                "__sf_k")])
            probe: exp.Expr = node.this.copy()
        else:
            inner = node.this.unnest() if isinstance(node.this, exp.Subquery) else node.this
            if not isinstance(inner, exp.Select) or inner.args.get("where") is None:
                continue
            inner_names = {s.alias_or_name.lower() for s in sources_of(inner)}
            conds = list(inner.args["where"].this.flatten()) \
                if isinstance(inner.args["where"].this, exp.And) else [inner.args["where"].this]

            def is_outer(c: exp.Column, inner_names: set[str] = inner_names) -> bool:
                return bool(c.table) and c.table.lower() in outer \
                    and c.table.lower() not in inner_names

            correlated = [c for c in conds
                          if any(is_outer(col) for col in c.find_all(exp.Column))]
            if len(correlated) != 1 or not isinstance(correlated[0], exp.EQ):
                continue
            eq = correlated[0]
            sides = [eq.this, eq.expression]
            outer_side = [s for s in sides if isinstance(s, exp.Column) and is_outer(s)]
            if len(outer_side) != 1:
                continue
            inner_side = sides[1] if outer_side[0] is sides[0] else sides[0]
            if any(is_outer(c) for c in inner_side.find_all(exp.Column)):
                continue
            keys = inner.copy()
            rest = [c.copy() for c in conds if c is not eq]
            keys.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
            keys.set("expressions", [exp.alias_(inner_side.copy(), "__sf_k")])
            probe = outer_side[0].copy()
        keys.set("distinct", exp.Distinct())
        for arg in ("order", "limit", "offset"):
            keys.set(arg, None)
        counter[0] += 1
        alias = f"__sf_or{counter[0]}"
        select.join(exp.Subquery(this=keys, alias=exp.TableAlias(
            this=exp.to_identifier(alias))), on=exp.EQ(
                this=probe, expression=exp.column("__sf_k", table=alias)),
            join_type="LEFT", copy=False)
        node.replace(exp.Not(this=exp.Is(this=exp.column("__sf_k", table=alias),
                                         expression=exp.Null())))


def _uncorrelated(inner: exp.Select, columns_of: ColumnsOf | None) -> bool:
    """Whether every column of ``inner`` is one of its own relations': qualified by
    one of their aliases, or (unqualified) a column of one of its tables."""
    aliases = {t.alias_or_name.lower() for t in inner.find_all(exp.Table)} | {
        s.alias_or_name.lower() for s in inner.find_all(exp.Subquery) if s.alias_or_name}
    names: set[str] = set()
    for t in inner.find_all(exp.Table):
        names |= {c.lower() for c in ((columns_of(t.name) if columns_of else None) or ())}
    outputs = {i.alias_or_name.lower() for s in inner.find_all(exp.Select)
               for i in s.expressions if i.alias_or_name}
    for col in inner.find_all(exp.Column):
        if isinstance(col.this, exp.Star):
            continue
        if col.table:
            if col.table.lower() not in aliases:
                return False
        elif col.name.lower() not in names | outputs:
            return False
    return True


def scalar_to_aggregate(select: exp.Select, columns_of: ColumnsOf | None = None) -> None:
    """The last rule above, on the uncorrelated scalar subqueries of ``select``'s
    WHERE and SELECT list, in place (a column the subquery's own relations do not
    have, by ``columns_of``, may be the outer query's: such a subquery stays)."""
    for clause in [select.args.get("where"), *select.expressions]:
        if clause is None:
            continue
        for sub in list(clause.find_all(exp.Subquery)):
            if isinstance(sub.parent, exp.In | exp.Exists | exp.From | exp.Join) \
                    or sub.find_ancestor(exp.Select) is not select:
                continue
            inner = sub.this
            if not isinstance(inner, exp.Select) or len(inner.expressions) != 1:
                continue
            aggregate = inner.args.get("group") is None and not inner.args.get("distinct") \
                and any(a.find_ancestor(exp.Select) is inner for a in inner.find_all(exp.AggFunc))
            if aggregate or not _uncorrelated(inner, columns_of):
                continue
            body = inner.copy()
            body.set("expressions", [exp.alias_(inner.expressions[0].unalias().copy(),
                                                "__sf_c")])
            value = exp.Case(ifs=[exp.If(
                this=exp.EQ(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(1)),
                true=exp.Max(this=exp.column("__sf_c")))])
            wrapped = exp.select(exp.alias_(value, "__sf_v")).from_(exp.Subquery(
                this=body, alias=exp.TableAlias(this=exp.to_identifier("__sf_scalar"))))
            sub.set("this", wrapped)
