"""Small rewrites of SQL as analytics users write it (TPC-DS), into forms the
planner compiles.

Invariant: each rewrite returns exactly the rows of the query it replaces over
any input (as a multiset, NULLs included); the oracle keeps running the original.

- Parentheses around a whole ``JOIN ... ON (a = b AND c = d)`` condition, or
  around a whole SELECT item (``SELECT DISTINCT (x)``), are dropped: the same
  expression (Spark names ``(x)`` as ``x`` too). A derived table without an alias
  (Spark accepts ``FROM (SELECT ...)``) is named ``__sf_dt<n>``: nothing refers to
  it by name.
- A query that returns at most one row — a global aggregate (aggregates, no
  ``GROUP BY``, no window function), or a comma join without ``WHERE`` of such
  derived tables — keeps that row under ``LIMIT n`` (``n >= 1``, no ``OFFSET``):
  the ``LIMIT`` and its ``ORDER BY`` are dropped.
- A comma (cross) join with a derived table that is a global aggregate (exactly
  one row, or none under ``HAVING``) is an inner join ``ON 1 = d.__sf_one`` with
  that derived table given the column ``1 AS __sf_one``: every row matches its one
  row, as in the cross join.
- Any other comma (cross) join left without an equality (after the comma joins
  were given their ``ON``) is an inner join on a constant: the joined relation
  (a table as ``(SELECT <its columns>, 1 AS __sf_one FROM t) AS t``, a derived table
  given the column) ``ON 1 = t.__sf_one``: every pair of rows matches, as in the
  cross join (all rows share one join key, so each change joins every row of the
  other side: meant for small relations).
"""

from __future__ import annotations

from sqlglot import exp

from .sql_tree import ColumnsOf, from_of, has_star, source_columns, sources_of

__all__ = ["unwrap_parens", "drop_limit_of_one_row", "one_row_cross_joins", "is_one_row"]

#: the constant column a one-row derived table is joined on
ONE = "__sf_one"


def unwrap_parens(query: exp.Expr) -> exp.Expr:
    unnamed = [s for s in query.find_all(exp.Subquery)
               if isinstance(s.parent, exp.From | exp.Join) and not s.alias]
    for n, sub in enumerate(unnamed, start=1):
        sub.set("alias", exp.TableAlias(this=exp.to_identifier(f"__sf_dt{n}")))
    for join in list(query.find_all(exp.Join)):
        on = join.args.get("on")
        while isinstance(on, exp.Paren):
            on = on.this
        if on is not None and on is not join.args.get("on"):
            join.set("on", on.copy())
    for select in query.find_all(exp.Select):
        items = []
        for item in select.expressions:
            inner = item
            while isinstance(inner, exp.Paren):
                inner = inner.this
            items.append(inner.copy() if inner is not item else item)
        select.set("expressions", items)
    return query


def _is_global_aggregate(select: exp.Expr) -> bool:
    if not isinstance(select, exp.Select) or select.args.get("group") is not None \
            or select.args.get("limit") is not None or select.args.get("offset") is not None:
        return False
    if any(isinstance(n, exp.Window) for n in select.find_all(exp.Window)):
        return False
    return any(a.find_ancestor(exp.Select) is select for a in select.find_all(exp.AggFunc))


def is_one_row(select: exp.Expr) -> bool:
    """Whether ``select`` returns at most one row by its shape."""
    if _is_global_aggregate(select):
        return True
    if not isinstance(select, exp.Select) or select.args.get("where") is not None \
            or select.args.get("group") is not None:
        return False
    from_ = from_of(select)
    if from_ is None:
        return False
    rels = [from_.this, *[j.this for j in select.args.get("joins") or []]]
    if any(j.args.get("on") or j.args.get("side") or j.args.get("using")
           for j in select.args.get("joins") or []):
        return False
    return all(isinstance(r, exp.Subquery) and is_one_row(r.this) for r in rels)


def drop_limit_of_one_row(query: exp.Expr) -> exp.Expr:
    if not isinstance(query, exp.Select) or query.args.get("offset") is not None:
        return query
    limit = query.args.get("limit")
    value = limit.expression if isinstance(limit, exp.Limit) else None
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()
            and int(value.this) >= 1):
        return query
    body = query.copy()
    body.set("limit", None)
    body.set("order", None)
    return body if is_one_row(body) else query


def _always_true(on: exp.Expr | None) -> bool:
    """Whether ``on`` is ``1 = 1`` (any parentheses): what a join on a constant
    becomes when the relation that held the constant is merged into its query."""
    if not isinstance(on, exp.EQ):
        return False
    sides = [on.this, on.expression]
    for i, side in enumerate(sides):
        while isinstance(side, exp.Paren):
            side = side.this
        sides[i] = side
    return all(isinstance(x, exp.Literal) and not x.is_string and x.this == "1" for x in sides)


def _constant_join(join: exp.Join, columns_of: ColumnsOf | None) -> None:
    rel = join.this
    alias = rel.alias_or_name
    if isinstance(rel, exp.Table) and not isinstance(rel.this, exp.Func):
        cols = list(columns_of(rel.name) or ()) if columns_of is not None else []
        if not cols:
            return
        body = exp.select(*[exp.column(c, quoted=True) for c in cols],
                          exp.alias_(exp.Literal.number(1), ONE)).from_(
            exp.Table(this=rel.this.copy()))
        join.set("this", exp.Subquery(this=body, alias=exp.TableAlias(
            this=exp.to_identifier(alias))))
    elif isinstance(rel, exp.Subquery) and isinstance(rel.this, exp.Select) \
            and not has_star(rel.this) and alias:
        if not any(i.alias_or_name == ONE for i in rel.this.expressions):
            rel.this.select(exp.alias_(exp.Literal.number(1), ONE), copy=False)
    else:
        return
    join.set("kind", None)
    join.set("on", exp.EQ(this=exp.Literal.number(1), expression=exp.column(ONE, table=alias)))


def one_row_cross_joins(select: exp.Select, columns_of: ColumnsOf | None = None) -> None:
    """Each comma/cross join of ``select`` with a one-row derived table joined on
    the constant (see above); ``select`` is changed in place. A ``*`` over only
    derived tables whose columns are all named is spelled out first (it must not
    list the new column); another ``*`` leaves the joins as written."""
    if has_star(select):
        rels = sources_of(select)
        if not all(isinstance(r, exp.Subquery) and isinstance(r.this, exp.Select)
                   and r.alias and all(i.alias_or_name for i in r.this.expressions)
                   and not has_star(r.this) for r in rels) \
                or any(not isinstance(i, exp.Star) for i in select.expressions):
            return
        select.set("expressions", [exp.column(c, table=r.alias, quoted=True)
                                   for r in rels for c in source_columns(r, lambda _: None)])
    for join in select.args.get("joins") or []:
        if _always_true(join.args.get("on")) and not join.args.get("side"):
            # a join on a constant whose relation was merged into it again (``1 = (1)``)
            join.set("on", None)
            join.set("kind", "CROSS")
        if join.args.get("on") or join.args.get("using") or join.args.get("side") \
                or (join.args.get("kind") or "CROSS").upper() != "CROSS":
            continue
        rel = join.this
        if not (isinstance(rel, exp.Subquery) and rel.alias):
            _constant_join(join, columns_of)
            continue
        inner = rel.this
        if not (isinstance(inner, exp.Select) and _is_global_aggregate(inner)):
            _constant_join(join, columns_of)
            continue
        if not any(i.alias_or_name == ONE for i in inner.expressions):
            inner.select(exp.alias_(exp.Literal.number(1), ONE), copy=False)
        join.set("kind", None)
        join.set("on", exp.EQ(this=exp.Literal.number(1),
                              expression=exp.column(ONE, table=rel.alias)))
