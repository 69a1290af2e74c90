"""Where an MV's query leaves a choice among rows that tie: the rows it keeps by
their position in an order, which SQL does not fix for rows with equal order values.

Invariant: ``ranked_selection(query, topn, output, columns)`` returns
``(candidates, selection)`` only when every result of ``query`` is ``selection``
applied to the rows of ``candidates`` (the query without the selection, with the
same output columns), its ties taken in any order; the selection names the MV's
``columns``. Shapes found:

- the top-level ``ORDER BY ... LIMIT n [OFFSET m]`` of a top-N MV (``topn``);
- ``SELECT ... FROM (SELECT ..., row_number() OVER (PARTITION BY p ORDER BY o) AS rn
  ...) s WHERE <bounds on rn>`` (a derived table or a CTE), the ``WHERE`` nothing but
  constant bounds (``rn <= 3``, ``rn = 1``, ``rn BETWEEN 2 AND 5``, ...);
- a ``row_number()`` in the SELECT list, unfiltered (the whole order).

For a ``row_number()`` its ``PARTITION BY`` and ``ORDER BY`` terms must be columns
of the result (else the MV's rows cannot be put in tie groups); its own column, if
the result has it, is the selection's position. None otherwise: VERIFY compares
exactly. ``rank()`` and ``dense_rank()`` give tied rows one value, so a filter on
them keeps the same rows whatever the order of ties: they need none of this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sqlglot import exp

from .planner import TopNSpec
from .sql_tree import conjuncts, from_of, has_star

__all__ = ["RankedSelection", "ranked_selection"]

#: clauses that make a filter over a derived table more than a filter
_OUTER_CLAUSES = ("joins", "group", "having", "qualify", "order", "limit", "offset",
                  "distinct", "windows")


@dataclass(frozen=True)
class RankedSelection:
    """The rows at positions ``first..last`` (1-based; ``last`` None: no end) of each
    partition in an order whose ties may come in any order."""

    #: the columns whose values make a partition (none: one partition)
    partition: tuple[str, ...]
    #: (column, descending, nulls first)
    order: tuple[tuple[str, bool, bool], ...]
    first: int = 1
    last: int | None = None
    #: the column holding each row's position (``row_number()``), if the rows have it
    position: str | None = None

    def renamed(self, names: Mapping[str, str]) -> RankedSelection:
        """The selection with every column renamed by ``names``."""
        return RankedSelection(tuple(names[c] for c in self.partition),
                               tuple((names[c], desc, nf) for c, desc, nf in self.order),
                               self.first, self.last,
                               None if self.position is None else names[self.position])

    @property
    def columns(self) -> set[str]:
        """Every column the selection names."""
        named = {*self.partition, *(c for c, _, _ in self.order)}
        return named if self.position is None else named | {self.position}


def ranked_selection(query: exp.Expr, topn: TopNSpec | None, output: Sequence[str],
                     columns: Sequence[str]) -> tuple[exp.Expr, RankedSelection] | None:
    """``query``'s candidates query and its ranked selection, or None (see the module).
    ``topn``: the MV's top-N (names of ``columns``); ``output``: the names Spark gives
    the query's columns; ``columns``: the MV's names of them, by position."""
    if len(output) != len(columns):
        return None
    if topn is not None:
        return _top_n(query, topn, columns)
    lowered = [n.lower() for n in output]
    names = {n: c for n, c in zip(lowered, columns, strict=True) if lowered.count(n) == 1}
    found = _row_number(query)
    if found is None:
        return None
    candidates, selection = found
    if not {n.lower() for n in selection.columns} <= names.keys():
        return None
    return candidates, selection.renamed({n: names[n.lower()] for n in selection.columns})


def _top_n(query: exp.Expr, topn: TopNSpec,
           columns: Sequence[str]) -> tuple[exp.Expr, RankedSelection] | None:
    if not isinstance(query, exp.Select) or query.args.get("limit") is None \
            or any(c not in columns for c, _, _ in topn.order):
        return None
    candidates = query.copy()
    for arg in ("order", "limit", "offset"):
        candidates.set(arg, None)
    return candidates, RankedSelection((), topn.order, topn.offset + 1,
                                       topn.offset + topn.limit)


def _row_number(query: exp.Expr) -> tuple[exp.Expr, RankedSelection] | None:
    """The selection in the query's output names."""
    if not isinstance(query, exp.Select):
        return None
    own = [i for i in query.expressions if _row_number_window(i) is not None]
    if own:  # the whole order: every row, each numbered
        if len(own) > 1:
            return None
        own_names = {i.alias_or_name.lower(): i.alias_or_name for i in query.expressions
                     if not _is_star(i)}
        selection = _over(query, own[0], own_names, has_star(query))
        return None if selection is None else (query, selection)
    if any(query.args.get(a) for a in _OUTER_CLAUSES) \
            or any(i.find(exp.Window, exp.AggFunc) for i in query.expressions):
        return None
    from_ = from_of(query)
    inner, alias = _derived(query, from_.this) if from_ is not None else (None, "")
    where = query.args.get("where")
    if inner is None or where is None:
        return None
    bounds = [_bound(c, alias) for c in conjuncts(where.this)]
    known = [b for b in bounds if b is not None]
    if len(known) != len(bounds) or len({name for name, _, _ in known}) != 1:
        return None
    item = next((i for i in inner.expressions if _row_number_window(i) is not None
                 and i.alias_or_name.lower() == known[0][0]), None)
    if item is None:
        return None
    # the derived table's names that are the query's outputs, by name in the table
    names: dict[str, str] = {}
    for i in query.expressions:
        value = i.unalias()
        if isinstance(value, exp.Column) and not _is_star(value) \
                and value.table.lower() in ("", alias):
            names.setdefault(value.name.lower(), i.alias_or_name)
    selection = _over(inner, item, names, has_star(query))
    if selection is None:
        return None
    lows = [low for _, low, _ in known if low is not None]
    highs = [high for _, _, high in known if high is not None]
    candidates = query.copy()
    candidates.set("where", None)
    return candidates, replace(selection, first=max([1, *lows]),
                               last=min(highs) if highs else None)


def _over(select: exp.Select, item: exp.Expr, names: dict[str, str],
          star: bool) -> RankedSelection | None:
    """The whole order of the ``row_number()`` of ``item`` (in ``select``'s list), in
    output names; None when one of its terms is no output. ``names``: output name by
    (lowercase) name in ``select``; ``star``: every name of ``select`` is an output
    under its own name as well."""
    window = _row_number_window(item)
    assert window is not None
    order = window.args.get("order")
    if order is None or not order.expressions or window.args.get("spec") is not None:
        return None

    def output(name: str | None) -> str | None:
        if name is None:
            return None
        return names.get(name.lower(), name if star else None)

    partition = [output(_name_in(select, p)) for p in window.args.get("partition_by") or []]
    ordered: list[tuple[str, bool, bool]] = []
    for o in order.expressions:
        column = output(_name_in(select, o.this))
        if column is None:
            return None
        desc = bool(o.args.get("desc"))
        nulls_first = o.args.get("nulls_first")
        # Spark's default: NULLs first ascending, last descending
        ordered.append((column, desc, (not desc) if nulls_first is None else bool(nulls_first)))
    kept = [p for p in partition if p is not None]
    if len(kept) != len(partition):
        return None
    return RankedSelection(tuple(kept), tuple(ordered),
                           position=output(item.alias_or_name))


def _name_in(select: exp.Select, term: exp.Expr) -> str | None:
    """The name of ``select``'s output that ``term`` (an expression over its FROM)
    is: an item with the same expression, or a column of its ``*``."""
    text = term.sql(dialect="spark")
    column = term.name.lower() if isinstance(term, exp.Column) else None
    table = term.table if isinstance(term, exp.Column) else ""
    for i in select.expressions:
        if _is_star(i):
            continue
        value = i.unalias()
        if value.sql(dialect="spark") == text:
            return i.alias_or_name
        if column is not None and isinstance(value, exp.Column) \
                and value.name.lower() == column and not (value.table and table):
            return i.alias_or_name
    return term.name if column is not None and has_star(select) else None


def _derived(query: exp.Select, source: exp.Expr) -> tuple[exp.Select | None, str]:
    """The SELECT a FROM reads (a derived table, or a CTE of the query) and its alias."""
    if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select):
        return source.this, source.alias_or_name.lower()
    if isinstance(source, exp.Table) and not source.db:
        with_ = query.args.get("with_") or query.args.get("with")
        for cte in with_.expressions if with_ is not None else []:
            if cte.alias_or_name.lower() == source.name.lower() \
                    and isinstance(cte.this, exp.Select):
                return cte.this, source.alias_or_name.lower()
    return None, ""


def _row_number_window(item: exp.Expr) -> exp.Window | None:
    value = item.unalias()
    if isinstance(value, exp.Window) and isinstance(value.this, exp.RowNumber):
        return value
    return None


def _is_star(item: exp.Expr) -> bool:
    return isinstance(item, exp.Star) or isinstance(item, exp.Column) \
        and isinstance(item.this, exp.Star)


def _bound(cond: exp.Expr, alias: str) -> tuple[str, int | None, int | None] | None:
    """A constant bound on a column of the derived table ``alias``: (its lowercase
    name, lowest value kept or None, highest or None); None for anything else."""
    def column(e: exp.Expr) -> str | None:
        if isinstance(e, exp.Column) and e.table.lower() in ("", alias):
            return e.name.lower()
        return None

    def number(e: exp.Expr) -> int | None:
        if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
            return int(e.this)
        return None

    if isinstance(cond, exp.Between):
        name, low, high = column(cond.this), number(cond.args["low"]), \
            number(cond.args["high"])
        return None if name is None or low is None or high is None else (name, low, high)
    flipped = {exp.LT: exp.GT, exp.LTE: exp.GTE, exp.GT: exp.LT, exp.GTE: exp.LTE,
               exp.EQ: exp.EQ}
    kind = type(cond)
    if kind not in flipped:
        return None
    left, right = cond.this, cond.expression
    if column(left) is None:
        left, right, kind = right, left, flipped[kind]
    name, n = column(left), number(right)
    if name is None or n is None:
        return None
    return {exp.LT: (name, None, n - 1), exp.LTE: (name, None, n), exp.EQ: (name, n, n),
            exp.GT: (name, n + 1, None), exp.GTE: (name, n, None)}[kind]
