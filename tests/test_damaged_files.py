"""Damaged files (issue 35, item 4): a data file of a table, an MV or a state table
deleted or truncated by hand. Reads (``Engine.read``, VERIFY, queries) and epochs
raise ``DamagedFile`` naming the relation (an internal one as a part of its MV) and
the file, having committed nothing; nothing is read as other rows. A table's file
put back makes the warehouse whole again; ``ALTER MATERIALIZED VIEW m RECOMPUTE``
repairs an MV whose own or whose state tables' files are damaged: the next epoch
rebuilds them from the upstreams without reading them, and MVs downstream take the
difference like any change."""

from __future__ import annotations

import os

import pytest

from sparkfill import DamagedFile

ROWS = [{"id": i, "g": i % 3, "v": 10 * i} for i in range(12)]


def data_files(eng, name: str, kind: str | None = None):
    """The data files of relation ``name`` (an internal one too) at the committed
    epoch."""
    rel = eng.catalog.get(name)
    return [f for f in eng.store.files_at(rel.stored, eng.committed_epoch)
            if kind is None or f.kind == kind]


def truncate(path: str) -> bytes:
    """Cut the file to half its bytes; its old bytes."""
    with open(path, "rb") as fh:
        data = fh.read()
    with open(path, "r+b") as fh:
        fh.truncate(len(data) // 2)
    return data


def delete(path: str) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read()
    os.remove(path)
    return data


def restore(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def damaged(fn, *words: str) -> DamagedFile:
    """``fn()`` raises DamagedFile whose message holds every one of ``words``."""
    with pytest.raises(DamagedFile) as info:
        fn()
    for word in words:
        assert word in str(info.value), f"{str(info.value)!r} does not name {word!r}"
    return info.value


def batch(spark, eng, sql: str):
    return spark.sql(sql, t=eng.read("t"))


@pytest.mark.parametrize("how", ["truncated", "deleted"])
def test_damaged_table_file(engine, spark, how):
    eng = engine
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", ROWS)
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS "
            "SELECT id, v * 2 AS w FROM t WHERE g <> 1")
    eng.step()
    [f] = data_files(eng, "t")
    saved = truncate(f.uri) if how == "truncated" else delete(f.uri)
    found = "truncated" if how == "truncated" else "is missing"

    # every read of the table says what and where; nothing is read as other rows
    damaged(lambda: eng.read("t"), "table 't'", f.uri, found)
    damaged(lambda: eng.sql("SELECT count(*) FROM t"), "table 't'", f.uri)
    damaged(lambda: eng.verify("m"), "table 't'", f.uri)
    # the MV's own files are whole: it reads
    assert eng.read("m").count() == 8
    # an epoch whose change looks the table's rows up fails, committing nothing
    epoch = eng.committed_epoch
    eng.insert("t", [{"id": 4, "g": 0, "v": -1}])
    damaged(eng.step, "table 't'", f.uri, "restore the file")
    assert eng.committed_epoch == epoch

    # the file put back: the epoch runs, exactly once
    restore(f.uri, saved)
    eng.step()
    expected = {r["id"]: r["v"] for r in ROWS} | {4: -1}
    assert sorted((r.id, r.v) for r in eng.read("t").collect()) == sorted(expected.items())
    assert eng.verify("m").count() == 0
