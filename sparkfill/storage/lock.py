"""The warehouse writer lock.

Invariant: at most one open Engine writes a warehouse at a time, across
processes, machines and within one process. With the SQLite meta store the lock
is an ``flock`` on ``writer.lock``, so the operating system releases it when its
holder dies, even by SIGKILL. With a PostgreSQL meta store it is a session-level
advisory lock (``AdvisoryLock``, keyed by the warehouse's schema) held on a
connection of its own while the Engine is open: it needs no shared filesystem,
and the server releases it when that connection ends, which a SIGKILLed holder's
does at once (a holder whose machine vanishes: when the server's TCP keepalive
gives up). Every write transaction first checks that the lock is still held
(``AdvisoryLock.check``), so a writer whose lock connection died writes nothing
until it took the lock again (``reacquire``, on a new connection: the Engine's next
call after a server restart), refused if another engine took it meanwhile.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import WarehouseLocked

__all__ = ["WriterLock", "AdvisoryLock"]


class WriterLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise WarehouseLocked(
                f"warehouse {self.path.parent} is open for writing by another engine "
                f"(pid {holder}); close it first, or open it for reading beside its writer "
                f"with Engine(path, read_only=True)") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class AdvisoryLock:
    """The writer lock of a warehouse whose meta store is PostgreSQL: a session-level
    ``pg_try_advisory_lock(key)`` on ``conn``, a psycopg connection (autocommit) used
    for nothing else. ``name`` describes the warehouse in messages."""

    def __init__(self, conn: Any, key: int, name: str) -> None:
        self.conn: Any = conn
        self.key = key
        self.name = name
        self._pid: int | None = None
        #: opens a new connection for ``reacquire`` (set by whoever opened ``conn``)
        self.connect: Callable[[], Any] | None = None

    @property
    def lost(self) -> bool:
        """Whether the lock's connection ended (so the server released the lock)."""
        return bool(self.conn.closed or self.conn.broken)

    def reacquire(self) -> None:
        """Take the lock again on a new connection, once ``lost`` (a server restart);
        ``WarehouseLocked`` if another engine took it meanwhile."""
        if self.connect is None:
            raise WarehouseLocked(f"warehouse {self.name}: this engine lost its writer lock "
                                  "(its connection to the meta store ended); close it and "
                                  "open the warehouse again")
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - it is gone already
            pass
        self._pid = None
        self.conn = self.connect()
        self.acquire()

    def acquire(self) -> None:
        if not self.conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0]:
            holder = self._holder()
            self.conn.close()
            raise WarehouseLocked(
                f"warehouse {self.name} is open for writing by another engine ({holder}); "
                f"close it first, or open it for reading beside its writer with "
                f"Engine(path, meta=..., read_only=True)")
        self._pid = int(self.conn.execute("SELECT pg_backend_pid()").fetchone()[0])

    def _ids(self) -> tuple[int, int]:
        """pg_locks' classid and objid of a bigint advisory key."""
        unsigned = self.key & 0xFFFFFFFFFFFFFFFF
        return unsigned >> 32, unsigned & 0xFFFFFFFF

    def _holder(self) -> str:
        classid, objid = self._ids()
        try:
            row = self.conn.execute(
                "SELECT a.application_name, a.client_addr, l.pid FROM pg_locks l "
                "LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
                "AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid "
                "AND l.objsubid = 1 AND l.granted", (classid, objid)).fetchone()
        except Exception:  # noqa: BLE001 - only for the message
            return "holder unknown"
        if row is None:
            return "holder unknown"
        who = row[0] or "an unnamed client"
        return f"{who}, client {row[1] or 'local'}, server process {row[2]}"

    def check(self, conn: Any) -> None:
        """Raise unless this lock is still held: run by each write transaction of the
        meta store (``conn``, inside it), so a writer whose lock connection ended
        (server restart, network) commits nothing another writer could contradict."""
        classid, objid = self._ids()
        row = conn.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = ? "
            "AND classid = ?::bigint::oid AND objid = ?::bigint::oid AND objsubid = 1 "
            "AND granted", (self._pid, classid, objid)).fetchone()
        if row is None:
            raise WarehouseLocked(
                f"warehouse {self.name}: this engine lost its writer lock (its connection to "
                "the meta store ended); close it and open the warehouse again")

    def release(self) -> None:
        if self._pid is not None and not self.conn.closed:
            try:
                self.conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except Exception:  # noqa: BLE001 - closing the connection releases it too
                pass
        self._pid = None
        if not self.conn.closed:
            self.conn.close()
