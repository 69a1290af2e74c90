"""Shared fixtures: one SparkSession for the whole run, a fresh warehouse
directory per test, and an Engine over it that is closed after the test.

The session is local, or, with ``SPARKFILL_TEST_CONNECT=1``, a Spark Connect
client of a server the fixture starts (``connect_server.py``); tests marked
``connect`` are the subset ``make test`` runs that way too."""

from __future__ import annotations

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from helpers import assert_rows_equal, assert_same_rows  # noqa: E402,F401

#: Every JVM the tests start (each worker's session, the crash drivers, the CLI, the
#: Spark Connect servers, the cluster's master, workers and executors: they inherit
#: this environment) compiles with C1 alone, not C1 then C2: a test's plans change
#: from test to test over relations of a few rows, and C2's compiles of Spark cost
#: more CPU on two cores than its faster code gives back. C1 alone gets Java's small
#: code cache (48 MiB, where tiered compilation gets 240 MiB); a worker's JVM lives
#: the whole run and fills it, after which Java stops compiling or evicts and
#: compiles again, so the cache is tiered compilation's size. Measured:
#: bench/RESULTS.md, stops 67 and 71.
os.environ.setdefault("JDK_JAVA_OPTIONS",
                      "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "connect: also run against a Spark Connect server (SPARKFILL_TEST_CONNECT=1)")
    config.addinivalue_line(
        "markers", "extended: a larger or repeated variant of a test CI runs (another "
        "strategy pair, a longer history, more queries of a benchmark); `make test` "
        "deselects them, `make torture` runs them")


#: tests that take a minute or more (a cluster, an S3 server, SIGKILLed drivers, many
#: epochs): run first, so that on ``make test``'s workers the last tests to
#: finish are short ones
LONG_TESTS = ("test_cluster_faults.py", "test_object_store.py", "test_nexmark.py",
              "test_source_crash.py", "test_crash.py", "sigkill", "decorrelated",
              "random_shapes", "test_arrangement_is_default", "test_drifting_scalar.py",
              "test_column_lists_created_online", "test_durability.py", "test_faults.py",
              "test_tpcds_queries_created_online", "test_new_shapes_created_online")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not any(name in item.nodeid for name in LONG_TESTS))


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from connect_server import CONNECT_ENV, ConnectServer
    from session_conf import TEST_SPARK_CONF

    from sparkfill.session import REMOTE_ENV, build_spark_session

    if os.environ.get(CONNECT_ENV) != "1":
        session = build_spark_session(master="local[2]", shuffle_partitions=2,
                                      extra_conf=TEST_SPARK_CONF)
        yield session
        session.stop()
        return
    with ConnectServer(tmp_path_factory.mktemp("connect"),
                       extra_conf=TEST_SPARK_CONF) as server:
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

@pytest.fixture(scope="session")
def pg_url():
    """The URL of a throwaway PostgreSQL server on loopback, stopped after the session."""
    from pg_server import PgUnavailable, pg_server

    server = pg_server()
    try:
        url = server.__enter__()
    except PgUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield url
    finally:
        server.__exit__(None, None, None)
