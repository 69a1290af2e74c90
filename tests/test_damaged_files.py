"""Damaged files (issue 35, item 4): a data file of a table, an MV or a state table
deleted, truncated or overwritten (with what is not a Parquet file) by hand. Reads
(``Engine.read``, VERIFY, queries) and epochs raise ``DamagedFile`` naming the
relation (an internal one as a part of its MV) and the file, having committed
nothing; nothing is read as other rows. A table's file put back makes the warehouse
whole again; ``ALTER MATERIALIZED VIEW m RECOMPUTE`` repairs an MV whose own or whose
state tables' files are damaged: the next epoch rebuilds them from the upstreams
without reading them, and MVs downstream take the difference like any change."""

from __future__ import annotations

import os

import pytest
from deltalake import DeltaTable
from helpers import assert_same_rows

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


def overwrite(path: str) -> bytes:
    """Write bytes that are not a Parquet file over the file; its old bytes."""
    with open(path, "rb") as fh:
        data = fh.read()
    with open(path, "wb") as fh:
        fh.write(b"not parquet " * 100)
    return data


@pytest.mark.parametrize("how", ["truncated", "deleted", "overwritten"])
def test_damaged_table_file(engine, spark, how):
    eng = engine
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", ROWS)
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS "
            "SELECT id, v * 2 AS w FROM t WHERE g <> 1")
    eng.step()
    [f] = data_files(eng, "t")
    saved = {"truncated": truncate, "deleted": delete, "overwritten": overwrite}[how](f.uri)
    found = "is missing" if how == "deleted" else "not a whole Parquet file"

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


def sink_rows(path) -> list[tuple]:
    return sorted(tuple(r.values()) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def test_damaged_mv_and_state_files_repaired_by_recompute(engine, spark, tmp_path):
    eng = engine
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", ROWS)
    eng.step()
    queries = {
        # a projection: its rule never reads its own rows, so epochs go on over its
        # damaged file (its sink's write is what fails); an MV downstream reads it
        "proj": "SELECT id, v + 1 AS w FROM t WHERE g <> 2",
        # count(DISTINCT) keeps its input rows in a state table (a running min over
        # one leaf would keep none: it finds a lost min in t)
        "agg": "SELECT g, count(*) AS n, count(DISTINCT v) AS lo FROM t GROUP BY g",
        "top": "SELECT id, v FROM t ORDER BY v DESC LIMIT 3",
    }
    for name, sql in queries.items():
        eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS {sql}")
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW down WITH (backfill = 'blocking') AS "
            "SELECT g, n, lo FROM agg WHERE n > 0")
    eng.sql("CREATE MATERIALIZED VIEW proj_down WITH (backfill = 'blocking') AS "
            "SELECT id, w FROM proj WHERE w > 20")
    eng.sql(f"CREATE SINK s FROM proj WITH (connector = 'delta', path = '{tmp_path / 's'}')")
    eng.step()
    assert sink_rows(tmp_path / "s") == sorted(tuple(r) for r in eng.read("proj").collect())

    # the projection's file truncated: reads refuse it; an epoch that does not read
    # it commits, and its sink's write, which does, is a warning
    [proj_file] = data_files(eng, "proj")
    truncate(proj_file.uri)
    damaged(lambda: eng.read("proj"), "materialized view 'proj'", proj_file.uri, "truncated",
            "ALTER MATERIALIZED VIEW proj RECOMPUTE")
    eng.sql("UPDATE t SET v = v + 1")  # every row: the sink rewrites every bucket
    report = eng.step()
    assert any(proj_file.uri in w for w in report.warnings), report.warnings
    # the next epoch runs though the sink still cannot catch up before it
    eng.insert("t", [{"id": 30, "g": 0, "v": 300}])
    report = eng.step()
    assert any(proj_file.uri in w for w in report.warnings), report.warnings

    # the aggregate's and the top-N's own files and the aggregate's state damaged
    state = next(r.name for r in eng.catalog.states_of(eng.catalog.get("agg")))
    mv_file = data_files(eng, "agg")[0]
    state_file = data_files(eng, state)[0]
    top_file = data_files(eng, "top")[0]
    delete(mv_file.uri)
    truncate(state_file.uri)
    delete(top_file.uri)
    damaged(lambda: eng.read("agg"), "materialized view 'agg'", mv_file.uri, "is missing")
    damaged(lambda: eng.read("top"), "materialized view 'top'", top_file.uri)
    # an internal relation is named as a part of its MV, never by its own name
    exc = damaged(lambda: eng.store.snapshot(eng.catalog.get(state).stored,
                                             eng.committed_epoch),
                  "materialized view 'agg' (a state table of it)", state_file.uri, "truncated")
    assert "__sf_" not in str(exc).replace(state_file.uri, "")
    # an epoch whose change reads them fails and commits nothing: a change of group
    # 0's rows, which the aggregate recomputes from its state
    epoch = eng.committed_epoch
    eng.delete("t", [{"id": 0}])
    eng.insert("t", [{"id": 20, "g": 1, "v": 500}])
    damaged(eng.step, "materialized view")
    assert eng.committed_epoch == epoch

    # the repair: the next epoch rebuilds each from its upstream, reading no damaged
    # file (the projection's Δ that the failed attempt appended included); the MVs
    # downstream and the sink take the difference as a change
    for name in queries:
        eng.sql(f"ALTER MATERIALIZED VIEW {name} RECOMPUTE")
    report = eng.step()
    assert report.epoch == epoch + 1
    for name, sql in queries.items():
        assert_same_rows(eng.read(name), batch(spark, eng, sql.replace("FROM t", "FROM {t}")),
                         label=f"{name} repaired")
    for name in (*queries, "down", "proj_down"):
        assert eng.verify(name).count() == 0, name
    assert sink_rows(tmp_path / "s") == sorted(tuple(r) for r in eng.read("proj").collect())
    damaged_uris = {mv_file.uri, state_file.uri, top_file.uri, proj_file.uri}
    for name in (*queries, state):
        assert not damaged_uris & {f.uri for f in data_files(eng, name)}, name
    # and it stays exact under later changes that read its state and rows
    eng.delete("t", [{"id": 3}, {"id": 9}])
    eng.insert("t", [{"id": 21, "g": 0, "v": -5}])
    eng.step()
    for name in (*queries, "down", "proj_down"):
        assert eng.verify(name).count() == 0, name
    assert sink_rows(tmp_path / "s") == sorted(tuple(r) for r in eng.read("proj").collect())
