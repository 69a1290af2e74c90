"""Subqueries of WHERE, HAVING and the SELECT list compiled into joins
(decorrelation), so that every relation an MV reads is a join input its dataflow
maintains.

Invariant: each rewrite returns exactly the rows of the query it replaces over any
input, NULLs included (SQL's three-valued logic). A subquery of a form not listed
here stays as written, and the planner refuses it with ``UnsupportedQuery``.

``decorrelate`` rewrites one SELECT (the caller goes innermost first). A conjunct
of ``WHERE`` that is

- ``x IN (SELECT y ...)`` (uncorrelated) or ``EXISTS (SELECT ... WHERE i.a = o.b
  ...)`` (correlated by equalities) becomes an inner join with a derived table of
  the subquery's DISTINCT keys: a semi-join keeps a row once when a match exists,
  a join with a set of distinct keys does the same;
- ``NOT EXISTS (...)`` correlated by equalities becomes a LEFT JOIN with those keys
  keeping the rows without a match (an anti-join);
- ``x NOT IN (SELECT y ...)`` (uncorrelated) is that anti-join plus a one-row count
  of the subquery's rows and of its NULL ``y``: it holds when the subquery is
  empty, or when ``x`` is not NULL, matches no ``y`` and no ``y`` is NULL;
- ``x [NOT] IN (SELECT y ... WHERE i.a = o.b ...)`` correlated by equalities: ``IN``
  is ``EXISTS`` with ``y = x`` added to the correlation; ``NOT IN`` the same
  anti-join and counts, per correlated key (a LEFT JOIN of the counts grouped by the
  key: a key without rows is an empty subquery);
- ``[NOT] EXISTS`` correlated by equalities and by one comparison ``i.c <op> o.d``
  joins the per-key ``min(c)`` and ``max(c)``: some ``c <> d`` exists iff the min or
  the max differs from ``d``, some ``c < d`` iff ``min(c) < d``, and so on (NULL
  ``c`` never compares true, and min/max skip NULLs);
- ``EXISTS`` with no correlation joins a one-row count of the subquery.

A scalar subquery (a single aggregate without GROUP BY: always one row) anywhere in
``WHERE``, or in the SELECT list of a query that does not aggregate, becomes a
column of a joined derived table: uncorrelated, its one row joined on a constant;
correlated by equalities, the aggregate grouped by the correlated columns, joined
inner when it is compared in a conjunct and is NULL over no rows, else LEFT with
the aggregate's value over no rows for a group without rows (``count`` is 0).

A ``HAVING`` conjunct with a subquery: the grouped query becomes a derived table
of its outputs and of the conjunct's aggregates, and the conjunct a ``WHERE`` over
it (where the rules above apply).

The derived tables are named ``__sf_sq<n>`` (``__sf_grouped`` for HAVING) and
their columns ``__sf_k<i>`` (keys), ``__sf_v`` (a scalar), ``__sf_n``,
``__sf_nulls``, ``__sf_lo``, ``__sf_hi`` and ``__sf_one`` (the constant 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from .sql_tree import ColumnsOf, conjuncts, from_of, has_star, source_columns, sources_of

__all__ = ["decorrelate"]

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
#: a comparison read with its sides swapped
_FLIPPED: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.EQ: exp.EQ, exp.NEQ: exp.NEQ, exp.GT: exp.LT, exp.LT: exp.GT,
    exp.GTE: exp.LTE, exp.LTE: exp.GTE}
#: expressions that are NULL when an operand is NULL
_NULL_PROPAGATING = (exp.Paren, exp.Cast, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.SafeDivide,
                     exp.Neg, exp.Literal)


def decorrelate(select: exp.Select, columns_of: ColumnsOf | None) -> exp.Select:
    """``select`` with the subqueries above as joins: the same node changed in place,
    or a new SELECT that replaces it (HAVING)."""
    if columns_of is None or from_of(select) is None \
            or has_star(select) and not isinstance(select.parent, exp.Exists):
        return select  # (``*`` would list the joined columns too; EXISTS ignores it)
    select = _having_to_where(select)
    rewriter = _Rewriter(select, columns_of)
    where = select.args.get("where")
    kept: list[exp.Expr] = []
    for cond in conjuncts(where.this if where is not None else None):
        kept.extend(rewriter.conjunct(cond))
    kept = [rewriter.scalars(c, in_conjunct=True) for c in kept]
    if not _aggregates(select):
        select.set("expressions", [rewriter.scalars(e, in_conjunct=False)
                                   for e in select.expressions])
    if rewriter.joins:
        for join in rewriter.joins:
            select.append("joins", join)
        select.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    return select


# --- scopes -----------------------------------------------------------------------------


@dataclass
class _Scope:
    """A subquery's own relations: their aliases and column names (lower case)."""

    names: set[str] = field(default_factory=set)
    columns: set[str] = field(default_factory=set)

    def has(self, col: exp.Column) -> bool:
        return col.table.lower() in self.names if col.table else col.name.lower() in self.columns


def _scope(sub: exp.Select, columns_of: ColumnsOf) -> _Scope | None:
    """None when a relation of ``sub`` is neither a table nor a derived table with
    named columns, or ``sub`` still holds a subquery outside its derived tables."""
    sources = sources_of(sub)
    if not sources or any(_nested(n, sub) for n in sub.find_all(exp.Select)):
        return None
    scope = _Scope()
    for source in sources:
        if not (isinstance(source, exp.Table) and not isinstance(source.this, exp.Func)
                or isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select)
                and source.alias and not has_star(source.this)
                and all(e.alias_or_name for e in source.this.expressions)):
            return None
        scope.names.add(source.alias_or_name.lower())
        scope.columns |= {c.lower() for c in source_columns(source, columns_of)}
    return scope


def _nested(node: exp.Select, sub: exp.Select) -> bool:
    """Whether ``node`` is a subquery of ``sub`` (not ``sub``, not in a derived table
    of ``sub``)."""
    while node is not sub:
        parent = node.parent
        if isinstance(node, exp.Subquery) and isinstance(parent, exp.From | exp.Join) \
                and parent.parent is sub:
            return False
        if parent is None:
            return True
        node = parent  # type: ignore[assignment]
    return False


def _own_columns(sub: exp.Select) -> list[exp.Column]:
    """The columns ``sub`` itself reads (not those inside its derived tables)."""
    return [c for c in sub.find_all(exp.Column) if c.find_ancestor(exp.Select) is sub]


@dataclass
class _Correlation:
    """A subquery's WHERE split by what it reads."""

    local: list[exp.Expr]  # conjuncts over the subquery's own relations
    pairs: list[tuple[exp.Column, exp.Column]]  # (inner, outer) equalities
    compare: tuple[exp.Column, type[exp.Expr], exp.Column] | None  # inner <op> outer

    def where(self) -> exp.Where | None:
        """The subquery's own conditions, for a derived table of it."""
        return exp.Where(this=exp.and_(*[c.copy() for c in self.local])) if self.local else None

    def keys(self) -> list[exp.Expr]:
        """The inner columns of the equalities, as ``__sf_k<i>``."""
        return [exp.alias_(i.copy(), f"__sf_k{n}") for n, (i, _) in enumerate(self.pairs)]

    def group(self) -> exp.Group:
        return exp.Group(expressions=[i.copy() for i, _ in self.pairs])

    def matches(self, alias: str) -> list[exp.Expr]:
        """The outer columns equal to the keys of the derived table ``alias``."""
        return [exp.EQ(this=o.copy(), expression=exp.column(f"__sf_k{n}", table=alias))
                for n, (_, o) in enumerate(self.pairs)]


def _counts(value: exp.Expr) -> list[exp.Expr]:
    """A subquery's rows (``__sf_n``) and its NULL ``value``s (``__sf_nulls``): what
    ``NOT IN`` needs besides the anti-join."""
    return [exp.alias_(exp.Count(this=exp.Star()), "__sf_n"),
            exp.alias_(exp.CountIf(this=exp.Is(this=value, expression=exp.Null())),
                       "__sf_nulls")]


def _correlation(sub: exp.Select, scope: _Scope, allow_compare: bool) -> _Correlation | None:
    """None when a conjunct reads the outer query other than as ``inner = outer``
    (or one ``inner <op> outer`` when ``allow_compare``), or anything else than the
    WHERE reads it."""
    where = sub.args.get("where")
    if any(not scope.has(c) for c in _own_columns(sub)
           if where is None or c.find_ancestor(exp.Where) is not where):
        return None
    found = _Correlation([], [], None)
    for cond in conjuncts(where.this if where is not None else None):
        if all(scope.has(c) for c in cond.find_all(exp.Column)):
            found.local.append(cond)
            continue
        a, b = cond.args.get("this"), cond.args.get("expression")
        if not (isinstance(cond, _COMPARISONS) and isinstance(a, exp.Column)
                and isinstance(b, exp.Column) and scope.has(a) != scope.has(b)):
            return None
        op: type[exp.Expr] = type(cond)
        inner, outer = (a, b) if scope.has(a) else (b, a)
        if not scope.has(a):
            op = _FLIPPED[op]
        if op is exp.EQ:
            found.pairs.append((inner, outer))
        elif allow_compare and found.compare is None:
            found.compare = (inner, op, outer)
        else:
            return None
    return found


# --- the rewrites -------------------------------------------------------------------------


class _Rewriter:
    """The joins that replace one SELECT's subqueries, gathered as they are built."""

    def __init__(self, select: exp.Select, columns_of: ColumnsOf) -> None:
        self.columns_of = columns_of
        self.joins: list[exp.Join] = []
        self.sources = sources_of(select)
        taken = {s.alias_or_name.lower() for s in self.sources}
        self.next = 1 + sum(1 for t in taken if t.startswith("__sf_sq"))

    def _alias(self) -> str:
        alias = f"__sf_sq{self.next}"
        self.next += 1
        return alias

    def _join(self, derived: exp.Select, on: exp.Expr, alias: str, left: bool = False) -> None:
        self.joins.append(exp.Join(
            this=exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias))),
            on=on, side="LEFT" if left else None))

    def _one_row(self, derived: exp.Select, alias: str) -> None:
        """Join ``derived`` (a global aggregate: exactly one row) on a constant."""
        derived.select(exp.alias_(exp.Literal.number(1), "__sf_one"), copy=False)
        self._join(derived, exp.EQ(this=exp.Literal.number(1),
                                   expression=exp.column("__sf_one", table=alias)), alias)

    # conjuncts of WHERE: semi- and anti-joins

    def conjunct(self, cond: exp.Expr) -> list[exp.Expr]:
        """What stays of ``cond`` in WHERE once its subquery (if it is one of the
        forms above) is a join: ``[cond]`` when it is not."""
        negated = isinstance(cond, exp.Not)
        inner = cond.this if negated else cond
        if isinstance(inner, exp.Paren):
            inner = inner.unnest()
        if isinstance(inner, exp.In) and isinstance(inner.args.get("query"), exp.Subquery):
            out = self._in(inner, negated)
        elif isinstance(inner, exp.Exists) and isinstance(inner.this, exp.Select):
            out = self._exists(inner.this, negated)
        else:
            out = None
        return [cond] if out is None else out

    def _in(self, cond: exp.In, negated: bool) -> list[exp.Expr] | None:
        sub = cond.args["query"].this
        if not isinstance(sub, exp.Select) or len(sub.expressions) != 1 \
                or isinstance(sub.expressions[0], exp.Star) or sub.args.get("limit") \
                or not isinstance(cond.this, exp.Column):
            return None
        scope = _scope(sub, self.columns_of)
        if scope is None:
            return None
        if not all(scope.has(c) for c in _own_columns(sub)):
            return self._correlated_in(cond, sub, scope, negated)
        value = sub.expressions[0].unalias()
        group = sub.args.get("group")
        keyed = group is not None and len(group.expressions) == 1 \
            and value == group.expressions[0]
        if (group is not None or sub.args.get("having") or _aggregates(sub)) and not keyed:
            return None  # DISTINCT over an aggregate's output: not rewritten
        alias = self._alias()
        keys = sub.copy()
        keys.set("expressions", [exp.alias_(value.copy(), "__sf_k0")])
        keys.set("order", None)
        if not keyed:
            keys.set("distinct", exp.Distinct())
        matches = exp.EQ(this=cond.this.copy(), expression=exp.column("__sf_k0", table=alias))
        if not negated:
            self._join(keys, matches, alias)
            return []
        self._join(keys, matches, alias, left=True)
        counts = sub.copy()
        counts.set("distinct", None)
        counts.set("order", None)
        counts.set("expressions", _counts(value.copy()))
        if group is not None:  # count the groups' keys: one row per group
            counts = exp.select(*_counts(exp.column("__sf_k0"))).from_(exp.Subquery(
                this=keys.copy(), alias=exp.TableAlias(this=exp.to_identifier("__sf_keys"))))
        stats = self._alias()
        self._one_row(counts, stats)
        n, nulls = exp.column("__sf_n", table=stats), exp.column("__sf_nulls", table=stats)
        return [exp.Is(this=exp.column("__sf_k0", table=alias), expression=exp.Null()),
                exp.Paren(this=exp.or_(
                    exp.EQ(this=n, expression=exp.Literal.number(0)),
                    exp.and_(exp.Not(this=exp.Is(this=cond.this.copy(), expression=exp.Null())),
                             exp.EQ(this=nulls, expression=exp.Literal.number(0)))))]

    def _correlated_in(self, cond: exp.In, sub: exp.Select, scope: _Scope,
                       negated: bool) -> list[exp.Expr] | None:
        """``x IN (SELECT y FROM s WHERE <correlation>)``, ``y`` a column of ``s``: as a
        conjunct of WHERE (where FALSE and NULL both drop the row) it is ``EXISTS
        (SELECT * FROM s WHERE <correlation> AND y = x)``. ``NOT IN``: per correlated
        key, the rows of ``s`` counted (``__sf_n``, ``__sf_nulls`` of ``y``) and an
        anti-join on ``(key, y)``: it holds when the key has no rows, or when ``x`` is
        not NULL, no ``y`` of the key is NULL and none equals ``x``."""
        value, outer = sub.expressions[0].unalias(), cond.this
        if not isinstance(value, exp.Column) or not scope.has(value) \
                or sub.args.get("group") or sub.args.get("having") or _aggregates(sub):
            return None
        if not outer.table:  # qualified, as x moves into the subquery's scope
            owners = [s.alias_or_name for s in self.sources if outer.name.lower() in
                      {c.lower() for c in source_columns(s, self.columns_of)}]
            if len(owners) != 1:
                return None
            outer = exp.column(outer.name, table=owners[0])
        if outer.table.lower() in scope.names:
            return None
        corr = _correlation(sub, scope, allow_compare=False)
        if corr is None or not corr.pairs:
            return None
        if not negated:
            probe = sub.copy()
            probe.set("where", exp.Where(this=exp.and_(
                *[c.copy() for c in conjuncts(sub.args["where"].this)],
                exp.EQ(this=value.copy(), expression=outer.copy()))))
            return self._exists(probe, negated=False)
        counts, stats = sub.copy(), self._alias()
        counts.set("distinct", None)
        counts.set("order", None)
        counts.set("where", corr.where())
        counts.set("expressions", [*corr.keys(), *_counts(value.copy())])
        counts.set("group", corr.group())
        self._join(counts, exp.and_(*corr.matches(stats)), stats, left=True)
        matches, found = sub.copy(), self._alias()
        matches.set("order", None)
        matches.set("where", corr.where())
        matches.set("expressions", [*corr.keys(), exp.alias_(value.copy(), "__sf_v")])
        matches.set("distinct", exp.Distinct())
        self._join(matches, exp.and_(*corr.matches(found), exp.EQ(
            this=outer.copy(), expression=exp.column("__sf_v", table=found))), found, left=True)
        n, nulls = exp.column("__sf_n", table=stats), exp.column("__sf_nulls", table=stats)
        return [exp.Paren(this=exp.or_(
            exp.Is(this=n, expression=exp.Null()),
            exp.and_(exp.Not(this=exp.Is(this=outer.copy(), expression=exp.Null())),
                     exp.EQ(this=nulls, expression=exp.Literal.number(0)),
                     exp.Is(this=exp.column("__sf_k0", table=found), expression=exp.Null()))))]

    def _exists(self, sub: exp.Select, negated: bool) -> list[exp.Expr] | None:
        if sub.args.get("group") or sub.args.get("having") or sub.args.get("limit"):
            return None
        scope = _scope(sub, self.columns_of)
        corr = None if scope is None else _correlation(sub, scope, allow_compare=True)
        if corr is None:
            return None
        alias = self._alias()
        derived = sub.copy()
        derived.set("order", None)
        derived.set("distinct", None)
        derived.set("where", corr.where())
        keys = corr.keys()
        test: exp.Expr | None = None
        aggs: list[exp.Expr] = []
        if corr.compare is not None:
            col, op, outer = corr.compare
            lo, hi = exp.column("__sf_lo", table=alias), exp.column("__sf_hi", table=alias)
            aggs = [exp.alias_(exp.Min(this=col.copy()), "__sf_lo"),
                    exp.alias_(exp.Max(this=col.copy()), "__sf_hi")]
            if op is exp.NEQ:
                test = exp.or_(exp.NEQ(this=lo, expression=outer.copy()),
                               exp.NEQ(this=hi.copy(), expression=outer.copy()))
            else:
                bound = lo if op in (exp.LT, exp.LTE) else hi
                test = op(this=bound, expression=outer.copy())
            test = exp.func("coalesce", exp.Paren(this=test), exp.false())
        elif not corr.pairs:
            aggs = [exp.alias_(exp.Count(this=exp.Star()), "__sf_n")]
            test = exp.GT(this=exp.column("__sf_n", table=alias), expression=exp.Literal.number(0))
        derived.set("expressions", [*keys, *aggs])
        if not corr.pairs:
            self._one_row(derived, alias)
            assert test is not None
            return [exp.Not(this=test) if negated else test]
        if aggs:
            derived.set("group", corr.group())
        else:
            derived.set("distinct", exp.Distinct())
        self._join(derived, exp.and_(*corr.matches(alias)), alias, left=negated)
        if not negated:
            return [] if test is None else [test]
        if test is None:
            return [exp.Is(this=exp.column("__sf_k0", table=alias), expression=exp.Null())]
        return [exp.Not(this=test)]

    # scalar subqueries anywhere in an expression

    def scalars(self, node: exp.Expr, in_conjunct: bool) -> exp.Expr:
        """``node`` with each scalar subquery of a form above replaced by a column of
        a joined derived table (``in_conjunct``: ``node`` is a conjunct of WHERE)."""
        if isinstance(node, exp.Subquery):  # the whole conjunct
            return (self._scalar(node, None) if isinstance(node.this, exp.Select) else None
                    ) or node
        # not inside another subquery (nor an EXISTS left as written): its own scope
        found = [s for s in node.walk(prune=lambda n: isinstance(n, exp.Subquery | exp.Select))
                 if isinstance(s, exp.Subquery) and isinstance(s.this, exp.Select)
                 and not isinstance(s.parent, exp.In)]
        for sub in found:
            value = self._scalar(sub, node if in_conjunct else None)
            if value is not None:
                sub.replace(value)
        return node

    def _scalar(self, node: exp.Subquery, conjunct: exp.Expr | None) -> exp.Expr | None:
        sub = node.this
        if len(sub.expressions) != 1 or not _aggregates(sub) \
                or any(sub.args.get(a) for a in ("group", "having", "limit", "offset")):
            return None  # not one row by its shape
        scope = _scope(sub, self.columns_of)
        corr = None if scope is None else _correlation(sub, scope, allow_compare=False)
        if corr is None:
            return None
        alias = self._alias()
        projection = sub.expressions[0].unalias()
        derived = sub.copy()
        derived.set("order", None)
        derived.set("where", corr.where())
        value = exp.column("__sf_v", table=alias)
        derived.set("expressions", [*corr.keys(), exp.alias_(projection.copy(), "__sf_v")])
        if not corr.pairs:
            self._one_row(derived, alias)
            return value
        derived.set("group", corr.group())
        on = exp.and_(*corr.matches(alias))
        null_if_empty = _null_over_no_rows(projection)
        # compared in a conjunct, a NULL drops the row: a group without rows (NULL)
        # and no group at all (no row) are then the same
        inner = null_if_empty and conjunct is not None and _rejects_null(conjunct, node)
        self._join(derived, on, alias, left=not inner)
        if null_if_empty:
            return value
        return exp.Case(ifs=[exp.If(this=exp.Is(this=exp.column("__sf_k0", table=alias),
                                                expression=exp.Null()),
                                    true=_over_no_rows(projection))], default=value)


def _aggregates(select: exp.Select) -> bool:
    """Whether ``select``'s own SELECT list aggregates."""
    return any(a.find_ancestor(exp.Select) is select
               for e in select.expressions for a in e.find_all(exp.AggFunc))


def _over_no_rows(projection: exp.Expr) -> exp.Expr:
    """``projection`` evaluated over no rows: counts are 0, other aggregates NULL."""
    def empty(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Count | exp.CountIf):
            return exp.Literal.number(0)
        if isinstance(node, exp.AggFunc):
            return exp.Null()
        return node
    return projection.copy().transform(empty)


def _null_over_no_rows(projection: exp.Expr) -> bool:
    """Whether ``projection`` is NULL over no rows: aggregates other than counts,
    under operators that keep a NULL."""
    def null(node: exp.Expr) -> bool:
        if isinstance(node, exp.Count | exp.CountIf):
            return False
        if isinstance(node, exp.AggFunc):
            return True
        if isinstance(node, exp.Literal | exp.DataType):
            return False
        if not isinstance(node, _NULL_PROPAGATING):
            return False
        return any(null(child) for child in node.iter_expressions())
    return null(projection)


def _rejects_null(conjunct: exp.Expr, node: exp.Expr) -> bool:
    """Whether ``conjunct`` is a comparison that is NULL when ``node`` (inside it,
    under operators that keep a NULL) is NULL."""
    if not isinstance(conjunct, _COMPARISONS):
        return False
    parent = node.parent
    while parent is not None and parent is not conjunct:
        if not isinstance(parent, _NULL_PROPAGATING):
            return False
        parent = parent.parent
    return parent is conjunct


# --- HAVING -------------------------------------------------------------------------------


def _having_to_where(select: exp.Select) -> exp.Select:
    """``select`` with each HAVING conjunct holding a subquery moved to a WHERE over
    the grouped query as a derived table ``__sf_grouped``; unchanged when there is
    none (or the outputs are not all named, or ORDER BY reads more than outputs)."""
    having = select.args.get("having")
    if having is None:
        return select
    moved = [c for c in conjuncts(having.this) if c.find(exp.Select) is not None]
    if not moved:
        return select
    names = [e.alias_or_name for e in select.expressions]
    order = select.args.get("order")
    if not all(names) or len({n.lower() for n in names}) != len(names) or order is not None \
            and not all(isinstance(o.this, exp.Column) and not o.this.table
                        and o.this.name.lower() in {n.lower() for n in names}
                        for o in order.expressions):
        return select
    grouped = select.copy()
    for arg in ("order", "limit", "offset"):
        grouped.set(arg, None)
    rest = [c.copy() for c in conjuncts(having.this) if all(c is not m for m in moved)]
    grouped.set("having", exp.Having(this=exp.and_(*rest)) if rest else None)
    exposed: list[exp.Expr] = []
    conds = []
    for cond in moved:
        cond = cond.copy()
        # the aggregates and group columns it reads outside its subqueries
        reads = [n for n in cond.find_all(exp.AggFunc, exp.Column)
                 if n.find_ancestor(exp.Select, exp.AggFunc) is None]
        for node in reads:
            name = f"__sf_h{len(exposed)}"
            exposed.append(exp.alias_(node.copy(), name))
            node.replace(exp.column(name, table="__sf_grouped"))
        conds.append(cond)
    grouped.set("expressions", [*[e.copy() for e in select.expressions], *exposed])
    outer = exp.select(*[exp.alias_(exp.column(n, table="__sf_grouped", quoted=True), n,
                                    quoted=True) for n in names]).from_(
        exp.Subquery(this=grouped, alias=exp.TableAlias(this=exp.to_identifier("__sf_grouped"))))
    outer.set("where", exp.Where(this=exp.and_(*conds)))
    for arg in ("order", "limit", "offset"):
        if select.args.get(arg) is not None:
            outer.set(arg, select.args[arg].copy())
    return outer
