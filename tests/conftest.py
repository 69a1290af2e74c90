"""Shared fixtures: one local SparkSession for the whole run, a fresh warehouse
directory per test, and an Engine over it that is closed after the test."""

from __future__ import annotations

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from helpers import assert_rows_equal, assert_same_rows  # noqa: E402,F401


@pytest.fixture(scope="session")
def spark():
    from sparkfill.session import build_spark_session

    session = build_spark_session(master="local[2]", shuffle_partitions=2)
    yield session
    session.stop()


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
