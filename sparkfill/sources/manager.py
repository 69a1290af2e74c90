"""Staging each source's input for the next epoch, exactly once.

Invariant: a source's batch for epoch ``e`` is staged as DML batches (the
table's changes, and its malformed records for the dead-letter table) in the
same meta-store transaction that records ``e`` and advances the source's
offset (``MetaStore.stage_source``). ``stage(e)`` skips a source that has
already staged for ``e``, so a batch is staged once even when the process dies
between staging and running the epoch; the staged DML is then applied exactly
once by epoch ``e`` (the coordinator's plan pins it and recovery re-runs the
plan). A batch whose staging did not commit left only unregistered files,
which the DML stager removes on open, and its offset did not move, so it is
read again.

Every file the manager writes goes through the ``Warehouse`` (a local folder or an
object store): staged batches under ``staging/dml`` (written by Spark through
``spark_files``), a batch's scratch files under ``staging/sources`` (emptied on
open and after each batch).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..errors import InvalidOption, SourceError, SparkfillError, SqlError
from ..storage.catalog import Catalog, Relation
from ..storage.dml import IDX, KIND, SEQ, UPSERT
from ..storage.meta_store import MetaStore, SourceRow, StagedBatch
from ..storage.schema import Column, spark_type
from ..storage.spark_files import write_parquet
from ..storage.warehouse import Warehouse
from .base import BatchContext, Connector, SourceBatch, TableShape
from .cdc_files import DEAD_LETTER_COLUMNS, DEAD_LETTER_KEY, CdcFilesConnector
from .datagen import DatagenConnector
from .delta_cdf import DeltaCdfConnector

__all__ = ["SourceManager", "SourceDefinition", "CONNECTORS", "DEAD_LETTER_SUFFIX"]

CONNECTORS: dict[str, type[Connector]] = {
    c.name: c for c in (DatagenConnector, CdcFilesConnector, DeltaCdfConnector)}
DEAD_LETTER_SUFFIX = "__dead_letter"


@dataclass(frozen=True)
class SourceDefinition:
    """A validated ``CREATE TABLE ... WITH (connector = ...)``."""

    connector: str
    options: dict[str, Any]
    #: the dead-letter table to create with it: name, columns, key (or None)
    dead_letter: tuple[str, tuple[Column, ...], tuple[str, ...]] | None


class SourceManager:
    def __init__(self, spark: SparkSession, meta: MetaStore, warehouse: Warehouse) -> None:
        self.spark = spark
        self.meta = meta
        self.warehouse = warehouse
        #: URIs of the staged DML batches' directory and of the sources' scratch
        self.dir = warehouse.join("staging", "dml")
        self.scratch = warehouse.join("staging", "sources")
        warehouse.rmtree(self.scratch)

    # --- definitions ----------------------------------------------------------------------

    def define(self, name: str, columns: tuple[Column, ...], key: tuple[str, ...],
               options: dict[str, Any]) -> SourceDefinition:
        """Validate a source table's ``WITH (...)`` options (nothing is created)."""
        connector = options.get("connector")
        if connector is None:
            raise InvalidOption(f"table {name!r}: WITH (...) needs connector = "
                                f"{' | '.join(map(repr, CONNECTORS))}")
        cls = CONNECTORS.get(str(connector).lower())
        if cls is None:
            raise InvalidOption(f"table {name!r}: unknown connector {connector!r}; choose one "
                                f"of {', '.join(CONNECTORS)}")
        normalized = cls.validate(TableShape(name, columns, key), options, self.warehouse)
        dead = None
        if cls.has_dead_letters:
            dead = (f"{name}{DEAD_LETTER_SUFFIX}", DEAD_LETTER_COLUMNS, DEAD_LETTER_KEY)
        return SourceDefinition(cls.name, normalized, dead)

    def sources(self) -> list[SourceRow]:
        return self.meta.sources()

    def source_of(self, rel: Relation) -> SourceRow | None:
        return next((s for s in self.meta.sources() if s.rel_id == rel.id), None)

    def owner_of_dead_letters(self, rel: Relation) -> SourceRow | None:
        return next((s for s in self.meta.sources() if s.dead_letter_id == rel.id), None)

    def refuse_dml(self, rel: Relation, catalog: Catalog) -> None:
        """Raise when ``rel`` is fed by a source (its table or its dead letters)."""
        src = self.source_of(rel)
        if src is not None:
            raise SqlError(f"table {rel.name!r} is fed by its {src.connector} source; "
                           "INSERT, UPDATE and DELETE on it are refused (change its input, "
                           "or create a plain table)")
        owner = self.owner_of_dead_letters(rel)
        if owner is not None:
            raise SqlError(f"table {rel.name!r} is the dead-letter table of source "
                           f"{catalog.get_by_id(owner.rel_id).name!r}; only the source "
                           "writes it")

    # --- staging --------------------------------------------------------------------------

    def _write(self, df: DataFrame, columns: tuple[Column, ...], seq: int,
               proctime: str | None = None) -> tuple[str, int]:
        """Stage a batch; the processing-time column, which the connector does not
        produce, is staged NULL: the epoch applying the batch fills it."""
        path = f"{self.dir}/{seq:012d}-{uuid.uuid4().hex[:8]}-src"
        out = df.select(*[(F.lit(None) if c.name == proctime else F.col(c.name))
                          .cast(spark_type(c.type)).alias(c.name) for c in columns],
                        F.lit(seq).cast("long").alias(SEQ), F.col(IDX).cast("long").alias(IDX),
                        F.col(KIND).cast("string").alias(KIND))
        written = write_parquet(out, self.warehouse, path, [])
        return path, sum(f.rows for f in written)

    def stage(self, catalog: Catalog, epoch: int) -> None:
        """Stage every source's batch for ``epoch`` (skipping those already staged)."""
        for src in self.meta.sources():
            if src.epoch >= epoch:
                continue
            table = catalog.get_by_id(src.rel_id)
            self._stage_one(catalog, table, src, epoch)

    def _stage_one(self, catalog: Catalog, table: Relation, src: SourceRow, epoch: int) -> None:
        cls = CONNECTORS[src.connector]
        # the connector sees the columns it writes: not the processing time
        connector = cls(self.spark, TableShape(table.name, tuple(table.writable_columns),
                                               table.key), src.options)
        scratch = f"{self.scratch}/{table.id}-{uuid.uuid4().hex[:8]}"
        consumed = (frozenset(self.meta.source_files(src.rel_id)) if cls.has_dead_letters
                    else frozenset())
        written: list[str] = []
        batch: SourceBatch | None = None
        try:
            batch = connector.read(BatchContext(epoch, src.batch + 1, src.position, consumed,
                                                scratch, self.warehouse))
            staged: list[StagedBatch] = []
            seq = self.meta.next_dml_seq()
            rows = dead = 0
            if batch.rows is not None:
                path, rows = self._write(batch.rows, table.columns, seq, table.proctime)
                written.append(path)
                if rows:
                    staged.append(StagedBatch(seq, table.id, path, rows))
            if batch.dead_letters is not None and src.dead_letter_id is not None:
                dl = catalog.get_by_id(src.dead_letter_id)
                path, dead = self._write(
                    batch.dead_letters.withColumn(IDX, F.lit(0)).withColumn(KIND, F.lit(UPSERT)),
                    dl.columns, seq + 1)
                written.append(path)
                if dead:
                    staged.append(StagedBatch(seq + 1, dl.id, path, dead))
            self.meta.stage_source(
                replace(src, epoch=epoch, batch=src.batch + 1, position=batch.position,
                        rows=rows, dead_letters=dead), staged, batch.files)
            for path in written:
                if not any(b.path == path for b in staged):
                    self._remove(path)  # never raises: the batch is staged
        except BaseException as exc:
            for path in written:
                self._remove(path)
            if isinstance(exc, Exception) and not isinstance(exc, SparkfillError):
                raise SourceError(f"source table {table.name!r} ({src.connector}), epoch "
                                  f"{epoch}: {type(exc).__name__}: "
                                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                                  ) from exc
            raise
        finally:
            for df in batch.cached if batch is not None else []:
                df.unpersist()
            self._remove(scratch)

    def _remove(self, uri: str) -> None:
        """Remove a file or directory of this batch, on the way out of a failure or
        after staging: a failure to remove leaves an orphan the next open removes."""
        try:
            self.warehouse.rmtree(uri)
        except OSError:
            pass

    # --- reports --------------------------------------------------------------------------

    def report(self, catalog: Catalog, epoch: int) -> tuple[dict[str, int], dict[str, int]]:
        """Rows and dead letters each source staged for ``epoch``."""
        rows: dict[str, int] = {}
        dead: dict[str, int] = {}
        for src in self.meta.sources():
            if src.epoch != epoch:
                continue
            name = catalog.get_by_id(src.rel_id).name
            rows[name] = src.rows
            if src.dead_letter_id is not None:
                dead[name] = src.dead_letters
        return rows, dead

    @staticmethod
    def describe(src: SourceRow) -> str:
        """The source's offset in words."""
        return CONNECTORS[src.connector].describe(src.position)
