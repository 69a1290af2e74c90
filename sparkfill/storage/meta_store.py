"""The meta store: catalog, committed epoch, staged DML, backfill progress,
source offsets and sinks.

Invariant: the meta store is the source of truth for what is committed. An
epoch is committed exactly when ``commit_epoch`` returns; everything it
records (relation versions, progress, applied DML, row counts) lands in that
one transaction. Nothing above the committed epoch is ever read. A
source's offset advances in the same transaction that stages its input as DML
(``stage_source``), so an input is staged once and applied by one epoch.

Two databases serve it with one schema (``_SCHEMA``) and one set of queries:
SQLite in the warehouse (``meta.sqlite``, the embedded default) and PostgreSQL
(``Engine(..., meta="postgresql://...")``) for a warehouse whose meta store must
live off the local disk. The queries are written for SQLite (``?`` placeholders,
``ON CONFLICT`` upserts); ``_PgConn`` is the whole dialect adapter: ``?`` becomes
``%s``, INTEGER becomes BIGINT and REAL DOUBLE PRECISION in the schema, rows are
read by name and by index like ``sqlite3.Row``, and a write transaction is
REPEATABLE READ instead of ``BEGIN IMMEDIATE`` (the writer lock already keeps
every other writer out, so no write transaction can conflict; SERIALIZABLE
would add nothing). Reads outside a transaction, and all of a read-only
engine's, run statement by statement in both databases: each statement sees
the last committed transaction whole, never a part of one.

A PostgreSQL meta store keeps each warehouse's tables in a schema of its own,
named when the warehouse is created (``sf_<folder name>_<random hex>``) and
recorded in the warehouse's ``meta.json`` with the URL less its password; a
warehouse is always reopened with the meta store it was created with (the
same URL, or none for SQLite), else ``MetaStoreError``.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from ..errors import InvalidOption, MetaStoreError, SparkfillError, WarehouseReadOnly
from .warehouse import Warehouse

if TYPE_CHECKING:
    from .lock import AdvisoryLock

__all__ = ["MetaStore", "RelationRow", "StagedBatch", "ProgressRow", "EpochCommit", "SourceRow",
           "SinkRow", "EpochRow", "AfterCommit", "Conn", "PgTarget", "META_FILE", "check_meta",
           "open_postgres"]


class Cursor(Protocol):
    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """A meta store connection as its methods use it: ``sqlite3.Connection`` or the
    PostgreSQL adapter ``_PgConn`` (``?`` placeholders; rows by name and index)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> Cursor: ...

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS relations (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    definition TEXT NOT NULL,
    state TEXT NOT NULL,
    created_epoch INTEGER NOT NULL,
    row_count INTEGER NOT NULL DEFAULT 0,
    dir TEXT NOT NULL,
    ready_epoch INTEGER
);
CREATE TABLE IF NOT EXISTS relation_versions (
    rel_id INTEGER NOT NULL, epoch INTEGER NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (rel_id, epoch)
);
CREATE TABLE IF NOT EXISTS dml_batches (
    seq INTEGER PRIMARY KEY, rel_id INTEGER NOT NULL, path TEXT NOT NULL, rows INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS backfill_progress (
    mv_id INTEGER NOT NULL, leaf INTEGER NOT NULL, vnode INTEGER NOT NULL,
    state TEXT NOT NULL, pos TEXT, rows INTEGER NOT NULL, pinned_epoch INTEGER,
    PRIMARY KEY (mv_id, leaf, vnode)
);
CREATE TABLE IF NOT EXISTS pending_epoch (epoch INTEGER PRIMARY KEY, plan TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending_dirs (dir TEXT PRIMARY KEY, rel_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS removed_files (rel_id INTEGER NOT NULL, epoch INTEGER NOT NULL,
    path TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS epochs (epoch INTEGER PRIMARY KEY, seconds REAL NOT NULL,
    finished_at REAL NOT NULL, backfill_seconds REAL, commit_seconds REAL, changes INTEGER,
    spark_jobs INTEGER, jobs TEXT, warnings TEXT);
CREATE TABLE IF NOT EXISTS sources (
    rel_id INTEGER PRIMARY KEY, connector TEXT NOT NULL, options TEXT NOT NULL,
    dead_letter_id INTEGER, epoch INTEGER NOT NULL, batch INTEGER NOT NULL DEFAULT 0,
    position TEXT, rows INTEGER NOT NULL DEFAULT 0, dead_letters INTEGER NOT NULL DEFAULT 0,
    total_rows INTEGER NOT NULL DEFAULT 0, total_dead_letters INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS source_files (rel_id INTEGER NOT NULL, name TEXT NOT NULL,
    epoch INTEGER NOT NULL, PRIMARY KEY (rel_id, name));
CREATE TABLE IF NOT EXISTS sinks (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
    rel_id INTEGER NOT NULL, connector TEXT NOT NULL, path TEXT NOT NULL,
    options TEXT NOT NULL, created_epoch INTEGER NOT NULL);
"""

#: columns added to a table after its first release: (table, column, type). A writer
#: adds those its database lacks when it opens (``_add_columns``); a reader of an older
#: meta store reads them as NULL (``SELECT *``, read by name when present)
_ADDED_COLUMNS = (
    ("epochs", "backfill_seconds", "REAL"), ("epochs", "commit_seconds", "REAL"),
    ("epochs", "changes", "INTEGER"), ("epochs", "spark_jobs", "INTEGER"),
    ("epochs", "jobs", "TEXT"), ("epochs", "warnings", "TEXT"),
)


@dataclass(frozen=True)
class RelationRow:
    id: int
    name: str
    kind: str
    definition: dict[str, Any]
    state: str
    created_epoch: int
    row_count: int
    dir: str
    ready_epoch: int | None = None


@dataclass(frozen=True)
class StagedBatch:
    seq: int
    rel_id: int
    path: str
    rows: int


@dataclass(frozen=True)
class ProgressRow:
    mv_id: int
    leaf: int
    vnode: int
    state: str
    pos: Any
    rows: int
    pinned_epoch: int | None


@dataclass(frozen=True)
class SourceRow:
    """A source table: its connector, options and offset."""

    rel_id: int
    connector: str
    options: dict[str, Any]
    dead_letter_id: int | None
    #: the last epoch it staged input for (its input of that epoch is staged)
    epoch: int
    #: batches staged so far
    batch: int = 0
    #: the connector's offset after the last batch (JSON)
    position: Any = None
    #: rows and dead letters staged for ``epoch``
    rows: int = 0
    dead_letters: int = 0
    total_rows: int = 0
    total_dead_letters: int = 0


@dataclass(frozen=True)
class SinkRow:
    id: int
    name: str
    rel_id: int
    connector: str
    path: str
    options: dict[str, Any]
    created_epoch: int


@dataclass(frozen=True)
class AfterCommit:
    """What a committed epoch did after its commit, written with the next epoch's
    commit (its row of ``epochs``): the seconds from the end of its Δs to the end of
    its ``step()`` (the commit, releasing chunks, removing applied DML, compaction,
    vacuum, the sinks' writes, a sampled VERIFY) and the warnings of that work."""

    epoch: int
    seconds: float
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class EpochRow:
    """One committed epoch as the ``epochs`` table records it. ``seconds``: its Δs
    computed and appended (what ``EpochReport.seconds`` says), of which
    ``backfill_seconds`` the creating jobs' own share; ``commit_seconds`` and
    ``warnings``: its commit and the work after it (``AfterCommit``), known once the
    next epoch commits; ``jobs``: the snapshot rows each creating MV (by id) had
    backfilled once it committed. None: not recorded (an older warehouse's epoch,
    or the last epoch's commit part)."""

    epoch: int
    seconds: float
    finished_at: float
    backfill_seconds: float | None = None
    commit_seconds: float | None = None
    changes: int | None = None
    spark_jobs: int | None = None
    jobs: dict[int, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


@dataclass
class EpochCommit:
    """Everything one epoch commits, written in one transaction."""

    epoch: int
    seconds: float
    finished_at: float
    versions: dict[int, int]
    row_count_deltas: dict[int, int]
    progress: list[ProgressRow]
    created: list[int]
    applied_dml_upto: int
    #: versions of appends tagged with an earlier epoch (a snapshot job catching up)
    tagged_versions: list[tuple[int, int, int]] = field(default_factory=list)
    #: the epoch's processing time (microseconds since the Unix epoch): the value of
    #: the processing-time columns of the rows it wrote; the next epoch's is later
    proctime_us: int | None = None
    #: relations whose definition the epoch changes (an MV switched to its
    #: replacement, its new state tables and links) and relations it drops (the
    #: replaced definition's state tables and links, the replacement)
    definitions: dict[int, dict[str, Any]] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)
    #: the dropped relations' folders, pending until their files are removed
    dropped_folders: dict[int, str] = field(default_factory=dict)
    #: the parts of its row of ``epochs`` (``EpochRow``): the creating jobs' share of
    #: ``seconds``, the rows its Δs changed, the Spark jobs it ran
    backfill_seconds: float | None = None
    changes: int | None = None
    spark_jobs: int | None = None
    #: the previous epoch's work after its commit, recorded in its row
    after_previous: AfterCommit | None = None
    #: key-value settings the epoch writes with its commit (the failed relations)
    settings: dict[str, str] = field(default_factory=dict)


class MetaStore:
    """The meta store over SQLite (``path`` a file) or PostgreSQL (``path`` a
    ``PgTarget``: a database and the schema that namespaces one warehouse)."""

    def __init__(self, path: Path | PgTarget, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        #: run at the start of every write transaction (the PostgreSQL writer lock's check
        #: that this engine still holds it); raises to refuse the write
        self.fence: Callable[[Conn], None] | None = None
        self._conn: Conn
        self._pg: _PgConn | None = None
        if isinstance(path, PgTarget):
            self._pg = _PgConn(_pg_open(path, read_only))
            self._conn = self._pg
            self._begin = "BEGIN ISOLATION LEVEL REPEATABLE READ"
            return
        self._begin = "BEGIN IMMEDIATE"
        if read_only:
            uri = f"file:{path}?mode=ro"
            lite = sqlite3.connect(uri, uri=True, isolation_level=None,
                                   check_same_thread=False)
        else:
            lite = sqlite3.connect(str(path), isolation_level=None,
                                   check_same_thread=False)
            lite.execute("PRAGMA journal_mode=WAL")
            lite.execute("PRAGMA synchronous=FULL")
            lite.executescript(_SCHEMA)
        lite.row_factory = sqlite3.Row
        if not read_only:
            _add_columns(lite)
        self._lite = lite
        self._conn = lite

    def close(self) -> None:
        if self._pg is not None:
            self._pg.raw.close()
        else:
            self._lite.close()

    @property
    def broken(self) -> bool:
        """Whether the PostgreSQL connection ended (a server restart, the network): found
        by the statement that failed on it; never for SQLite."""
        return self._pg is not None and bool(self._pg.raw.closed or self._pg.raw.broken)

    def reconnect(self) -> None:
        """Open the PostgreSQL connection again (after ``broken``)."""
        assert isinstance(self.path, PgTarget) and self._pg is not None
        try:
            self._pg.raw.close()
        except Exception:  # noqa: BLE001 - it is gone already
            pass
        self._pg = _PgConn(_pg_open(self.path, self.read_only))
        self._conn = self._pg

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that see one committed state of the meta store however many
        statements they take (a reader beside a writer that commits epochs): a read
        transaction, SQLite's deferred ``BEGIN`` (WAL: one snapshot) or PostgreSQL's
        REPEATABLE READ, READ ONLY."""
        self._conn.execute("BEGIN" if self._pg is None
                           else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield
        finally:
            if self._pg is None or not self._pg.raw.broken:
                self._conn.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        """One write transaction: SQLite's ``BEGIN IMMEDIATE`` (the database's one
        writer), PostgreSQL's REPEATABLE READ (one snapshot; the writer lock keeps
        other writers out, so no write can conflict). Readers outside it see its
        writes all at once, at COMMIT, or none of them."""
        self._conn.execute(self._begin)
        try:
            if self.fence is not None:
                self.fence(self._conn)
            yield self._conn
        except BaseException:
            if self._pg is None or not self._pg.raw.broken:
                self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")

    # --- key/value ------------------------------------------------------------------------

    def get(self, key: str, default: str | None = None) -> str | None:
        row = self._conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return default if row is None else str(row[0])

    def put(self, conn: Conn, key: str, value: str) -> None:
        conn.execute("INSERT INTO kv(key, value) VALUES (?, ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def forget(self, conn: Conn, key: str) -> None:
        conn.execute("DELETE FROM kv WHERE key = ?", (key,))

    @property
    def committed_epoch(self) -> int:
        return int(self.get("committed_epoch", "0") or 0)

    # --- catalog --------------------------------------------------------------------------

    def relations(self) -> list[RelationRow]:
        rows = self._conn.execute("SELECT * FROM relations ORDER BY id").fetchall()
        return [self._relation(r) for r in rows]

    @staticmethod
    def _relation(r: Any) -> RelationRow:
        return RelationRow(r["id"], r["name"], r["kind"], json.loads(r["definition"]),
                           r["state"], r["created_epoch"], r["row_count"], r["dir"],
                           r["ready_epoch"])

    def next_relation_id(self) -> int:
        row = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM relations").fetchone()
        used = int(self.get("max_relation_id", "0") or 0)
        return max(int(row[0]), used) + 1

    def add_relation(self, conn: Conn, rel: RelationRow, version: int) -> None:
        conn.execute(
            "INSERT INTO relations(id, name, kind, definition, state, created_epoch, row_count,"
            " dir, ready_epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rel.id, rel.name, rel.kind, json.dumps(rel.definition), rel.state,
             rel.created_epoch, rel.row_count, rel.dir, rel.ready_epoch),
        )
        self.put(conn, "max_relation_id", str(rel.id))
        self.set_version(conn, rel.id, rel.created_epoch, version)

    def drop_relation(self, conn: Conn, rel_id: int, folder: str | None = None) -> None:
        """Remove a relation from the catalog; ``folder`` (its table's URI) is registered
        as pending in the same transaction, so that a crash before its files are removed
        leaves nothing recovery does not remove (``remove_pending_dirs`` once they are)."""
        for table in ("relation_versions", "dml_batches", "removed_files", "pending_dirs",
                      "sources", "source_files"):
            conn.execute(f"DELETE FROM {table} WHERE rel_id = ?", (rel_id,))
        conn.execute("DELETE FROM backfill_progress WHERE mv_id = ?", (rel_id,))
        conn.execute("DELETE FROM relations WHERE id = ?", (rel_id,))
        if folder is not None:
            self.put_pending_dir(conn, rel_id, folder)

    def update_definition(self, conn: Conn, rel_id: int,
                          definition: dict[str, Any]) -> None:
        conn.execute("UPDATE relations SET definition = ? WHERE id = ?",
                     (json.dumps(definition), rel_id))

    def reset_relation(self, conn: Conn, rel_id: int, dir_: str, epoch: int,
                       version: int) -> None:
        """Point a relation at a new, empty Delta table (a restarted creating job)."""
        conn.execute("UPDATE relations SET dir = ?, row_count = 0 WHERE id = ?", (dir_, rel_id))
        conn.execute("DELETE FROM relation_versions WHERE rel_id = ?", (rel_id,))
        conn.execute("INSERT INTO relation_versions(rel_id, epoch, version) VALUES (?, ?, ?)",
                     (rel_id, epoch, version))

    def set_created_epoch(self, conn: Conn, rel_id: int, epoch: int) -> None:
        """Move a creating MV's start to ``epoch`` (a job that waited for its upstream
        MVs starts from their first complete epoch)."""
        conn.execute("UPDATE relations SET created_epoch = ? WHERE id = ?", (epoch, rel_id))

    # --- versions -------------------------------------------------------------------------

    def version_at(self, rel_id: int, epoch: int) -> int | None:
        row = self._conn.execute(
            "SELECT version FROM relation_versions WHERE rel_id = ? AND epoch <= ? "
            "ORDER BY epoch DESC LIMIT 1", (rel_id, epoch)).fetchone()
        return None if row is None else int(row[0])

    def first_version_epoch(self, rel_id: int) -> int | None:
        row = self._conn.execute(
            "SELECT MIN(epoch) FROM relation_versions WHERE rel_id = ?", (rel_id,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def set_version(self, conn: Conn, rel_id: int, epoch: int,
                    version: int) -> None:
        conn.execute("INSERT INTO relation_versions(rel_id, epoch, version) VALUES (?, ?, ?) "
                     "ON CONFLICT(rel_id, epoch) DO UPDATE SET version = excluded.version",
                     (rel_id, epoch, version))

    def prune_versions(self, conn: Conn, horizon: int) -> None:
        """Forget versions no epoch >= horizon can read."""
        conn.execute(
            "DELETE FROM relation_versions WHERE epoch < (SELECT MAX(v2.epoch) FROM "
            "relation_versions v2 WHERE v2.rel_id = relation_versions.rel_id AND v2.epoch <= ?)",
            (horizon,))

    # --- staged DML -----------------------------------------------------------------------

    def next_dml_seq(self) -> int:
        row = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM dml_batches").fetchone()
        used = int(self.get("max_dml_seq", "0") or 0)
        return max(int(row[0]), used) + 1

    def stage_dml(self, batch: StagedBatch) -> None:
        with self.transaction() as conn:
            self.add_dml(conn, batch)

    def add_dml(self, conn: Conn, batch: StagedBatch) -> None:
        conn.execute("INSERT INTO dml_batches(seq, rel_id, path, rows) VALUES (?, ?, ?, ?)",
                     (batch.seq, batch.rel_id, batch.path, batch.rows))
        self.put(conn, "max_dml_seq", str(batch.seq))

    def staged(self, upto: int | None = None) -> list[StagedBatch]:
        bound = upto if upto is not None else 2**62
        rows = self._conn.execute(
            "SELECT seq, rel_id, path, rows FROM dml_batches WHERE seq <= ? ORDER BY seq",
            (bound,)).fetchall()
        return [StagedBatch(r[0], r[1], r[2], r[3]) for r in rows]

    # --- sources --------------------------------------------------------------------------

    def add_source(self, conn: Conn, src: SourceRow) -> None:
        conn.execute(
            "INSERT INTO sources(rel_id, connector, options, dead_letter_id, epoch, batch, "
            "position) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (src.rel_id, src.connector, json.dumps(src.options), src.dead_letter_id, src.epoch,
             src.batch, json.dumps(src.position)))

    def sources(self) -> list[SourceRow]:
        rows = self._conn.execute("SELECT * FROM sources ORDER BY rel_id").fetchall()
        return [SourceRow(r["rel_id"], r["connector"], json.loads(r["options"]),
                          r["dead_letter_id"], r["epoch"], r["batch"],
                          None if r["position"] is None else json.loads(r["position"]),
                          r["rows"], r["dead_letters"], r["total_rows"],
                          r["total_dead_letters"]) for r in rows]

    def stage_source(self, src: SourceRow, batches: list[StagedBatch],
                     files: list[str]) -> None:
        """Stage one batch of a source's input in one transaction: its DML batches,
        its new offset (``src``: epoch, batch, position, rows, dead letters) and the
        files it consumed."""
        with self.transaction() as conn:
            for b in batches:
                self.add_dml(conn, b)
            if batches:
                self.put(conn, "max_dml_seq", str(max(b.seq for b in batches)))
            conn.execute(
                "UPDATE sources SET epoch = ?, batch = ?, position = ?, rows = ?, "
                "dead_letters = ?, total_rows = total_rows + ?, "
                "total_dead_letters = total_dead_letters + ? WHERE rel_id = ?",
                (src.epoch, src.batch, json.dumps(src.position), src.rows, src.dead_letters,
                 src.rows, src.dead_letters, src.rel_id))
            conn.executemany("INSERT INTO source_files(rel_id, name, epoch) VALUES (?, ?, ?)",
                             [(src.rel_id, f, src.epoch) for f in files])

    def source_files(self, rel_id: int) -> set[str]:
        rows = self._conn.execute("SELECT name FROM source_files WHERE rel_id = ?",
                                  (rel_id,)).fetchall()
        return {str(r[0]) for r in rows}

    # --- sinks ----------------------------------------------------------------------------

    def add_sink(self, sink: SinkRow) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO sinks(id, name, rel_id, connector, path, options, created_epoch) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sink.id, sink.name, sink.rel_id, sink.connector, sink.path,
                 json.dumps(sink.options), sink.created_epoch))
            self.put(conn, "max_sink_id", str(sink.id))

    def drop_sink(self, sink_id: int) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM sinks WHERE id = ?", (sink_id,))

    def sinks(self) -> list[SinkRow]:
        rows = self._conn.execute("SELECT * FROM sinks ORDER BY id").fetchall()
        return [SinkRow(r["id"], r["name"], r["rel_id"], r["connector"], r["path"],
                        json.loads(r["options"]), r["created_epoch"]) for r in rows]

    def next_sink_id(self) -> int:
        row = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM sinks").fetchone()
        used = int(self.get("max_sink_id", "0") or 0)
        return max(int(row[0]), used) + 1

    # --- progress -------------------------------------------------------------------------

    def progress(self, mv_id: int) -> list[ProgressRow]:
        rows = self._conn.execute(
            "SELECT * FROM backfill_progress WHERE mv_id = ? ORDER BY leaf, vnode",
            (mv_id,)).fetchall()
        return [_progress_row(r) for r in rows]

    def put_progress(self, conn: Conn, p: ProgressRow) -> None:
        conn.execute(
            "INSERT INTO backfill_progress(mv_id, leaf, vnode, state, pos, rows, pinned_epoch) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(mv_id, leaf, vnode) DO UPDATE SET "
            "state = excluded.state, pos = excluded.pos, rows = excluded.rows, "
            "pinned_epoch = excluded.pinned_epoch",
            (p.mv_id, p.leaf, p.vnode, p.state, None if p.pos is None else json.dumps(p.pos),
             p.rows, p.pinned_epoch))

    # --- epochs ---------------------------------------------------------------------------

    def pending_epoch(self) -> tuple[int, dict[str, Any]] | None:
        row = self._conn.execute("SELECT epoch, plan FROM pending_epoch").fetchone()
        return None if row is None else (int(row[0]), json.loads(row[1]))

    def begin_epoch(self, epoch: int, plan: dict[str, Any]) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM pending_epoch")
            conn.execute("INSERT INTO pending_epoch(epoch, plan) VALUES (?, ?)",
                         (epoch, json.dumps(plan)))

    def commit_epoch(self, c: EpochCommit) -> None:
        with self.transaction() as conn:
            for rel_id, version in c.versions.items():
                self.set_version(conn, rel_id, c.epoch, version)
            for rel_id, tag, version in c.tagged_versions:
                self.set_version(conn, rel_id, tag, version)
            for rel_id, delta in c.row_count_deltas.items():
                conn.execute("UPDATE relations SET row_count = row_count + ? WHERE id = ?",
                             (delta, rel_id))
            for p in c.progress:
                self.put_progress(conn, p)
            # the rows each creating job (this epoch's completed ones too) has backfilled
            jobs = {str(r[0]): int(r[1]) for r in conn.execute(
                "SELECT p.mv_id, SUM(p.rows) FROM backfill_progress p JOIN relations r "
                "ON r.id = p.mv_id WHERE r.state = 'creating' GROUP BY p.mv_id").fetchall()}
            for rel_id in c.created:
                conn.execute("UPDATE relations SET state = 'created', ready_epoch = ? WHERE id = ?",
                             (c.epoch, rel_id))
            for rel_id in c.dropped:
                self.drop_relation(conn, rel_id, c.dropped_folders.get(rel_id))
            for rel_id, definition in c.definitions.items():
                self.update_definition(conn, rel_id, definition)
            conn.execute("DELETE FROM dml_batches WHERE seq <= ?", (c.applied_dml_upto,))
            conn.execute("DELETE FROM pending_epoch")
            conn.execute(
                "INSERT INTO epochs(epoch, seconds, finished_at, backfill_seconds, changes, "
                "spark_jobs, jobs) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(epoch) DO UPDATE "
                "SET seconds = excluded.seconds, finished_at = excluded.finished_at, "
                "backfill_seconds = excluded.backfill_seconds, changes = excluded.changes, "
                "spark_jobs = excluded.spark_jobs, jobs = excluded.jobs",
                (c.epoch, c.seconds, c.finished_at, c.backfill_seconds, c.changes, c.spark_jobs,
                 json.dumps(jobs) if jobs else None))
            if (after := c.after_previous) is not None:
                conn.execute("UPDATE epochs SET commit_seconds = ?, warnings = ? WHERE epoch = ?",
                             (after.seconds, json.dumps(list(after.warnings))
                              if after.warnings else None, after.epoch))
            self.put(conn, "committed_epoch", str(c.epoch))
            for key, value in c.settings.items():
                self.put(conn, key, value)
            if c.proctime_us is not None:
                self.put(conn, "proctime_us", str(c.proctime_us))

    def recent_epochs(self, limit: int = 20) -> list[tuple[int, float, float]]:
        rows = self._conn.execute(
            "SELECT epoch, seconds, finished_at FROM epochs ORDER BY epoch DESC LIMIT ?",
            (limit,)).fetchall()
        return [(int(r[0]), float(r[1]), float(r[2])) for r in rows]

    def epoch_rows(self, limit: int = 20, epochs: Sequence[int] = ()) -> list[EpochRow]:
        """The last ``limit`` committed epochs' rows, oldest first, and those of
        ``epochs`` (any epoch, e.g. a backfill's first) among them."""
        rows = self._conn.execute(
            "SELECT * FROM epochs WHERE epoch > (SELECT COALESCE(MAX(epoch), 0) FROM epochs) - ?"
            " ORDER BY epoch", (limit,)).fetchall()
        wanted = sorted({int(e) for e in epochs} - {int(r["epoch"]) for r in rows})
        if wanted:
            marks = ", ".join("?" for _ in wanted)
            rows = self._conn.execute(f"SELECT * FROM epochs WHERE epoch IN ({marks})",
                                      wanted).fetchall() + rows
        return sorted(_epoch_rows(rows), key=lambda r: r.epoch)

    def last_versions(self) -> dict[int, tuple[int, int]]:
        """Each relation's last recorded (epoch, Delta version): the last epoch that
        changed it and the version its committed rows are at."""
        rows = self._conn.execute("SELECT rel_id, MAX(epoch), MAX(version) FROM "
                                  "relation_versions GROUP BY rel_id").fetchall()
        return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def all_progress(self) -> dict[int, list[ProgressRow]]:
        """``progress`` of every MV, by MV id (one query)."""
        out: dict[int, list[ProgressRow]] = {}
        rows = self._conn.execute(
            "SELECT * FROM backfill_progress ORDER BY mv_id, leaf, vnode").fetchall()
        for r in rows:
            out.setdefault(int(r["mv_id"]), []).append(_progress_row(r))
        return out

    # --- files ----------------------------------------------------------------------------

    def add_pending_dir(self, rel_id: int, dir_: str) -> None:
        with self.transaction() as conn:
            self.put_pending_dir(conn, rel_id, dir_)

    def put_pending_dir(self, conn: Conn, rel_id: int, dir_: str) -> None:
        """Register ``dir_`` (a URI) as pending in ``conn``'s transaction: recovery
        removes it unless ``rel_id``'s table references files under it."""
        conn.execute("INSERT INTO pending_dirs(dir, rel_id) VALUES (?, ?) "
                     "ON CONFLICT(dir) DO UPDATE SET rel_id = excluded.rel_id", (dir_, rel_id))

    def remove_pending_dir(self, dir_: str) -> None:
        self.remove_pending_dirs([dir_])

    def remove_pending_dirs(self, dirs: Sequence[str]) -> None:
        if not dirs:
            return
        with self.transaction() as conn:
            for dir_ in dirs:
                conn.execute("DELETE FROM pending_dirs WHERE dir = ?", (dir_,))

    def pending_dirs(self) -> list[tuple[int, str]]:
        rows = self._conn.execute("SELECT rel_id, dir FROM pending_dirs").fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def add_removed_files(self, conn: Conn, rel_id: int, epoch: int,
                          paths: list[str]) -> None:
        conn.executemany("INSERT INTO removed_files(rel_id, epoch, path) VALUES (?, ?, ?)",
                         [(rel_id, epoch, p) for p in paths])

    def removed_files_before(self, horizon: int) -> list[tuple[int, str]]:
        rows = self._conn.execute("SELECT rel_id, path FROM removed_files WHERE epoch <= ?",
                                  (horizon,)).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def forget_removed_files(self, conn: Conn, horizon: int) -> None:
        conn.execute("DELETE FROM removed_files WHERE epoch <= ?", (horizon,))


def _progress_row(r: Any) -> ProgressRow:
    return ProgressRow(r["mv_id"], r["leaf"], r["vnode"], r["state"],
                       None if r["pos"] is None else json.loads(r["pos"]), r["rows"],
                       r["pinned_epoch"])


def _epoch_rows(rows: Sequence[Any]) -> list[EpochRow]:
    """``epochs`` rows read with ``SELECT *`` (a column an older meta store lacks reads
    as None)."""
    if not rows:
        return []
    names = list(rows[0].keys())
    out = []
    for r in rows:
        d = dict(zip(names, r, strict=True))
        jobs, warnings, part = d.get("jobs"), d.get("warnings"), d.get("backfill_seconds")
        commit, changes, spark_jobs = d.get("commit_seconds"), d.get("changes"), \
            d.get("spark_jobs")
        out.append(EpochRow(
            int(d["epoch"]), float(d["seconds"]), float(d["finished_at"]),
            None if part is None else float(part), None if commit is None else float(commit),
            None if changes is None else int(changes),
            None if spark_jobs is None else int(spark_jobs),
            {} if jobs is None else {int(k): int(v) for k, v in json.loads(jobs).items()},
            () if warnings is None else tuple(json.loads(warnings))))
    return out


def _add_columns(conn: Any, pg: bool = False) -> None:
    """Add the columns of ``_ADDED_COLUMNS`` a writer's meta store lacks (a warehouse
    created by an earlier sparkfill); ``conn``: a sqlite3 or (``pg``) psycopg
    connection."""
    for table, column, kind in _ADDED_COLUMNS:
        cur = conn.execute(f"SELECT * FROM {table} LIMIT 0")
        if column not in [d[0] for d in cur.description or ()]:
            if pg:
                kind = {"REAL": "DOUBLE PRECISION", "INTEGER": "BIGINT"}.get(kind, kind)
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


# --- PostgreSQL ---------------------------------------------------------------------------

#: the file in a warehouse that names its PostgreSQL meta store (none: SQLite, meta.sqlite)
META_FILE = "meta.json"
_SCHEMES = ("postgresql", "postgres")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class PgTarget:
    """A warehouse's PostgreSQL meta store: the URL to connect with (its password,
    if any, is used only to connect, never shown or written) and the schema that
    holds the warehouse's tables."""

    url: str
    schema: str
    #: the warehouse folder, named in messages and the schema's comment
    warehouse: str = ""

    @property
    def shown(self) -> str:
        return redact_url(self.url)


def redact_url(url: str) -> str:
    """A PostgreSQL URL as sparkfill shows and records it: scheme ``postgresql``,
    no password (in the user part or a ``password=`` parameter), parameters sorted."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hostport = netloc.rsplit("@", 1)
        netloc = f"{userinfo.split(':', 1)[0]}@{hostport}"
    params = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                    if k != "password")
    query = urlencode(params)
    return f"postgresql://{netloc}{parts.path}" + (f"?{query}" if query else "")


def _meta_url(meta: str) -> str:
    if not isinstance(meta, str):
        raise InvalidOption(f"meta names a meta store by a postgresql://user@host:port/database "
                            f"URL (a string), or is None for SQLite; not {type(meta).__name__}")
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", meta)
    if m is None or m.group(1).lower() not in _SCHEMES:
        shown = re.sub(r"(//[^/:@]*):[^/@]*@", r"\1@", meta)  # no password in the message
        raise InvalidOption(
            f"meta={shown!r}: a meta store is named by a postgresql://user@host:port/database "
            "URL (postgres:// too), or meta=None for SQLite in the warehouse (meta.sqlite)")
    return meta


def _as_warehouse(warehouse: Warehouse | Path | str) -> Warehouse:
    return warehouse if isinstance(warehouse, Warehouse) else Warehouse(warehouse)


def _read_meta_file(warehouse: Warehouse | Path | str) -> dict[str, str] | None:
    wh = _as_warehouse(warehouse)
    path = wh.join(META_FILE)
    try:
        text = wh.read_text(path)
    except OSError as exc:  # an object store that cannot be reached
        raise SparkfillError(f"warehouse {wh.uri}: cannot read {META_FILE}: "
                             f"{' '.join(str(exc).split())}") from None
    if text is None:
        return None
    try:
        recorded = json.loads(text)
        meta, schema = str(recorded["meta"]), str(recorded["schema"])
    except (ValueError, KeyError, TypeError) as exc:
        raise MetaStoreError(f"{path}: not a meta store record ({exc})") from None
    if not _SCHEMA_NAME.match(schema):
        raise MetaStoreError(f"{path}: schema {schema!r} is not a sparkfill schema name")
    return {"meta": meta, "schema": schema}


def recorded_meta(warehouse: Warehouse | Path | str) -> str | None:
    """The PostgreSQL URL (less its password) the warehouse records in ``META_FILE``;
    None for a warehouse whose meta store is its SQLite file (or no warehouse)."""
    recorded = _read_meta_file(warehouse)
    return None if recorded is None else recorded["meta"]


def check_meta(warehouse: Warehouse | Path | str, meta: str | None) -> str | None:
    """The PostgreSQL URL of the warehouse's meta store (``meta``), or None for SQLite
    in the warehouse. Raises ``InvalidOption`` for another kind of URL and
    ``MetaStoreError`` when the warehouse was created with another meta store (a
    different URL, PostgreSQL while ``meta`` is None, or SQLite). Creates nothing."""
    url = None if meta is None else _meta_url(meta)
    warehouse = _as_warehouse(warehouse)
    if url is None and not warehouse.is_local:
        raise InvalidOption(
            f"warehouse {warehouse.uri}: a warehouse on {warehouse.scheme}:// keeps its meta "
            "store in PostgreSQL (SQLite needs a local disk): "
            "Engine(uri, meta='postgresql://user@host:port/database')")
    recorded = _read_meta_file(warehouse)
    if recorded is not None:
        if url is None:
            raise MetaStoreError(
                f"warehouse {warehouse} keeps its meta store in PostgreSQL ({recorded['meta']}, "
                f"schema {recorded['schema']}, recorded in {META_FILE}); open it with "
                f"Engine(path, meta={recorded['meta']!r}) (and its password, if it needs one)")
        if redact_url(url) != recorded["meta"]:
            raise MetaStoreError(
                f"warehouse {warehouse} keeps its meta store in {recorded['meta']} (schema "
                f"{recorded['schema']}, recorded in {META_FILE}), not in {redact_url(url)}; "
                f"open it with meta={recorded['meta']!r}")
    elif url is not None and warehouse.exists(warehouse.join("meta.sqlite")):
        raise MetaStoreError(
            f"warehouse {warehouse} keeps its meta store in SQLite (meta.sqlite, the default); "
            f"open it without meta= (its meta store does not move to {redact_url(url)})")
    return url


def _record_meta(warehouse: Warehouse, url: str, conn: Any) -> tuple[bool, str]:
    """The schema of the warehouse's meta store, recorded in META_FILE; a new one
    (``sf_<folder>_<random>``) written there if there is none. Whether it existed.
    Of two engines creating it at once the first wins: locally by a hard link, on
    an object store under an advisory lock on the warehouse's URI (``conn``)."""
    recorded = _read_meta_file(warehouse)
    if recorded is None:
        folder = Warehouse.name_of(warehouse.uri).lower()
        name = re.sub(r"[^a-z0-9]+", "_", folder).strip("_")[:24] or "warehouse"
        schema = f"sf_{name}_{uuid.uuid4().hex[:16]}"
        text = json.dumps({"meta": redact_url(url), "schema": schema}, indent=2) + "\n"
        key = _lock_key(f"create {warehouse.uri}")
        if not warehouse.is_local:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            if warehouse.create_text(warehouse.join(META_FILE), text):
                return False, schema
        finally:
            if not warehouse.is_local:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    check_meta(warehouse, url)
    recorded = _read_meta_file(warehouse)
    assert recorded is not None
    return True, recorded["schema"]


def _lock_key(schema: str) -> int:
    """The advisory lock key of a warehouse's writer: 64 bits of a hash of its schema
    (or of another name, for another lock)."""
    import hashlib

    digest = hashlib.sha256(f"sparkfill writer {schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def open_postgres(warehouse: Warehouse | Path | str, url: str,
                  read_only: bool) -> tuple[PgTarget, AdvisoryLock | None]:
    """The PostgreSQL meta store of the warehouse and, for a writer, its writer lock,
    held. A writer connects first (an unreachable server creates nothing), then
    creates the warehouse folder and its META_FILE (or reads the schema recorded
    there), then takes the lock. A reader needs an existing warehouse."""
    from .lock import AdvisoryLock

    warehouse = _as_warehouse(warehouse)
    if read_only:
        recorded = _read_meta_file(warehouse)
        if recorded is None:
            raise WarehouseReadOnly(f"{warehouse} is not a sparkfill warehouse; a read-only "
                                    "open needs one that exists")
        return PgTarget(url, recorded["schema"], warehouse.uri), None
    conn = _pg_connect(url, f"sparkfill writer pid {os.getpid()}@{os.uname().nodename}")
    try:
        warehouse.makedirs(warehouse.uri)
        existed, schema = _record_meta(warehouse, url, conn)
        target = PgTarget(url, schema, warehouse.uri)
        lock = AdvisoryLock(conn, _lock_key(schema),
                            f"{warehouse} (meta store {target.shown}, schema {schema})")
        lock.connect = lambda: _pg_connect(
            url, f"sparkfill writer pid {os.getpid()}@{os.uname().nodename}")
        lock.acquire()
        if existed and not _schema_exists(conn, schema) \
                and warehouse.list(warehouse.join("relations")):
            lock.release()
            raise MetaStoreError(
                f"warehouse {warehouse} has relations but its meta store {target.shown} has "
                f"no schema {schema} (dropped, or another database of the same URL?)")
    except BaseException:
        conn.close()
        raise
    return target, lock


def _pg_connect(url: str, application_name: str) -> Any:
    """A psycopg connection in autocommit mode (transactions are explicit) whose rows
    read like sqlite3.Row; a clear MetaStoreError if the server cannot be reached."""
    try:
        import psycopg
    except ImportError:
        raise MetaStoreError(
            f"meta={redact_url(url)!r} needs the PostgreSQL driver psycopg: "
            "pip install 'sparkfill[postgres]'") from None
    kwargs: dict[str, Any] = {"autocommit": True, "row_factory": _pg_row,
                              "prepare_threshold": None,
                              "application_name": application_name}
    if "connect_timeout" not in url:
        kwargs["connect_timeout"] = 10
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        password = urlsplit(url).password
        if password:
            text = text.replace(password, "***").replace(unquote(password), "***")
        raise MetaStoreError(f"meta store {redact_url(url)}: cannot connect: {text}") from None


def _schema_exists(conn: Any, schema: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                        (schema,)).fetchone() is not None


def _pg_open(target: PgTarget, read_only: bool) -> Any:
    """The meta store's own connection, its search_path the warehouse's schema; a
    writer's creates the schema and its tables, a reader's is read-only."""
    conn = _pg_connect(target.url, f"sparkfill {'reader' if read_only else 'meta'} "
                                   f"pid {os.getpid()}@{os.uname().nodename}")
    try:
        ident = f'"{target.schema}"'  # _SCHEMA_NAME: plain lower-case letters, digits, _
        if read_only:
            if not _schema_exists(conn, target.schema):
                raise WarehouseReadOnly(
                    f"{target.warehouse}: its meta store {target.shown} has no schema "
                    f"{target.schema} yet; a read-only open needs a warehouse that exists")
            conn.execute("SET default_transaction_read_only = on")
        elif not _schema_exists(conn, target.schema):
            comment = f"sparkfill warehouse {target.warehouse}".replace("'", "''")
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident}")
            conn.execute(f"COMMENT ON SCHEMA {ident} IS '{comment}'")
        conn.execute(f"SET search_path TO {ident}")
        if not read_only:
            conn.execute(_pg_schema())
            _add_columns(conn, pg=True)
    except BaseException:
        conn.close()
        raise
    return conn


@lru_cache(maxsize=1)
def _pg_schema() -> str:
    """_SCHEMA in PostgreSQL's types: 64-bit integers (row counts, sequence numbers
    and keys can pass 2^31), double precision seconds."""
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", re.sub(r"\bINTEGER\b", "BIGINT", _SCHEMA))


@lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    """A query with SQLite's ``?`` placeholders in psycopg's ``%s`` (the queries have no
    ``?`` or ``%`` of their own in literals)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _PgRow(tuple[Any, ...]):
    """A row read by index and by column name, like sqlite3.Row."""

    _names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _pg_row(cursor: Any) -> Callable[[Sequence[Any]], _PgRow]:
    names = {c.name: i for i, c in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> _PgRow:
        row = _PgRow(values)
        row._names = names
        return row

    return make


class _PgConn:
    """The dialect adapter: a psycopg connection that takes the meta store's queries
    as written for SQLite (see ``Conn``)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        cur: Cursor = self.raw.execute(_pg_sql(sql), tuple(parameters))
        return cur

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> Cursor:
        cur = self.raw.cursor()
        cur.executemany(_pg_sql(sql), [tuple(p) for p in seq_of_parameters])
        return cur  # type: ignore[no-any-return]
