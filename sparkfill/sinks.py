"""Sinks: plain Delta tables kept equal to a materialized view (``CREATE SINK
name FROM mv WITH (connector = 'delta', path = '...')``).

Invariant: every commit of a sink's Delta table makes it hold exactly the MV's
visible rows at one committed epoch ``e`` and records ``e`` as the version of
the sink's Delta application transaction (``sparkfill-sink-<id>``) in the same
commit; a sync to ``e`` is skipped when the table already records ``e``, so an
epoch is written once whatever crashes, and a reader sees the MV as of some
committed epoch, never between two.

Layout: the table's files are split into ``buckets`` (default 16) by the MV's
vnode (``bucket = vnode * buckets / 256``). An epoch rewrites the buckets its
changes touched — the MV's snapshot restricted to those vnodes, read from its
relation store with file pruning — and removes their old files in the same
commit (copy-on-write by key, as Delta's MERGE does). When the MV's log since
the last sync is no longer there (compaction folded it into a base), the sync
rewrites every bucket. A sink on an MV that is still being created waits; its
first sync writes the whole snapshot. The files are plain Parquet with only the
MV's visible columns: any Delta reader, or Spark reading the files the log
lists, reads the MV.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from .errors import CatalogError, DependentObjects, InvalidOption, SinkError, UnknownRelation
from .sources.base import opt_int, resolve_path
from .sql.frontend import CreateSink, DropSink
from .storage.catalog import Catalog, Relation
from .storage.meta_store import MetaStore, SinkRow
from .storage.relation_store import RelationStore
from .storage.schema import VNODE, VNODE_COUNT, arrow_type
from .storage.warehouse import Warehouse

__all__ = ["SinkManager", "APP_PREFIX", "synced_epoch"]

APP_PREFIX = "sparkfill-sink-"


def synced_epoch(path: str, sink_id: int) -> int | None:
    """The epoch a sink's Delta table holds (its application transaction), if any."""
    try:
        version = DeltaTable(path).transaction_version(f"{APP_PREFIX}{sink_id}")
    except Exception:  # noqa: BLE001 - a missing table has synced nothing
        return None
    return None if version is None else int(version)
BUCKET = "sf_bucket"
DEFAULT_BUCKETS = 16
OPTIONS = ("connector", "path", "buckets", "vacuum_retention_hours")
_DIR = re.compile(r"^e(\d{10})-[0-9a-f]{8}$")
_BUCKET_OF = re.compile(rf"(?:^|/){BUCKET}=(\d+)/")
_BAD_NAME = re.compile(r"[ ,;{}()\n\t=]")


def _local(path: str) -> Path:
    return Path(path)


class SinkManager:
    def __init__(self, spark: SparkSession, meta: MetaStore, store: RelationStore,
                 warehouse: Warehouse) -> None:
        self.spark = spark
        self.meta = meta
        self.store = store
        assert warehouse.local_path is not None  # TODO: sinks beside an object store
        self.warehouse = warehouse.local_path

    # --- catalog --------------------------------------------------------------------------

    def find(self, name: str) -> SinkRow | None:
        return next((s for s in self.meta.sinks() if s.name.lower() == name.lower()), None)

    def sinks_of(self, rel: Relation) -> list[SinkRow]:
        return [s for s in self.meta.sinks() if s.rel_id == rel.id]

    def refuse_drop(self, rel: Relation) -> None:
        sinks = self.sinks_of(rel)
        if sinks:
            raise DependentObjects(f"cannot drop {rel.name!r}: sink(s) "
                                   f"{', '.join(s.name for s in sinks)} write it out; "
                                   "DROP SINK them first")

    @staticmethod
    def app_id(sink: SinkRow) -> str:
        return f"{APP_PREFIX}{sink.id}"

    def create(self, cmd: CreateSink, catalog: Catalog) -> None:
        if self.find(cmd.name) is not None:
            if cmd.if_not_exists:
                return
            raise CatalogError(f"a sink named {cmd.name!r} already exists")
        rel = catalog.get(cmd.source)
        if rel.internal:
            raise UnknownRelation(f"no table or materialized view named {cmd.source!r}")
        opts = {k.lower(): v for k, v in cmd.options.items()}
        for k in opts:
            if k not in OPTIONS:
                raise InvalidOption(f"sink {cmd.name!r}: unknown option {k!r}; known: "
                                    f"{', '.join(OPTIONS)}")
        if str(opts.get("connector", "")).lower() != "delta":
            raise InvalidOption(f"sink {cmd.name!r}: connector must be 'delta', got "
                                f"{opts.get('connector')!r}")
        if not opts.get("path"):
            raise InvalidOption(f"sink {cmd.name!r}: needs path = 'DIR' (the Delta table)")
        path = resolve_path(str(opts["path"]), self.warehouse)
        if "://" in path:
            raise SinkError(f"sink {cmd.name!r}: path {path!r}: only local paths are supported")
        buckets = opt_int(cmd.name, opts, "buckets", DEFAULT_BUCKETS, minimum=1)
        assert buckets is not None
        if buckets > VNODE_COUNT:
            raise InvalidOption(f"sink {cmd.name!r}: buckets must be <= {VNODE_COUNT}")
        retention = opt_int(cmd.name, opts, "vacuum_retention_hours", 1)
        p = _local(path)
        if p.exists() and (p.is_file() or any(p.iterdir())):
            raise SinkError(f"sink {cmd.name!r}: path {path!r} already exists and is not "
                            "empty; a sink writes a new Delta table")
        bad = [c.name for c in rel.visible_columns if _BAD_NAME.search(c.name)]
        if bad:
            raise SinkError(f"sink {cmd.name!r}: column(s) {', '.join(map(repr, bad))} of "
                            f"{rel.name!r} are not valid Delta column names; alias them in "
                            "the MV")
        sink = SinkRow(self.meta.next_sink_id(), cmd.name, rel.id, "delta", path,
                       {"buckets": buckets, "vacuum_retention_hours": retention},
                       self.meta.committed_epoch)
        existed = p.exists()
        self.meta.add_sink(sink)  # first: a crash after it leaves a sink the next sync repairs
        try:
            self._sync_one(sink, rel, self.meta.committed_epoch)
        except BaseException:
            self.meta.drop_sink(sink.id)
            self._remove(p, existed)
            raise

    @staticmethod
    def _remove(path: Path, keep_dir: bool) -> None:
        if keep_dir:
            for child in path.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)

    def drop(self, cmd: DropSink) -> None:
        """Forget a sink; its Delta table stays where it is."""
        sink = self.find(cmd.name)
        if sink is None:
            if cmd.if_exists:
                return
            raise CatalogError(f"no sink named {cmd.name!r}")
        self.meta.drop_sink(sink.id)

    # --- syncing --------------------------------------------------------------------------

    def sync(self, catalog: Catalog, epoch: int) -> None:
        """Bring every sink whose MV is created up to committed ``epoch``."""
        for sink in self.meta.sinks():
            self._sync_one(sink, catalog.get_by_id(sink.rel_id), epoch)

    @staticmethod
    def _schema(rel: Relation) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in rel.visible_columns])

    def _open(self, sink: SinkRow, rel: Relation) -> DeltaTable:
        """The sink's Delta table, created (empty) when it is not there yet."""
        try:
            if not DeltaTable.is_deltatable(sink.path):
                _local(sink.path).mkdir(parents=True, exist_ok=True)
                return DeltaTable.create(sink.path, self._schema(rel), mode="overwrite",
                                         name=sink.name)
            return DeltaTable(sink.path)
        except Exception as exc:  # noqa: BLE001
            raise SinkError(f"sink {sink.name!r}: cannot open its Delta table {sink.path!r}: "
                            f"{exc}") from exc

    def _sync_one(self, sink: SinkRow, rel: Relation, epoch: int) -> None:
        dt = self._open(sink, rel)
        if rel.kind == "mv" and (rel.state != "created" or rel.ready_epoch is None
                                 or epoch < rel.ready_epoch):
            return
        done = dt.transaction_version(self.app_id(sink))
        if done is not None and int(done) >= epoch:
            return
        self._clean_attempts(sink, -1 if done is None else int(done))
        with self.store.reading_for(f"sink {sink.name}"):
            self._write(sink, rel, dt, None if done is None else int(done), epoch)

    def _clean_attempts(self, sink: SinkRow, done: int) -> None:
        """Remove what syncs that never committed wrote (epochs above ``done``)."""
        root = _local(sink.path)
        for child in root.iterdir():
            m = _DIR.match(child.name)
            if m and int(m.group(1)) > done and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)

    def _touched_vnodes(self, rel: Relation, done: int, epoch: int) -> list[int] | None:
        """Vnodes the MV changed in ``(done, epoch]``; None when its log no longer
        holds all of those changes."""
        files = self.store.files_at(rel.stored, epoch)
        base_epoch = max((f.epoch_max for f in files if f.kind == "base"), default=0)
        if base_epoch > done:
            return None
        if not any(f.kind == "log" and f.epoch_max > done for f in files):
            return []
        rows = self.store.changelog(rel.stored, done, epoch).select(VNODE).distinct().collect()
        return sorted(int(r[0]) for r in rows)

    def _write(self, sink: SinkRow, rel: Relation, dt: DeltaTable, done: int | None,
               epoch: int) -> None:
        buckets = int(sink.options.get("buckets", DEFAULT_BUCKETS))
        touched = None if done is None else self._touched_vnodes(rel, done, epoch)
        now_ms = int(time.time() * 1000)
        props = CommitProperties(app_transactions=[Transaction(self.app_id(sink), epoch, now_ms)])
        if touched is not None and not touched:
            dt.create_write_transaction([], mode="append", schema=dt.schema(),
                                        commit_properties=props)
            return
        hit = None if touched is None else sorted({v * buckets // VNODE_COUNT for v in touched})
        vnodes = None if hit is None else [v for v in range(VNODE_COUNT)
                                           if v * buckets // VNODE_COUNT in hit]
        cols = [c.name for c in rel.visible_columns]
        snap = self.store.snapshot(rel.stored, epoch, vnodes=vnodes)
        out = snap.select(*cols, (F.col(VNODE) * F.lit(buckets) / F.lit(VNODE_COUNT))
                          .cast("int").alias(BUCKET))
        sub = f"e{epoch:010d}-{uuid.uuid4().hex[:8]}"
        root = _local(sink.path)
        target = root / sub
        try:
            out.repartition(BUCKET).write.partitionBy(BUCKET).parquet(str(target))
            adds = self._adds(root, target, now_ms)
            actions: list[AddAction | RemoveAction] = list(adds)
            if hit is not None:
                wanted = set(hit)
                for path, size in self._files(dt):
                    m = _BUCKET_OF.search(path)
                    if m is None or int(m.group(1)) in wanted:
                        actions.append(RemoveAction(path, True, now_ms, size))
            dt.create_write_transaction(actions, mode="overwrite" if hit is None else "append",
                                        schema=dt.schema(), commit_properties=props)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        if epoch % 10 == 0:
            self._vacuum(sink)

    @staticmethod
    def _files(dt: DeltaTable) -> list[tuple[str, int]]:
        actions = pa.table(dt.get_add_actions(flatten=True))
        return list(zip(actions.column("path").to_pylist(),
                        [int(s) for s in actions.column("size_bytes").to_pylist()], strict=True))

    @staticmethod
    def _adds(root: Path, target: Path, now_ms: int) -> Sequence[AddAction]:
        adds = []
        for p in sorted(target.rglob("*")):
            if p.is_file() and (p.name.startswith((".", "_"))):
                p.unlink()  # _SUCCESS and checksum files: not part of the table
        for p in sorted(target.glob(f"{BUCKET}=*/*.parquet")):
            rows = pq.ParquetFile(p).metadata.num_rows
            adds.append(AddAction(str(p.relative_to(root)), p.stat().st_size, {}, now_ms, True,
                                  json.dumps({"numRecords": rows})))
        return adds

    def _vacuum(self, sink: SinkRow) -> None:
        """Delete files the table stopped referencing more than the retention ago."""
        hours = sink.options.get("vacuum_retention_hours")
        if hours is None:
            return
        try:
            DeltaTable(sink.path).vacuum(retention_hours=int(hours), dry_run=False,
                                         enforce_retention_duration=False)
        except Exception:  # noqa: BLE001 - vacuum is housekeeping; the next one retries
            return
        for d in sorted(_local(sink.path).glob("e*/*"), reverse=True):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        for d in _local(sink.path).glob("e*"):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
