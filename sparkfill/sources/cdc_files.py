"""``connector = 'cdc_files'``: Debezium change events in JSON files landing in a
directory.

Invariant: every file is consumed by exactly one batch (its name is recorded
with the batch's offset), files are consumed in arrival order (modification
time, then name), and every non-blank line of a consumed file becomes either
changes of the table or one row of the dead-letter table — never both, never
neither. Within a batch, changes apply in file order then line order (the last
change of a key wins).

A line is one Debezium envelope, bare (``{"op": ..., "before": ..., "after":
...}``) or wrapped (``{"payload": {...}}``, as the Kafka Connect JSON converter
writes it): ``c`` / ``r`` / ``u`` upsert the ``after`` image (a ``u`` whose
``before`` key differs also deletes that key), ``d`` deletes the ``before``
key. Image fields map onto the table's columns by name (case-insensitive);
fields the table lacks are ignored, columns the image lacks are NULL. A line
that is not a JSON object, has an unknown op, lacks its image or a key column,
or holds a value that does not cast to its column's type (or a NULL in a NOT
NULL column) goes to the dead-letter table with the reason.

The directory is a local (or mounted) folder or a folder of an object store
(``s3://``, ``gs://``, ``abfss://``, ..., opened with the warehouse's storage
options when it is on the same kind of store, else with the environment's). The
driver only lists it; the files are read by Spark's executors (Spark's own text
source for local files, pyarrow's filesystems for an object store). A relative
path is refused when the warehouse is not a local folder. On an object store a
file is visible once whole, so no rename is needed there.

Files whose name starts with ``.`` or ``_`` are ignored (write a file under such
a name and rename it when complete). Timestamps are ISO-8601 strings or epoch
milliseconds, dates ISO strings or days since 1970-01-01.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow.fs as pafs
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..dataflow.cached import persisted
from ..errors import SourceError, SparkfillError
from ..storage.dml import DELETE, IDX, KIND, UPSERT
from ..storage.schema import Column, spark_type
from ..storage.spark_files import read_texts
from ..storage.warehouse import Warehouse
from .base import (
    BatchContext,
    Connector,
    SourceBatch,
    TableShape,
    check_known,
    opt_int,
    opt_str,
    resolve_path,
    storage_options_for,
)

__all__ = ["CdcFilesConnector", "DEAD_LETTER_COLUMNS", "DEAD_LETTER_KEY", "landed_files"]

DEAD_LETTER_COLUMNS = (Column("file", "string", False), Column("line", "bigint", False),
                       Column("reason", "string"), Column("raw", "string"),
                       Column("epoch", "bigint"))
DEAD_LETTER_KEY = ("file", "line")
OPS = ("c", "r", "u", "d")

_IMAGE = T.MapType(T.StringType(), T.StringType())
_ENVELOPE = T.StructType([T.StructField("op", T.StringType()),
                          T.StructField("before", _IMAGE), T.StructField("after", _IMAGE)])
_RECORD = T.StructType([*_ENVELOPE.fields, T.StructField("payload", _ENVELOPE)])


def _folder(path: str, warehouse: Warehouse | None) -> Warehouse:
    """The directory as a location whose files the driver can list."""
    return Warehouse(path, storage_options_for(path, warehouse))


def landed_files(folder: Warehouse, consumed: frozenset[str] | set[str]) -> list[str]:
    """Names of the files in ``folder`` not consumed yet, in arrival order."""
    # an object store has no empty folders: a folder nothing landed in yet is no error
    selector = pafs.FileSelector(folder.fs_path(folder.uri), allow_not_found=not folder.is_local)
    try:
        infos = folder.fs.get_file_info(selector)
    except (OSError, ValueError) as exc:
        raise SourceError(f"cannot list cdc_files directory {folder.uri!r}: "
                          f"{' '.join(str(exc).split())}") from exc
    found = []
    for info in infos:
        name = info.base_name
        if name.startswith((".", "_")) or name in consumed or info.type != pafs.FileType.File:
            continue
        found.append((info.mtime_ns or 0, name))
    return [name for _, name in sorted(found)]


def _cast(value: SparkColumn, type_name: str) -> SparkColumn:
    """A JSON scalar (as text) cast to a column type; NULL when it does not cast."""
    t = type_name.lower()
    digits = value.rlike(r"^-?[0-9]+$")
    if t in ("timestamp", "timestamp_ntz"):
        return F.when(digits, F.timestamp_millis(value.try_cast("long"))).otherwise(
            value.try_cast(t)).cast(t)
    if t == "date":
        return F.when(digits, F.date_add(F.lit("1970-01-01").cast("date"),
                                         value.try_cast("int"))).otherwise(value.try_cast(t))
    if t == "string":
        return value
    return value.try_cast(spark_type(t))


class CdcFilesConnector(Connector):
    name: ClassVar[str] = "cdc_files"
    options: ClassVar[tuple[str, ...]] = ("path", "format", "max_files_per_epoch")
    has_dead_letters: ClassVar[bool] = True

    @classmethod
    def validate(cls, table: TableShape, options: dict[str, Any],
                 warehouse: Warehouse) -> dict[str, Any]:
        name = table.name
        check_known(name, cls.name, options, cls.options)
        raw_path = opt_str(name, options, "path", None)
        if not raw_path:
            raise SourceError(f"table {name!r}: connector 'cdc_files' needs path = 'DIR'")
        path = resolve_path(raw_path, warehouse, f"table {name!r}")
        try:
            folder = _folder(path, warehouse)
        except SparkfillError as exc:
            raise SourceError(f"table {name!r}: cdc_files path {path!r}: {exc}") from None
        if folder.is_local:
            if folder.fs.get_file_info(folder.uri).type != pafs.FileType.Directory:
                raise SourceError(f"table {name!r}: cdc_files path {path!r} is not a directory")
        else:
            # an object store has no empty folders: its bucket must be there and readable
            try:
                folder.check_reachable()
                landed_files(folder, frozenset())
            except SparkfillError as exc:
                raise SourceError(f"table {name!r}: cdc_files path {path!r}: {exc}") from None
            if folder.is_file(folder.uri):
                raise SourceError(f"table {name!r}: cdc_files path {path!r} is a file, "
                                  "not a folder")
        return {"path": folder.uri,
                "format": opt_str(name, options, "format", "debezium_json", ("debezium_json",)),
                "max_files_per_epoch": opt_int(name, options, "max_files_per_epoch", None, 1)}

    def _parsed(self, folder: Warehouse, files: list[str]) -> DataFrame:
        """One row per non-blank line: file, index, line, raw, and either the reason
        it is malformed or its op and images."""
        index = F.create_map(*[x for i, f in enumerate(files) for x in (F.lit(f), F.lit(i))])
        texts = read_texts(self.spark, folder, [folder.join(f) for f in files])
        lines = texts.select("file", F.posexplode(F.split("value", "\n"))
                             .alias("pos", "raw"))
        lines = lines.select("file", F.element_at(index, F.col("file")).cast("long")
                             .alias("fidx"), (F.col("pos") + 1).cast("long").alias("line"),
                             F.regexp_replace("raw", "\r$", "").alias("raw"))
        lines = lines.where(F.trim("raw") != "")
        rec = F.from_json("raw", _RECORD)
        is_object = F.from_json("raw", _IMAGE).isNotNull()

        def lower_keys(m: SparkColumn) -> SparkColumn:
            return F.transform_keys(m, lambda k, _: F.lower(k))
        env = F.when(rec["payload"].isNotNull(), rec["payload"]).otherwise(
            F.struct(rec["op"].alias("op"), rec["before"].alias("before"),
                     rec["after"].alias("after")))
        parsed = lines.select("*", is_object.alias("_ok"), env["op"].alias("op"),
                              lower_keys(env["before"]).alias("before"),
                              lower_keys(env["after"]).alias("after"))
        return parsed

    def _reason(self) -> SparkColumn:
        """Why a parsed line is malformed (NULL when it is not)."""
        op, before, after = F.col("op"), F.col("before"), F.col("after")
        upsert = op.isin("c", "r", "u")
        image = F.when(op == "d", before).otherwise(after)
        checks: list[tuple[SparkColumn, SparkColumn]] = [
            (~F.col("_ok"), F.lit("bad JSON: not a JSON object")),
            (op.isNull(), F.lit("missing op")),
            (~op.isin(*OPS), F.concat(F.lit("unknown op '"), op, F.lit("'"))),
            (upsert & after.isNull(), F.concat(F.lit("op '"), op, F.lit("' has no after image"))),
            ((op == "d") & before.isNull(), F.lit("op 'd' has no before image")),
        ]
        for k in self.table.key:
            checks.append((image[k.lower()].isNull(),
                           F.lit(f"key column {k!r} is missing or null")))
        for c in self.table.columns:
            v = image[c.name.lower()]
            in_image = upsert | F.lit(c.name in self.table.key)
            checks.append((in_image & v.isNotNull() & _cast(v, c.type).isNull(),
                           F.concat(F.lit(f"column {c.name!r}: value '"), v,
                                    F.lit(f"' is not a valid {c.type.upper()}"))))
            if not c.nullable:
                checks.append((upsert & v.isNull(), F.lit(f"NOT NULL column {c.name!r} is null")))
        for k in self.table.key:
            bv = before[k.lower()]
            checks.append(((op == "u") & bv.isNotNull() & _cast(bv, self._type(k)).isNull(),
                           F.concat(F.lit(f"before image: column {k!r}: value '"), bv,
                                    F.lit(f"' is not a valid {self._type(k).upper()}"))))
        return F.coalesce(*[F.when(cond, msg) for cond, msg in checks])

    def _type(self, column: str) -> str:
        return self.table.by_lower[column.lower()].type

    def _changes(self, good: DataFrame) -> DataFrame:
        """The changes of well-formed lines, in the staged shape."""
        cols = self.table.columns
        key = self.table.key
        order = F.col("fidx") * F.lit(2**33) + F.col("line") * 2

        def image_row(image: str, keys_only: bool) -> list[SparkColumn]:
            out = []
            for c in cols:
                if keys_only and c.name not in key:
                    out.append(F.lit(None).cast(spark_type(c.type)).alias(c.name))
                else:
                    out.append(_cast(F.col(image)[c.name.lower()], c.type)
                               .cast(spark_type(c.type)).alias(c.name))
            return out
        upserts = good.where(F.col("op").isin("c", "r", "u")).select(
            *image_row("after", False), (order + 1).alias(IDX), F.lit(UPSERT).alias(KIND))
        deletes = good.where(F.col("op") == "d").select(
            *image_row("before", True), (order + 1).alias(IDX), F.lit(DELETE).alias(KIND))
        moved = F.lit(False)
        for k in key:
            b = _cast(F.col("before")[k.lower()], self._type(k))
            a = _cast(F.col("after")[k.lower()], self._type(k))
            moved = moved | (b.isNotNull() & ~b.eqNullSafe(a))
        rekeyed = good.where((F.col("op") == "u") & moved).select(
            *image_row("before", True), order.alias(IDX), F.lit(DELETE).alias(KIND))
        return upserts.unionByName(deletes).unionByName(rekeyed)

    def read(self, ctx: BatchContext) -> SourceBatch:
        folder = _folder(self.opts["path"], ctx.warehouse)
        files = landed_files(folder, ctx.consumed)
        limit = self.opts.get("max_files_per_epoch")
        if limit:
            files = files[:int(limit)]
        if not files:
            return SourceBatch(rows=None, position=ctx.position)
        parsed = self._parsed(folder, files).withColumn("_sf_reason", self._reason())
        parsed = persisted(parsed)
        good = parsed.where(F.col("_sf_reason").isNull())
        bad = parsed.where(F.col("_sf_reason").isNotNull()).select(
            "file", "line", F.col("_sf_reason").alias("reason"), "raw",
            F.lit(ctx.epoch).cast("long").alias("epoch"))
        count = len(ctx.consumed) + len(files)
        return SourceBatch(rows=self._changes(good), position={"files": count},
                           dead_letters=bad, files=files, cached=[parsed])

    @classmethod
    def describe(cls, position: Any) -> str:
        return "" if not position else f"{position.get('files', 0)} files"
