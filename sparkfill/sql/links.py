"""An MV's internal links: the MVs a query is compiled into when one plan does
not hold it — the DAG of the query, at MV granularity.

Invariant: ``plan_chain`` returns link queries and an MV query whose composition
returns exactly the rows of the original query over any input; every link is an
MV the dataflow already maintains (created with its owner, hidden, dropped with it):

- a join of three or more relations is a chain of two-way joins (below);
- a derived table that aggregates, joins or is DISTINCT is a link of its own, read
  under its alias (aggregates over aggregates);
- ``ORDER BY ... LIMIT`` reads a link holding the rows before it (a top-N MV);
- subqueries arrive as derived tables joined to the query (``subqueries.py``), so
  they are links too; a one-row link (an uncorrelated scalar subquery) is joined on
  a constant key (``ON 1 = s.__sf_one``).

``split_joins``: A query ``FROM a0 JOIN a1 ON c1 JOIN
a2 ON c2 ... JOIN an ON cn`` becomes internal MVs

    j1 = SELECT <columns of a0, a1> FROM a0 JOIN a1 ON c1 [WHERE <its filters>]
    jk = SELECT <columns of a0..ak> FROM j(k-1) JOIN ak ON ck [WHERE <its filters>]

and the MV itself reads ``j(n-1) JOIN an ON cn`` with the rest of the query (the
chain rule: the incremental form of a composition is the composition of the
incremental forms; each link is a two-way join the dataflow maintains). Joins
are left-deep in the order written; an outer join stays one at its link. A
``WHERE`` conjunct moves down to the first link that holds all the relations it
reads, while every join up to that link is inner (below a LEFT JOIN a filter
would change which rows are null-extended) and no RIGHT or FULL join follows
(it null-extends the relations before it). Internal columns are
named ``<alias>__<column>``; the MV's own output names do not change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pyspark.sql import SparkSession
from sqlglot import exp

from ..errors import UnsupportedQuery
from .output_names import name_outputs
from .planner import (
    LeafInfo,
    PlannedMv,
    TopNSpec,
    check_shape,
    explain_plan,
    plan_materialized_view,
    split_top_n,
    union_branches,
)
from .probe_views import probing
from .rewrite import rewrite_query
from .sql_tree import ColumnsOf, conjuncts, has_star, set_from, sources_of

__all__ = ["ChainLink", "split_joins", "internal_name", "plan_chain", "explain_chain"]

@dataclass(frozen=True)
class ChainLink:
    """One internal MV of a join chain: its name and its two-way join query."""

    name: str
    query: exp.Query


def internal_name(mv_name: str, link: int) -> str:
    """The name of link ``link`` (1-based) of ``mv_name``'s join chain."""
    return f"__sf_{mv_name.removeprefix('__sf_')}_join{link}"


def split_joins(select: exp.Select, mv_name: str, columns_of: ColumnsOf,
                ) -> tuple[list[ChainLink], exp.Select] | None:
    """The links of ``select``'s join chain and the MV's query over the last link;
    None when it joins at most two relations."""
    if len(select.args.get("joins") or []) < 2:
        return None
    select = select.copy()
    joins = list(select.args["joins"])
    tables = sources_of(select)
    assert tables
    aliases = [t.alias_or_name for t in tables]
    columns = {}
    for t, alias in zip(tables, aliases, strict=True):
        cols = columns_of(t.name)
        if cols is None:
            return None  # an unknown relation: the planner says so
        columns[alias.lower()] = list(cols)
    _expand_stars(select, aliases, columns)
    _qualify(select, aliases, columns)

    def alias_index(col: exp.Column) -> int | None:
        table = col.table.lower() if col.table else None
        for i, a in enumerate(aliases):
            if table == a.lower():
                return i
        return None

    def reads(node: exp.Expr) -> set[int]:
        found = set()
        for col in node.find_all(exp.Column):
            i = alias_index(col)
            if i is not None:
                found.add(i)
        return found

    def columns_read(nodes: Sequence[exp.Expr]) -> list[tuple[int, str]]:
        """The relations' columns ``nodes`` read, in order of first use."""
        found: list[tuple[int, str]] = []
        seen: set[tuple[int, str]] = set()
        for node in nodes:
            for col in node.find_all(exp.Column):
                i = alias_index(col)
                if i is not None and (i, col.name.lower()) not in seen:
                    seen.add((i, col.name.lower()))
                    found.append((i, col.name))
        return found

    used = columns_read([select])

    def internal_column(i: int, name: str) -> str:
        return f"{aliases[i]}__{name}"

    def joins_before(c: exp.Expr, k: int) -> bool:
        """An equality of a column of relation ``k`` with a column of one before it,
        or (on the left) with a constant."""
        if not (isinstance(c, exp.EQ) and isinstance(c.expression, exp.Column)):
            return False
        if isinstance(c.this, exp.Literal):
            return alias_index(c.expression) == k
        sides = (alias_index(c.this), alias_index(c.expression)) \
            if isinstance(c.this, exp.Column) else (None, None)
        return k in sides and any(i is not None and i < k for i in sides)

    for k, join in enumerate(joins, start=1):
        if not any(joins_before(c, k) for c in conjuncts(join.args.get("on"))):
            raise UnsupportedQuery(
                f"the join condition {join.args['on'].sql(dialect='spark')} has no equality "
                f"between a column of {aliases[k]} and a column of the relations before it; "
                "non-equi joins are not supported")
    names = [internal_column(i, c).lower() for i, c in used]
    if len(set(names)) != len(names):
        raise UnsupportedQuery("the join's columns cannot be given distinct internal names; "
                               "rename the relations' aliases")

    # WHERE conjuncts, each at the first link holding what it reads (inner joins only)
    where = select.args.get("where")
    remaining = conjuncts(where.this if where is not None else None)
    pushed: dict[int, list[exp.Expr]] = {}
    inner_upto = 0  # links 1..inner_upto are all inner joins
    for k, join in enumerate(joins, start=1):
        if (join.args.get("side") or "").upper():
            break
        inner_upto = k
    if any((j.args.get("side") or "").upper() in ("RIGHT", "FULL") for j in joins):
        # a RIGHT/FULL join null-extends the relations before it: a filter on them
        # must stay above it
        inner_upto = 0
    kept = []
    for cond in remaining:
        if cond.find(exp.AggFunc, exp.Subquery, exp.Select) is not None:
            kept.append(cond)
            continue
        link = max(max(reads(cond), default=0), 1)
        if link <= min(inner_upto, len(joins) - 1):
            pushed.setdefault(link, []).append(cond)
        else:
            kept.append(cond)

    def rewrite(node: exp.Expr, link: int) -> exp.Expr:
        """``node`` over link ``link``'s inputs: columns of relations before its new
        relation read from the previous link (``__j``; the first link reads both
        relations themselves)."""
        def swap(n: exp.Expr) -> exp.Expr:
            if isinstance(n, exp.Column):
                i = alias_index(n)
                if i is not None and i < link and link > 1:
                    return exp.column(internal_column(i, n.name), table="__j", quoted=True)
            return n
        return node.copy().transform(swap)

    # what is evaluated above each link: later joins' conditions, later links' filters
    # and the MV's own clauses
    top_clauses = [*select.expressions, *kept,
                   *[select.args[a] for a in ("group", "having", "order")
                     if select.args.get(a) is not None]]
    links: list[ChainLink] = []
    for k in range(1, len(joins)):
        above = [*top_clauses, *[j.args["on"] for j in joins[k:]],
                 *[c for link, conds in pushed.items() if link > k for c in conds]]
        needed = {(i, c.lower()) for i, c in columns_read(above)}
        outputs = [exp.alias_(rewrite(exp.column(c, table=aliases[i], quoted=True), k),
                              internal_column(i, c), quoted=True)
                   for i, c in used if i <= k and (i, c.lower()) in needed]
        if not outputs:  # nothing above reads the link's columns: keep one for its rows
            i, c = next((i, c) for i, c in used if i <= k)
            outputs = [exp.alias_(rewrite(exp.column(c, table=aliases[i], quoted=True), k),
                                  internal_column(i, c), quoted=True)]
        query = exp.select(*outputs)
        if k == 1:
            query = query.from_(tables[0].copy())
        else:
            query = query.from_(exp.Table(this=exp.to_identifier(internal_name(mv_name, k - 1)),
                                          alias=exp.TableAlias(this=exp.to_identifier("__j"))))
        join = joins[k - 1].copy()
        join.set("on", rewrite(join.args["on"], k))
        query.append("joins", join)
        if pushed.get(k):
            query = query.where(exp.and_(*[rewrite(c, k) for c in pushed[k]]))
        links.append(ChainLink(internal_name(mv_name, k), query))

    # the MV's own query: the last join, over the last link, with the rest of the query
    last = len(joins)
    top = select.copy()
    for item in top.expressions:  # keep each output's name
        if not isinstance(item, exp.Alias):
            item.replace(exp.alias_(item.copy(), item.alias_or_name, quoted=True))
    set_from(top, exp.Table(this=exp.to_identifier(internal_name(mv_name, last - 1)),
                            alias=exp.TableAlias(this=exp.to_identifier("__j"))))
    top.set("joins", [joins[-1].copy()])
    top.set("where", exp.Where(this=exp.and_(*[c.copy() for c in kept])) if kept else None)
    final = rewrite(top, last)
    assert isinstance(final, exp.Select)
    return links, final


def _expand_stars(select: exp.Select, aliases: Sequence[str],
                  columns: dict[str, list[str]]) -> None:
    items: list[exp.Expr] = []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            for a in aliases:
                items.extend(exp.column(c, table=a, quoted=True) for c in columns[a.lower()])
        elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            owner = next((x for x in aliases if x.lower() == item.table.lower()), None)
            if owner is None:
                raise UnsupportedQuery(f"unknown table alias {item.table!r} in "
                                       f"{item.sql(dialect='spark')}")
            items.extend(exp.column(c, table=owner, quoted=True)
                         for c in columns[owner.lower()])
        else:
            items.append(item)
    select.set("expressions", items)


def _qualify(select: exp.Select, aliases: Sequence[str], columns: dict[str, list[str]]) -> None:
    """Give every unqualified column reference its relation's alias (a column of
    exactly one relation); a name that is an output alias only stays as written."""
    owners: dict[str, list[str]] = {}
    for a in aliases:
        for c in columns[a.lower()]:
            owners.setdefault(c.lower(), []).append(a)
    for col in list(select.find_all(exp.Column)):
        if col.table or isinstance(col.this, exp.Star):
            continue
        found = owners.get(col.name.lower(), [])
        if len(found) > 1:
            raise UnsupportedQuery(f"column {col.name!r} is ambiguous; qualify it with a table")
        if len(found) == 1:
            col.set("table", exp.to_identifier(found[0]))


def plan_chain(spark: SparkSession, name: str, query: exp.Expr, columns_of: ColumnsOf,
               resolve: Callable[[str], LeafInfo], outermost: bool = True,
               ) -> tuple[list[tuple[ChainLink, PlannedMv]], PlannedMv]:
    """The plans of an MV's internal links, upstream first, and of the MV itself;
    nothing is created. A join of three or more relations has join-chain links; a
    top-N (``ORDER BY ... LIMIT``) reads a link holding the query without it.
    ``outermost``: the MV's own query (its unnamed outputs take Spark's names)."""
    with probing(spark):  # one planning: each leaf schema's empty relation made once
        return _plan_chain(spark, name, query, columns_of, resolve, outermost)


def _plan_chain(spark: SparkSession, name: str, query: exp.Expr, columns_of: ColumnsOf,
                resolve: Callable[[str], LeafInfo], outermost: bool,
                ) -> tuple[list[tuple[ChainLink, PlannedMv]], PlannedMv]:
    if outermost:
        query = name_outputs(spark, query, resolve)
    rewritten = rewrite_query(query, columns_of)
    if isinstance(rewritten, exp.SetOperation) and rewritten.args.get("limit") is not None:
        # a top-N over a set operation: over the set operation as a derived table
        rewritten = _select_over(rewritten)
    infos: dict[str, LeafInfo] = {}
    planned_links: list[tuple[ChainLink, PlannedMv]] = []

    def resolve_link(rel_name: str) -> LeafInfo:
        return infos.get(rel_name.lower()) or resolve(rel_name)

    def link_columns(rel_name: str) -> Sequence[str] | None:
        info = infos.get(rel_name.lower())
        return [c.name for c in info.columns if not c.hidden] if info else columns_of(rel_name)

    def plan_link(link: ChainLink, planned: PlannedMv | None = None) -> PlannedMv:
        if planned is None:
            planned = plan_materialized_view(spark, link.query, resolve_link, link.name)
        infos[link.name.lower()] = LeafInfo(link.name, tuple(planned.columns),
                                            tuple(planned.key))
        planned_links.append((link, planned))
        return planned

    # a derived table that aggregates, joins or is DISTINCT (the others were merged)
    # is a link of its own, planned like an MV, read under its alias
    if isinstance(rewritten, exp.Select):
        rewritten = rewritten.copy()
        derived = [s for s in rewritten.find_all(exp.Subquery)
                   if isinstance(s.parent, exp.From | exp.Join)
                   and s.find_ancestor(exp.Select) is rewritten]
        for i, sub in enumerate(derived, start=1):
            alias = sub.args.get("alias")
            if alias is None:
                raise UnsupportedQuery("a subquery in FROM needs an alias: (SELECT ...) AS "
                                       "name")
            sub_name = f"{name}_sub{i}"
            sub_links, sub_planned = plan_chain(spark, sub_name, sub.this, link_columns,
                                                resolve_link, outermost=False)
            for link, planned in sub_links:
                plan_link(link, planned)
            plan_link(ChainLink(f"__sf_{sub_name}", sub.this.copy()), sub_planned)
            sub.replace(exp.Table(this=exp.to_identifier(f"__sf_{sub_name}"),
                                  alias=exp.TableAlias(this=alias.this.copy())))
    if isinstance(rewritten, exp.Union) and not rewritten.args.get("distinct"):
        branches = []
        for i, branch in enumerate(union_branches(rewritten), start=1):
            inner = branch.unnest() if isinstance(branch, exp.Subquery) else branch
            if _plain_branch(inner):
                branches.append(inner.copy())
                continue
            link_query, projection = _branch_link(inner, f"__sf_{name}_b{i}",
                                                  branches[0] if branches else None)
            sub_links, sub_planned = plan_chain(spark, f"{name}_b{i}", link_query,
                                                link_columns, resolve_link, outermost=False)
            for link, planned in sub_links:
                plan_link(link, planned)
            plan_link(ChainLink(f"__sf_{name}_b{i}", link_query), sub_planned)
            branches.append(projection)
        union = branches[0]
        for b in branches[1:]:
            union = exp.union(union, b, distinct=False)
        rewritten = union
    outputs = 0
    top_n = None
    if isinstance(rewritten, exp.Select) and rewritten.args.get("limit") is not None:
        rewritten, outputs = _top_n_outputs(rewritten, link_columns)
        top_n = split_top_n(rewritten)
    if top_n is None:
        top_order, limit, offset = None, 0, 0
    else:
        rewritten, top_order, limit, offset = top_n
    select = check_shape(rewritten)
    chain = split_joins(select, name, link_columns) if isinstance(select, exp.Select) else None
    links, body = chain if chain is not None else ([], select)
    for link in links:
        plan_link(link)
    if top_order is None:
        return planned_links, plan_materialized_view(spark, body, resolve_link, name)
    # the top-N: the rows before it are a link of their own; the MV keeps the first
    # ``limit`` of them (after ``offset``) in the order, ties broken by the key
    assert isinstance(body, exp.Select | exp.Union)
    input_name = f"__sf_{name.removeprefix('__sf_')}_input"
    rows = plan_link(ChainLink(input_name, body))
    visible = [c.name for c in rows.columns if not c.hidden]
    # (the columns after the first ``outputs`` are ORDER BY expressions the SELECT
    # list does not hold: the top-N orders its input by them, the MV does not keep them)
    project = exp.select(*[exp.column(c, quoted=True) for c in visible[:outputs]]).from_(
        exp.to_table(input_name))
    planned = plan_materialized_view(spark, project, resolve_link, name)
    spec = TopNSpec(tuple((visible[pos], desc, nulls_first)
                          for pos, desc, nulls_first in top_order), limit, offset)
    return planned_links, replace(planned, plan=replace(planned.plan, topn=spec))


def _plain_branch(branch: exp.Expr) -> bool:
    """Whether a UNION ALL branch is a filter/project of one table (the union
    operator's own input); any other branch is a link of its own."""
    if not isinstance(branch, exp.Select):
        return False
    from_ = sources_of(branch)
    return (len(from_) == 1 and isinstance(from_[0], exp.Table)
            and not isinstance(from_[0].this, exp.Func)
            and not any(branch.args.get(a) for a in ("joins", "group", "distinct", "having",
                                                    "limit", "order"))
            and branch.find(exp.AggFunc, exp.Window, exp.Subquery) is None)


def _branch_link(branch: exp.Expr, link: str, first: exp.Expr | None,
                 ) -> tuple[exp.Query, exp.Select]:
    """A UNION ALL branch that joins, aggregates or reads a derived table as a link
    and the branch's projection of it: the link holds the branch's items that read
    columns (as ``__sf_c<i>``), the projection adds its constants (a NULL of a rolled
    up column has no type of its own: the union gives it the other branches' type)
    and names every column as the first branch does (the union's names)."""
    if not isinstance(branch, exp.Select) or has_star(branch):
        if isinstance(branch, exp.Select):
            raise UnsupportedQuery("a UNION ALL branch that joins or aggregates over "
                                   "SELECT *: name the columns")
        query = exp.select(exp.Star()).from_(exp.Subquery(
            this=branch.copy(), alias=exp.TableAlias(this=exp.to_identifier("__sf_b"))))
        return query, exp.select(exp.Star()).from_(exp.to_table(link))
    items = branch.expressions
    firsts = first.expressions if isinstance(first, exp.Select) else items
    query = branch.copy()
    kept: list[exp.Expr] = []
    projection: list[exp.Expr] = []
    group = branch.args.get("group")
    by_position = group is not None and any(isinstance(g, exp.Literal)
                                            for g in group.expressions)
    for j, item in enumerate(items):
        name = (firsts[j].alias_or_name if j < len(firsts) else "") or item.alias_or_name
        value = item.unalias()
        if value.find(exp.Column, exp.AggFunc, exp.Window) is None and not by_position:
            projection.append(exp.alias_(value.copy(), name, quoted=True) if name
                              else value.copy())
            continue
        kept.append(exp.alias_(value.copy(), f"__sf_c{j}", quoted=True))
        projection.append(exp.alias_(exp.column(f"__sf_c{j}", quoted=True), name, quoted=True)
                          if name else exp.column(f"__sf_c{j}", quoted=True))
    if not kept:  # only constants: the link keeps the branch's rows by the first
        kept.append(exp.alias_(items[0].unalias().copy(), "__sf_c0", quoted=True))
    query.set("expressions", kept)
    return query, exp.select(*projection).from_(exp.to_table(link))


def _select_over(query: exp.Expr) -> exp.Select:
    """``SELECT * FROM (query) ORDER BY ... LIMIT ...`` of a set operation's order
    and limit (its ORDER BY names its output columns: the same rows)."""
    body = query.copy()
    outer = exp.select(exp.Star()).from_(exp.Subquery(
        this=body, alias=exp.TableAlias(this=exp.to_identifier("__sf_setop"))))
    for arg in ("order", "limit", "offset"):
        if body.args.get(arg) is not None:
            outer.set(arg, body.args[arg])
            body.set(arg, None)
    return outer


def _top_n_outputs(select: exp.Select, columns_of: ColumnsOf) -> tuple[exp.Select, int]:
    """A top-N query with ``*`` spelled out (from its relations' columns) and each
    ORDER BY expression that is not an item of its SELECT list added to it as
    ``__sf_o<i>`` (ordered by that column instead), and how many items the query
    had: its outputs. An order expression of a DISTINCT query cannot be added (it
    would change which rows are distinct); it stays as written, for the planner to
    refuse."""
    select = select.copy()
    if has_star(select):
        tables = sources_of(select)
        if all(isinstance(t, exp.Table) for t in tables):
            aliases = [t.alias_or_name for t in tables]
            columns = {}
            for t, a in zip(tables, aliases, strict=True):
                known = columns_of(t.name)
                if known is None:
                    return select, len(select.expressions)
                columns[a.lower()] = list(known)
            _expand_stars(select, aliases, columns)
    outputs = len(select.expressions)
    order = select.args.get("order")
    if order is None or select.args.get("distinct") or has_star(select):
        return select, outputs
    names = [i.alias_or_name.lower() for i in select.expressions]
    sqls = [i.unalias().sql(dialect="spark") for i in select.expressions]
    by_alias = {i.alias.lower(): i.unalias() for i in select.expressions
                if isinstance(i, exp.Alias)}

    def unalias(node: exp.Expr) -> exp.Expr:
        # an output alias inside an ORDER BY expression names the item's value
        if isinstance(node, exp.Column) and not node.table \
                and node.name.lower() in by_alias:
            return by_alias[node.name.lower()].copy()
        return node

    for i, o in enumerate(order.expressions):
        target = o.this
        if isinstance(target, exp.Literal) or (
                isinstance(target, exp.Column) and not target.table
                and target.name.lower() in names) or target.sql(dialect="spark") in sqls:
            continue
        alias = f"__sf_o{i}"
        select.select(exp.alias_(target.copy().transform(unalias), alias), copy=False)
        o.set("this", exp.column(alias))
    return select, outputs


def explain_chain(parts: Sequence[tuple[str, PlannedMv]]) -> str:
    """EXPLAIN text of an MV and its links ((name, plan), upstream first): each
    link's operators and state tables, then the MV's."""
    lines: list[str] = []
    for i, (name, planned) in enumerate(parts):
        if len(parts) > 1:
            role = f"link {i + 1} (an internal MV)" if i < len(parts) - 1 else "the MV"
            lines.append(f"-- {role}: {name}")
        states = tuple(f"__sf_{name.removeprefix('__sf_')}_{d.role}" for d in planned.states)
        lines.append(explain_plan(name, replace(planned.plan, states=states), planned.key))
        for state, d in zip(states, planned.states, strict=True):
            lines.append(f"state {state}: key=({', '.join(d.key)}) "
                         f"vnode=hash({', '.join(d.dist_key)})")
    return "\n".join(lines)
