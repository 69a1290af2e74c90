"""``connector = 'datagen'``: a deterministic generator of inserts, updates and
deletes.

Invariant: batch ``n`` of a datagen source is a pure function of
``(seed, n)`` and the options, computed by Spark from ``spark.range`` (no rows
pass through the driver), and every update and delete it emits hits a key that
is live before the batch:

- batch ``m`` inserts the keys ``(m-1)*I + j`` for ``j`` in ``[0, I)``;
- a bijection ``rank_m(j) = (a*j + c_m) mod I`` orders them; the keys ranked
  below ``D`` are *mortal*: rank ``r`` is deleted in batch ``m + 1 + r mod L``
  (``L``: ``key_lifetime``), so from batch ``L + 1`` on every batch deletes
  exactly ``D`` keys;
- updates rewrite keys ranked ``>= D`` (never deleted) of earlier batches.

Within a batch the inserted, updated and deleted keys are disjoint (two updates
may pick the same key; the later one wins). Non-key values are a hash of
``(seed, key, batch)``: an update writes new values. ``mode = 'nexmark'`` takes
its columns from ``nexmark.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..errors import InvalidOption
from ..storage.dml import DELETE, IDX, KIND, UPSERT
from ..storage.schema import spark_type
from ..storage.warehouse import Warehouse
from . import nexmark
from .base import (
    BatchContext,
    Connector,
    SourceBatch,
    TableShape,
    check_known,
    opt_float,
    opt_int,
    opt_str,
)

__all__ = ["DatagenConnector", "KeySchedule"]

ID = "_sf_id"
VERSION = "_sf_version"


def _h(seed: int, *parts: SparkColumn | int) -> SparkColumn:
    """A deterministic 64-bit hash of the seed and ``parts``."""
    cols = [p if isinstance(p, SparkColumn) else F.lit(p).cast("long") for p in parts]
    return F.xxhash64(F.lit(seed).cast("long"), *cols)


@dataclass(frozen=True)
class KeySchedule:
    """Which keys batch ``n`` inserts, updates and deletes (see the module's docstring)."""

    inserts: int
    updates: int
    deletes: int
    lifetime: int
    seed: int

    @staticmethod
    def of(rows: int, ratios: tuple[float, float, float], lifetime: int,
           seed: int) -> KeySchedule:
        total = sum(ratios)
        if rows == 0 or total == 0:
            return KeySchedule(0, 0, 0, lifetime, seed)
        inserts = round(rows * ratios[0] / total)
        deletes = round(rows * ratios[2] / total)
        updates = max(0, rows - inserts - deletes)
        return KeySchedule(inserts, updates, deletes, lifetime, seed)

    def check(self, table: str) -> None:
        if self.deletes > self.inserts or (self.updates and self.deletes >= self.inserts):
            raise InvalidOption(
                f"table {table!r}: datagen mix gives {self.inserts} inserts, {self.updates} "
                f"updates and {self.deletes} deletes per epoch; updates and deletes hit "
                "existing keys, so deletes must stay below inserts (insert_ratio > "
                "delete_ratio)")

    @property
    def _mult(self) -> tuple[int, int]:
        """``a`` coprime with ``I`` and its inverse modulo ``I``."""
        n = self.inserts
        if n <= 1:
            return 1, 0
        a = (self.seed * 2654435761 + 40503) % n or 1
        while math.gcd(a, n) != 1:
            a = a % (n - 1) + 1
        return a, pow(a, -1, n)

    def _rank_c(self, m: SparkColumn) -> SparkColumn:
        return F.pmod(_h(self.seed, m, 1), F.lit(self.inserts).cast("long"))

    def _key_of(self, m: SparkColumn, r: SparkColumn) -> SparkColumn:
        """The key of rank ``r`` in batch ``m``: ``(m-1)*I + rank_m^-1(r)``."""
        _, inv = self._mult
        n = F.lit(self.inserts).cast("long")
        j = F.pmod(F.lit(inv).cast("long") * F.pmod(r - self._rank_c(m), n), n)
        return (m - 1) * n + j

    def inserted(self, spark: Any, n: int) -> DataFrame:
        return spark.range(self.inserts).select(
            (F.lit((n - 1) * self.inserts).cast("long") + F.col("id")).alias(ID),
            F.col("id").alias(IDX))

    def updated(self, spark: Any, n: int) -> DataFrame:
        if n < 2 or not self.updates or self.inserts <= self.deletes:
            return spark.range(0).select(F.col("id").alias(ID), F.col("id").alias(IDX))
        u = F.col("id")
        m = F.lit(1).cast("long") + F.pmod(_h(self.seed, n, u, 2), F.lit(n - 1).cast("long"))
        r = F.lit(self.deletes).cast("long") + F.pmod(
            _h(self.seed, n, u, 3), F.lit(self.inserts - self.deletes).cast("long"))
        return spark.range(self.updates).select(
            self._key_of(m, r).alias(ID), (F.lit(self.inserts).cast("long") + u).alias(IDX))

    def deleted(self, spark: Any, n: int) -> DataFrame:
        r = F.col("id")
        m = F.lit(n - 1).cast("long") - F.pmod(r, F.lit(self.lifetime).cast("long"))
        return (spark.range(self.deletes).where(m >= 1)
                .select(self._key_of(m, r).alias(ID),
                        (F.lit(self.inserts + self.updates).cast("long") + r).alias(IDX)))

    def live_after(self, n: int) -> int:
        """Keys live after batch ``n``."""
        dead = 0
        for m in range(1, n + 1):
            # mortal ranks r < D of batch m die in m + 1 + r % L <= n
            span = n - m  # r % L <= n - m - 1
            if span <= 0:
                continue
            full, rest = divmod(self.deletes, self.lifetime)
            dead += sum(full + (1 if k < rest else 0) for k in range(min(span, self.lifetime)))
        return n * self.inserts - dead


def _value(type_name: str, h: SparkColumn, value_range: int) -> SparkColumn:
    """A value of a column type from a hash."""
    t = type_name.lower()
    rng = F.lit(value_range).cast("long")
    if t in ("bigint", "int", "smallint", "tinyint"):
        return F.pmod(h, rng).cast(t)
    if t in ("double", "float"):
        return (F.pmod(h, rng * 100) / F.lit(100.0)).cast(t)
    if t.startswith("decimal"):
        p, s = (int(x) for x in t[len("decimal("):-1].split(","))
        top = min(value_range, 10 ** min(p - s, 17))
        return (F.pmod(h, F.lit(top * 10 ** min(s, 2)).cast("long"))
                / F.lit(10 ** min(s, 2))).cast(t)
    if t == "boolean":
        return F.pmod(h, F.lit(2)) == 1
    if t == "date":
        return F.date_add(F.lit("2024-01-01").cast("date"), F.pmod(h, rng).cast("int"))
    if t in ("timestamp", "timestamp_ntz"):
        return F.timestamp_seconds(F.lit(1_704_067_200) + F.pmod(h, rng * 60)).cast(t)
    return F.concat(F.lit("v"), F.pmod(h, rng).cast("string"))


class DatagenConnector(Connector):
    name: ClassVar[str] = "datagen"
    options: ClassVar[tuple[str, ...]] = (
        "rows_per_epoch", "seed", "insert_ratio", "update_ratio", "delete_ratio",
        "key_lifetime", "value_range", "mode", "nexmark_stream")

    @classmethod
    def validate(cls, table: TableShape, options: dict[str, Any],
                 warehouse: Warehouse) -> dict[str, Any]:
        name = table.name
        check_known(name, cls.name, options, cls.options)
        mode = opt_str(name, options, "mode", "default", ("default", "nexmark"))
        rows = opt_int(name, options, "rows_per_epoch", 1000)
        out: dict[str, Any] = {
            "rows_per_epoch": rows,
            "seed": opt_int(name, options, "seed", 0, minimum=-(2**62)),
            "insert_ratio": opt_float(name, options, "insert_ratio", 1.0),
            "update_ratio": opt_float(name, options, "update_ratio", 0.0),
            "delete_ratio": opt_float(name, options, "delete_ratio", 0.0),
            "key_lifetime": opt_int(name, options, "key_lifetime", 5, minimum=1),
            "value_range": opt_int(name, options, "value_range", 1000, minimum=1),
            "mode": mode,
        }
        if len(table.key) != 1:
            raise InvalidOption(f"table {name!r}: datagen needs a one-column primary key, "
                                f"got ({', '.join(table.key)})")
        key_col = table.by_lower[table.key[0].lower()]
        if key_col.type not in ("bigint", "int", "string"):
            raise InvalidOption(f"table {name!r}: datagen key column {key_col.name!r} must be "
                                f"BIGINT, INT or STRING, got {key_col.type.upper()}")
        if mode == "nexmark":
            stream = opt_str(name, options, "nexmark_stream", None, tuple(nexmark.STREAMS))
            if stream is None:
                raise InvalidOption(f"table {name!r}: mode = 'nexmark' needs nexmark_stream = "
                                    f"{' | '.join(map(repr, nexmark.STREAMS))}")
            nexmark.check_columns(name, stream, table.columns, table.key)
            out["nexmark_stream"] = stream
        elif "nexmark_stream" in options:
            raise InvalidOption(f"table {name!r}: nexmark_stream needs mode = 'nexmark'")
        cls._schedule(out).check(name)
        return out

    @staticmethod
    def _schedule(opts: dict[str, Any]) -> KeySchedule:
        rows = int(opts["rows_per_epoch"])
        if opts["mode"] == "nexmark":
            rows = nexmark.stream_rows(opts["nexmark_stream"], rows)
        return KeySchedule.of(rows, (opts["insert_ratio"], opts["update_ratio"],
                                     opts["delete_ratio"]),
                              int(opts["key_lifetime"]), int(opts["seed"]))

    @property
    def schedule(self) -> KeySchedule:
        return self._schedule(self.opts)

    def _columns(self, ids: DataFrame, n: int) -> DataFrame:
        """Rows for the keys in ``ids`` as written by batch ``n``."""
        seed = int(self.opts["seed"])
        key = self.table.key[0]
        key_type = self.table.by_lower[key.lower()].type
        id_col = F.col(ID)
        if self.opts["mode"] == "nexmark":
            values = nexmark.columns(self.opts["nexmark_stream"], id_col, n, seed,
                                     int(self.opts["rows_per_epoch"]))
        else:
            values = {}
        out = []
        for i, c in enumerate(self.table.columns):
            if c.name == key:
                expr = (F.concat(F.lit("k"), id_col.cast("string")) if key_type == "string"
                        else id_col + F.lit(nexmark.ID_BASE.get(
                            self.opts.get("nexmark_stream") or "", 0)))
            elif c.name.lower() in values:
                expr = values[c.name.lower()]
            else:
                expr = _value(c.type, _h(seed, id_col, n, 1000 + i),
                              int(self.opts["value_range"]))
            out.append(expr.cast(spark_type(c.type)).alias(c.name))
        return ids.select(*out, F.col(IDX), F.lit(UPSERT).alias(KIND))

    def _key_only(self, ids: DataFrame) -> DataFrame:
        key = self.table.key[0]
        key_type = self.table.by_lower[key.lower()].type
        id_col = F.col(ID)
        out = []
        for c in self.table.columns:
            if c.name == key:
                expr = (F.concat(F.lit("k"), id_col.cast("string")) if key_type == "string"
                        else id_col + F.lit(nexmark.ID_BASE.get(
                            self.opts.get("nexmark_stream") or "", 0)))
            else:
                expr = F.lit(None)
            out.append(expr.cast(spark_type(c.type)).alias(c.name))
        return ids.select(*out, F.col(IDX), F.lit(DELETE).alias(KIND))

    def read(self, ctx: BatchContext) -> SourceBatch:
        n = ctx.batch
        sched = self.schedule
        rows = self._columns(sched.inserted(self.spark, n), n).unionByName(
            self._columns(sched.updated(self.spark, n), n)).unionByName(
            self._key_only(sched.deleted(self.spark, n)))
        return SourceBatch(rows=rows, position={"batch": n})

    @classmethod
    def describe(cls, position: Any) -> str:
        return "" if not position else f"batch {position.get('batch', 0)}"
