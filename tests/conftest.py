"""Shared fixtures: one SparkSession for the whole run, a fresh warehouse
directory per test, and an Engine over it that is closed after the test.

The session is local, or, with ``SPARKFILL_TEST_CONNECT=1``, a Spark Connect
client of a server the fixture starts (``connect_server.py``); tests marked
``connect`` are the subset ``make test`` runs that way too."""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from helpers import assert_rows_equal, assert_same_rows  # noqa: E402,F401


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "connect: also run against a Spark Connect server (SPARKFILL_TEST_CONNECT=1)")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from connect_server import CONNECT_ENV, ConnectServer

    from sparkfill.session import REMOTE_ENV, build_spark_session

    if os.environ.get(CONNECT_ENV) != "1":
        session = build_spark_session(master="local[2]", shuffle_partitions=2)
        yield session
        session.stop()
        return
    with ConnectServer(tmp_path_factory.mktemp("connect")) as server:
        # processes a test starts (crash drivers, the CLI) connect to it too
        os.environ[REMOTE_ENV] = server.url
        session = build_spark_session(remote=server.url, shuffle_partitions=2)
        try:
            yield session
        finally:
            session.stop()
            os.environ.pop(REMOTE_ENV, None)


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server on loopback (moto), its AWS_* environment set."""
    from s3_server import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture
def s3_warehouse(s3_server):
    """The URI of a warehouse in a fresh bucket of ``s3_server``."""
    return f"s3://{s3_server.new_bucket()}/wh"


@pytest.fixture
def warehouse(tmp_path):
    path = tmp_path / "warehouse"
    path.mkdir()
    return str(path)


@pytest.fixture
def engine(warehouse, spark):
    from sparkfill import Engine

    eng = Engine(warehouse, spark=spark)
    try:
        yield eng
    finally:
        eng.close()


# --- a PostgreSQL server for the meta store ------------------------------------------------

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


def _pg_bin() -> Path:
    found = sorted((Path(d) for d in glob.glob(PG_BIN_GLOB) if Path(d, "initdb").is_file()),
                   key=lambda d: int(re.sub(r"\D", "", d.parent.name) or 0))
    if not found:
        pytest.fail("PostgreSQL's server binaries (/usr/lib/postgresql/<version>/bin/initdb) "
                    "are missing: install Debian's package with "
                    "`apt-get install -y postgresql` (.ci/run does this)", pytrace=False)
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_url():
    """The URL of a throwaway PostgreSQL server on loopback, stopped after the session."""
    bin_dir = _pg_bin()
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="sparkfill-pg-"))
    data = base / "data"
    if as_root:  # the server refuses to run as root: run it as Debian's postgres user
        if shutil.which("runuser") is None:
            pytest.fail("running as root needs runuser (util-linux) to start PostgreSQL "
                        "as the postgres user", pytrace=False)
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root needs the postgres system user of Debian's "
                        "postgresql package: apt-get install -y postgresql", pytrace=False)
        os.chown(base, pw.pw_uid, pw.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    log = base / "server.log"

    def run(*args: str) -> None:
        proc = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            extra = log.read_text()[-2000:] if log.is_file() else ""
            pytest.fail(f"{' '.join(args[:2])} failed:\n{proc.stdout}\n{proc.stderr}\n{extra}",
                        pytrace=False)

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", "sparkfill", "--auth=trust",
        "--no-locale", "--encoding=UTF8", "--no-sync")
    options = (f"-p {port} -h 127.0.0.1 -k '' -c fsync=off -c synchronous_commit=off "
               "-c full_page_writes=off -c shared_buffers=16MB -c max_connections=50")
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w",
        "-t", "60", "start")
    try:
        yield f"postgresql://sparkfill@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
