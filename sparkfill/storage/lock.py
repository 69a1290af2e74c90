"""The warehouse writer lock.

Invariant: at most one open Engine writes a warehouse at a time, across
processes and within one; the lock is an ``flock`` on ``writer.lock``, so the
operating system releases it when its holder dies, even by SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import WarehouseLocked

__all__ = ["WriterLock"]


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
