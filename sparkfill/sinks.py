"""Sinks: plain Delta tables kept equal to a materialized view (``CREATE SINK
name FROM mv WITH (connector = 'delta', path = '...')``).

Invariant: every commit of a sink's Delta table makes it hold exactly the MV's
visible rows at one committed epoch ``e`` and records ``e`` as the version of
the sink's Delta application transaction (``sparkfill-sink-<id>``) in the same
commit; a sync to ``e`` is skipped when the table already records ``e``, so an
epoch is written once whatever crashes, and a reader sees the MV as of some
committed epoch, never between two. A sync whose commit raised removes the files
it wrote only once the table is found not to record ``e`` (a commit whose reply
was lost landed, and references them).

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

Location: a sink's table is a local folder or an object-store URI (``s3://...``;
a relative path beside an object-store warehouse lands under its URI), opened by
delta-rs with the warehouse's storage options when it is on the same kind of object
store (``Warehouse.options_for``; else the environment's) and reached for files through a
``Warehouse`` handle rooted at it. Locally Spark writes the bucket folders
itself; on an object store the executors write them through pyarrow and return
each file's URI, size and rows, so the driver never lists what was written.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .errors import (
    CatalogError,
    DependentObjects,
    InvalidOption,
    SinkError,
    SparkfillError,
    UnknownRelation,
)
from .sources.base import opt_int, resolve_path
from .sql.frontend import CreateSink, DropSink
from .storage import object_files
from .storage.catalog import Catalog, Relation
from .storage.meta_store import MetaStore, SinkRow
from .storage.relation_store import RelationStore, compaction_epoch
from .storage.schema import VNODE, VNODE_COUNT, arrow_type
from .storage.warehouse import Warehouse

__all__ = ["SinkManager", "APP_PREFIX", "synced_epoch"]

APP_PREFIX = "sparkfill-sink-"
BUCKET = "sf_bucket"
DEFAULT_BUCKETS = 16
OPTIONS = ("connector", "path", "buckets", "vacuum_retention_hours")
_DIR = re.compile(r"^e(\d{10})-[0-9a-f]{8}$")
_BUCKET_OF = re.compile(rf"(?:^|/){BUCKET}=(\d+)/")
_BAD_NAME = re.compile(r"[ ,;{}()\n\t=]")


def _on_object_store(path: str) -> bool:
    return "://" in path and not path.lower().startswith("file://")


def _handle(path: str, storage_options: dict[str, str] | None = None) -> Warehouse:
    """A filesystem handle rooted at a sink's table: a local folder (no storage
    options) or an object-store URI (``storage_options``, completed from the
    environment as for a warehouse)."""
    return Warehouse(path, storage_options if _on_object_store(path) else None)


def synced_epoch(path: str, sink_id: int,
                 storage_options: dict[str, str] | None = None) -> int | None:
    """The epoch a sink's Delta table holds (its application transaction), if any."""
    try:
        version = _handle(path, storage_options).delta(path).transaction_version(
            f"{APP_PREFIX}{sink_id}")
    except Exception:  # noqa: BLE001 - a missing table has synced nothing
        return None
    return None if version is None else int(version)


class SinkManager:
    def __init__(self, spark: SparkSession, meta: MetaStore, store: RelationStore,
                 warehouse: Warehouse) -> None:
        self.spark = spark
        self.meta = meta
        self.store = store
        self.warehouse = warehouse
        #: vacuum a sink every this many epochs (tests lower it to reach vacuum often)
        self.vacuum_every = 10
        self._handles: dict[str, Warehouse] = {}

    def _fs(self, path: str) -> Warehouse:
        """The handle of the sink table at ``path`` (on an object store, with the storage
        options ``Warehouse.options_for`` gives it)."""
        fs = self._handles.get(path)
        if fs is None:
            fs = self._handles[path] = _handle(path, self.warehouse.options_for(path))
        return fs

    def _location(self, value: str) -> str:
        """A sink's ``path`` option as an absolute local path or an object-store URI:
        ``{warehouse}`` stands for the warehouse; a relative path is relative to the
        current directory beside a local warehouse, and under the warehouse's URI
        beside an object-store one."""
        wh = self.warehouse
        if wh.local_path is not None:
            return resolve_path(value, wh.local_path)
        text = value.replace("{warehouse}", wh.uri)
        if "://" in text:
            return resolve_path(text, Path(wh.uri))
        if Path(text).expanduser().is_absolute():
            return str(Path(text).expanduser().resolve())
        return wh.join(text)

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
        path = self._location(str(opts["path"]))
        try:
            fs = _handle(path, self.warehouse.options_for(path))
        except SparkfillError as exc:
            raise SinkError(f"sink {cmd.name!r}: path {path!r}: {exc}") from None
        path = fs.uri
        buckets = opt_int(cmd.name, opts, "buckets", DEFAULT_BUCKETS, minimum=1)
        assert buckets is not None
        if buckets > VNODE_COUNT:
            raise InvalidOption(f"sink {cmd.name!r}: buckets must be <= {VNODE_COUNT}")
        retention = opt_int(cmd.name, opts, "vacuum_retention_hours", 1)
        try:
            existed = fs.exists(path)
            busy = existed and (fs.is_file(path) or bool(fs.list(path)))
        except OSError as exc:
            raise SinkError(f"sink {cmd.name!r}: path {path!r}: {exc}") from None
        if busy:
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
        self._handles[path] = fs
        self.meta.add_sink(sink)  # first: a crash after it leaves a sink the next sync repairs
        try:
            self._sync_one(sink, rel, self.meta.committed_epoch)
        except BaseException:
            self.meta.drop_sink(sink.id)
            self._remove(fs, path, existed)
            raise

    @staticmethod
    def _remove(fs: Warehouse, path: str, keep_dir: bool) -> None:
        try:
            if keep_dir:
                for child in fs.list(path):
                    fs.rmtree(child)
            else:
                fs.rmtree(path)
        except OSError:
            pass  # best effort: the statement's own error is what the caller sees

    def drop(self, cmd: DropSink) -> None:
        """Forget a sink; its Delta table stays where it is."""
        sink = self.find(cmd.name)
        if sink is None:
            if cmd.if_exists:
                return
            raise CatalogError(f"no sink named {cmd.name!r}")
        self.meta.drop_sink(sink.id)
        self._handles.pop(sink.path, None)

    # --- syncing --------------------------------------------------------------------------

    def sync(self, catalog: Catalog, epoch: int) -> None:
        """Bring every sink whose MV is created up to committed ``epoch`` — or, for an
        MV that failed on its rows (or reads one that did: ``pipelines.failures``), up
        to the epoch before the failure: what it would write after it is not the MV's
        query over the upstreams; once the MV is rebuilt, its difference arrives."""
        from .pipelines.failures import failed_upstream, load_failures

        failures = load_failures(self.meta)
        for sink in self.meta.sinks():
            rel = catalog.get_by_id(sink.rel_id)
            failed = failed_upstream(catalog, rel, failures)
            self._sync_one(sink, rel, epoch if failed is None
                           else min(epoch, failed[1].epoch - 1))

    @staticmethod
    def _schema(rel: Relation) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in rel.visible_columns])

    def _open(self, sink: SinkRow, rel: Relation) -> DeltaTable:
        """The sink's Delta table, created (empty) when it is not there yet."""
        try:
            fs = self._fs(sink.path)
            try:
                return fs.delta(sink.path)
            except TableNotFoundError:
                pass
            if fs.is_local:
                fs.makedirs(sink.path)
            return DeltaTable.create(sink.path, self._schema(rel), mode="overwrite",
                                     name=sink.name, storage_options=fs.storage_options or None)
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
        fs = self._fs(sink.path)
        for child in fs.list(sink.path):
            m = _DIR.match(Warehouse.name_of(child))
            if m and int(m.group(1)) > done and not fs.is_file(child):
                fs.rmtree(child)

    def _touched_vnodes(self, rel: Relation, done: int, epoch: int) -> list[int] | None:
        """Vnodes the MV changed in ``(done, epoch]``; None when its log no longer
        holds all of those changes."""
        files = self.store.files_at(rel.stored, epoch)
        if compaction_epoch(files) > done:
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
                          .cast("int").alias(BUCKET)).repartition(BUCKET)
        fs = self._fs(sink.path)
        root = fs.uri.rstrip("/")
        target = fs.join(f"e{epoch:010d}-{uuid.uuid4().hex[:8]}")
        try:
            if fs.is_local:
                out.write.partitionBy(BUCKET).parquet(target)
                written = self._listed(fs, target)
            else:
                written = self._write_remote(out, fs, target, self._schema(rel))
            actions: list[AddAction | RemoveAction] = []
            for uri, size, rows in written:
                if not uri.startswith(root + "/"):
                    raise SinkError(f"sink {sink.name!r}: wrote {uri!r} outside its table")
                actions.append(AddAction(uri[len(root) + 1:], size, {}, now_ms, True,
                                         json.dumps({"numRecords": rows})))
            if hit is not None:
                wanted = set(hit)
                for path, size in self._files(dt):
                    m = _BUCKET_OF.search(path)
                    if m is None or int(m.group(1)) in wanted:
                        actions.append(RemoveAction(path, True, now_ms, size))
            dt.create_write_transaction(actions, mode="overwrite" if hit is None else "append",
                                        schema=dt.schema(), commit_properties=props)
        except BaseException as exc:
            if isinstance(exc, Exception) and self._landed(sink, epoch):
                pass  # the commit landed, its reply was lost: its files are the table's
            else:
                try:
                    fs.rmtree(target)
                except OSError:
                    pass  # the next sync's _clean_attempts removes it
                raise
        if epoch % self.vacuum_every == 0:
            self._vacuum(sink)

    def _landed(self, sink: SinkRow, epoch: int) -> bool:
        """Whether the sink's table records ``epoch`` (read afresh): a commit that
        raised may have landed (a reply lost, a retry that found it done)."""
        try:
            done = self._fs(sink.path).delta(sink.path).transaction_version(self.app_id(sink))
        except Exception:  # noqa: BLE001 - unknown: treated as not landed
            return False
        return done is not None and int(done) >= epoch

    @staticmethod
    def _listed(fs: Warehouse, target: str) -> list[tuple[str, int, int]]:
        """The data files Spark wrote under a local ``target`` (URI, size, rows); the
        marker and checksum files it wrote beside them are removed."""
        found = []
        for child in fs.list(target):
            name = Warehouse.name_of(child)
            if name.startswith((".", "_")):
                fs.rmtree(child)  # _SUCCESS and its checksum: not part of the table
                continue
            if not name.startswith(f"{BUCKET}="):
                continue
            for uri in fs.list(child):
                file = Warehouse.name_of(uri)
                if file.startswith((".", "_")):
                    fs.rmtree(uri)
                elif file.endswith(".parquet"):
                    found.append((uri, fs.size(uri), int(fs.parquet_metadata(uri).num_rows)))
        return sorted(found)

    @staticmethod
    def _write_remote(out: DataFrame, fs: Warehouse, target: str,
                      schema: pa.Schema) -> list[tuple[str, int, int]]:
        """Write ``out`` (visible columns, then the bucket) under ``target`` on an object
        store in one Spark job: the executors write each bucket's rows of a partition
        as one Parquet file under ``target/sf_bucket=N/`` (``object_files``) and
        return its URI, size and rows, so the driver lists nothing."""
        make = object_files.parquet_writer  # bound here: shipped by value with the closure
        options = dict(fs.storage_options)
        column = BUCKET

        def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            import pyarrow.compute as pc

            collected = [b for b in batches if b.num_rows]
            if not collected:
                return
            rows = pa.Table.from_batches(collected)
            for bucket in sorted(pc.unique(rows[column]).to_pylist()):
                part = rows.filter(pc.equal(rows[column], bucket)).drop_columns([column])
                writer = make(f"{target}/{column}={bucket}", options, [], schema)
                yield from writer(iter(part.to_batches()))

        object_files.ship_by_value()
        got = out.mapInArrow(write, object_files.WRITTEN_SCHEMA).collect()
        return sorted((str(r["path"]), int(r["size"]), int(r["rows"])) for r in got)

    @staticmethod
    def _files(dt: DeltaTable) -> list[tuple[str, int]]:
        actions = pa.table(dt.get_add_actions(flatten=True))
        return list(zip(actions.column("path").to_pylist(),
                        [int(s) for s in actions.column("size_bytes").to_pylist()], strict=True))

    def _vacuum(self, sink: SinkRow) -> None:
        """Delete files the table stopped referencing more than the retention ago."""
        hours = sink.options.get("vacuum_retention_hours")
        if hours is None:
            return
        fs = self._fs(sink.path)
        try:
            fs.delta(sink.path).vacuum(retention_hours=int(hours), dry_run=False,
                                       enforce_retention_duration=False)
            # then the sync folders vacuum emptied (and an object store's folder markers)
            for folder in fs.list(sink.path):
                if not _DIR.match(Warehouse.name_of(folder)) or fs.is_file(folder):
                    continue
                for sub in fs.list(folder):
                    if Warehouse.name_of(sub).startswith(f"{BUCKET}=") and not fs.list(sub):
                        fs.rmtree(sub)
                if not fs.list(folder):
                    fs.rmtree(folder)
        except Exception:  # noqa: BLE001 - vacuum is housekeeping; the next one retries
            return
