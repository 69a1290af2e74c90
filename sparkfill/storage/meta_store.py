"""The meta store: catalog, committed epoch, staged DML, backfill progress,
source offsets and sinks.

Invariant: the meta store is the source of truth for what is committed. An
epoch is committed exactly when ``commit_epoch`` returns; everything it
records (relation versions, progress, applied DML, row counts) lands in that
one SQLite transaction. Nothing above the committed epoch is ever read. A
source's offset advances in the same transaction that stages its input as DML
(``stage_source``), so an input is staged once and applied by one epoch.

SQLite is the default; the interface is small and plain SQL so that another
database can serve a cluster.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MetaStore", "RelationRow", "StagedBatch", "ProgressRow", "EpochCommit", "SourceRow",
           "SinkRow"]

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
    finished_at REAL NOT NULL);
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


class MetaStore:
    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = path
        if read_only:
            uri = f"file:{path}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, isolation_level=None,
                                         check_same_thread=False)
        else:
            self._conn = sqlite3.connect(str(path), isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
        self._conn.row_factory = sqlite3.Row

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")

    # --- key/value ------------------------------------------------------------------------

    def get(self, key: str, default: str | None = None) -> str | None:
        row = self._conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return default if row is None else str(row[0])

    def put(self, conn: sqlite3.Connection, key: str, value: str) -> None:
        conn.execute("INSERT INTO kv(key, value) VALUES (?, ?) "
                     "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    @property
    def committed_epoch(self) -> int:
        return int(self.get("committed_epoch", "0") or 0)

    # --- catalog --------------------------------------------------------------------------

    def relations(self) -> list[RelationRow]:
        rows = self._conn.execute("SELECT * FROM relations ORDER BY id").fetchall()
        return [self._relation(r) for r in rows]

    @staticmethod
    def _relation(r: sqlite3.Row) -> RelationRow:
        return RelationRow(r["id"], r["name"], r["kind"], json.loads(r["definition"]),
                           r["state"], r["created_epoch"], r["row_count"], r["dir"],
                           r["ready_epoch"])

    def next_relation_id(self) -> int:
        row = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM relations").fetchone()
        used = int(self.get("max_relation_id", "0") or 0)
        return max(int(row[0]), used) + 1

    def add_relation(self, conn: sqlite3.Connection, rel: RelationRow, version: int) -> None:
        conn.execute(
            "INSERT INTO relations(id, name, kind, definition, state, created_epoch, row_count,"
            " dir, ready_epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rel.id, rel.name, rel.kind, json.dumps(rel.definition), rel.state,
             rel.created_epoch, rel.row_count, rel.dir, rel.ready_epoch),
        )
        self.put(conn, "max_relation_id", str(rel.id))
        conn.execute("INSERT OR REPLACE INTO relation_versions(rel_id, epoch, version) "
                     "VALUES (?, ?, ?)", (rel.id, rel.created_epoch, version))

    def drop_relation(self, conn: sqlite3.Connection, rel_id: int) -> None:
        for table in ("relation_versions", "dml_batches", "removed_files", "pending_dirs",
                      "sources", "source_files"):
            conn.execute(f"DELETE FROM {table} WHERE rel_id = ?", (rel_id,))
        conn.execute("DELETE FROM backfill_progress WHERE mv_id = ?", (rel_id,))
        conn.execute("DELETE FROM relations WHERE id = ?", (rel_id,))

    def update_definition(self, conn: sqlite3.Connection, rel_id: int,
                          definition: dict[str, Any]) -> None:
        conn.execute("UPDATE relations SET definition = ? WHERE id = ?",
                     (json.dumps(definition), rel_id))

    def reset_relation(self, conn: sqlite3.Connection, rel_id: int, dir_: str, epoch: int,
                       version: int) -> None:
        """Point a relation at a new, empty Delta table (a restarted creating job)."""
        conn.execute("UPDATE relations SET dir = ?, row_count = 0 WHERE id = ?", (dir_, rel_id))
        conn.execute("DELETE FROM relation_versions WHERE rel_id = ?", (rel_id,))
        conn.execute("INSERT INTO relation_versions(rel_id, epoch, version) VALUES (?, ?, ?)",
                     (rel_id, epoch, version))

    def set_created_epoch(self, conn: sqlite3.Connection, rel_id: int, epoch: int) -> None:
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

    def set_version(self, conn: sqlite3.Connection, rel_id: int, epoch: int,
                    version: int) -> None:
        conn.execute("INSERT OR REPLACE INTO relation_versions(rel_id, epoch, version) "
                     "VALUES (?, ?, ?)", (rel_id, epoch, version))

    def prune_versions(self, conn: sqlite3.Connection, horizon: int) -> None:
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

    def add_dml(self, conn: sqlite3.Connection, batch: StagedBatch) -> None:
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

    def add_source(self, conn: sqlite3.Connection, src: SourceRow) -> None:
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
        return [ProgressRow(r["mv_id"], r["leaf"], r["vnode"], r["state"],
                            None if r["pos"] is None else json.loads(r["pos"]), r["rows"],
                            r["pinned_epoch"]) for r in rows]

    def put_progress(self, conn: sqlite3.Connection, p: ProgressRow) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO backfill_progress(mv_id, leaf, vnode, state, pos, rows, "
            "pinned_epoch) VALUES (?, ?, ?, ?, ?, ?, ?)",
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
            for rel_id in c.created:
                conn.execute("UPDATE relations SET state = 'created', ready_epoch = ? WHERE id = ?",
                             (c.epoch, rel_id))
            conn.execute("DELETE FROM dml_batches WHERE seq <= ?", (c.applied_dml_upto,))
            conn.execute("DELETE FROM pending_epoch")
            conn.execute("INSERT OR REPLACE INTO epochs(epoch, seconds, finished_at) "
                         "VALUES (?, ?, ?)", (c.epoch, c.seconds, c.finished_at))
            self.put(conn, "committed_epoch", str(c.epoch))

    def recent_epochs(self, limit: int = 20) -> list[tuple[int, float, float]]:
        rows = self._conn.execute(
            "SELECT epoch, seconds, finished_at FROM epochs ORDER BY epoch DESC LIMIT ?",
            (limit,)).fetchall()
        return [(int(r[0]), float(r[1]), float(r[2])) for r in rows]

    # --- files ----------------------------------------------------------------------------

    def add_pending_dir(self, rel_id: int, dir_: str) -> None:
        with self.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO pending_dirs(dir, rel_id) VALUES (?, ?)",
                         (dir_, rel_id))

    def remove_pending_dir(self, dir_: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM pending_dirs WHERE dir = ?", (dir_,))

    def pending_dirs(self) -> list[tuple[int, str]]:
        rows = self._conn.execute("SELECT rel_id, dir FROM pending_dirs").fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def add_removed_files(self, conn: sqlite3.Connection, rel_id: int, epoch: int,
                          paths: list[str]) -> None:
        conn.executemany("INSERT INTO removed_files(rel_id, epoch, path) VALUES (?, ?, ?)",
                         [(rel_id, epoch, p) for p in paths])

    def removed_files_before(self, horizon: int) -> list[tuple[int, str]]:
        rows = self._conn.execute("SELECT rel_id, path FROM removed_files WHERE epoch <= ?",
                                  (horizon,)).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def forget_removed_files(self, conn: sqlite3.Connection, horizon: int) -> None:
        conn.execute("DELETE FROM removed_files WHERE epoch <= ?", (horizon,))
