"""The engine's durability points, named and counted from outside it (issue 35, item 1).

``install()`` wraps, in the running process, every function through which sparkfill
makes something durable or visible, and calls ``reached(point)`` right after each
one did its work (or, for a fault, right before). A *point* is the kind of act and
the sparkfill function that asked for it, e.g. ``delta.commit:_commit_append``,
``meta:commit_epoch``, ``parquet:_write_arrow``, ``rename:stage``,
``text:write_chunk``, ``spark.write:write_chunk``, ``rm:vacuum``:

========================  ===============================================================
``parquet``               a Parquet file written on the driver (``pyarrow.parquet``)
``spark.write``           Parquet files written by a Spark job (``DataFrameWriter.parquet``)
``delta.commit``          a Delta commit (``create_write_transaction``): table, MV, state,
                          sink, compaction, merge, reset
``delta.create``          a Delta table created (a relation, a sink)
``delta.checkpoint``      a Delta checkpoint written
``delta.alter``           a Delta schema change (columns added)
``delta.vacuum``          a Delta vacuum (a sink's)
``meta``                  a meta-store transaction committed (``MetaStore.transaction``):
                          staged DML, source offsets, epochs begun and committed, DDL, ...
``rename``                a staged DML batch renamed to its final name
``text``                  a text file replaced atomically (a snapshot job's plan, chunk
                          markers and manifest)
``link``                  a file linked or copied (compaction adopting log files as base)
``rm``                    files removed (vacuum, cleanup, DROP); only when there was some
========================  ===============================================================

The process's environment says what to do at the points:

- ``SPARKFILL_POINTS_LOG=path``: append each point reached to ``path``, one a line;
- ``SPARKFILL_CRASH_AT=point#k``: ``os._exit(CRASH_EXIT)`` right after the ``k``-th
  occurrence of ``point`` (as SIGKILL would: no ``finally``, no flush, no atexit);
  ``*#n``: after the ``n``-th act of any kind;
- ``SPARKFILL_FAULT_AT=point#k``: the ``k``-th occurrence of ``point`` raises
  ``OSError(ENOSPC)`` instead of doing its work (a full disk), once.

Invariant: a point is counted once per act, in the order the acts happen (a
thread-safe counter per point), whatever thread does it; nothing in sparkfill is
changed but the wrapped functions' names.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

LOG_ENV = "SPARKFILL_POINTS_LOG"
CRASH_ENV = "SPARKFILL_CRASH_AT"
FAULT_ENV = "SPARKFILL_FAULT_AT"
#: the exit status of a process killed at a point
CRASH_EXIT = 86
#: ``SPARKFILL_CRASH_AT=*#n``: crash after the n-th act of any kind (a crash of a
#: recovery, counted from the process's start)
ANY = "*"

_lock = threading.Lock()
counts: Counter[str] = Counter()
_installed = False
_log: Any = None
_crash: tuple[str, int] | None = None
_fault: tuple[str, int] | None = None
#: the injected fault (``inject``): what it raises, and whether after the act (the
#: act done, its caller told it failed: an ambiguous outcome) or instead of it
_raise: Callable[[], BaseException] | None = None
_raise_after = False
#: the faults injected so far, as ``point#k``
fired: list[str] = []
#: frames of these files and functions are the generic layers: a point is named after
#: the sparkfill function that called into them (a link's after ``_link_as_base`` or
#: ``_link_prepared``, not their shared ``_link_files``; vacuum's removal after
#: ``vacuum``, not ``RelationStore.remove_file``, which removes a file and its keyed copy)
_GENERIC_FILES = ("storage/warehouse.py", "storage/spark_files.py", "contextlib.py",
                  os.path.basename(__file__))
_GENERIC_FUNCS = {"transaction", "_link_files", "remove_file"}


def parse_site(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    point, _, k = text.rpartition("#")
    return point, int(k)


def caller() -> str:
    """The sparkfill function that asked for the act being done."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if ("/sparkfill/" in path and "/tests/" not in path
                and not path.endswith(_GENERIC_FILES)
                and frame.f_code.co_name not in _GENERIC_FUNCS):
            return frame.f_code.co_name
        frame = frame.f_back
    return "?"


def _next(kind: str) -> tuple[str, int]:
    point = f"{kind}:{caller()}"
    with _lock:
        counts[point] += 1
        counts[ANY] += 1
        if _crash is not None and _crash[0] == ANY:  # the n-th act of any kind
            return ANY, counts[ANY]
        return point, counts[point]


def _enospc(site: tuple[str, int]) -> BaseException:
    return OSError(errno.ENOSPC, f"No space left on device (injected at {site[0]}#{site[1]})")


def inject(site: tuple[str, int] | None, make: Callable[[], BaseException] | None = None,
           after_act: bool = False) -> None:
    """Make the act at ``site`` fail once with ``make()`` (default: ``ENOSPC``), in place
    of the act or, with ``after_act``, once it is done; None: no fault."""
    global _fault, _raise, _raise_after
    _fault, _raise, _raise_after = site, make, after_act


def _fail(site: tuple[str, int]) -> None:
    global _fault
    if _fault is None or _fault != site:
        return
    _fault = None  # once
    fired.append(f"{site[0]}#{site[1]}")
    _emit(f"FAULT {site[0]}#{site[1]}")
    raise (_raise() if _raise is not None else _enospc(site))


def before(kind: str) -> tuple[str, int]:
    """Count an act about to happen; raise the injected fault when it is the one."""
    site = _next(kind)
    if not _raise_after:
        _fail(site)
    return site


def after(site: tuple[str, int]) -> None:
    """The act counted by ``before`` is done: log it; crash when it is the one (or
    raise the fault injected after it)."""
    if _raise_after:
        _fail(site)
    point, k = site
    if _log is not None:
        with _lock:
            _log.write(f"{point}\n")
            _log.flush()
    if _crash is not None and _crash == (point, k):
        _emit(f"CRASH {point}#{k}")
        os._exit(CRASH_EXIT)


#: a boundary's mark in the points log (``mark``): not a point
BOUNDARY = "@boundary "


def mark(line: str) -> None:
    """Write ``line`` to the points log (when logging): a boundary between acts."""
    if _log is not None:
        with _lock:
            _log.write(f"{line}\n")
            _log.flush()


def _emit(line: str) -> None:
    try:
        os.write(1, (line + "\n").encode())
    except OSError:
        pass


def _wrap(owner: Any, name: str, kind: str | Callable[..., str | None]) -> None:
    inspected = owner.__dict__.get(name) if isinstance(owner, type) else None
    raw = (inspected.__func__ if isinstance(inspected, classmethod | staticmethod)
           else getattr(owner, name))
    if getattr(raw, "_sf_point", False):
        return

    @functools.wraps(raw)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        k = kind(*args, **kwargs) if callable(kind) else kind
        if k is None:
            return raw(*args, **kwargs)
        site = before(k)
        result = raw(*args, **kwargs)
        after(site)
        return result

    wrapper._sf_point = True  # type: ignore[attr-defined]
    if isinstance(inspected, classmethod):
        setattr(owner, name, classmethod(wrapper))
    elif isinstance(inspected, staticmethod):
        setattr(owner, name, staticmethod(wrapper))
    else:
        setattr(owner, name, wrapper)


def install() -> None:
    """Wrap the durability functions (once per process) and read the environment."""
    global _installed, _log, _crash, _fault
    if _installed:
        return
    _installed = True
    _crash = parse_site(os.environ.get(CRASH_ENV))
    _fault = parse_site(os.environ.get(FAULT_ENV))
    if os.environ.get(LOG_ENV):
        _log = open(os.environ[LOG_ENV], "a")  # noqa: SIM115 - open for the process's life

    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.table import TableAlterer
    from pyspark.sql.readwriter import DataFrameWriter

    import sparkfill.storage.dml as dml
    from sparkfill.storage import meta_store, warehouse

    _wrap(pq, "write_table", "parquet")
    _wrap(DeltaTable, "create_write_transaction", "delta.commit")
    _wrap(DeltaTable, "create", "delta.create")
    _wrap(DeltaTable, "create_checkpoint", "delta.checkpoint")
    _wrap(DeltaTable, "vacuum", "delta.vacuum")
    _wrap(TableAlterer, "add_columns", "delta.alter")
    _wrap(DataFrameWriter, "parquet", "spark.write")
    try:
        from pyspark.sql.connect.readwriter import DataFrameWriter as ConnectWriter
    except ImportError:  # the Connect client's extras are not installed
        pass
    else:
        _wrap(ConnectWriter, "parquet", "spark.write")
    W = warehouse.Warehouse
    _wrap(W, "write_text", "text")
    _wrap(W, "create_text", lambda self, uri, text: None if self.exists(uri) else "text")
    _wrap(W, "link_or_copy", "link")
    _wrap(W, "rmtree", lambda self, uri: "rm" if self.exists(uri) else None)

    # a staged DML batch's rename to its final name (``os.replace`` in dml.py only)
    real_os = dml.os
    proxy = types.ModuleType("os")
    proxy.__dict__.update(real_os.__dict__)

    def replace(src: Any, dst: Any) -> None:
        site = before("rename")
        real_os.replace(src, dst)
        after(site)

    proxy.replace = replace  # type: ignore[attr-defined]
    dml.os = proxy  # type: ignore[attr-defined]

    # a meta-store transaction: the point is its COMMIT
    M = meta_store.MetaStore
    original = M.transaction

    @contextlib.contextmanager
    def transaction(self: Any) -> Iterator[Any]:
        site = _next("meta")
        with original(self) as conn:
            yield conn
            if not _raise_after:  # the COMMIT fails: rolled back
                _fail(site)
        after(site)

    transaction._sf_point = True  # type: ignore[attr-defined]
    M.transaction = transaction  # type: ignore[assignment]
