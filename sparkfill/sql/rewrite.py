"""Rewrites of an MV's query into the forms the planner compiles.

Invariant: every rewrite keeps the query's meaning exactly — the rewritten query
returns the same rows (as a multiset) as the original over any input — so the
oracle may keep running the original SQL. The MV keeps the user's text; only the
plan is built from the rewritten tree.

- A derived table (``FROM (SELECT ...) AS s``) or a non-recursive CTE that only
  filters and projects is merged into the query that reads it (sqlglot's
  ``qualify`` and ``merge_subqueries``); one that cannot be merged leaves the
  query as written.
- ``ORDER BY`` without ``LIMIT``/``OFFSET`` is dropped: an MV is a set of rows.
- ``A UNION B [UNION ...]`` (no ``ALL`` anywhere in the chain) is ``SELECT DISTINCT *
  FROM (A UNION ALL B ...)``.
- ``A INTERSECT B`` and ``A EXCEPT B`` (set semantics, no ``ALL``) group ``A UNION ALL
  B`` by every column, each branch tagged with which side it is: a group is in the
  intersection when both sides have a row of it, in the difference when only ``A``
  has. Grouping treats NULLs as equal, as these set operations do. The columns keep
  ``A``'s names (each must have one: a column or an ``AS``).
- ``agg(x) FILTER (WHERE c)`` becomes ``agg(CASE WHEN c THEN x END)`` (and
  ``count(*) FILTER (WHERE c)`` becomes ``count(CASE WHEN c THEN 1 END)``): every
  aggregate sparkfill maintains ignores NULL inputs, so a row the filter rejects
  counts for nothing either way.
- A condition of ``WHERE`` that is an ``OR`` of ``AND``s shares the conjuncts
  common to every branch: ``(a AND b) OR (a AND c)`` becomes ``a AND (b OR c)``
  (distributivity holds in SQL's three-valued logic), so a join equality written
  in each branch (TPC-H q19) is found.
- A non-recursive CTE is inlined: each reference to it becomes a derived table of
  its query (then merged, or compiled as a link, like any derived table).
- ``TUMBLE(t, col, INTERVAL ...)`` in FROM (the streaming engines' tumbling window)
  is a derived table ``(SELECT *, window_start, window_end FROM t) AS t``: each row
  with the fixed-size window (aligned to the Unix epoch) its ``col`` falls in;
  ``HOP(t, col, slide, size)`` is a UNION ALL of one such projection per window a
  row falls in.
- ``GROUP BY p..., session_window(col, gap)`` (Spark's session windows: per group,
  rows ordered by ``col`` form one session while each follows the one before by at
  most ``gap``; a session spans its first time to its last time + ``gap``) is a
  grouped query over two derived tables of window functions: a row starts a
  session when the row before it in its group (``lag``) is more than ``gap``
  earlier; its session's start is the latest start at or before it (a running
  ``max``). The query then groups by ``p...`` and that start; ``session_window.start``
  is the start, ``session_window.end`` is ``max(col) + gap``. A row whose ``col``
  is NULL is in no session. A late row changes only the sessions of its group
  around it (a session is named by its start, not numbered).
- ``GROUP BY ROLLUP/CUBE/GROUPING SETS`` (with ``grouping()``/``grouping_id()``) and
  window functions over a grouped query: the grouping (a UNION ALL of one grouped
  query per grouping set) is a derived table the query reads (``grouping_sets.py``).
- Parentheses around a JOIN's whole condition or a whole SELECT item are dropped;
  ``LIMIT`` over a query of at most one row is dropped; a comma join with a global
  aggregate's one row joins it on a constant (``one_row.py``).
- ``IN``/``EXISTS`` under an ``OR`` of ``WHERE`` become LEFT JOINs with the
  subquery's distinct keys; a scalar subquery that does not aggregate becomes one
  that does (``or_subqueries.py``).
- Subqueries in ``WHERE``, ``HAVING`` and the SELECT list become joins with derived
  tables (``subqueries.py``), innermost first.
- A comma (cross) join whose ``WHERE`` holds equalities between its relation and
  the relations before it becomes an inner join ``ON`` those equalities; the rest
  of the ``WHERE`` stays. A list of comma joins is first put in an order where
  each relation has such an equality with those before it (inner joins commute).
  A column names its relation by qualifier, or (given the relations' columns) by
  being a column of exactly one of them.
- ``a / b`` is ``try_divide(a, b)``: the same value (and type) wherever Spark's
  division returns one, NULL where it raises (a zero divisor, a decimal overflow,
  under ANSI mode). An MV evaluates its expressions over states Spark's query never
  sees — a join or aggregate half backfilled, a global ``count(*)`` that is 0 before
  its link has read a row (TPC-DS q90's ``amc / pmc``), the other side of an epoch's
  change — and a division that raises there would fail every epoch. Over the whole
  input the MV differs from Spark's query only where that query fails (VERIFY then
  reports Spark's error). A SELECT whose unnamed item holds a division keeps its
  divisions (Spark names the item after its text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.qualify import qualify

from ..errors import SqlError, UnsupportedQuery
from .column_lists import name_columns
from .grouping_sets import split_grouping
from .one_row import drop_limit_of_one_row, one_row_cross_joins, unwrap_parens
from .or_subqueries import flatten_where, scalar_to_aggregate, subqueries_under_or
from .sql_tree import (
    ColumnsOf,
    conjuncts,
    from_of,
    has_star,
    set_from,
    source_columns,
    sources_of,
)
from .subqueries import decorrelate

__all__ = ["rewrite_query", "time_windows_to_derived", "session_windows_to_derived",
           "ColumnsOf", "conjuncts", "has_star"]


def rewrite_query(query: exp.Expr, columns_of: ColumnsOf | None = None) -> exp.Expr:
    """A copy of ``query`` with the rewrites above applied (the input is unchanged);
    ``columns_of`` resolves unqualified columns of comma joins."""
    query = _merge_derived_tables(session_windows_to_derived(time_windows_to_derived(
        _inline_ctes(name_columns(unwrap_parens(query.copy()), columns_of)))), columns_of)
    query = drop_limit_of_one_row(query)
    _drop_order(query)
    query = _union_to_distinct(query)
    query = _intersect_except_to_groups(query)
    for select in reversed(list(query.find_all(exp.Select))):  # innermost first
        _filters_to_case(select)
        grouped = split_grouping(select)
        if grouped is not None:
            if select is query:
                query = grouped
            else:
                select.replace(grouped)
    counter = [0]
    for select in reversed(list(query.find_all(exp.Select))):  # innermost first
        flatten_where(select)
        _factor_where(select)
        _comma_joins_to_inner(select, columns_of)
        one_row_cross_joins(select, columns_of)
        scalar_to_aggregate(select, columns_of)
        subqueries_under_or(select, counter)
        decorrelated = decorrelate(select, columns_of)
        if decorrelated is not select:
            if select is query:
                query = decorrelated
            else:
                select.replace(decorrelated)
    _divisions_to_try(query)
    return query


def _divisions_to_try(query: exp.Expr) -> None:
    """Each ``a / b`` of ``query`` as ``try_divide(a, b)``, in place (see above)."""
    kept: set[int] = set()
    for select in query.find_all(exp.Select):
        if any(not isinstance(item, exp.Alias | exp.Column | exp.Star)
               and any(d.find_ancestor(exp.Select) is select for d in item.find_all(exp.Div))
               for item in select.expressions):
            kept.add(id(select))
    for div in list(query.find_all(exp.Div)):
        scope = div.find_ancestor(exp.Select)
        if scope is not None and id(scope) in kept:
            continue
        div.replace(exp.SafeDivide(this=div.this, expression=div.expression))


def _union_to_distinct(query: exp.Expr) -> exp.Expr:
    """``A UNION B [UNION C ...]`` (every union of the chain without ALL, no ORDER BY
    or LIMIT on it) is ``SELECT DISTINCT * FROM (A UNION ALL B ...)``: the same set."""
    if not isinstance(query, exp.Union) or not query.args.get("distinct"):
        return query
    chain: list[exp.Union] = [query]
    for union in chain:
        for side in (union.this, union.expression):
            inner = side.unnest() if isinstance(side, exp.Subquery) else side
            if isinstance(inner, exp.SetOperation):
                if not isinstance(inner, exp.Union) or not inner.args.get("distinct"):
                    return query
                chain.append(inner)
    if any(u.args.get(a) is not None for u in chain for a in ("order", "limit", "offset")):
        return query
    for union in chain:  # (a UNION inside a branch's subquery keeps its meaning)
        union.set("distinct", False)
    return exp.select(exp.Star()).distinct().from_(exp.Subquery(
        this=query, alias=exp.TableAlias(this=exp.to_identifier("__sf_union"))))


#: the branch tags of an INTERSECT/EXCEPT rewritten as a grouped UNION ALL
_LEFT, _RIGHT = "__sf_left", "__sf_right"


def _intersect_except_to_groups(query: exp.Expr) -> exp.Expr:
    """Every ``A INTERSECT B`` / ``A EXCEPT B`` of ``query`` (innermost first) as
    ``SELECT cols FROM (A' UNION ALL B') GROUP BY cols HAVING ...`` (see above)."""
    for node in reversed(list(query.find_all(exp.Intersect, exp.Except))):
        grouped = _set_operation_as_groups(node)
        if node is query:
            query = grouped
        else:
            node.replace(grouped)
    return query


def _set_operation_as_groups(node: exp.SetOperation) -> exp.Expr:
    op = "INTERSECT" if isinstance(node, exp.Intersect) else "EXCEPT"
    if not node.args.get("distinct"):
        raise UnsupportedQuery(f"{op} ALL is not supported in a materialized view "
                               f"({op} without ALL is)")
    if any(node.args.get(a) is not None for a in ("order", "limit", "offset")):
        return node  # as written: the planner says what it does not support
    sides = [s.unnest() if isinstance(s, exp.Subquery) else s
             for s in (node.this, node.expression)]
    if not all(isinstance(s, exp.Select) for s in sides):
        return node
    left, right = sides
    assert isinstance(left, exp.Select) and isinstance(right, exp.Select)
    names: list[str] = []
    for item in left.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column)
                                          and isinstance(item.this, exp.Star)):
            raise UnsupportedQuery(f"{op} over SELECT *: name the columns of each side")
        if not isinstance(item, exp.Alias | exp.Column) or not item.alias_or_name:
            raise UnsupportedQuery(f"every column of {op}'s first query needs a name: "
                                   f"write {item.sql(dialect='spark')} AS name")
        names.append(item.alias_or_name)
    if len({n.lower() for n in names}) < len(names):
        raise UnsupportedQuery(f"{op}'s first query names a column twice: {', '.join(names)}")
    if len(right.expressions) != len(names) or any(
            isinstance(i, exp.Star) for i in right.expressions):
        raise SqlError(f"the two queries of {op} must have the same number of columns "
                       f"(named, not *): {len(names)} and {len(right.expressions)}")
    def side(first: bool) -> list[exp.Expr]:
        return [exp.alias_(exp.Literal.number(int(first)), _LEFT),
                exp.alias_(exp.Literal.number(int(not first)), _RIGHT)]

    tagged_left: exp.Select = left.copy()
    tagged_left.select(*side(True), copy=False)
    tagged_right: exp.Select = right.copy()
    tagged_right.set("expressions", [
        exp.alias_(item.unalias().copy(), name) for item, name in zip(
            right.expressions, names, strict=True)])
    tagged_right.select(*side(False), copy=False)
    both = exp.union(tagged_left, tagged_right, distinct=False)

    def tag(name: str) -> exp.Expr:
        return exp.Max(this=exp.column(name))

    having = (exp.and_(exp.EQ(this=tag(_LEFT), expression=exp.Literal.number(1)),
                       exp.EQ(this=tag(_RIGHT), expression=exp.Literal.number(1)))
              if op == "INTERSECT" else
              exp.EQ(this=tag(_RIGHT), expression=exp.Literal.number(0)))
    columns = [exp.Column(this=exp.to_identifier(n)) for n in names]
    return (exp.select(*columns)
            .from_(exp.Subquery(this=both, alias=exp.TableAlias(
                this=exp.to_identifier("__sf_setop"))))
            .group_by(*[c.copy() for c in columns])
            .having(having))


def _inline_ctes(query: exp.Expr) -> exp.Expr:
    """``query`` with each reference to a CTE of its (non-recursive) WITH replaced by
    a derived table of the CTE's query (``name_columns`` moved a CTE's column list into
    its query)."""
    with_ = query.args.get("with") or query.args.get("with_")
    if with_ is None or with_.args.get("recursive"):
        return query
    ctes: dict[str, exp.Expr] = {}
    for cte in with_.expressions:
        body = cte.this.copy()
        _replace_references(body, ctes)  # to the CTEs before it
        ctes[cte.alias_or_name.lower()] = body
    for arg in ("with", "with_"):
        if arg in query.args:
            query.set(arg, None)
    _replace_references(query, ctes)
    return query


#: microseconds per unit of a fixed-length interval (a month or a year is not fixed)
_MICROS = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000,
           "MINUTE": 60_000_000, "HOUR": 3_600_000_000, "DAY": 86_400_000_000}


def time_windows_to_derived(query: exp.Expr) -> exp.Expr:
    """Every ``TUMBLE(t, col, size)`` and ``HOP(t, col, slide, size)`` in FROM or JOIN
    as a derived table of ``t`` with ``window_start`` and ``window_end``, under the
    alias (or ``t``'s name): a tumbling window is one projection; a row is in
    ``ceil(size / slide)`` hopping windows, one UNION ALL branch each (the window
    starting ``i`` slides before the one its time falls in; kept when it still holds
    the time)."""
    for table in list(query.find_all(exp.Table)):
        func = table.this
        if not isinstance(func, exp.Anonymous):
            continue
        kind = str(func.name).upper()
        if kind == "SESSION":
            raise UnsupportedQuery("SESSION(...) in FROM is not supported; group by "
                                   "Spark's session_window(col, gap) instead")
        if kind not in ("TUMBLE", "HOP"):
            continue
        args = func.expressions
        sizes = 1 if kind == "TUMBLE" else 2
        if len(args) != 2 + sizes or not isinstance(
                args[0], exp.Column | exp.Table | exp.Subquery) \
                or not isinstance(args[1], exp.Column):
            raise UnsupportedQuery(
                f"{kind} takes a table (or a subquery), a timestamp column and "
                + ("a size: TUMBLE(bid, date_time, INTERVAL '10' SECOND)" if kind == "TUMBLE"
                   else "a slide and a size: HOP(bid, date_time, INTERVAL '2' SECOND, "
                        "INTERVAL '10' SECOND)"))
        size = _interval_micros(args[-1])
        slide = size if kind == "TUMBLE" else _interval_micros(args[2])
        column = exp.column(args[1].name, quoted=True).sql("spark")
        name = f"__sf_{kind.lower()}"
        source = (f"({args[0].unnest().sql(dialect='spark')}) AS {name}"
                  if isinstance(args[0], exp.Subquery) else args[0].name)
        micros = f"unix_micros({column})"
        branches = []
        for i in range(-(-size // slide)):
            start = f"{micros} - pmod({micros}, {slide}) - {i * slide}"
            where = f" WHERE {micros} < {start} + {size}" if size % slide else ""
            branches.append(f"SELECT *, timestamp_micros({start}) AS window_start, "
                            f"timestamp_micros({start} + {size}) AS window_end "
                            f"FROM {source}{where}")
        body = sqlglot.parse_one(" UNION ALL ".join(branches), read="spark")
        alias = table.alias_or_name if table.alias else \
            name if isinstance(args[0], exp.Subquery) else source
        table.replace(exp.Subquery(this=body,
                                   alias=exp.TableAlias(this=exp.to_identifier(alias))))
    return query


#: the columns a session window adds to its rows (in the derived tables)
_SESSION_NEW, _SESSION_START = "__sf_session_new", "__sf_session_start"


def session_windows_to_derived(query: exp.Expr) -> exp.Expr:
    """Every query grouped by ``session_window(col, gap)`` as a query grouped by the
    session's start over derived tables that compute it (see above)."""
    for select in reversed(list(query.find_all(exp.Select))):  # innermost first
        group = select.args.get("group")
        items = list(group.expressions) if group is not None else []
        sessions = [g for g in items if _is_session_window(g)]
        if not sessions:
            continue
        grouped = _session_grouped(select, sessions, items)
        if select is query:
            query = grouped
        else:
            select.replace(grouped)
    return query


def _is_session_window(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.name).lower() == "session_window"


def _session_grouped(select: exp.Select, sessions: list[exp.Expr],
                     items: list[exp.Expr]) -> exp.Select:
    text = sessions[0].sql(dialect="spark")
    if len(sessions) > 1:
        raise UnsupportedQuery(f"a query may group by one session_window, not {len(sessions)}")
    args = sessions[0].expressions
    if len(args) != 2 or not isinstance(args[0], exp.Column):
        raise UnsupportedQuery(f"{text}: session_window takes a timestamp column and a gap: "
                               "session_window(date_time, '10 seconds')")
    gap_node = args[1]
    if isinstance(gap_node, exp.Literal) and gap_node.is_string:
        gap_node = sqlglot.parse_one(f"INTERVAL '{gap_node.name}'", read="spark")
    gap = _interval_micros(gap_node)
    from_ = from_of(select)
    if from_ is None or select.args.get("joins") or not isinstance(
            from_.this, exp.Table | exp.Subquery) or isinstance(from_.this.this, exp.Func):
        raise UnsupportedQuery(f"{text}: a session window groups the rows of one table or "
                               "derived table; put a join in a derived table first")
    partition = [g for g in items if g is not sessions[0]]
    if not all(isinstance(g, exp.Column) for g in partition):
        raise UnsupportedQuery(f"{text}: the other GROUP BY items of a session window must "
                               "be columns (compute expressions in a derived table)")
    source = from_.this
    alias = source.alias_or_name
    q = exp.to_identifier
    col = q(args[0].name, quoted=True).sql("spark")
    over_by = ", ".join(q(g.name, quoted=True).sql("spark") for g in partition)
    over = (f"PARTITION BY {over_by} " if over_by else "") + f"ORDER BY {col}"
    where = select.args.get("where")
    conds = [f"{col} IS NOT NULL"] + ([f"({where.this.sql(dialect='spark')})"]
                                     if where is not None else [])
    starts = (f"SELECT *, CASE WHEN unix_micros({col}) - unix_micros(lag({col}) OVER ({over})) "
              f"<= {gap} THEN 0 ELSE 1 END AS {_SESSION_NEW} "
              f"FROM {source.sql(dialect='spark')} WHERE {' AND '.join(conds)}")
    sessions_sql = (f"SELECT *, max(CASE WHEN {_SESSION_NEW} = 1 THEN {col} END) OVER ({over} "
                    f"ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS {_SESSION_START} "
                    f"FROM ({starts}) AS __sf_session_rows")
    out = select.copy()
    out.set("where", None)
    set_from(out, exp.Subquery(this=sqlglot.parse_one(sessions_sql, read="spark"),
                               alias=exp.TableAlias(this=q(alias))))
    new_items = [exp.column(_SESSION_START, table=alias) if _is_session_window(g) else g.copy()
                 for g in out.args["group"].expressions]
    out.args["group"].set("expressions", new_items)
    start = exp.column(_SESSION_START, table=alias)
    end = sqlglot.parse_one(f"timestamp_micros(unix_micros(max({alias}.{col})) + {gap})",
                            read="spark")
    struct = exp.Anonymous(this="named_struct", expressions=[
        exp.Literal.string("start"), start.copy(), exp.Literal.string("end"), end.copy()])

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table.lower() == "session_window" \
                and node.name.lower() in ("start", "end"):
            return (start if node.name.lower() == "start" else end).copy()
        if isinstance(node, exp.Column) and not node.table \
                and node.name.lower() == "session_window":
            return struct.copy()
        return node

    for key in ("expressions", "having"):
        value = out.args.get(key)
        if isinstance(value, list):
            out.set(key, [e.transform(replace) for e in value])
        elif value is not None:
            out.set(key, value.transform(replace))
    return out


def _interval_micros(node: exp.Expr) -> int:
    """A window size: a positive interval of fixed length, in microseconds."""
    text = node.sql(dialect="spark")
    if isinstance(node, exp.Interval):
        unit = str(node.unit.name if node.unit is not None else "").upper().rstrip("S")
        value = node.this.name if node.this is not None else ""
        parts = value.split()
        if len(parts) == 2 and not unit:  # INTERVAL '10 SECONDS'
            value, unit = parts[0], parts[1].upper().rstrip("S")
        try:
            amount = float(value)
        except ValueError:
            amount = 0.0
        if unit in _MICROS and amount > 0 and (amount * _MICROS[unit]).is_integer():
            return int(amount * _MICROS[unit])
    raise UnsupportedQuery(f"a window size must be a positive INTERVAL of fixed length "
                           f"(microseconds to days), got {text}")


def _replace_references(tree: exp.Expr, ctes: dict[str, exp.Expr]) -> None:
    for table in list(tree.find_all(exp.Table)):
        if not table.args.get("db") and not isinstance(table.this, exp.Func) \
                and table.name.lower() in ctes:
            table.replace(exp.Subquery(
                this=ctes[table.name.lower()].copy(),
                alias=exp.TableAlias(this=exp.to_identifier(table.alias_or_name))))


def _merge_derived_tables(query: exp.Expr, columns_of: ColumnsOf | None) -> exp.Expr:
    has_derived = _has_with(query) or any(
        isinstance(node.parent, exp.From | exp.Join) for node in query.find_all(exp.Subquery))
    if columns_of is None or not has_derived:
        return query
    schema: dict[str, object] = {}
    for table in query.find_all(exp.Table):
        columns = columns_of(table.name)
        if columns is not None:
            schema[table.name] = {c: "string" for c in columns}
    try:
        candidate = merge_subqueries(qualify(query.copy(), dialect="spark", schema=schema))
    except Exception:  # noqa: BLE001 - not something qualify can resolve: as written
        return query
    if _has_with(candidate) or any(
            True for _ in candidate.find_all(exp.Subquery)):
        return query  # a derived table that does more than filter and project
    # qualify lower-cases names (Spark's are case-insensitive); the MV's columns keep
    # the names the user wrote
    if isinstance(query, exp.Select) and isinstance(candidate, exp.Select) \
            and not any(isinstance(e, exp.Star) or isinstance(e.unalias(), exp.Column)
                        and isinstance(e.unalias().this, exp.Star) for e in query.expressions):
        for item, out in zip(query.expressions, candidate.expressions, strict=True):
            if item.alias_or_name:
                out.replace(exp.alias_(out.unalias(), item.alias_or_name, quoted=True))
    return candidate


def _has_with(query: exp.Expr) -> bool:
    return any(query.args.get(k) is not None for k in ("with", "with_"))


def _drop_order(query: exp.Expr) -> None:
    """The outermost ORDER BY orders nothing an MV keeps (without LIMIT/OFFSET)."""
    if isinstance(query, exp.Query) and query.args.get("order") is not None \
            and query.args.get("limit") is None and query.args.get("offset") is None:
        query.set("order", None)


def _filters_to_case(select: exp.Select) -> None:
    for node in list(select.find_all(exp.Filter)):
        agg, where = node.this, node.expression
        if not isinstance(agg, exp.AggFunc) or not isinstance(where, exp.Where):
            continue
        cond = where.this
        target = agg.this
        if isinstance(target, exp.Distinct):
            target.set("expressions", [_when(cond, e) for e in target.expressions])
        elif isinstance(target, exp.Star) or target is None:
            agg.set("this", _when(cond, exp.Literal.number(1)))
        else:
            agg.set("this", _when(cond, target))
        node.replace(agg)


def _factor_where(select: exp.Select) -> None:
    where = select.args.get("where")
    if where is None:
        return
    factored: list[exp.Expr] = []
    for cond in conjuncts(where.this):
        factored.extend(_factor_or(cond.unnest()))
    select.set("where", exp.Where(this=exp.and_(*factored)))


def _factor_or(cond: exp.Expr) -> list[exp.Expr]:
    """The conjuncts of ``cond`` with those common to every branch of an OR pulled
    out of it (unchanged when there are none)."""
    if not isinstance(cond, exp.Or):
        return [cond]
    branches = [[c.unnest() for c in conjuncts(b.unnest())] for b in cond.flatten()]
    common = [c for c in branches[0]
              if all(any(c == d for d in other) for other in branches[1:])]
    if not common:
        return [cond]
    rests = [[c for c in b if not any(c == m for m in common)] for b in branches]
    if any(not rest for rest in rests):  # a branch holds only common terms: OR is true
        return [c.copy() for c in common]
    ored = exp.or_(*[exp.and_(*[c.copy() for c in rest]) for rest in rests])
    return [*[c.copy() for c in common], exp.Paren(this=ored)]


def _when(cond: exp.Expr, value: exp.Expr) -> exp.Expr:
    return exp.Case(ifs=[exp.If(this=cond.copy(), true=value.copy())])


def _relation_names(rel: exp.Expr) -> set[str]:
    return {rel.alias_or_name.lower()} if isinstance(rel, exp.Table) or \
        isinstance(rel, exp.Subquery) and rel.alias else set()


def _comma_joins_to_inner(select: exp.Select, columns_of: ColumnsOf | None) -> None:
    joins = select.args.get("joins") or []
    from_ = from_of(select)
    if not joins or from_ is None:
        return
    # which relation (alias) each unqualified column name belongs to, when only one has it
    owners: dict[str, set[str]] = {}
    for rel in sources_of(select):
        if _relation_names(rel) and columns_of is not None:
            for col in source_columns(rel, columns_of):
                owners.setdefault(col.lower(), set()).add(rel.alias_or_name.lower())

    def table_of(col: exp.Column) -> str | None:
        if col.table:
            return col.table.lower()
        found = owners.get(col.name.lower(), set())
        return next(iter(found)) if len(found) == 1 else None

    where = select.args.get("where")
    remaining = conjuncts(where.this if where is not None else None)
    joins = _connected_order(select, from_, joins, remaining, table_of)
    seen = _relation_names(from_.this)
    for join in joins:
        names = _relation_names(join.this)
        if _is_comma(join) and names:
            moved = [c for c in remaining if _joins_to(c, names, seen, table_of)]
            if moved:
                remaining = [c for c in remaining if all(c is not m for m in moved)]
                join.set("kind", None)
                join.set("on", exp.and_(*[m.copy() for m in moved]))
        seen |= names
    if where is not None:
        select.set("where", exp.Where(this=exp.and_(*remaining)) if remaining else None)


def _is_comma(join: exp.Join) -> bool:
    return (join.args.get("kind") or "").upper() == "CROSS" and not join.args.get("on") \
        and not join.args.get("using") and not join.args.get("side")


def _connected_order(select: exp.Select, from_: exp.From, joins: list[exp.Join],
                     conds: Sequence[exp.Expr],
                     table_of: Callable[[exp.Column], str | None]) -> list[exp.Join]:
    """A comma join's relations in an order where each one has an equality with
    those before it (the first such relation, in the order written, goes next), so
    every join gets an ON. Inner joins commute: the rows are the same. Left as
    written when some join is not a comma join, or ``*`` would list its columns in
    FROM order."""
    if not all(_is_comma(j) for j in joins) or has_star(select):
        return joins
    seen = _relation_names(from_.this)
    pending = list(joins)
    ordered: list[exp.Join] = []
    while pending:
        nxt = next((j for j in pending if any(
            _joins_to(c, _relation_names(j.this), seen, table_of) for c in conds)), pending[0])
        pending.remove(nxt)
        ordered.append(nxt)
        seen |= _relation_names(nxt.this)
    if ordered != joins:
        select.set("joins", ordered)
    return ordered


def _joins_to(cond: exp.Expr, names: set[str], before: set[str],
              table_of: Callable[[exp.Column], str | None]) -> bool:
    """An equality of a column of ``names`` and a column of the relations ``before``."""
    if not (isinstance(cond, exp.EQ) and isinstance(cond.this, exp.Column)
            and isinstance(cond.expression, exp.Column)):
        return False
    left, right = table_of(cond.this), table_of(cond.expression)
    if left is None or right is None or left == right:
        return False
    sides = {left, right}
    return bool(sides & names) and bool(sides & before) and sides <= (names | before)
