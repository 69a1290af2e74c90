"""A throwaway PostgreSQL server on loopback for the meta-store tests and benchmarks.

``pg_server()`` starts one from Debian's ``postgresql`` package on a free port (as the
``postgres`` user when run as root: the server refuses to run as root) and stops it
on exit (``restart(url)`` restarts it, ending every connection); without the package's
binaries it raises ``PgUnavailable`` saying how to install them (``.ci/run`` does)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import free_port

#: the server of each URL ``pg_server`` yields: how to restart it
_RESTARTS: dict[str, Callable[[], None]] = {}


def restart(url: str) -> None:
    """Restart the server of ``url`` (a fast shutdown: every connection ends)."""
    _RESTARTS[url]()


class PgUnavailable(RuntimeError):
    """The server cannot be started here."""


def _fail(message: str) -> None:
    raise PgUnavailable(message)


PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


def _pg_bin() -> Path:
    found = sorted((Path(d) for d in glob.glob(PG_BIN_GLOB) if Path(d, "initdb").is_file()),
                   key=lambda d: int(re.sub(r"\D", "", d.parent.name) or 0))
    if not found:
        _fail("PostgreSQL's server binaries (/usr/lib/postgresql/<version>/bin/initdb) "
                    "are missing: install Debian's package with "
                    "`apt-get install -y postgresql` (.ci/run does this)")
    return found[-1]


@contextmanager
def pg_server() -> Iterator[str]:
    """The URL of a throwaway PostgreSQL server on loopback, stopped on exit."""
    bin_dir = _pg_bin()
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="sparkfill-pg-"))
    data = base / "data"
    if as_root:  # the server refuses to run as root: run it as Debian's postgres user
        if shutil.which("runuser") is None:
            _fail("running as root needs runuser (util-linux) to start PostgreSQL "
                        "as the postgres user")
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            _fail("running as root needs the postgres system user of Debian's "
                        "postgresql package: apt-get install -y postgresql")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    log = base / "server.log"

    def run(*args: str) -> None:
        proc = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            extra = log.read_text()[-2000:] if log.is_file() else ""
            _fail(f"{' '.join(args[:2])} failed:\n{proc.stdout}\n{proc.stderr}\n{extra}",
                        pytrace=False)

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", "sparkfill", "--auth=trust",
        "--no-locale", "--encoding=UTF8", "--no-sync")
    options = (f"-p {port} -h 127.0.0.1 -k '' -c fsync=off -c synchronous_commit=off "
               "-c full_page_writes=off -c shared_buffers=16MB -c max_connections=50")
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w",
        "-t", "60", "start")
    url = f"postgresql://sparkfill@127.0.0.1:{port}/postgres"
    _RESTARTS[url] = lambda: run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log),
                                 "-o", options, "-m", "fast", "-w", "-t", "60", "restart")
    try:
        yield url
    finally:
        _RESTARTS.pop(url, None)
        subprocess.run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
