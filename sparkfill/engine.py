"""The Engine: sparkfill's public entry point.

Invariants: every public method either completes or raises a
``SparkfillError`` having changed nothing (errors of Spark, delta-rs, SQLite,
PostgreSQL and sqlglot are translated here, at the boundary); reads see
committed epochs only; opening a warehouse recovers it — cleans what no
committed epoch refers to and re-runs the epoch that was in flight. ``step`` stages each source's
input for the epoch before running it and brings every sink up to the epoch
after committing it.
"""

from __future__ import annotations

import functools
import json
import logging
import numbers
import random
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlglot import exp

from .backfill.state import NotStarted, state_to_row
from .errors import (
    DataError,
    DependentObjects,
    EngineClosed,
    EpochNotRetained,
    InvalidOption,
    MaterializedViewNotReady,
    MetaStoreError,
    RelationExists,
    SparkfillError,
    SqlError,
    UnknownColumn,
    UnknownRelation,
    UnsupportedQuery,
    WarehouseReadOnly,
    without_internal_names,
)
from .options import (
    DEFAULT_VERIFY_SAMPLE,
    WAREHOUSE_OPTIONS,
    BackfillOptions,
    resolve_options,
    sample_fraction,
)
from .pipelines.coordinator import EpochCoordinator, uses_snapshot_job
from .pipelines.failures import failed_as_of, failed_upstream, failure_message, load_failures
from .pipelines.replace import check_replacement, check_swap
from .progress import EpochReport
from .session import build_spark_session
from .sinks import SinkManager
from .sources import SourceManager
from .sql.frontend import (
    AlterMaterializedView,
    CancelJobs,
    CreateMaterializedView,
    CreateSink,
    CreateTable,
    Delete,
    Drop,
    DropSink,
    Explain,
    ExplainExisting,
    InsertValues,
    Query,
    RecomputeMaterializedView,
    SetOption,
    Show,
    SwapMaterializedViews,
    Update,
    Verify,
    keys_pinned,
    parse_statement,
)
from .sql.links import explain_chain, plan_chain
from .sql.planner import (
    LeafInfo,
    PlannedMv,
)
from .sql.ties import ranked_selection
from .storage.catalog import Catalog, Relation, check_not_reserved
from .storage.dml import DELETE, DRIVER_STAGE_ROWS, IDX, KIND, UPSERT, DmlStager
from .storage.lock import AdvisoryLock, WriterLock
from .storage.meta_store import MetaStore, PgTarget, SourceRow, check_meta, open_postgres
from .storage.metadata import explain_existing, show_rows, show_schema
from .storage.relation_store import RelationStore
from .storage.schema import Column
from .storage.warehouse import Warehouse
from .verify import differences, sampled_differences

__all__ = ["Engine"]

LOG = logging.getLogger("sparkfill")

P = ParamSpec("P")
R = TypeVar("R")


def _translate(exc: Exception, where: str) -> SparkfillError:
    """A SparkfillError for an error of Spark or a library."""
    if isinstance(exc, SparkfillError):
        return exc
    text = str(exc)
    cls = getattr(exc, "getCondition", None)
    condition = ""
    if callable(cls):
        try:
            condition = cls() or ""
        except Exception:  # noqa: BLE001 - best effort only
            condition = ""
    short = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    # a failed Spark job: its reason (stage failure, executor lost), not the JVM call
    m = re.search(r"^.*(?:Job aborted|SparkException:)[^\n]*", text, re.MULTILINE)
    if short.startswith("An error occurred while calling") and m is not None:
        short = " ".join(m.group(0).split()).lstrip(": ")[:500]
    # names of internal relations and planning views never reach users
    short = without_internal_names(short)
    if condition.startswith("UNRESOLVED_COLUMN") or "UNRESOLVED_COLUMN" in text:
        m = re.search(r"name `?([^`\s]+)`? cannot be resolved", text)
        name = m.group(1) if m else "?"
        return UnknownColumn(f"{where}: unknown column {name}: {short}")
    if condition.startswith("TABLE_OR_VIEW_NOT_FOUND") or "TABLE_OR_VIEW_NOT_FOUND" in text:
        return UnknownRelation(f"{where}: {short}")
    if "PARSE_SYNTAX_ERROR" in text or condition.startswith("PARSE"):
        return SqlError(f"{where}: {short}")
    if any(k in text for k in ("CAST_INVALID_INPUT", "ARITHMETIC_OVERFLOW", "DIVIDE_BY_ZERO",
                               "INCOMPATIBLE_", "DATATYPE_MISMATCH", "CAST_OVERFLOW")):
        return DataError(f"{where}: {short}")
    if isinstance(exc, PySparkException):
        return SqlError(f"{where}: {short}")
    return SparkfillError(f"{where}: {type(exc).__name__}: {short}")


def _is_session(spark: Any) -> bool:
    """Whether ``spark`` is a classic or a Spark Connect session."""
    if isinstance(spark, SparkSession):
        return True
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # the Connect client's extras are not installed
        return False
    return isinstance(spark, ConnectSession)


def _epoch_number(as_of: Any) -> int:
    """An ``as_of`` argument as an epoch: an integer (or its digits as a string)."""
    if isinstance(as_of, numbers.Integral) and not isinstance(as_of, bool):
        return int(as_of)
    if isinstance(as_of, str) and re.fullmatch(r"\s*[+-]?\d+\s*", as_of):
        return int(as_of)
    text = repr(as_of)
    raise EpochNotRetained(f"as_of names an epoch, an integer; got {type(as_of).__name__} "
                           f"{text if len(text) <= 80 else text[:80] + '...'}")


def _boundary(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self: Any = args[0]
        if getattr(self, "_closed", False):
            raise EngineClosed("the engine is closed")
        try:
            self._reconnect()
            return method(*args, **kwargs)
        except SparkfillError:
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary translates every error
            if self.meta.broken:
                raise MetaStoreError(
                    f"Engine.{method.__name__}: the connection to the meta store ended (a "
                    f"server restart?): {_translate(exc, 'meta store')}; nothing of this "
                    "call is committed; the next call connects again") from exc
            raise _translate(exc, f"Engine.{method.__name__}") from exc
    return wrapper


class Engine:
    """An incremental materialized-view engine over one warehouse folder."""

    def __init__(self, warehouse: str | Path, spark: SparkSession | None = None,
                 *, retain_epochs: int = 200, read_only: bool = False,
                 meta: str | None = None,
                 storage_options: dict[str, str] | None = None) -> None:
        """Open (or create) a warehouse as its one writer; ``read_only=True`` opens an
        existing one for reading beside its writer: reads, progress, SHOW, EXPLAIN,
        VERIFY and queries see each epoch the writer commits; anything that would
        write raises ``WarehouseReadOnly``.

        ``meta`` names the meta store: None (the default) keeps it in the warehouse
        (SQLite, ``meta.sqlite``); ``"postgresql://user:password@host:port/database"``
        keeps it in that PostgreSQL database, in a schema of the warehouse's own, with
        the writer lock an advisory lock there (no shared filesystem needed). A
        warehouse is always reopened with the meta store it was created with
        (``MetaStoreError`` otherwise); another kind of URL raises ``InvalidOption``.

        ``warehouse`` is a local path, a ``file://`` URI or an object-store URI
        (``s3://bucket/prefix``, ``gs://``, ``abfss://``, ...), whose credentials and
        endpoint come from the environment (``AWS_*``, as for delta-rs and pyarrow)
        or ``storage_options`` (delta-rs's keys, e.g. ``AWS_ENDPOINT_URL``); an
        object-store warehouse needs a PostgreSQL ``meta``. An unknown scheme raises
        ``SparkfillError`` and creates nothing."""
        self._closed = True
        if isinstance(retain_epochs, bool) or not isinstance(retain_epochs, int) \
                or retain_epochs < 0:
            raise InvalidOption(f"retain_epochs is a number of epochs (an integer >= 0), not "
                                f"{retain_epochs!r}")
        if spark is not None and not _is_session(spark):
            raise SparkfillError(f"spark is a SparkSession (classic or Spark Connect) or None, "
                                 f"not {type(spark).__name__}")
        self.read_only = read_only
        self.warehouse = Warehouse(warehouse, storage_options)
        #: the warehouse folder (a Path) or, on an object store, its URI
        self.path: Path | str = (self.warehouse.local_path if self.warehouse.local_path
                                 is not None else self.warehouse.uri)
        pg_url = check_meta(self.warehouse, meta)
        self.warehouse.check_reachable()
        self._lock: WriterLock | AdvisoryLock | None
        pg: PgTarget | None = None
        if pg_url is not None:
            pg, self._lock = open_postgres(self.warehouse, pg_url, read_only)
        else:
            assert isinstance(self.path, Path)  # check_meta: SQLite needs a local folder
            if read_only and not (self.path / "meta.sqlite").is_file():
                raise WarehouseReadOnly(f"{self.path} is not a sparkfill warehouse; a "
                                        "read-only open needs one that exists")
            if not read_only:
                try:
                    self.path.mkdir(parents=True, exist_ok=True)
                except OSError as exc:  # a file there, no permission, a read-only disk
                    raise SparkfillError(f"warehouse {self.path}: cannot create its folder: "
                                         f"{exc.strerror or exc}") from None
            self._lock = WriterLock(self.path / "writer.lock")
            if not read_only:
                self._lock.acquire()
        try:
            self._own_spark = spark is None
            self.spark = spark if spark is not None else build_spark_session()
            # a caller's session too: an epoch's plans reuse cached Δs many times
            self.spark.conf.set("spark.sql.maxPlanStringLength", "65536")
            self.meta = MetaStore(pg if pg is not None else Path(self.path) / "meta.sqlite",
                                  read_only=read_only)
            if isinstance(self._lock, AdvisoryLock):
                self.meta.fence = self._lock.check
            self.store = RelationStore(self.spark, self.warehouse, self.meta)
            self.catalog = Catalog(self.meta)
            self.stager = DmlStager(self.spark, self.meta, self.warehouse, self.store)
            self.sources = SourceManager(self.spark, self.meta, self.warehouse)
            self.sinks = SinkManager(self.spark, self.meta, self.store, self.warehouse)
            self.coordinator = EpochCoordinator(self.spark, self.meta, self.store, self.catalog,
                                                self.stager, retain_epochs)
            self._session_options: dict[str, Any] = {}
            self._closed = False
            if not read_only:
                self._recover()
        except BaseException as exc:
            self._closed = True
            if getattr(self, "meta", None) is not None:
                self.meta.close()
            if self._lock is not None:
                self._lock.release()
            if isinstance(exc, SparkfillError) or not isinstance(exc, Exception):
                raise
            raise _translate(exc, "Engine.open") from exc

    # --- lifecycle ------------------------------------------------------------------------

    def _reconnect(self) -> None:
        """After the PostgreSQL meta store's connections ended (a server restart, found
        by the call that failed on them): connect again, take the writer lock again
        (``WarehouseLocked`` if another engine took it meanwhile) and recover as a
        reopen would: reload the catalog, re-run an epoch left in flight."""
        lock = self._lock if isinstance(self._lock, AdvisoryLock) else None
        if not self.meta.broken and (lock is None or not lock.lost):
            return
        if lock is not None and not self.read_only:
            lock.reacquire()
        self.meta.reconnect()
        self.catalog.reload()
        if not self.read_only:
            self._recover()

    def _recover(self) -> None:
        """Clean what no committed epoch refers to; restart what lost its memory;
        re-run the epoch that was in flight."""
        for rel_id, dir_ in self.meta.pending_dirs():
            rel = next((r for r in self.catalog.all() if r.id == rel_id), None)
            if rel is None:
                self.warehouse.rmtree(dir_)
            else:
                self.store.remove_unreferenced_dir(rel.stored, dir_)
            self.meta.remove_pending_dir(dir_)
        self.stager.remove_orphans()
        self.coordinator.snapshots.remove_orphans({r.id for r in self.catalog.all()})
        for rel in self.catalog.all():
            if rel.kind == "mv" and rel.state == "creating" and rel.options \
                    and rel.options.strategy == "buffer":
                if any(r.state != "not_started" for r in self.meta.progress(rel.id)):
                    self._restart_job(rel)
        self.catalog.reload()
        self.coordinator.recover()
        try:  # a sink behind after a crash catches up; a broken one must not lock us out
            self.sinks.sync(self.catalog, self.meta.committed_epoch)
        except Exception:  # noqa: BLE001 - step() retries it and reports the error
            pass
        for rel in self.catalog.all():
            if uses_snapshot_job(rel) and not self.catalog.is_waiting(rel):
                self.coordinator.snapshots.start(self.coordinator.prepare_snapshot_job(rel))

    def _restart_job(self, rel: Relation) -> None:
        """Start a creating job over on a fresh, empty relation (its in-memory
        state was lost)."""
        olds = (rel, *self.catalog.states_of(rel))
        dirs = [f"{r.id:06d}-{r.name}-{uuid.uuid4().hex[:6]}" for r in olds]
        # the fresh folders pending until the switch to them commits, the old ones
        # from then until removed: a crash anywhere leaves nothing recovery misses
        with self.meta.transaction() as conn:
            for r, new_dir in zip(olds, dirs, strict=True):
                self.meta.put_pending_dir(conn, r.id, f"{self.store.root}/{new_dir}")
        versions = [self.store.create(new_dir, r.columns)
                    for r, new_dir in zip(olds, dirs, strict=True)]
        with self.meta.transaction() as conn:
            conn.execute("DELETE FROM backfill_progress WHERE mv_id = ?", (rel.id,))
            for r, new_dir, version in zip(olds, dirs, versions, strict=True):
                self.meta.reset_relation(conn, r.id, new_dir, rel.created_epoch, version)
                conn.execute("DELETE FROM pending_dirs WHERE dir = ?",
                             (f"{self.store.root}/{new_dir}",))
                self.meta.put_pending_dir(conn, r.id, self.store.path(r.stored))
            for leaf in range(len(rel.upstreams)):
                self.meta.put_progress(conn, state_to_row(rel.id, NotStarted(), None, leaf))
        for r in olds:
            self.store.delete(r.dir)
        self.meta.remove_pending_dirs([self.store.path(r.stored) for r in olds])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.coordinator.snapshots.stop_all()
            self.meta.close()
        finally:
            if self._lock is not None:
                self._lock.release()
            if self._own_spark:
                self.spark.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def committed_epoch(self) -> int:
        return self.meta.committed_epoch

    # --- epochs ---------------------------------------------------------------------------

    @_boundary
    def step(self) -> EpochReport:
        """Run and commit one epoch: stage the sources' input for it, run it, and
        bring the sinks up to it. After a ``step()`` that raised, the epoch runs with
        the failed run's inputs (DML staged since then waits for the next epoch)."""
        self._writable("step()")
        behind: list[str] = []
        try:  # behind after a crash; one that cannot catch up (an MV's data file damaged
            # by hand) must not keep the epoch that repairs it from running
            self.sinks.sync(self.catalog, self.meta.committed_epoch)
        except Exception as exc:  # noqa: BLE001 - the sync after the epoch retries it
            behind.append(f"a sink could not catch up before epoch "
                          f"{self.meta.committed_epoch + 1} (retried after it): "
                          f"{_translate(exc, 'sink')}")
            LOG.warning(behind[-1])
        self.sources.stage(self.catalog, self.meta.committed_epoch + 1)
        report = self.coordinator.step()
        # the epoch is committed: a sink that cannot write now is reported and
        # brought up to date by a later step
        warnings = behind + list(report.warnings)
        try:
            self.sinks.sync(self.catalog, report.epoch)
        except Exception as exc:  # noqa: BLE001 - the epoch stands; retried next step
            warnings.append(f"epoch {report.epoch} committed, but a sink could not write "
                            f"(retried next step): {_translate(exc, 'sink')}")
            LOG.warning(warnings[-1])
        try:
            warnings.extend(self._verify_periodically(report.epoch))
        except Exception as exc:  # noqa: BLE001 - the epoch stands
            warnings.append(f"epoch {report.epoch} committed, but its sampled VERIFY "
                            f"failed: {_translate(exc, 'verify')}")
            LOG.warning(warnings[-1])
        rows, dead = self.sources.report(self.catalog, report.epoch)
        # recorded in the epoch's row of ``epochs`` with the next epoch's commit
        self.coordinator.after_commit(report.epoch, warnings)
        return replace(report, source_rows=rows, dead_letters=dead, warnings=warnings)

    # --- DML ------------------------------------------------------------------------------

    def _see_writer_commits(self) -> None:
        """A read-only engine reads the catalog the writer last committed."""
        if self.read_only:
            self.catalog.reload()

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise WarehouseReadOnly(f"{what}: warehouse {self.path} is open read-only; "
                                    "open it without read_only=True to write (one writer "
                                    "at a time)")

    def _table(self, name: str) -> Relation:
        self._writable(f"DML on {name!r}")
        rel = self.catalog.get(name)
        if rel.kind != "table":
            raise SqlError(f"{name!r} is a materialized view; only tables take DML")
        self.sources.refuse_dml(rel, self.catalog)
        return rel

    @_boundary
    def insert(self, table: str, rows: Any) -> int:
        """Stage rows as upserts into ``table``; durable when this returns."""
        return self.stager.stage(self._table(table), rows, UPSERT)

    @_boundary
    def delete(self, table: str, keys: Any) -> int:
        """Stage deletes of the keys in ``keys``; a missing key is a no-op."""
        return self.stager.stage(self._table(table), keys, DELETE)

    # --- reads ----------------------------------------------------------------------------

    def _epoch_for_read(self, rel: Relation, as_of: int | None) -> int:
        committed = self.meta.committed_epoch
        epoch = committed if as_of is None else _epoch_number(as_of)
        if epoch > committed or epoch < 0:
            raise EpochNotRetained(f"epoch {epoch} is not committed (committed epoch: "
                                   f"{committed})")
        horizon = int(self.meta.get("retention_horizon", "0") or 0)
        if epoch < horizon:
            raise EpochNotRetained(f"epoch {epoch} is no longer retained (oldest retained: "
                                   f"{horizon})")
        if epoch < rel.created_epoch:
            raise EpochNotRetained(f"{rel.name!r} did not exist at epoch {epoch} (created at "
                                   f"epoch {rel.created_epoch})")
        if rel.kind == "mv":
            if rel.state != "created":
                p = self.coordinator.job_progress(rel)
                raise MaterializedViewNotReady(
                    f"materialized view {rel.name!r} is still being created: {p.state}, "
                    f"{p.rows_done}/{p.rows_total_estimate} rows")
            if rel.ready_epoch is not None and epoch < rel.ready_epoch:
                raise MaterializedViewNotReady(
                    f"materialized view {rel.name!r} became readable at epoch "
                    f"{rel.ready_epoch}, after epoch {epoch}")
            failed = failed_as_of(self.catalog, rel, load_failures(self.meta), epoch)
            if failed is not None:
                raise MaterializedViewNotReady(failure_message(self.catalog, rel, *failed))
        return epoch

    def _snapshot(self, rel: Relation, epoch: int) -> DataFrame:
        """``rel``'s visible rows at ``epoch``, in its columns then (``Relation.at``)."""
        then = rel.at(epoch)
        return self.store.snapshot(then.stored, epoch, guarded=True).select(
            *[c.name for c in then.visible_columns])

    @_boundary
    def read(self, name: str, as_of: int | None = None) -> DataFrame:
        """The relation at the committed epoch (or ``as_of``, while retained)."""
        self._see_writer_commits()
        rel = self.catalog.get(name)
        return self._snapshot(rel, self._epoch_for_read(rel, as_of))

    @_boundary
    def create_temp_views(self, as_of: int | None = None) -> list[str]:
        """Register every table and created MV as a temporary view of the engine's
        Spark session, under its own name, as of the committed epoch (or ``as_of``),
        so plain ``spark.sql`` reads them; returns the names registered. A view is
        a snapshot: call again after later epochs to see them."""
        self._see_writer_commits()
        names = []
        failures = load_failures(self.meta)
        for rel in self.catalog.all():
            if rel.internal or (rel.kind == "mv" and rel.state != "created"):
                continue
            epoch = self.meta.committed_epoch if as_of is None else _epoch_number(as_of)
            if epoch < rel.created_epoch or (rel.ready_epoch or 0) > epoch:
                continue
            if failed_as_of(self.catalog, rel, failures, epoch) is not None:
                continue  # failed on its rows (``read`` says why)
            self._snapshot(rel, self._epoch_for_read(rel, epoch)) \
                .createOrReplaceTempView(rel.name)
            names.append(rel.name)
        return names

    # --- progress -------------------------------------------------------------------------

    @_boundary
    def progress(self, name: str | None = None) -> Any:
        """``JobProgress`` of one MV, or the list of every MV's."""
        self._see_writer_commits()
        if name is None:
            return self.coordinator.jobs()
        rel = self.catalog.get(name)
        if rel.internal:
            raise UnknownRelation(f"no materialized view named {name!r}")
        if rel.kind != "mv":
            raise SqlError(f"{name!r} is a table; progress is kept for materialized views")
        return self.coordinator.user_job(rel)

    # --- SQL ------------------------------------------------------------------------------

    @_boundary
    def sql(self, statement: str) -> DataFrame | None:
        """Run one statement; queries return a DataFrame, other statements None
        (SHOW returns a DataFrame)."""
        cmd = parse_statement(statement)
        if not isinstance(cmd, Show | Query | Explain | ExplainExisting | Verify):
            self._writable(type(cmd).__name__)
        self._see_writer_commits()
        handler = {
            CreateTable: self._create_table,
            CreateMaterializedView: self._create_mv,
            Drop: self._drop,
            SetOption: self._set,
            Show: self._show,
            InsertValues: self._insert_values,
            Update: self._update,
            Delete: self._delete_where,
            Query: self._query,
            AlterMaterializedView: self._alter_mv,
            RecomputeMaterializedView: self._recompute_mv,
            SwapMaterializedViews: self._swap_mvs,
            CancelJobs: self._cancel_jobs,
            Explain: self._explain,
            ExplainExisting: self._explain,
            Verify: lambda c: self.verify(c.name, c.as_of, c.sample),
            CreateSink: lambda c: self.sinks.create(c, self.catalog),
            DropSink: self.sinks.drop,
        }[type(cmd)]
        return handler(cmd)  # type: ignore[operator]

    def _new_relation(self, rel: Relation, states: Sequence[Relation] = (),
                      extra: Callable[[Any], None] | None = None) -> None:
        """Create a relation (and an MV's state tables, or a source's dead-letter
        table) in one meta-store transaction; ``extra`` writes more in it."""
        self._new_relations([(rel, list(states))], extra)

    def _new_relations(self, groups: Sequence[tuple[Relation, Sequence[Relation]]],
                       extra: Callable[[Any], None] | None = None) -> None:
        """Create relations, each with the relations it owns, in one meta-store
        transaction (all or none)."""
        created: list[str] = []
        every = [r for rel, owned in groups for r in (rel, *owned)]
        folders = [f"{self.store.root}/{r.dir}" for r in every]
        # pending until the relations commit: a crash between leaves no folder behind
        with self.meta.transaction() as conn:
            for r, folder in zip(every, folders, strict=True):
                self.meta.put_pending_dir(conn, r.id, folder)
        try:
            versions = []
            for r in every:
                versions.append(self.store.create(r.dir, r.columns))
                created.append(r.dir)
            with self.meta.transaction() as conn:
                for folder in folders:
                    conn.execute("DELETE FROM pending_dirs WHERE dir = ?", (folder,))
                for r, version in zip(every, versions, strict=True):
                    self.meta.add_relation(conn, r.to_row(), version)
                for rel, _ in groups:
                    if rel.kind == "mv":
                        for leaf in range(len(rel.upstreams)):
                            self.meta.put_progress(conn, state_to_row(rel.id, NotStarted(),
                                                                      None, leaf))
                if extra is not None:
                    extra(conn)
        except BaseException:
            for dir_ in created:
                self.store.delete(dir_)
            self.meta.remove_pending_dirs(folders)
            raise
        self.catalog.reload()

    def session_options(self) -> dict[str, Any]:
        """The options ``SET`` gave this session (each MV created now starts from them)."""
        return dict(self._session_options)

    def _check_new_name(self, name: str) -> bool:
        check_not_reserved(name)
        if self.catalog.find(name) is not None:
            return False
        return True

    def _create_table(self, cmd: CreateTable) -> None:
        if not self._check_new_name(cmd.name):
            if cmd.if_not_exists:
                return None
            raise RelationExists(f"a relation named {cmd.name!r} already exists")
        rel_id = self.meta.next_relation_id()
        epoch = self.meta.committed_epoch
        table = Relation(
            id=rel_id, name=cmd.name, kind="table", columns=tuple(cmd.columns),
            key=tuple(cmd.key), state="created", created_epoch=epoch,
            dir=f"{rel_id:06d}-{cmd.name}", ready_epoch=epoch, proctime=cmd.proctime)
        if not cmd.options:
            self._new_relation(table)
            return None
        # a source produces the columns it may write: not the processing time
        source = self.sources.define(cmd.name, tuple(table.writable_columns), table.key,
                                     cmd.options)
        owned = []
        if source.dead_letter is not None:
            name, columns, key = source.dead_letter
            if self.catalog.find(name) is not None:
                raise RelationExists(f"source table {cmd.name!r} needs the name {name!r} for "
                                     "its dead-letter table, but a relation has it")
            owned.append(Relation(
                id=rel_id + 1, name=name, kind="table", columns=columns, key=key,
                state="created", created_epoch=epoch, dir=f"{rel_id + 1:06d}-{name}",
                ready_epoch=epoch))
        row = SourceRow(rel_id, source.connector, source.options,
                        owned[0].id if owned else None, epoch)
        self._new_relation(table, owned, lambda conn: self.meta.add_source(conn, row))
        return None

    def _create_mv(self, cmd: CreateMaterializedView) -> None:
        existing = self.catalog.find(cmd.name)
        if cmd.or_replace and existing is not None and not existing.internal:
            return self._replace_mv(cmd, existing)
        if not self._check_new_name(cmd.name):
            if cmd.if_not_exists:
                return None
            raise RelationExists(f"a relation named {cmd.name!r} already exists")
        options = resolve_options(self._session_options, cmd.options)
        links, planned = self._plan_mv(cmd, cmd.name, options, self._columns_of,
                                       self._leaf_info)
        prefix = cmd.name
        if any(self.catalog.find(n) is not None
               for n in self._internal_names(cmd.name, links, planned)):
            # a name an MV's internal relations took in a SWAP WITH: these go apart
            prefix = f"{cmd.name}_{self.meta.next_relation_id()}"
            links, planned = self._plan_mv(cmd, prefix, options, self._columns_of,
                                           self._leaf_info)
        self._start_mv(cmd, cmd.name, options, links, planned, prefix=prefix)
        return None

    @staticmethod
    def _internal_names(prefix: str, links: list[tuple[Any, PlannedMv]],
                        planned: PlannedMv) -> list[str]:
        """The names of an MV's join-chain links and state tables, planned under
        ``prefix``."""
        names = [lk.name for lk, _ in links]
        for rel_name, p in [*[(lk.name, lp) for lk, lp in links], (prefix, planned)]:
            names += [f"__sf_{rel_name.removeprefix('__sf_')}_{d.role}" for d in p.states]
        return names

    def _plan_mv(self, cmd: CreateMaterializedView, name: str, options: BackfillOptions,
                 columns_of: Callable[[str], list[str] | None],
                 leaf_info: Callable[[str], LeafInfo],
                 ) -> tuple[list[tuple[Any, PlannedMv]], PlannedMv]:
        """Plan every link of the join chain and the MV (nothing is created)."""
        links, planned = plan_chain(self.spark, name, cmd.query, columns_of, leaf_info)
        leaf_names = {n.lower() for p in (*[lp for _, lp in links], planned)
                      for lf in p.plan.leaves for n in (lf.alias, lf.relation)}
        unknown = [n for n in options.backfill_order if n.lower() not in leaf_names]
        if unknown:
            raise InvalidOption(f"backfill_order names {', '.join(map(repr, unknown))}, which "
                                f"{cmd.name!r} does not read; it reads "
                                f"{', '.join(lf.alias for lf in planned.plan.leaves)}")
        return links, planned

    def _start_mv(self, cmd: CreateMaterializedView, name: str, options: BackfillOptions,
                  links: list[tuple[Any, PlannedMv]], planned: PlannedMv,
                  replaces: int | None = None, prefix: str | None = None) -> None:
        """Create the MV ``name`` (with its links and state tables, named after
        ``prefix``, by default ``name``) in one meta-store transaction, as a creating
        job; ``replaces``: the MV it is a replacement for."""
        first_id = self.meta.next_relation_id()
        owner_id = first_id + sum(1 + len(lp.states) for _, lp in links)
        epoch = self.meta.committed_epoch
        groups: list[tuple[Relation, list[Relation]]] = []
        next_id = first_id
        for link, sql in [*[(lp, lk.query.sql(dialect="spark")) for lk, lp in links],
                          (planned, cmd.query_sql)]:
            rel_name = name if link is planned else links[len(groups)][0].name
            internal = (prefix or name) if link is planned else rel_name
            rel_id = next_id
            states = [Relation(
                id=rel_id + 1 + i, name=f"__sf_{internal.removeprefix('__sf_')}_{d.role}",
                kind="state", columns=d.columns, key=d.key, state="created",
                created_epoch=epoch, dir=f"{rel_id + 1 + i:06d}-{rel_name}-{d.role}",
                owner=rel_id)
                for i, d in enumerate(link.states)]
            plan = replace(link.plan, states=tuple(r.name for r in states))
            groups.append((Relation(
                id=rel_id, name=rel_name, kind="mv", columns=tuple(link.columns),
                key=tuple(link.key), state="creating", created_epoch=epoch,
                dir=f"{rel_id:06d}-{rel_name}", sql=sql, plan=plan, options=options,
                owner=None if link is planned else owner_id,
                replaces=replaces if link is planned else None), states))
            next_id += 1 + len(states)
        assert groups[-1][0].id == owner_id
        self._new_relations(groups)
        for rel, _ in groups:
            created = self.catalog.get_by_id(rel.id)
            if uses_snapshot_job(created) and not self.catalog.is_waiting(created):
                self.coordinator.snapshots.start(created)

    def _replace_mv(self, cmd: CreateMaterializedView, mv: Relation) -> None:
        """``CREATE OR REPLACE MATERIALIZED VIEW`` of an existing MV: checked whole
        first (nothing changes if it is refused), then the new definition starts as
        a replacement job beside ``mv``, which keeps serving its old definition; an
        earlier replacement not switched yet is dropped. The switch is the
        coordinator's (``pipelines/replace.py``)."""
        if mv.kind != "mv" or mv.options is None:
            raise SqlError(f"{mv.name!r} is a table; CREATE OR REPLACE MATERIALIZED VIEW "
                           "replaces a materialized view")
        if mv.state != "created":
            raise SqlError(f"materialized view {mv.name!r} is still being created; CANCEL "
                           f"JOBS {mv.name} and create it again with the new query")
        downstream = {r.name.lower() for r in self.catalog.downstream_of(mv)}
        own_name = mv.name.lower()

        def leaf_info(name: str) -> LeafInfo:
            if name.lower() == own_name or name.lower() in downstream:
                what = ("itself" if name.lower() == own_name
                        else f"{name!r}, which reads {mv.name!r}")
                raise UnsupportedQuery(f"the new query of {mv.name!r} reads {what}: a "
                                       "materialized view cannot be defined over its own "
                                       "rows")
            return self._leaf_info(name)

        options = resolve_options(self._session_options, cmd.options)
        name = f"__sf_r{self.meta.next_relation_id()}_{mv.name}"
        links, planned = self._plan_mv(cmd, name, options, self._columns_of, leaf_info)
        check_replacement(mv, planned, self.catalog, self.sinks.sinks_of(mv),
                          self._plan_dependent)
        old = self.catalog.replacement_of(mv)
        if old is not None:
            self._drop_relations(old)
        self._start_mv(cmd, name, options, links, planned, replaces=mv.id)
        return None

    def _plan_dependent(self, dep: Relation, new: LeafInfo) -> list[Column]:
        """The columns of the user's MV ``dep`` planned again with relation ``new``
        in place of the one of its name (raises where it fails)."""
        assert dep.sql is not None
        tree = parse_statement(dep.sql)
        assert isinstance(tree, Query)

        def columns_of(name: str) -> list[str] | None:
            if name.lower() == new.name.lower():
                return [c.name for c in new.columns if not c.hidden]
            return self._columns_of(name)

        def leaf_info(name: str) -> LeafInfo:
            return new if name.lower() == new.name.lower() else self._leaf_info(name)

        _, planned = plan_chain(self.spark, dep.name, tree.tree, columns_of, leaf_info)
        return planned.columns

    def _columns_of(self, name: str) -> list[str] | None:
        """A table's or MV's visible column names (None: no such relation)."""
        rel = self.catalog.find(name)
        if rel is None or rel.internal:
            return None
        return [c.name for c in rel.visible_columns]

    def _leaf_info(self, name: str) -> LeafInfo:
        rel = self.catalog.get(name)
        if rel.internal:
            raise UnknownRelation(f"no table or materialized view named {name!r}")
        if rel.kind == "mv" and rel.state != "created":
            raise UnsupportedQuery(
                f"materialized view {rel.name!r} is still being created; create an MV over "
                f"it once progress({rel.name!r}).state is 'created'")
        return LeafInfo(rel.name, rel.columns, rel.key)

    def _refuse_drop(self, rel: Relation, dropped_too: Sequence[str] = ()) -> list[Relation]:
        """Raise unless ``rel`` can be dropped (no sink writes it, no MV reads it but
        those named in ``dropped_too``, which go with it); the relations it owns,
        which go with it (a source's dead-letter table)."""
        owner = self.sources.owner_of_dead_letters(rel)
        if owner is not None:
            raise SqlError(f"{rel.name!r} is the dead-letter table of source "
                           f"{self.catalog.get_by_id(owner.rel_id).name!r}; it is dropped "
                           "with that table")
        source = self.sources.source_of(rel)
        owned = ([self.catalog.get_by_id(source.dead_letter_id)]
                 if source is not None and source.dead_letter_id is not None else [])
        also = {n.lower() for n in dropped_too}
        for r in (rel, *owned):
            self.sinks.refuse_drop(r)
            dependents = [d for d in self.catalog.dependents(r.name)
                          if d.name.lower() not in also]
            if dependents:
                raise DependentObjects(
                    f"cannot drop {rel.name!r}: materialized view(s) "
                    f"{', '.join(d.name for d in dependents)} read {r.name!r}; drop them first")
        return owned

    def _drop(self, cmd: Drop) -> None:
        rel = self.catalog.find(cmd.name)
        if rel is None or rel.internal:
            if cmd.if_exists:
                return None
            raise UnknownRelation(f"no {'table' if cmd.kind == 'table' else 'materialized view'}"
                                  f" named {cmd.name!r}")
        if (cmd.kind == "table") != (rel.kind == "table"):
            actual = "a table" if rel.kind == "table" else "a materialized view"
            raise SqlError(f"{cmd.name!r} is {actual}; use DROP "
                           f"{'TABLE' if rel.kind == 'table' else 'MATERIALIZED VIEW'}")
        owned = self._refuse_drop(rel)
        replacement = self.catalog.replacement_of(rel) if rel.kind == "mv" else None
        if replacement is not None:
            self._drop_relations(replacement)
        self._drop_relations(rel, owned)
        return None

    def _drop_relations(self, rel: Relation, owned: Sequence[Relation] = ()) -> None:
        """Remove ``rel`` (an MV with its join chain's links and every state table;
        a table with ``owned``, its dead-letter table) from the meta store in one
        transaction, then its files."""
        ids = {r.id for r in (rel, *owned)}
        staged = [b.path for b in self.meta.staged() if b.rel_id in ids]
        # an MV goes with its join chain's links; each MV with its state tables
        mvs = [rel, *reversed(self.catalog.internals_of(rel))] if rel.kind == "mv" else []
        states = [*[st for mv in mvs for st in self.catalog.states_of(mv)], *owned]
        for mv in mvs:
            self.coordinator.snapshots.stop(mv.id, self.coordinator.snapshots.job_dir(mv))
        dropped = [*(mvs or [rel]), *states]
        with self.meta.transaction() as conn:
            for r in dropped:
                self.meta.drop_relation(conn, r.id, self.store.path(r.stored))
        for r in dropped:
            self.store.delete(r.dir)
        self.meta.remove_pending_dirs([self.store.path(r.stored) for r in dropped])
        self.stager.remove_applied(staged)
        for mv in mvs:
            self.coordinator.scan.forget(mv.id)
        self.catalog.reload()

    def _alter_mv(self, cmd: AlterMaterializedView) -> None:
        rel = self.catalog.get(cmd.name)
        if rel.internal:
            raise UnknownRelation(f"no materialized view named {cmd.name!r}")
        if rel.kind != "mv" or rel.options is None:
            raise SqlError(f"{cmd.name!r} is a table; ALTER MATERIALIZED VIEW needs an MV")
        # the links follow their MV; a replacement being built takes the option too
        replacement = self.catalog.replacement_of(rel)
        owners = [rel] if replacement is None else [rel, replacement]
        altered = [(mv, owner.options.altered(cmd.option, cmd.value))
                   for owner in owners if owner.options is not None
                   for mv in (owner, *self.catalog.internals_of(owner))]
        with self.meta.transaction() as conn:
            for mv, options in altered:
                definition = mv.definition()
                definition["options"] = options.to_json()
                self.meta.update_definition(conn, mv.id, definition)
        self.catalog.reload()
        for mv, options in altered:
            self.coordinator.snapshots.set_rate_limit(mv.id, options.rate_limit)
        return None

    def _recompute_mv(self, cmd: RecomputeMaterializedView) -> None:
        """Ask the next epoch to rebuild the MV (and its join chain's links) from its
        upstreams and write the difference from its rows as its change: the repair
        of an MV that VERIFY finds inexact. The request is persisted: a restart
        before that epoch commits still honours it."""
        rel = self.catalog.get(cmd.name)
        if rel.internal:
            raise UnknownRelation(f"no materialized view named {cmd.name!r}")
        if rel.kind != "mv":
            raise SqlError(f"{cmd.name!r} is a table; RECOMPUTE rebuilds a materialized view")
        if rel.state != "created":
            failed = failed_upstream(self.catalog, rel, load_failures(self.meta))
            if failed is not None:  # its backfill raised on its rows
                raise SqlError(failure_message(self.catalog, rel, *failed))
            raise SqlError(f"materialized view {rel.name!r} is still being created: its "
                           "backfill builds it from its upstreams")
        ids = [rel.id, *[link.id for link in self.catalog.internals_of(rel)]]
        with self.meta.transaction() as conn:
            self.coordinator.request_recompute(conn, ids)
        return None

    def _swap_mvs(self, cmd: SwapMaterializedViews) -> None:
        """``ALTER MATERIALIZED VIEW a SWAP WITH b``: an epoch of its own, where no DML
        applies and no backfill reads, in which each MV takes the other's definition
        and, as its change, the difference between the two contents; dependents of
        each follow the name. Runs at once, as a step does."""
        self._writable("ALTER MATERIALIZED VIEW ... SWAP WITH")
        a, b = self.catalog.get(cmd.name), self.catalog.get(cmd.other)
        check_swap(a, b, self.catalog)
        self.sinks.sync(self.catalog, self.meta.committed_epoch)
        report = self.coordinator.swap(a, b)
        self.sinks.sync(self.catalog, report.epoch)
        return None

    def _cancel_jobs(self, cmd: CancelJobs) -> None:
        rels = [self.catalog.get(n) for n in cmd.names]
        for rel in rels:
            if rel.internal:
                raise UnknownRelation(f"no materialized view named {rel.name!r}")
            if rel.kind != "mv" or (rel.state != "creating"
                                    and self.catalog.replacement_of(rel) is None):
                raise SqlError(f"{rel.name!r} has no creating job to cancel")
        # every check before the first drop: a refused CANCEL cancels none of them
        for rel in rels:
            if self.catalog.replacement_of(rel) is None:
                self._refuse_drop(rel, cmd.names)
        for rel in sorted({r.id: r for r in rels}.values(), key=lambda r: -r.id):
            replacement = self.catalog.replacement_of(rel)
            if replacement is not None:  # the MV keeps its definition
                self._drop_relations(replacement)
            else:
                self._drop(Drop("mv", rel.name))  # readers first
        return None

    def _set(self, cmd: SetOption) -> None:
        if cmd.name in WAREHOUSE_OPTIONS:
            with self.meta.transaction() as conn:
                if cmd.value is None:
                    conn.execute("DELETE FROM kv WHERE key = ?", (cmd.name,))
                else:
                    self.meta.put(conn, cmd.name, str(cmd.value))
            return None
        if cmd.value is None:
            self._session_options.pop(cmd.name, None)
        else:
            self._session_options[cmd.name] = cmd.value
        return None

    def _show(self, cmd: Show) -> DataFrame:
        if cmd.what != "jobs":
            rows = show_rows(cmd.what, self.meta, self.catalog)
            if cmd.what == "materialized views":  # failed on its rows (``failures``)
                failures = load_failures(self.meta)
                rows = [(r[0], "failed", *r[2:]) if failed_upstream(
                    self.catalog, self.catalog.get(r[0]), failures) else r for r in rows]
        else:  # with the rates this engine measured
            rows = [(j.name, j.strategy, "failed" if j.failed else j.state, j.rows_done,
                     j.rows_total_estimate,
                     float(j.rows_per_second),
                     None if j.eta_seconds is None else float(j.eta_seconds))
                    for j in self.coordinator.jobs()]
        return self.spark.createDataFrame(rows, show_schema(cmd.what))

    def _insert_values(self, cmd: InsertValues) -> None:
        rel = self._table(cmd.table)
        # without a column list, VALUES give every column but the processing time
        names = cmd.columns or [c.name for c in rel.writable_columns]
        aliases = ", ".join("`" + n.replace("`", "``") + "`" for n in names)
        try:
            df = self.spark.sql(f"SELECT * FROM {cmd.values_sql} AS v({aliases})")
        except PySparkException as exc:
            text = str(exc).strip().splitlines()[0]
            raise DataError(f"INSERT INTO {rel.name}: bad VALUES: {text}") from exc
        if len(df.columns) != len(names):
            raise SqlError(f"INSERT INTO {rel.name}: {len(names)} columns but "
                           f"{len(df.columns)} values per row")
        try:
            values = df.collect()
        except (ValueError, OverflowError) as exc:  # a value Python cannot hold
            raise DataError(f"INSERT INTO {rel.name}: bad VALUES: a value is out of range "
                            f"({exc})") from exc
        rows = [dict(zip(names, r, strict=True)) for r in values]
        self.stager.stage(rel, rows, UPSERT)
        return None

    def _matching(self, rel: Relation, where_sql: str | None,
                  epoch: int | None = None) -> DataFrame:
        snap = self._snapshot(rel, self.meta.committed_epoch if epoch is None else epoch)
        return snap if where_sql is None else snap.where(F.expr(where_sql))

    def _update(self, cmd: Update) -> None:
        rel = self._table(cmd.table)
        by_lower = {c.name.lower(): c.name for c in rel.columns}
        assign: dict[str, str] = {}
        for col, expr_sql in cmd.assignments:
            if col.lower() not in by_lower:
                raise UnknownColumn(f"UPDATE {rel.name}: table has no column {col!r}")
            if by_lower[col.lower()] == rel.proctime:
                raise DataError(
                    f"UPDATE {rel.name}: column {rel.proctime!r} is the table's processing "
                    "time (AS PROCTIME()), which the engine fills with the epoch's time when "
                    "it writes the row; it cannot be SET (the updated rows get the new time)")
            assign[by_lower[col.lower()]] = expr_sql
        epoch = self.meta.committed_epoch
        matched = self._matching(rel, cmd.where_sql, epoch)
        # the processing time is left out: the epoch writing the new rows fills it
        columns = rel.writable_columns
        new_rows = matched.select(*[F.expr(assign[c.name]).alias(c.name) if c.name in assign
                                    else F.col(c.name) for c in columns])
        batch = new_rows.withColumn(KIND, F.lit(UPSERT)).withColumn(IDX, F.lit(1))
        if any(k in assign for k in rel.key):
            old_keys = matched.select(*rel.key)
            for c in columns:
                if c.name not in rel.key:
                    old_keys = old_keys.withColumn(c.name, F.lit(None))
            old_keys = old_keys.select(*[c.name for c in columns])
            deletes = old_keys.withColumn(KIND, F.lit(DELETE)).withColumn(IDX, F.lit(0))
            batch = deletes.unionByName(batch, allowMissingColumns=True)
            self.stager.stage(rel, batch, UPSERT, small=self._few_match(rel, cmd.where_sql))
            return None
        # each key once, from the rows at ``epoch`` (all of them with no WHERE): its
        # epoch takes these rows as the keys' latest, and with no WHERE keeps no old row
        self.stager.stage(rel, batch, UPSERT, updated_from=(epoch, cmd.where_sql is None),
                          small=self._few_match(rel, cmd.where_sql))
        return None

    @staticmethod
    def _few_match(rel: Relation, where_sql: str | None) -> bool:
        """Whether a statement's rows of ``rel`` are worth trying on the driver (a
        statement of more rows is then staged by Spark, its query run again): the
        table is small, or its WHERE pins the key to few values, or it has a WHERE and
        the table is small enough that a second run costs little. A statement over a
        large table that may match many rows goes to Spark at once."""
        if rel.row_count <= DRIVER_STAGE_ROWS:
            return True
        if where_sql is None:
            return False
        pinned = keys_pinned(where_sql, rel.key)
        return (pinned is not None and pinned <= DRIVER_STAGE_ROWS) or \
            rel.row_count <= 10 * DRIVER_STAGE_ROWS

    def _delete_where(self, cmd: Delete) -> None:
        rel = self._table(cmd.table)
        self.stager.stage(rel, self._matching(rel, cmd.where_sql).select(*rel.key), DELETE,
                          small=self._few_match(rel, cmd.where_sql))
        return None

    def _query(self, cmd: Query, epoch: int | None = None) -> DataFrame:
        """The query over the snapshots at ``epoch``. The snapshots are handed to
        ``spark.sql`` as DataFrame arguments, not as temporary views dropped on
        return: a Spark Connect DataFrame is analysed when it runs, so its plan
        must carry its relations."""
        epoch = self.meta.committed_epoch if epoch is None else epoch
        snapshots: dict[str, Any] = {}
        for name in cmd.tables:
            rel = self.catalog.get(name)
            snapshots[f"sf_rel_{len(snapshots)}"] = \
                self._snapshot(rel, self._epoch_for_read(rel, epoch))
        arg_of = dict(zip([n.lower() for n in cmd.tables], snapshots, strict=True))

        def rename(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Table) and node.name.lower() in arg_of:
                alias = node.alias or node.name
                return exp.Table(this=exp.to_identifier(arg_of[node.name.lower()]),
                                 alias=exp.TableAlias(this=exp.to_identifier(alias)))
            return node

        # str.format fills {sf_rel_i}: every other brace of the text is doubled
        text = cmd.tree.copy().transform(rename).sql(dialect="spark")
        text = text.replace("{", "{{").replace("}", "}}")
        for arg in snapshots:
            text = re.sub(rf"\b{arg}\b", "{" + arg + "}", text)
        return self.spark.sql(text, **snapshots)

    # --- introspection --------------------------------------------------------------------

    def _explain(self, cmd: Explain | ExplainExisting) -> DataFrame:
        text = (explain_existing(self.catalog, cmd.name) if isinstance(cmd, ExplainExisting)
                else self._plan_text(cmd.statement))
        return self.spark.createDataFrame([(line,) for line in text.splitlines()], "plan string")

    def _plan_text(self, cmd: CreateMaterializedView) -> str:
        links, planned = plan_chain(self.spark, cmd.name, cmd.query, self._columns_of,
                                    self._leaf_info)
        return explain_chain([*[(link.name, p) for link, p in links], (cmd.name, planned)])

    @_boundary
    def explain(self, statement: str) -> str:
        """The operator plan of ``CREATE MATERIALIZED VIEW ...`` (or of an existing
        MV, by name) as an indented tree with each operator's key and state tables."""
        if not isinstance(statement, str):
            raise SqlError("EXPLAIN takes CREATE MATERIALIZED VIEW ... or an MV's name (a "
                           f"string), not {type(statement).__name__}")
        if re.match(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*$", statement):
            return explain_existing(self.catalog, statement.strip())
        cmd = parse_statement(statement)
        if isinstance(cmd, ExplainExisting):
            return explain_existing(self.catalog, cmd.name)
        if isinstance(cmd, Explain):
            cmd = cmd.statement
        if not isinstance(cmd, CreateMaterializedView):
            raise SqlError("EXPLAIN takes CREATE MATERIALIZED VIEW ... or an MV's name")
        text = self._plan_text(cmd)
        print(text)
        return text

    @_boundary
    def verify(self, name: str, as_of: int | None = None,
               sample: float | None = None) -> DataFrame:
        """Recompute the MV's SQL as a batch query over its upstreams' snapshots at
        ``as_of`` (default: the committed epoch) and return the rows that differ:
        the MV's columns and ``side`` — "missing" (in the batch result, not in the
        MV) or "extra" (in the MV, not in the batch result). Empty when exact.
        Where the query keeps rows by position (``ORDER BY ... LIMIT``, a filter on
        ``row_number()``), rows that tie at the limit may be any of the tied rows
        (``sparkfill.verify``). ``sample``: compare only a random fraction of the rows
        (each row of either side with that probability; a fresh sample each call)."""
        rel = self.catalog.get(name)
        if rel.kind != "mv" or rel.sql is None:
            raise SqlError(f"{name!r} is not a materialized view")
        if sample is not None:
            sample = sample_fraction(sample)
        epoch = self._epoch_for_read(rel, as_of)
        actual = self._snapshot(rel, epoch)
        rel = rel.at(epoch)  # the definition it had then (CREATE OR REPLACE)
        assert rel.sql is not None
        tree = parse_statement(rel.sql)
        assert isinstance(tree, Query)
        expected = self._query(tree, epoch)
        found = ranked_selection(tree.tree, rel.plan.topn if rel.plan is not None else None,
                                 expected.columns, actual.columns)
        if found is None:
            if sample is not None:
                return sampled_differences(actual, expected, sample,
                                           random.randrange(1, 2**31))
            return differences(actual, expected)
        if sample is not None:
            raise UnsupportedQuery(
                f"VERIFY ... SAMPLE of {name!r}: its query keeps rows by their position in an "
                "order, where tied rows may be any of them; a sample of rows cannot tell; "
                "VERIFY it whole")
        candidates, selection = found
        return differences(actual, self._query(replace(tree, tree=candidates), epoch),
                           selection)

    def _verify_periodically(self, epoch: int) -> list[str]:
        """``SET verify_every = N``: every N epochs, a sampled VERIFY (``verify_sample``
        of the rows) of each created MV; its differences become warnings, and the last
        result of each MV is kept for ``sparkfill status``."""
        every = self.meta.get("verify_every")
        if every is None or int(every) <= 0 or epoch % int(every) != 0:
            return []
        fraction = float(self.meta.get("verify_sample") or DEFAULT_VERIFY_SAMPLE)
        warnings, results = [], {}
        for rel in self.catalog.all():
            if rel.kind != "mv" or rel.internal or rel.state != "created":
                continue
            try:
                found = self.verify(rel.name, epoch, sample=fraction).count()
            except UnsupportedQuery:
                continue  # rows kept by position: VERIFY whole, by hand
            except MaterializedViewNotReady:
                continue  # failed on its rows: the epoch that failed it said so
            results[rel.name] = {"epoch": epoch, "sample": fraction, "differences": found}
            if found:
                warnings.append(f"epoch {epoch}: a sampled VERIFY of {rel.name!r} "
                                f"({fraction:.2%} of rows) found {found} differing row(s); "
                                f"VERIFY MATERIALIZED VIEW {rel.name} shows them, ALTER "
                                f"MATERIALIZED VIEW {rel.name} RECOMPUTE repairs it")
                LOG.warning(warnings[-1])
        with self.meta.transaction() as conn:
            last = json.loads(self.meta.get("verify_last") or "{}")
            last.update(results)
            self.meta.put(conn, "verify_last", json.dumps(last))
        return warnings

    @_boundary
    def relation(self, name: str) -> Relation:
        """The catalog entry of a relation (columns, key, state, plan)."""
        return self.catalog.get(name)


