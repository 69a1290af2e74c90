"""VERIFY's comparison of an MV's rows with Spark's batch query of its SQL.

Invariant: ``differences(actual, expected, selection)`` is empty exactly when
``actual`` is a result the query may return. Without a selection the query has one
result: ``actual`` must equal ``expected`` as a multiset. A query that keeps rows
by their position in an order (``ORDER BY ... LIMIT n OFFSET m``; a filter on
``row_number()``) may return any of several results when rows tie in that order;
then ``expected`` holds every candidate row (the query without the selection) and,
for each tie group (the candidates of one partition with equal order values, at
positions ``lo..hi`` there), ``actual`` must hold exactly as many rows of the group
as the group has positions inside the selected range, each one of the group's
candidates (as a multiset), and, when the MV has the ``row_number()`` column, with
the positions of the range each once. A group wholly inside the range (rows whose
order values are strictly inside it) is so held exactly.

What breaks the rule is reported in the MV's columns and ``side``: "extra" for a
row of the MV that is no candidate and for the rows a group holds beyond its
count, "missing" for candidates of a group that holds too few (as many as it
lacks); a group with the right rows but wrong positions is reported as its
difference with the positions one batch run gives it.

A sampled comparison (``sampled_differences``) checks each row of either side
with the same probability: a row is in the sample when a seeded hash of its values
falls below the fraction, on both sides alike, so a row the MV holds wrongly is found
with probability ``p`` (a wrong value: its wrong and its right image, ``1-(1-p)^2``),
and ``k`` such rows with ``1-(1-p)^k`` at least.

All of it is DataFrame operations: nothing is collected to the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .sql.ties import RankedSelection

__all__ = ["RankedSelection", "differences", "sampled_differences"]

#: the sample's resolution: a row is sampled when its hash modulo this falls below
#: ``fraction * SAMPLE_BUCKETS``
SAMPLE_BUCKETS = 1_000_000


def differences(actual: DataFrame, expected: DataFrame,
                selection: RankedSelection | None = None) -> DataFrame:
    """The rows where ``actual`` is not a result the query may return: ``actual``'s
    columns and ``side`` ("missing"/"extra"). ``expected`` has ``actual``'s columns
    by position: the batch query's rows, or with ``selection`` every candidate row
    (the query without it). Empty when ``actual`` is such a result."""
    names = list(actual.columns)
    # internal names: nothing to quote, nothing to collide with the columns added here
    internal = [f"_sf_c{i}" for i in range(len(names))]
    mv = actual.toDF(*internal)
    candidates = expected.toDF(*internal)
    if selection is None:
        return _exact(mv, candidates).toDF(*names, "side")
    if not selection.order:
        raise ValueError("a ranked selection needs an order")
    if not selection.columns <= set(names) or len(set(names)) != len(names):
        raise ValueError(f"the selection's columns {sorted(selection.columns)} must be "
                         f"distinct columns of {names}")
    sel = selection.renamed(dict(zip(names, internal, strict=True)))
    part = list(sel.partition)
    key = list(dict.fromkeys([*part, *(c for c, _, _ in sel.order)]))
    if sel.position in key:
        raise ValueError("the position column cannot be a partition or order column")
    order = [_sorted(c, desc, nf) for c, desc, nf in sel.order]
    in_order = (Window.partitionBy(*part) if part else Window).orderBy(*order)

    # each tie group's positions lo..hi in its partition, and the part of them selected
    groups = candidates.groupBy(*key).agg(F.count(F.lit(1)).alias("_sf_n"))
    before = F.sum("_sf_n").over(in_order.rowsBetween(Window.unboundedPreceding, -1))
    lo = F.coalesce(before, F.lit(0)) + 1
    hi = lo + F.col("_sf_n") - 1
    groups = groups.select(
        *key, F.greatest(lo, F.lit(sel.first)).alias("_sf_start"),
        (hi if sel.last is None else F.least(hi, F.lit(sel.last))).alias("_sf_end"))

    need = F.greatest(F.col("_sf_end") - F.col("_sf_start") + 1, F.lit(0))
    groups = groups.select(*[F.col(k).alias(g) for k, g in zip(key, _names("g", key),
                                                                   strict=True)],
                           "_sf_start", "_sf_end", need.alias("_sf_need"))

    # the MV's rows matched with the candidates as multisets, the position aside: the
    # n-th copy of a row with the n-th copy of it among the candidates
    rest = [c for c in internal if c != sel.position]
    copies = Window.partitionBy(*rest).orderBy(
        F.col(sel.position) if sel.position is not None else F.lit(0))
    held = mv.withColumn("_sf_copy", F.row_number().over(copies))
    offered = candidates.withColumn("_sf_copy", F.row_number().over(copies))
    matched = [*rest, "_sf_copy"]

    def paired(rows: DataFrame, other: DataFrame, how: str) -> DataFrame:
        theirs = _names("m", matched)
        return rows.join(other.select(*matched).toDF(*theirs), _same(matched, theirs), how)

    foreign = paired(held, offered, "left_anti")  # no candidate: extra
    valid = paired(held, offered, "left_semi")
    unheld = paired(offered, held, "left_anti")

    # per group: how many rows it needs and how many of its candidates the MV holds
    counts = [F.count(F.lit(1)).alias("_sf_valid")]
    if sel.position is not None:
        counts += [F.count_distinct(sel.position).alias("_sf_distinct"),
                   F.min(sel.position).alias("_sf_min"), F.max(sel.position).alias("_sf_max")]
    kept = valid.groupBy(*[F.col(k).alias(h) for k, h in zip(key, _names("k", key),
                                                              strict=True)]).agg(*counts)
    stats = groups.join(kept, _same(_names("g", key), _names("k", key)), "left") \
        .withColumn("_sf_valid", F.coalesce(F.col("_sf_valid"), F.lit(0)))

    def in_groups(rows: DataFrame, where: Column) -> DataFrame:
        return rows.join(stats.where(where), _same(key, _names("g", key)), "inner")

    within = (Window.partitionBy(*key)
              .orderBy(F.col(sel.position) if sel.position is not None else F.lit(0)))
    nth = F.row_number().over(within).alias("_sf_nth")
    surplus = in_groups(valid, F.col("_sf_valid") > F.col("_sf_need")) \
        .select("*", nth).where(F.col("_sf_nth") > F.col("_sf_need"))
    short = F.col("_sf_need") - F.col("_sf_valid")
    shortage = in_groups(unheld, short > 0).select("*", nth).where(F.col("_sf_nth") <= short)
    missing = [shortage]
    extra = [foreign, surplus]
    if sel.position is not None:
        # the right rows with wrong numbers: the group against one batch run's choice
        numbered = (F.col("_sf_valid") == F.col("_sf_need")) & (F.col("_sf_need") > 0) & ~(
            F.col("_sf_distinct").eqNullSafe(F.col("_sf_need"))
            & F.col("_sf_min").eqNullSafe(F.col("_sf_start"))
            & F.col("_sf_max").eqNullSafe(F.col("_sf_end")))
        ranked = candidates.withColumn("_sf_pos", F.row_number().over(in_order))
        bounds = F.col("_sf_pos") >= sel.first
        if sel.last is not None:
            bounds = bounds & (F.col("_sf_pos") <= sel.last)
        kind = actual.schema[names[internal.index(sel.position)]].dataType
        chosen = ranked.where(bounds).withColumn(sel.position,
                                                 F.col("_sf_pos").cast(kind))
        chosen, renumbered = (in_groups(r, numbered).select(*internal)
                              for r in (chosen, valid))
        missing.append(chosen.exceptAll(renumbered))
        extra.append(renumbered.exceptAll(chosen))

    def side(frames: list[DataFrame], label: str) -> DataFrame:
        rows = reduce(DataFrame.unionByName, [f.select(*internal) for f in frames])
        return rows.withColumn("side", F.lit(label))

    return side(missing, "missing").unionByName(side(extra, "extra")).toDF(*names, "side")


def sampled_differences(actual: DataFrame, expected: DataFrame, fraction: float,
                        seed: int) -> DataFrame:
    """``differences(actual, expected)`` over the rows of both whose seeded hash
    falls in the sample (``fraction`` of all rows, the same rows on both sides:
    ``expected`` is compared in ``actual``'s types)."""
    names = list(actual.columns)
    internal = [f"_sf_c{i}" for i in range(len(names))]
    mv = actual.toDF(*internal)
    candidates = expected.toDF(*internal).select(
        *[F.col(c).cast(f.dataType).alias(c) for c, f in zip(internal, mv.schema.fields,
                                                             strict=True)])
    # a JSON image hashes any column type alike on both sides (a map has no hash)
    sampled = (f"pmod(xxhash64({int(seed)}, to_json(struct({', '.join(internal)}))), "
               f"{SAMPLE_BUCKETS}) < {max(1, round(fraction * SAMPLE_BUCKETS))}")
    return _exact(mv.where(sampled), candidates.where(sampled)).toDF(*names, "side")


def _exact(actual: DataFrame, expected: DataFrame) -> DataFrame:
    missing = expected.exceptAll(actual).withColumn("side", F.lit("missing"))
    extra = actual.exceptAll(expected).withColumn("side", F.lit("extra"))
    return missing.unionByName(extra)


def _sorted(column: str, desc: bool, nulls_first: bool) -> Column:
    c = F.col(column)
    if desc:
        return c.desc_nulls_first() if nulls_first else c.desc_nulls_last()
    return c.asc_nulls_first() if nulls_first else c.asc_nulls_last()


def _same(left: Sequence[str], right: Sequence[str]) -> Column:
    """Null-safe equality of the columns ``left`` with ``right``, pairwise (grouping
    treats NULLs as equal: so do tie groups)."""
    return reduce(lambda a, b: a & b, [F.col(x).eqNullSafe(F.col(y))
                                       for x, y in zip(left, right, strict=True)])


def _names(prefix: str, columns: Sequence[str]) -> list[str]:
    """Other names for ``columns``, to join on them without clashes."""
    return [f"_sf_{prefix}{i}" for i in range(len(columns))]
