"""Partition keys of the stateful operators: a group's or a window partition's
values as JSON, and the keys an epoch's state-table Δs touched.

Invariant: values Spark puts in one group have one JSON (-0.0 and 0.0 are one
group: their JSON agrees too), so the JSON is a partition's identity both in the
MV's key and in the first key column of its state table (which distributes the
state by partition). The touched keys of Δs are exactly the distinct values of
that column in them: on the driver when each write observed them, else a frame.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..storage.catalog import Relation
from ..storage.relation_store import Appended, DataFile, RelationStore
from ..storage.schema import quoted, vnode_expr
from .change import Deferred, StateDelta, Unkept
from .changelog import union_all

__all__ = ["normalized_sql", "normalized", "json_key_sql", "group_json_sql",
           "touched_partitions", "keyed_unkept", "read_touched", "SCAN_ROWS"]

#: a relation of at most this many rows is read whole where a lookup by the keys of
#: a state table's Δ would need that Δ written first (its keys observed by a Spark
#: job of its own): on this scale the read costs less than the job
SCAN_ROWS = 100_000


def normalized_sql(name: str, types: dict[str, str]) -> str:
    """A group column as Spark groups it: -0.0 is 0.0 (SQL text)."""
    col = quoted(name)
    if types.get(name) in ("double", "float"):
        return f"CASE WHEN {col} = 0 THEN CAST(0.0 AS {types[name]}) ELSE {col} END"
    return col


def normalized(name: str, types: dict[str, str]) -> SparkColumn:
    return F.expr(normalized_sql(name, types))


def json_key_sql(exprs: Sequence[str]) -> str:
    """Values (SQL texts) as one JSON key ``{"k0": ..., "k1": ...}``, as SQL text."""
    if not exprs:
        return "'{}'"
    fields = ", ".join(f"'k{i}', {e}" for i, e in enumerate(exprs))
    return f"to_json(named_struct({fields}))"


def group_json_sql(group: Sequence[str], types: dict[str, str]) -> str:
    """A group's values as JSON: the aggregate MV's key and its state's partition
    (-0.0 and 0.0 are one group: their JSON agrees too), as SQL text."""
    return json_key_sql([normalized_sql(g, types) for g in group])


def touched_partitions(written: Sequence[Appended | Unkept], column: str,
                       ) -> tuple[object, ...] | DataFrame:
    """The distinct ``column`` values of state-table Δs: on the driver when each
    write observed them (or the Δ's keys were collected), else a frame of them."""
    if all(w.keys is not None for w in written):
        return tuple(sorted({k for w in written for k in (w.keys or ())}, key=str))
    return union_all([w.delta.select(column) for w in written]).distinct()


def keyed_unkept(store: RelationStore, delta: DataFrame, column: str,
                 may_retract: bool) -> Unkept:
    """A small state-table Δ that is not appended, with the distinct values of its
    ``column`` and their vnodes on the driver (one Spark job), as an append would
    have observed them: a lookup by them stays keyed and pruned by vnode."""
    rows = delta.select(column, vnode_expr([column]).alias("v")).distinct().collect()
    store.spark_jobs += 1
    return Unkept(delta, may_retract, tuple(sorted({r[0] for r in rows}, key=str)),
                  tuple(sorted({int(r[1]) for r in rows})))


def read_touched(store: RelationStore, rel: Relation, epoch: int,
                 written: Sequence[StateDelta], column: str,
                 files: Sequence[DataFile] | None = None) -> DataFrame:
    """``rel``'s live rows at ``epoch`` of the partitions the state-table Δs
    ``written`` touched (the values of their ``column``, ``rel``'s first key): a
    keyed lookup, its files pruned to the Δs' vnodes. When a Δ is deferred its keys
    are not known, and the whole of ``rel`` (small: the operator chose so) is read;
    so is a small ``rel`` for a Δ not kept whose keys are not known. The caller's
    join with the Δ keeps the touched partitions. ``files``: ``rel``'s files at
    ``epoch``, when the caller resolved them."""
    unknown = [w for w in written if isinstance(w, Unkept) and w.keys is None]
    if any(isinstance(w, Deferred) for w in written) or (
            unknown and rel.row_count <= SCAN_ROWS):
        return store.snapshot(rel.stored, epoch, few=True, files=files)
    keyed = [w for w in written if isinstance(w, Appended | Unkept)]
    keys = touched_partitions(keyed, column)
    if isinstance(keys, DataFrame):
        keys = keys.select(F.col(column).alias(rel.key[0]))
    vnodes = None if any(w.vnodes is None for w in keyed) else sorted(
        {v for w in keyed for v in (w.vnodes or ())})
    return store.lookup(rel.stored, epoch, keys, vnodes=vnodes, files=files)
