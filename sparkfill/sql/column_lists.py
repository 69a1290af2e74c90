"""Column alias lists: ``(SELECT ...) AS x (c1, c2)`` and ``WITH x (c1, c2) AS (...)``.

Standard SQL names a derived table's or a CTE's columns in a list after its name; the
planner reads a relation's column names from its SELECT list. ``name_columns``
moves each list into the query it names: the i-th output of the query (of the first
branch of a set operation, which names a UNION's columns) is aliased to the i-th
name, a ``*`` in that SELECT list is first spelled out from its sources' columns,
and an ORDER BY, HAVING or QUALIFY of the query that referred to an output by its
old alias refers to it by the new one.

Invariant: the rewritten query returns the same rows under the same column names as
the query written with lists, and no derived table or CTE in it has a column list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sqlglot import exp

from ..errors import SqlError, UnsupportedQuery
from .sql_tree import ColumnsOf, has_star, sources_of

__all__ = ["name_columns"]

#: a FROM source's column names (None: not known)
ColumnsOfSource = Callable[[exp.Expr], "list[str] | None"]


def name_columns(query: exp.Expr, columns_of: ColumnsOf | None = None) -> exp.Expr:
    """``query`` with every column alias list moved into the SELECT list it names (the
    tree is changed in place and returned); ``columns_of`` gives a table's or MV's
    columns, to spell out a ``*`` under a list. Raises ``SqlError`` when a list names
    more or fewer columns than its query returns, ``UnsupportedQuery`` when a ``*``
    under a list is over a relation whose columns are not known."""
    if not any(_column_list(node) for node in query.find_all(exp.TableAlias)):
        return query
    ctes: dict[str, list[str]] = {}  # a CTE's name -> its columns, in WITH order

    def columns(source: exp.Expr) -> list[str] | None:
        if isinstance(source, exp.Table):
            if source.name.lower() in ctes:
                return ctes[source.name.lower()]
            return list(known) if columns_of and (known := columns_of(source.name)) else None
        if isinstance(source, exp.Subquery):
            return _outputs(source.this)
        return None

    # innermost first, a WITH before what follows it: a list's query may select * from
    # a derived table or a CTE that a list named
    for node in _innermost_first(query):
        alias = node.args.get("alias")
        if isinstance(alias, exp.TableAlias) and (names := _column_list(alias)):
            where = f"{'CTE' if isinstance(node, exp.CTE) else 'derived table'} " \
                    f"{alias.name!r}"
            _rename_outputs(node.this, names, where, columns)
            alias.set("columns", None)
        if isinstance(node, exp.CTE) and (outputs := _outputs(node.this)) is not None:
            ctes[node.alias_or_name.lower()] = outputs
    return query


def _innermost_first(node: exp.Expr) -> Iterator[exp.Subquery | exp.CTE]:
    """The derived tables and CTEs under ``node``, each after those inside it and after
    the CTEs of a WITH before it."""
    children = list(node.iter_expressions())
    children.sort(key=lambda child: not isinstance(child, exp.With))
    for child in children:
        yield from _innermost_first(child)
    if isinstance(node, exp.Subquery | exp.CTE):
        yield node


def _column_list(alias: exp.TableAlias) -> list[exp.Identifier]:
    return [c for c in alias.args.get("columns") or [] if isinstance(c, exp.Identifier)]


def _naming_select(query: exp.Expr) -> exp.Select | None:
    """The SELECT whose list names ``query``'s columns (a set operation's first branch)."""
    while isinstance(query, exp.SetOperation | exp.Subquery):
        query = query.this
    return query if isinstance(query, exp.Select) else None


def _outputs(query: exp.Expr) -> list[str] | None:
    """``query``'s column names when its SELECT list names every one (else None: an
    expression without an alias is named by Spark, e.g. ``count(1)``)."""
    select = _naming_select(query)
    if select is None or has_star(select) or not all(
            isinstance(e, exp.Alias | exp.Column) for e in select.expressions):
        return None
    return [e.alias_or_name for e in select.expressions]


def _rename_outputs(query: exp.Expr, names: list[exp.Identifier], where: str,
                    columns: ColumnsOfSource) -> None:
    select = _naming_select(query)
    if select is None:
        raise UnsupportedQuery(f"the column list of {where} names a query sparkfill cannot "
                               "rename; alias its columns in its SELECT list instead")
    if has_star(select):
        _spell_out_star(select, where, columns)
    items = list(select.expressions)
    if len(items) != len(names):
        raise SqlError(f"{where} names {len(names)} column(s) "
                       f"({', '.join(n.name for n in names)}) but its query returns "
                       f"{len(items)}")
    renamed: dict[str, exp.Identifier] = {}
    for item, name in zip(items, names, strict=True):
        if isinstance(item, exp.Alias) and item.alias.lower() != name.name.lower():
            renamed[item.alias.lower()] = name
        item.replace(exp.Alias(this=item.unalias().copy(), alias=name.copy()))
    if not renamed:
        return
    holders = {id(select): select, id(query): query}
    for holder in holders.values():
        for arg in ("order", "having", "qualify"):
            clause = holder.args.get(arg)
            for col in list(clause.find_all(exp.Column)) if clause is not None else []:
                if not col.table and col.name.lower() in renamed:
                    col.set("this", renamed[col.name.lower()].copy())


def _spell_out_star(select: exp.Select, where: str, columns: ColumnsOfSource) -> None:
    """``*`` and ``alias.*`` in ``select``'s list as the columns of its sources."""
    sources = sources_of(select)
    items: list[exp.Expr] = []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            targets = sources
        elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            targets = [s for s in sources if s.alias_or_name.lower() == item.table.lower()]
        else:
            items.append(item)
            continue
        for source in targets:
            names = columns(source)
            if names is None:
                raise UnsupportedQuery(
                    f"the column list of {where} renames a SELECT * over "
                    f"{source.sql(dialect='spark')}, whose columns sparkfill does not know; "
                    "list the columns instead of *")
            items.extend(exp.column(c, table=source.alias_or_name, quoted=True)
                         for c in names)
    select.set("expressions", items)
