"""``connector = 'delta_cdf'``: follow an external Delta table's change data feed.

Invariant: the offset is the last version of the external table the source
has consumed; the first batch is the table's snapshot at ``starting_version``
(every row an upsert), each later batch is the change feed of the versions
after the offset, up to the latest (at most ``max_versions_per_epoch``), so
after the batch that consumed version ``v`` the source table equals the
external table at ``v`` (restricted to the source table's columns; the
external table's key must be unique).

Within a batch, changes apply in version order, and within a version deletes
and update pre-images (deletes of their key) before inserts and update
post-images (upserts), so an update that moves a key deletes the old key.

Spark reads a change data feed only through the delta-spark connector, which
sparkfill does not depend on; the feed is read with delta-rs
(``DeltaTable.load_cdf``, the snapshot with its query engine) as a stream of
Arrow batches written to one Parquet file in the batch's scratch directory under
the warehouse (memory stays bounded by a batch), which Spark then reads
(``spark_files``: a local warehouse or an object store alike).

The external table is a local path or a URI (delta-rs opens either; a table on the
same kind of object store as the warehouse, e.g. ``{warehouse}/...``, with the
warehouse's storage options, any other with the environment's).
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from ..errors import SourceError
from ..storage.dml import IDX, KIND
from ..storage.object_files import filesystem_for
from ..storage.schema import arrow_type, spark_type
from ..storage.spark_files import read_parquet
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

__all__ = ["DeltaCdfConnector"]

#: order of change types within one version, and whether each deletes its key
_RANK = {"delete": 0, "update_preimage": 1, "insert": 2, "update_postimage": 3}


def _open(table: str, path: str, version: int | None = None,
          warehouse: Warehouse | None = None) -> DeltaTable:
    storage = storage_options_for(path, warehouse)
    try:
        return DeltaTable(path, version=version, storage_options=storage)
    except Exception as exc:  # noqa: BLE001 - delta-rs raises several types
        at = "" if version is None else f" at version {version}"
        raise SourceError(f"table {table!r}: cannot open the Delta table {path!r}{at}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
                          ) from exc


class DeltaCdfConnector(Connector):
    name: ClassVar[str] = "delta_cdf"
    options: ClassVar[tuple[str, ...]] = ("path", "starting_version", "max_versions_per_epoch")

    @classmethod
    def validate(cls, table: TableShape, options: dict[str, Any],
                 warehouse: Warehouse) -> dict[str, Any]:
        name = table.name
        check_known(name, cls.name, options, cls.options)
        raw_path = opt_str(name, options, "path", None)
        if not raw_path:
            raise SourceError(f"table {name!r}: connector 'delta_cdf' needs path = 'URI'")
        path = resolve_path(raw_path, warehouse, f"table {name!r}")
        dt = _open(name, path, warehouse=warehouse)
        config = dt.metadata().configuration
        if str(config.get("delta.enableChangeDataFeed", "false")).lower() != "true":
            raise SourceError(
                f"table {name!r}: the Delta table {path!r} has no change data feed; enable it "
                "with the table property delta.enableChangeDataFeed = true")
        fields = {f.name.lower() for f in pa.schema(dt.schema().to_arrow())}
        missing = [c.name for c in table.columns if c.name.lower() not in fields]
        if missing:
            raise SourceError(f"table {name!r}: the Delta table {path!r} has no column(s) "
                              f"{', '.join(missing)} (it has {', '.join(sorted(fields))})")
        latest = int(dt.version())
        start = opt_int(name, options, "starting_version", latest)
        assert start is not None
        if start > latest:
            raise SourceError(f"table {name!r}: starting_version {start} is after the latest "
                              f"version {latest} of {path!r}")
        return {"path": path, "starting_version": start,
                "max_versions_per_epoch": opt_int(name, options, "max_versions_per_epoch", None,
                                                  1)}

    def _target(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in self.table.columns]
                         + [pa.field(IDX, pa.int64()), pa.field(KIND, pa.string())])

    def _columns(self, batch: pa.RecordBatch, at: str) -> list[pa.Array]:
        names = {n.lower(): n for n in batch.schema.names}
        out = []
        for c in self.table.columns:
            try:
                out.append(pc.cast(batch.column(names[c.name.lower()]), arrow_type(c.type)))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SourceError(f"table {self.table.name!r}: column {c.name!r} of the Delta "
                                  f"table {self.opts['path']!r} ({at}) does not cast to "
                                  f"{c.type.upper()}: {exc}") from exc
        return out

    def _spark_schema(self) -> T.StructType:
        """``_target`` as Spark reads it back."""
        return T.StructType([T.StructField(c.name, spark_type(c.type), True)
                             for c in self.table.columns]
                            + [T.StructField(IDX, T.LongType(), True),
                               T.StructField(KIND, T.StringType(), True)])

    def _write(self, reader: Any, warehouse: Warehouse, uri: str, at: str, cdf: bool) -> int:
        """Stream ``reader``'s batches into the Parquet file ``uri`` (through the
        warehouse's filesystem); the rows written."""
        target = self._target()
        rows = 0
        fs, path = filesystem_for(uri, warehouse.storage_options)
        with pq.ParquetWriter(path, target, filesystem=fs) as writer:
            for batch in pa.RecordBatchReader.from_stream(reader):
                n = batch.num_rows
                if n == 0:
                    continue
                cols = self._columns(batch, at)
                if cdf:
                    change = batch.column(batch.schema.get_field_index("_change_type"))
                    change = pc.cast(change, pa.string())
                    version = pc.cast(batch.column(batch.schema.get_field_index(
                        "_commit_version")), pa.int64())
                    rank = pc.cast(pc.index_in(change, pa.array(list(_RANK))), pa.int64())
                    idx = pc.add(pc.multiply(version, 4), rank)
                    kind = pc.if_else(pc.less(rank, 2), "D", "U")
                else:
                    idx = pa.array(np.arange(rows, rows + n, dtype=np.int64))
                    kind = pa.repeat(pa.scalar("U", pa.string()), n)
                writer.write_batch(pa.record_batch([*cols, idx, kind], schema=target))
                rows += n
        return rows

    def _rows(self, warehouse: Warehouse, uri: str) -> DataFrame:
        return read_parquet(self.spark, warehouse, self._spark_schema(), [uri])

    def read(self, ctx: BatchContext) -> SourceBatch:
        path = self.opts["path"]
        name = self.table.name
        wh, scratch = ctx.scratch_space()
        out = f"{scratch.rstrip('/')}/cdf-{uuid.uuid4().hex[:8]}.parquet"
        wh.makedirs(scratch)
        if ctx.position is None:
            version = int(self.opts["starting_version"])
            dt = _open(name, path, version, ctx.warehouse)
            cols = ", ".join('"' + n.replace('"', '""') + '"'
                             for n in pa.schema(dt.schema().to_arrow()).names)
            try:
                reader = QueryBuilder().register("t", dt).execute(f"SELECT {cols} FROM t")
            except Exception as exc:  # noqa: BLE001
                raise SourceError(f"table {name!r}: cannot read {path!r} at version "
                                  f"{version}: {exc}") from exc
            self._write(reader, wh, out, f"version {version}", cdf=False)
            return SourceBatch(rows=self._rows(wh, out), position={"version": version})
        done = int(ctx.position["version"])
        latest = int(_open(name, path, warehouse=ctx.warehouse).version())
        limit = self.opts.get("max_versions_per_epoch")
        upto = min(latest, done + int(limit)) if limit else latest
        if upto <= done:
            return SourceBatch(rows=None, position=ctx.position)
        dt = _open(name, path, warehouse=ctx.warehouse)
        try:
            reader = dt.load_cdf(starting_version=done + 1, ending_version=upto)
            rows = self._write(reader, wh, out, f"versions {done + 1}..{upto}", cdf=True)
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"table {name!r}: cannot read the change data feed of {path!r}, "
                              f"versions {done + 1}..{upto}: {exc}") from exc
        return SourceBatch(rows=self._rows(wh, out) if rows else None,
                           position={"version": upto})

    @classmethod
    def describe(cls, position: Any) -> str:
        return "" if not position else f"version {position.get('version')}"
