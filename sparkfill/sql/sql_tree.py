"""Small helpers over sqlglot trees shared by the rewrites, the planner and the join
chain.

Invariant: none of them changes the tree it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlglot import exp

__all__ = ["ColumnsOf", "conjuncts", "has_star", "from_of", "set_from", "sources_of",
           "source_columns"]

#: a relation's column names by relation name (None: unknown relation)
ColumnsOf = Callable[[str], Sequence[str] | None]


def conjuncts(expr: exp.Expr | None) -> list[exp.Expr]:
    """The terms of an AND (the expression itself when it is not one)."""
    if expr is None:
        return []
    return list(expr.flatten()) if isinstance(expr, exp.And) else [expr]


def has_star(select: exp.Select) -> bool:
    """Whether the SELECT list holds ``*`` or ``alias.*``."""
    return any(isinstance(e, exp.Star) or isinstance(e, exp.Column) and isinstance(e.this, exp.Star)
               for e in select.expressions)


def from_of(select: exp.Select) -> exp.From | None:
    """The FROM clause (sqlglot names its argument ``from_`` or ``from`` by version)."""
    return select.args.get("from_") or select.args.get("from")


def set_from(select: exp.Select, source: exp.Expr) -> None:
    """Replace the FROM clause of ``select`` with ``source`` (same naming as ``from_of``)."""
    select.set("from_" if "from_" in select.args else "from", exp.From(this=source))


def sources_of(select: exp.Select) -> list[exp.Expr]:
    """The relations of FROM and of every JOIN, in order."""
    from_ = from_of(select)
    if from_ is None:
        return []
    return [from_.this, *[j.this for j in select.args.get("joins") or []]]


def source_columns(source: exp.Expr, columns_of: ColumnsOf) -> list[str]:
    """A table's columns, or a derived table's named outputs (none for anything else)."""
    if isinstance(source, exp.Table):
        return list(columns_of(source.name) or ())
    if isinstance(source, exp.Subquery):
        body = source.this
        while isinstance(body, exp.SetOperation):  # a set operation's first query names
            body = body.this.unnest() if isinstance(body.this, exp.Subquery) else body.this
        if isinstance(body, exp.Select):
            return [e.alias_or_name for e in body.expressions if e.alias_or_name]
    return []
