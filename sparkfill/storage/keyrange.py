"""Positions in a relation's key order ``(_vnode, pk...)`` and the range filters
built from them.

Invariant: ``le(pos)`` and ``gt(pos)`` partition every relation's rows exactly;
a position read back from JSON selects the same rows as the one written.
``Position(v, None)`` is the end of vnode ``v`` (every key of vnodes <= v).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F

from .schema import (
    VNODE,
    VNODE_COUNT,
    Column,
    comparable_key_expr,
    comparable_key_sql,
    decode_key_value,
    encode_key_value,
)

__all__ = [
    "Position", "END", "le", "gt", "between", "position_struct", "key_struct", "covered",
    "LAST_VNODE", "values_in", "values_in_sql", "sql_literal", "vnode_in", "vnode_in_sql",
]

LAST_VNODE = VNODE_COUNT - 1


@dataclass(frozen=True)
class Position:
    """An exclusive-upper-end-of-done position in ``(_vnode, pk...)`` order."""

    vnode: int
    key: tuple[Any, ...] | None  # None: the end of the vnode

    @property
    def is_end(self) -> bool:
        return self.vnode >= LAST_VNODE and self.key is None

    def to_json(self) -> dict[str, Any]:
        return {"vnode": self.vnode,
                "key": None if self.key is None else [encode_key_value(v) for v in self.key]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Position:
        key = d.get("key")
        return Position(int(d["vnode"]),
                        None if key is None else tuple(decode_key_value(v) for v in key))


END = Position(LAST_VNODE, None)


def _key_exprs(key_columns: Sequence[Column]) -> list[SparkColumn]:
    return [comparable_key_expr(c.name, c.type) for c in key_columns]


def position_struct(key_columns: Sequence[Column]) -> SparkColumn:
    """A struct ordered like the key order, for ``max`` over a chunk."""
    exprs = [F.col(VNODE).alias("v")] + [
        e.alias(f"k{i}") for i, e in enumerate(_key_exprs(key_columns))
    ]
    return F.struct(*exprs)


def key_struct(key_columns: Sequence[Column]) -> SparkColumn:
    """The key as a struct ordered like the key order (fields ``k0..kn``)."""
    return F.struct(*[e.cast(_comparable_type(c)).alias(f"k{i}")
                      for i, (e, c) in enumerate(zip(_key_exprs(key_columns), key_columns,
                                                     strict=True))])


def _comparable_type(c: Column) -> str:
    return "bigint" if c.type.startswith("timestamp") else c.type


def _key_literal(key: tuple[Any, ...], key_columns: Sequence[Column]) -> SparkColumn:
    return F.struct(*[F.lit(v).cast(_comparable_type(c)).alias(f"k{i}")
                      for i, (v, c) in enumerate(zip(key, key_columns, strict=True))])


def _covered_sql(done: Sequence[int], positions: dict[int, tuple[Any, ...]],
                 key_columns: Sequence[Column]) -> str | None:
    """``covered`` as one SQL expression (None: a key value has no literal form here).
    Built as text, it costs the driver one round trip to Spark, where the same
    expression built from Columns costs several per vnode in progress."""
    parts = [vnode_in_sql(done)] if done else []
    if positions:
        entries = []
        for v, key in sorted(positions.items()):
            literals = [sql_literal(x) for x in key]
            if any(lit is None for lit in literals):
                return None
            fields = ", ".join(f"'k{i}', CAST({lit} AS {_comparable_type(c)})"
                               for i, (lit, c) in enumerate(zip(literals, key_columns,
                                                                strict=True)))
            entries.append(f"{int(v)}, named_struct({fields})")
        row = ", ".join(f"'k{i}', CAST({comparable_key_sql(c.name, c.type)} AS "
                        f"{_comparable_type(c)})"
                        for i, c in enumerate(key_columns))
        parts.append(f"({vnode_in_sql(sorted(positions))} AND named_struct({row}) <= "
                     f"element_at(map({', '.join(entries)}), {VNODE}))")
    return " OR ".join(f"({p})" for p in parts) if parts else "FALSE"


def covered(done: Sequence[int], positions: dict[int, tuple[Any, ...]],
            key_columns: Sequence[Column]) -> SparkColumn:
    """Rows whose vnode is in ``done``, or at or below their vnode's position."""
    text = _covered_sql(done, positions, key_columns)
    if text is not None:
        return F.expr(text)
    cond: SparkColumn = vnode_in(done) if done else F.lit(False)
    if positions:
        bounds = F.create_map(*[x for v, key in sorted(positions.items())
                                for x in (F.lit(v), _key_literal(key, key_columns))])
        below = key_struct(key_columns) <= F.element_at(bounds, F.col(VNODE))
        cond = cond | (vnode_in(list(positions)) & below)
    return cond


def sql_literal(value: Any) -> str | None:
    """``value`` as a Spark SQL literal, for the types a key lookup filters by (None:
    another type). A string with a quote or a backslash is written as the UTF-8 of
    a binary literal, so it reads the same whatever the parser's escaping rules."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if "'" in value or "\\" in value:
            return f"CAST(X'{value.encode('utf-8').hex()}' AS STRING)"
        return f"'{value}'"
    return None


def values_in_sql(column: str, values: Sequence[Any]) -> str | None:
    """``column IN (values...)`` as SQL text, the values as literals (None: a value
    has no literal form here, or there are none: filter another way)."""
    literals = [sql_literal(v) for v in values]
    if not literals or any(lit is None for lit in literals):
        return None
    return f"`{column}` IN ({', '.join(str(lit) for lit in literals)})"


def values_in(column: str, values: Sequence[Any]) -> SparkColumn | None:
    """``values_in_sql`` as a Column."""
    text = values_in_sql(column, values)
    return None if text is None else F.expr(text)


def vnode_in_sql(vnodes: Sequence[int]) -> str:
    return f"{VNODE} IN ({', '.join(str(int(v)) for v in vnodes)})"


def vnode_in(vnodes: Sequence[int]) -> SparkColumn:
    """``_vnode IN (...)`` as one SQL expression (not one driver round trip per value)."""
    return F.expr(vnode_in_sql(vnodes))


def le(pos: Position | None, key_columns: Sequence[Column]) -> SparkColumn:
    """Rows at or below ``pos`` in key order (nothing when ``pos`` is None)."""
    if pos is None:
        return F.lit(False)
    if pos.key is None:
        return F.col(VNODE) <= F.lit(pos.vnode)
    exprs = _key_exprs(key_columns)
    # lexicographic (k1, ..., kn) <= (p1, ..., pn), built from the last column outwards
    cond: SparkColumn = exprs[-1] <= F.lit(pos.key[-1])
    for e, p in zip(reversed(exprs[:-1]), reversed(pos.key[:-1]), strict=True):
        cond = (e < F.lit(p)) | ((e == F.lit(p)) & cond)
    return (F.col(VNODE) < F.lit(pos.vnode)) | ((F.col(VNODE) == F.lit(pos.vnode)) & cond)


def gt(pos: Position | None, key_columns: Sequence[Column]) -> SparkColumn:
    """Rows strictly above ``pos`` (everything when ``pos`` is None)."""
    if pos is None:
        return F.lit(True)
    return ~le(pos, key_columns)


def between(lo: Position | None, hi: Position | None, key_columns: Sequence[Column]) -> SparkColumn:
    """Rows in ``(lo, hi]``."""
    return gt(lo, key_columns) & le(hi, key_columns)
