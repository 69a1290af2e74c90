"""Changelogs: rows with ``_op`` in ``+``, ``-``, ``U-``, ``U+``.

Invariant: every changelog this module produces is consolidated — each key has
at most one net change (one ``+``, one ``-``, or one ``U-``/``U+`` pair whose
rows differ) — and is exactly the difference between the "before" and "after"
images it was built from.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .relation_store import BEFORE_OPS, LIVE_OPS
from .schema import OP, VNODE, vnode_expr

__all__ = ["consolidate", "before_images", "after_images", "touched_keys"]


def before_images(delta: DataFrame) -> DataFrame:
    """Rows as they were before the change (from ``-`` and ``U-``)."""
    return delta.where(F.col(OP).isin(*BEFORE_OPS)).drop(OP)


def after_images(delta: DataFrame) -> DataFrame:
    """Rows as they are after the change (from ``+`` and ``U+``)."""
    return delta.where(F.col(OP).isin(*LIVE_OPS)).drop(OP)


def touched_keys(delta: DataFrame, key: Sequence[str]) -> DataFrame:
    return delta.select(*key).distinct()


def consolidate(before: DataFrame, after: DataFrame, columns: Sequence[str],
                key: Sequence[str]) -> DataFrame:
    """The changelog that turns the ``before`` rows into the ``after`` rows.

    Both inputs hold at most one row per key (``columns`` include the key);
    the output has ``columns``, ``_vnode`` and ``_op``.
    """
    key = list(key)
    values = [c for c in columns]
    b = before.select(*key, F.struct(*[F.col(c) for c in values]).alias("_sf_b"))
    a = after.select(*key, F.struct(*[F.col(c) for c in values]).alias("_sf_a"))
    joined = b.join(a, key, "full_outer").where(~F.col("_sf_b").eqNullSafe(F.col("_sf_a")))

    def event(op: str, image: str) -> F.Column:
        return F.struct(F.lit(op).alias("op"), F.col(image).alias("row"))

    events = (
        F.when(F.col("_sf_b").isNull(), F.array(event("+", "_sf_a")))
        .when(F.col("_sf_a").isNull(), F.array(event("-", "_sf_b")))
        .otherwise(F.array(event("U-", "_sf_b"), event("U+", "_sf_a")))
    )
    out = joined.select(F.explode(events).alias("_sf_ev"))
    out = out.select(*[F.col(f"_sf_ev.row.{c}").alias(c) for c in values],
                     F.col("_sf_ev.op").alias(OP))
    return out.withColumn(VNODE, vnode_expr(key)).select(*values, VNODE, OP)
