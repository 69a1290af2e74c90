"""``GROUP BY ROLLUP``/``CUBE``/``GROUPING SETS`` (with ``grouping()`` and
``grouping_id()``), and window functions over a grouped query, as a grouped query
(or a ``UNION ALL`` of one per grouping set) under a query that reads it.

Invariant: the rewritten query returns exactly the rows of the original over any
input (as a multiset, NULLs included); the oracle keeps running the original SQL.

A grouped ``SELECT`` whose ``GROUP BY`` has grouping sets, or whose SELECT list or
ORDER BY holds a window function, becomes

    SELECT <items> FROM (<branch per grouping set> UNION ALL ...) AS __sf_grouped
    [WHERE <having>] [ORDER BY ... LIMIT ...]

where each branch is the query's FROM/WHERE grouped by the set's expressions: it
returns each grouping expression (``__sf_g<i>``; NULL in a set without it, as
Spark's Expand gives it), each aggregate of the items, HAVING and ORDER BY over
the original rows (``__sf_a<k>``), and for each grouping expression whether the
set rolled it up (``__sf_r<i>``, 1 or 0: ``grouping(x)``; ``grouping_id(...)`` is
its bits). The outer items, HAVING (a WHERE over the groups) and ORDER BY read
those columns in place of the expressions; windows compute over them. A set
without expressions (the grand total) is a global aggregate that keeps its row
only over some input (``HAVING count(*) > 0``): a grouped query returns no group
over no rows. ``GROUP BY a, ROLLUP(b, c)`` crosses the plain items with each set.
Window functions of several ``PARTITION BY``s: those of each but the last are
computed in a layer of their own (``__sf_w<j>``) between the groups and the query,
so each query computes windows of one partitioning.
"""

from __future__ import annotations

import itertools

from sqlglot import exp

from ..errors import UnsupportedQuery
from .sql_tree import from_of

__all__ = ["split_grouping"]

#: how many grouping sets one query may expand to (CUBE of n columns has 2^n)
MAX_SETS = 64


def _is_grouping(node: exp.Expr) -> str | None:
    """"grouping" / "grouping_id" when ``node`` calls one of them."""
    name = type(node).__name__.lower()
    if isinstance(node, exp.Anonymous):
        name = str(node.name).lower()
    if name in ("grouping", "groupingid", "grouping_id"):
        return "grouping" if name == "grouping" else "grouping_id"
    return None


def _sets(group: exp.Group) -> tuple[list[exp.Expr], list[list[int]]] | None:
    """The grouping expressions and the sets (indexes into them); None for a
    plain GROUP BY."""
    exprs: list[exp.Expr] = []
    keys: dict[str, int] = {}

    def index(e: exp.Expr) -> int:
        while isinstance(e, exp.Paren):
            e = e.this
        sql = e.sql(dialect="spark").lower()
        if sql not in keys:
            keys[sql] = len(exprs)
            exprs.append(e)
        return keys[sql]

    plain: list[int] = []
    factors: list[list[list[int]]] = []
    special = False
    for item in group.expressions:
        if isinstance(item, exp.Rollup):
            special = True
            cols = [index(e) for e in item.expressions]
            factors.append([cols[:n] for n in range(len(cols), -1, -1)])
        elif isinstance(item, exp.Cube):
            special = True
            cols = [index(e) for e in item.expressions]
            factors.append([[c for c, keep in zip(cols, mask, strict=True) if keep]
                            for mask in itertools.product((1, 0), repeat=len(cols))])
        elif isinstance(item, exp.GroupingSets):
            special = True
            sets = []
            for s in item.expressions:
                members = s.expressions if isinstance(s, exp.Tuple) else [s]
                sets.append([index(e) for e in members])
            factors.append(sets)
        else:
            plain.append(index(item))
    for arg in ("rollup", "cube"):
        if group.args.get(arg):  # GROUP BY a, b WITH ROLLUP / WITH CUBE
            special = True
            cols = list(plain)
            plain = []
            factors.append([cols[:n] for n in range(len(cols), -1, -1)] if arg == "rollup"
                           else [[c for c, keep in zip(cols, mask, strict=True) if keep]
                                 for mask in itertools.product((1, 0), repeat=len(cols))])
    if group.args.get("totals") or group.args.get("all"):
        raise UnsupportedQuery("GROUP BY ALL / WITH TOTALS is not supported")
    if not special:
        return None
    sets = [plain]
    for factor in factors:
        sets = [[*s, *f] for s in sets for f in factor]
        if len(sets) > MAX_SETS:
            raise UnsupportedQuery(f"GROUP BY with more than {MAX_SETS} grouping sets")
    return exprs, [sorted(set(s)) for s in sets]


def split_grouping(select: exp.Select) -> exp.Select | None:
    """The rewrite above of ``select``, or None when it does not apply."""
    group = select.args.get("group")
    sets_of = _sets(group) if group is not None else None
    has_window = any(w.find_ancestor(exp.Select) is select for w in select.find_all(exp.Window))
    if sets_of is None and not (has_window and (group is not None or any(
            a.find_ancestor(exp.Select) is select and not isinstance(a.parent, exp.Window)
            and not _is_grouping(a) for a in select.find_all(exp.AggFunc)))):
        if group is None and any(_is_grouping(n) for n in select.find_all(exp.Func)
                                 if n.find_ancestor(exp.Select) is select):
            raise UnsupportedQuery("grouping() outside a query with GROUP BY")
        return None
    if select.args.get("distinct") and sets_of is not None:
        raise UnsupportedQuery("SELECT DISTINCT with GROUP BY ROLLUP/CUBE/GROUPING SETS")
    if sets_of is None:
        exprs: list[exp.Expr] = [g.unnest() if isinstance(g, exp.Paren) else g
                                 for g in (group.expressions if group is not None else [])]
        sets = [list(range(len(exprs)))] if group is not None else [[]]
        plain_global = group is None
    else:
        exprs, sets = sets_of
        plain_global = False
    group_sql = [e.sql(dialect="spark").lower() for e in exprs]
    names = {e.name.lower(): i for i, e in enumerate(exprs) if isinstance(e, exp.Column)}
    if len(names) != sum(isinstance(e, exp.Column) for e in exprs):
        names = {}  # two group columns of one name: match by qualified text only
    having = select.args.get("having")
    order = select.args.get("order")
    outer_parts: list[exp.Expr] = [*select.expressions]
    if having is not None:
        outer_parts.append(having.this)
    if order is not None:
        outer_parts.extend(order.expressions)

    aggs: dict[str, tuple[int, exp.Expr]] = {}
    used_groupings = False

    def replace(node: exp.Expr) -> exp.Expr:
        nonlocal used_groupings
        kind = _is_grouping(node)
        if kind is not None:
            used_groupings = True
            args = list(node.expressions) if isinstance(node, exp.Anonymous) else \
                [a for a in [node.this, *node.expressions] if a is not None]
            if kind == "grouping" and len(args) != 1:
                raise UnsupportedQuery(f"{node.sql(dialect='spark')}: grouping() takes one "
                                       "expression of GROUP BY")
            idx = [_group_index(a, group_sql, names) for a in args] if args else \
                list(range(len(exprs)))
            if any(i is None for i in idx):
                raise UnsupportedQuery(f"{node.sql(dialect='spark')}: its arguments must be "
                                       "expressions of GROUP BY")
            bits: exp.Expr = exp.Literal.number(0)
            for pos, i in enumerate(idx):
                assert i is not None
                term: exp.Expr = exp.column(f"__sf_r{i}")
                shift = len(idx) - 1 - pos
                if shift:
                    term = exp.Mul(this=term, expression=exp.Literal.number(2 ** shift))
                bits = term if pos == 0 else exp.Add(this=bits, expression=term)
            # Spark's types: grouping() is a TINYINT, grouping_id() a BIGINT
            return exp.cast(bits, "TINYINT" if kind == "grouping" else "BIGINT")
        if isinstance(node, exp.AggFunc) and not isinstance(node.parent, exp.Window):
            if node.find(exp.Window):
                raise UnsupportedQuery(f"a window function inside an aggregate: "
                                       f"{node.sql(dialect='spark')}")
            sql = node.sql(dialect="spark")
            if sql not in aggs:
                aggs[sql] = (len(aggs), node.copy())
            return exp.column(f"__sf_a{aggs[sql][0]}")
        if isinstance(node, exp.Subquery | exp.Select):
            return node
        i = _group_index(node, group_sql, names)
        if i is not None:
            return exp.column(f"__sf_g{i}")
        return node

    def rewrite(tree: exp.Expr) -> exp.Expr:
        return tree.copy().transform(replace)

    items = []
    for item in select.expressions:
        name = item.alias_or_name
        new = rewrite(item.unalias())
        items.append(exp.alias_(new, name, quoted=True) if name else new)
    new_having = rewrite(having.this) if having is not None else None
    new_order = [rewrite(o) for o in order.expressions] if order is not None else None
    for tree in [*items, *([new_having] if new_having is not None else []),
                 *(new_order or [])]:
        for col in tree.find_all(exp.Column):
            if not col.name.startswith("__sf_") and col.find_ancestor(
                    exp.Subquery, exp.Select) is None:
                if col.table or col.name.lower() not in {
                        i.alias_or_name.lower() for i in select.expressions}:
                    raise UnsupportedQuery(
                        f"column {col.sql(dialect='spark')} must be an expression of GROUP BY "
                        "or inside an aggregate")

    branches = []
    for s in sets:
        branch = exp.select(*[
            exp.alias_(exprs[i].copy() if i in s else exp.Null(), f"__sf_g{i}")
            for i in range(len(exprs))])
        branch.select(*[exp.alias_(agg.copy(), f"__sf_a{k}") for k, agg in aggs.values()],
                      copy=False)
        if used_groupings:
            branch.select(*[exp.alias_(exp.Literal.number(0 if i in s else 1), f"__sf_r{i}")
                            for i in range(len(exprs))], copy=False)
        if not branch.expressions:
            branch.select(exp.alias_(exp.Literal.number(1), "__sf_one"), copy=False)
        from_ = from_of(select)
        assert from_ is not None
        branch.set("from_" if "from_" in exp.Select.arg_types else "from", from_.copy())
        for arg in ("joins", "where", "laterals"):
            if select.args.get(arg):
                value = select.args[arg]
                branch.set(arg, [v.copy() for v in value] if isinstance(value, list)
                           else value.copy())
        if s:
            branch.set("group", exp.Group(expressions=[exprs[i].copy() for i in s]))
        elif not plain_global:
            branch.set("having", exp.Having(this=exp.GT(
                this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))))
        branches.append(branch)
    body: exp.Expr = branches[0]
    for b in branches[1:]:
        body = exp.union(body, b, distinct=False)
    source = exp.Subquery(this=body, alias=exp.TableAlias(
        this=exp.to_identifier("__sf_grouped")))
    # window functions of several PARTITION BYs: each but the last in a layer of its
    # own between the groups and the query (the groups' HAVING in the first)
    windows = [w for tree in [*items, *(new_order or [])] for w in tree.find_all(exp.Window)]
    specs: dict[str, list[exp.Window]] = {}
    for w in windows:
        spec = exp.Tuple(expressions=list(w.args.get("partition_by") or []))
        specs.setdefault(spec.sql(dialect="spark"), []).append(w)
    carried = [*(f"__sf_g{i}" for i in range(len(exprs))),
               *(f"__sf_a{k}" for k, _ in aggs.values()),
               *((f"__sf_r{i}" for i in range(len(exprs))) if used_groupings else ())]
    n = 0
    for depth, group_windows in enumerate(list(specs.values())[:-1]):
        layer = exp.select(*[exp.column(c) for c in carried]).from_(source)
        for w in group_windows:
            layer.select(exp.alias_(w.copy(), f"__sf_w{n}"), copy=False)
            w.replace(exp.column(f"__sf_w{n}"))
            carried.append(f"__sf_w{n}")
            n += 1
        if depth == 0 and new_having is not None:
            layer = layer.where(new_having)
            new_having = None
        source = exp.Subquery(this=layer, alias=exp.TableAlias(
            this=exp.to_identifier(f"__sf_layer{depth}")))
    outer = exp.select(*items).from_(source)
    if select.args.get("distinct"):
        outer.set("distinct", select.args["distinct"].copy())
    if new_having is not None:
        outer = outer.where(new_having)
    if new_order is not None:
        outer.set("order", exp.Order(expressions=new_order))
    for arg in ("limit", "offset"):
        if select.args.get(arg) is not None:
            outer.set(arg, select.args[arg].copy())
    return outer


def _group_index(node: exp.Expr, group_sql: list[str], names: dict[str, int]) -> int | None:
    while isinstance(node, exp.Paren):
        node = node.this
    sql = node.sql(dialect="spark").lower()
    if sql in group_sql:
        return group_sql.index(sql)
    if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
        return names.get(node.name.lower())
    return None
