"""Changelogs: rows with ``_op`` in ``+``, ``-``, ``U-``, ``U+``.

Invariant: every changelog this module produces is consolidated — each key has
at most one net change (one ``+``, one ``-``, or one ``U-``/``U+`` pair whose
rows differ) — and is exactly the difference between the "before" and "after"
images it was built from.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ..storage.relation_store import IS_BEFORE, IS_LIVE
from ..storage.schema import EPOCH, OP, VNODE, names_sql, quoted, vnode_sql
from .statement import sql_over

__all__ = ["consolidate", "changelog_of_pairs", "image", "BEFORE", "AFTER",
           "after_images", "net_changelog", "netted_sql", "touched_keys", "span_change",
           "union_all", "image_sql", "changelog_sql"]


def union_all(parts: Sequence[DataFrame]) -> DataFrame:
    """The rows of every part (by column name); ``parts`` is not empty."""
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def after_images(delta: DataFrame) -> DataFrame:
    """Rows as they are after the change (from ``+`` and ``U+``)."""
    return delta.where(IS_LIVE).drop(OP)


def touched_keys(delta: DataFrame, key: Sequence[str]) -> DataFrame:
    return delta.selectExpr(*names_sql(key)).distinct()


def consolidate(before: DataFrame | None, after: DataFrame, columns: Sequence[str],
                key: Sequence[str], dist_key: Sequence[str] | None = None,
                fresh: DataFrame | None = None) -> DataFrame:
    """The changelog that turns the ``before`` rows into the ``after`` rows.

    Both inputs hold at most one row per key (``columns`` include the key);
    the output has ``columns``, ``_vnode`` (the hash of ``dist_key``, a part of
    the key; the whole key by default) and ``_op``. ``before`` None: no rows (a
    first fill), so every ``after`` row is a ``+`` and no exchange pairs images.
    ``fresh``: more rows of ``after``'s columns whose keys neither input holds: each a
    ``+``, never paired (``Change.fresh``).
    """
    key = list(key)

    def inserted(rows: DataFrame) -> DataFrame:
        return rows.selectExpr(*[quoted(c) for c in columns],
                               f"{vnode_sql([quoted(k) for k in dist_key or key])} AS {VNODE}",
                               f"'+' AS {OP}")
    if before is None:
        return inserted(after if fresh is None else after.unionByName(fresh))
    if fresh is not None:
        return consolidate(before, after, columns, key, dist_key).unionByName(inserted(fresh))
    keys = ", ".join(quoted(k) for k in key)
    # the images of a key paired by a window over the key, not a full outer join:
    # one exchange (none over one partition) instead of one per side, and the
    # pairs keep their input's partitioning (a full outer join's is unknown, so
    # the group or join after it would shuffle again); one statement, analysed once
    img = image_sql(columns)
    none = f"IF(FALSE, {img}, NULL)"  # NULL of the image's type
    by_key = f"OVER (PARTITION BY {keys})"
    images = (f"SELECT {keys}, {img} AS {BEFORE}, {none} AS {AFTER} FROM {{_sf_before}} "
              f"UNION ALL SELECT {keys}, {none} AS {BEFORE}, {img} AS {AFTER} FROM {{_sf_after}}")
    windowed = (f"SELECT {keys}, {BEFORE}, first({BEFORE}, TRUE) {by_key} AS _sf_pb, "
                f"first({AFTER}, TRUE) {by_key} AS _sf_pa FROM ({images}) AS _sf_images")
    pairs = (f"SELECT {keys}, _sf_pb AS {BEFORE}, _sf_pa AS {AFTER} FROM ({windowed}) "
             f"AS _sf_windowed WHERE {BEFORE} IS NOT NULL OR _sf_pb IS NULL")
    return sql_over(changelog_sql(pairs, columns, dist_key or key),
                    {"_sf_before": before, "_sf_after": after})


def netted_sql(columns: Sequence[str], weight: str, source: str) -> str:
    """The signed rows of ``source`` (SQL: ``columns`` and their ``weight``) summed per
    distinct row, the rows whose weights cancel dropped, as a SQL statement."""
    cols = ", ".join(quoted(c) for c in columns)
    w = quoted(weight)
    return f"SELECT {cols}, sum({w}) AS {w} FROM {source} GROUP BY {cols} HAVING sum({w}) <> 0"


def net_changelog(signed: DataFrame, columns: Sequence[str], key: Sequence[str],
                  weight: str, dist_key: Sequence[str] | None = None,
                  spread: bool = True) -> DataFrame:
    """The changelog of signed rows (``columns`` and their ``weight`` column: +1
    arrives, -1 leaves), summed per distinct row, of a relation keyed by ``key``:
    what ``consolidate`` makes of the net's leaving and arriving rows, in one exchange
    — the rows go to their key's partition once, and are netted per row and paired
    per key there (a distinct row holds its key, so its partition holds the row's
    group too). Each key nets to at most one leaving and one arriving row.
    ``spread=False``: the rows are few, read as one partition, which satisfies both
    groupings: no exchange (a repartition by key would add one)."""
    keys = ", ".join(quoted(k) for k in key)
    img = image_sql(columns)
    w = quoted(weight)
    rows = (f"(SELECT * FROM {{_sf_signed}} DISTRIBUTE BY {keys}) AS _sf_spread" if spread
            else "{_sf_signed}")
    net = netted_sql(columns, weight, rows)
    pairs = (f"SELECT {keys}, first(IF({w} < 0, {img}, NULL), TRUE) AS {BEFORE}, "
             f"first(IF({w} > 0, {img}, NULL), TRUE) AS {AFTER} FROM ({net}) AS _sf_net "
             f"GROUP BY {keys}")
    return sql_over(changelog_sql(pairs, columns, dist_key or key), {"_sf_signed": signed})


#: the before- and after-image columns (structs of a row's columns, null when absent)
#: that ``changelog_of_pairs`` reads
BEFORE, AFTER = "_sf_b", "_sf_a"


def image(columns: Sequence[str]) -> F.Column:
    """A row's columns as one struct: a before- or after-image for ``changelog_of_pairs``."""
    return F.expr(image_sql(columns))


def image_sql(columns: Sequence[str]) -> str:
    """``image`` as SQL text."""
    return f"struct({', '.join(quoted(c) for c in columns)})"


def changelog_of_pairs(pairs: DataFrame, columns: Sequence[str],
                       dist_key: Sequence[str]) -> DataFrame:
    """The changelog of rows given as (before-image, after-image) pairs, at most one
    pair per key, either image null when the row is absent on that side: ``+`` for a
    new row, ``-`` for a gone one, ``U-``/``U+`` for a changed one, nothing for an
    unchanged one. Output: ``columns``, ``_vnode`` (the hash of ``dist_key``), ``_op``.
    Built as SQL text: a few driver calls, whatever the number of columns."""
    out = pairs.where(f"NOT ({BEFORE} <=> {AFTER})").selectExpr(
        f"explode({_events()}) AS _sf_ev")
    return out.selectExpr(*_event_columns(columns, dist_key))


def changelog_sql(pairs: str, columns: Sequence[str], dist_key: Sequence[str]) -> str:
    """``changelog_of_pairs`` as SQL text over the query ``pairs`` (SQL text)."""
    return (f"SELECT {', '.join(_event_columns(columns, dist_key))} FROM ("
            f"SELECT explode({_events()}) AS _sf_ev FROM ({pairs}) AS _sf_pairs "
            f"WHERE NOT ({BEFORE} <=> {AFTER})) AS _sf_events")


def _events() -> str:
    """A pair's changelog rows as an array of (op, row) structs."""
    def event(op: str, image: str) -> str:
        return f"named_struct('op', '{op}', 'row', {image})"

    return (f"CASE WHEN {BEFORE} IS NULL THEN array({event('+', AFTER)}) "
            f"WHEN {AFTER} IS NULL THEN array({event('-', BEFORE)}) "
            f"ELSE array({event('U-', BEFORE)}, {event('U+', AFTER)}) END")


def _event_columns(columns: Sequence[str], dist_key: Sequence[str]) -> list[str]:
    """The changelog's columns over ``_sf_ev`` (an event of ``_events``)."""
    row = {c: f"_sf_ev.row.{quoted(c)}" for c in columns}
    return [*[f"{row[c]} AS {quoted(c)}" for c in columns],
            f"{vnode_sql([row[k] for k in dist_key])} AS {VNODE}", f"_sf_ev.op AS {OP}"]


def span_change(log_rows: DataFrame, columns: Sequence[str],
                key: Sequence[str]) -> tuple[DataFrame, DataFrame]:
    """The net change of a span of epochs of a changelog (rows with ``_epoch``):
    per key, the row before the span (the before-image of its first change, when
    that is ``-`` or ``U-``) and the row after it (the after-image of its last
    change, when that is ``+`` or ``U+``)."""
    rank = F.when(F.col(OP) == "U-", F.lit(0)).otherwise(F.lit(1))
    first = Window.partitionBy(*key).orderBy(F.col(EPOCH).asc(), rank.asc())
    last = Window.partitionBy(*key).orderBy(F.col(EPOCH).desc(), rank.desc())
    ranked = (log_rows.withColumn("_sf_first", F.row_number().over(first))
              .withColumn("_sf_last", F.row_number().over(last)))
    before = ranked.where(f"_sf_first = 1 AND {IS_BEFORE}")
    after = ranked.where(f"_sf_last = 1 AND {IS_LIVE}")
    return before.selectExpr(*names_sql(columns)), after.selectExpr(*names_sql(columns))
