"""A first load staged placed (``storage/dml.py``): a Spark DataFrame of upserts into an
empty table is staged as the table's log files of the next epoch, and that epoch links
them in as they are; any other case reads the placed batch as staged upserts. Every
case is checked against a model of the table and, for the MV over it, the batch
query."""

from __future__ import annotations

import pytest
from helpers import TableModel, assert_rows_equal, check_mv, mv_sql

from sparkfill import DataError, Engine
from sparkfill.storage import dml

KV = "CREATE TABLE kv (id BIGINT, v BIGINT, tag STRING, PRIMARY KEY (id))"
KV_COLS = ["id", "v", "tag"]
BY_TAG = "SELECT tag, count(*) AS n, sum(v) AS s, max(v) AS m FROM {src} GROUP BY tag"


def kv_rows(keys, v_of=lambda k: k * 10, tag="a"):
    return [{"id": k, "v": v_of(k), "tag": tag} for k in keys]


def staged_paths(engine):
    return [b.path for b in engine.meta.staged()]


@pytest.fixture
def linked(engine, monkeypatch):
    """The directories each epoch's appends linked in (``RelationStore._link_prepared``)."""
    calls: list[tuple[str, ...]] = []
    real = type(engine.store)._link_prepared

    def spy(store, rel, dirs, subdir):
        calls.append(tuple(dirs))
        return real(store, rel, dirs, subdir)
    monkeypatch.setattr(type(engine.store), "_link_prepared", spy)
    return calls


def test_a_first_load_is_linked_in_with_the_last_row_of_each_key(engine, spark, linked):
    """The later of two rows of a key in the DataFrame wins (call order, as for any
    batch); the MV created before the load takes the load as its first Δ; the
    table's files are the staged ones, linked; the staged batch is gone after."""
    engine.sql(KV)
    engine.sql(f"CREATE MATERIALIZED VIEW by_tag AS {mv_sql(BY_TAG, 'kv')}")
    engine.step()
    first = spark.range(3_000).selectExpr("id", "id * 10 AS v", "IF(id % 3 = 0, 'a', 'b') AS tag")
    again = spark.range(0, 3_000, 4).selectExpr("id", "-id AS v", "'c' AS tag")
    assert engine.insert("kv", first.unionByName(again)) == 3_000 + 750
    (path,) = staged_paths(engine)
    assert dml.placed_epoch(path) == engine.committed_epoch + 1, path
    model = TableModel(KV_COLS, key="id")
    model.insert([{"id": k, "v": k * 10, "tag": "a" if k % 3 == 0 else "b"} for k in range(3_000)])
    model.insert(kv_rows(range(0, 3_000, 4), v_of=lambda k: -k, tag="c"))
    model.step()
    report = engine.step()
    assert linked == [(path,)], linked
    assert report.changes.get("kv") == 3_000
    assert staged_paths(engine) == []
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv after its first load")
    check_mv(engine, spark, "by_tag", BY_TAG, "kv", engine.committed_epoch)
    # the next epoch takes the usual path over the linked files
    engine.insert("kv", spark.createDataFrame(kv_rows([1, 5_000], v_of=lambda k: 7),
                                              "id bigint, v bigint, tag string"))
    engine.delete("kv", [{"id": 2}])
    model.insert(kv_rows([1, 5_000], v_of=lambda k: 7))
    model.delete([{"id": 2}])
    model.step()
    engine.step()
    assert len(linked) == 1, "only a first load is linked"
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv after an upsert")
    check_mv(engine, spark, "by_tag", BY_TAG, "kv", engine.committed_epoch)


def test_a_placed_batch_with_others_is_read_as_staged_upserts(engine, spark, linked):
    """A placed batch that is not its epoch's only batch for the table (a later
    insert, a delete) is read as upserts of its place in call order: nothing linked."""
    engine.sql(KV)
    engine.insert("kv", spark.range(2_000).selectExpr("id", "id AS v", "'a' AS tag"))
    engine.insert("kv", spark.range(1_000, 2_500).selectExpr("id", "-id AS v", "'b' AS tag"))
    engine.delete("kv", [{"id": k} for k in range(0, 2_500, 9)])
    engine.insert("kv", kv_rows([9, 18]))  # deleted, then back
    paths = staged_paths(engine)
    assert [dml.placed_epoch(p) is not None for p in paths] == [True, False, False, False]
    model = TableModel(KV_COLS, key="id")
    model.insert(kv_rows(range(2_000), v_of=lambda k: k))
    model.insert(kv_rows(range(1_000, 2_500), v_of=lambda k: -k, tag="b"))
    model.delete([{"id": k} for k in range(0, 2_500, 9)])
    model.insert(kv_rows([9, 18]))
    model.step()
    engine.step()
    assert linked == []
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv")


def test_a_placed_batch_for_another_epoch_is_read_as_staged_upserts(engine, spark, linked,
                                                                    monkeypatch):
    """Files written for an epoch that is not the one applying them (a step ran
    between the staging's look at the epoch and its registration) are not linked:
    their ``_epoch`` would be wrong; they are read as upserts."""
    engine.sql(KV)
    monkeypatch.setattr(dml.DmlStager, "_first_load_epoch",
                        lambda self, rel, df, kind: self.meta.committed_epoch + 2)
    engine.insert("kv", spark.range(1_500).selectExpr("id", "id AS v", "'a' AS tag"))
    (path,) = staged_paths(engine)
    assert dml.placed_epoch(path) == engine.committed_epoch + 2
    engine.step()
    assert linked == []
    model = TableModel(KV_COLS, key="id")
    model.insert(kv_rows(range(1_500), v_of=lambda k: k))
    model.step()
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv")


def test_a_first_load_of_a_two_column_key_keeps_the_last_row_of_each_key(engine, spark,
                                                                         linked):
    """A key of two columns: rows that share the first column but not the second are
    different keys; a key given three times keeps its last row (call order), whatever
    the order of its values; every row is checked against a model of the table."""
    engine.sql("CREATE TABLE pk2 (a STRING, b INT, v BIGINT, PRIMARY KEY (a, b))")
    rows = [(f"k{i % 7}", i % 5, i) for i in range(200)]  # (a, b) repeats: 35 keys
    rows += [("k1", 1, -1), ("k1", 2, -2), ("k0", 0, 7)]
    given = spark.createDataFrame(rows, "a string, b int, v bigint")
    assert engine.insert("pk2", given) == len(rows)
    (path,) = staged_paths(engine)
    assert dml.placed_epoch(path) == engine.committed_epoch + 1, path
    model = TableModel(["a", "b", "v"], key=["a", "b"])
    model.insert([{"a": a, "b": b, "v": v} for a, b, v in rows])
    model.step()
    engine.step()
    assert linked == [(path,)], linked
    assert_rows_equal(engine.read("pk2"), model.rows(), label="pk2 after its first load")
    assert engine.read("pk2").count() == 35


def test_a_table_with_rows_or_a_batch_staged_is_not_staged_placed(engine, spark):
    engine.sql(KV)
    engine.insert("kv", kv_rows([1]))
    engine.insert("kv", spark.range(10).selectExpr("id", "id AS v", "'a' AS tag"))
    assert [dml.placed_epoch(p) for p in staged_paths(engine)] == [None, None]
    engine.step()
    engine.insert("kv", spark.range(10).selectExpr("id", "id AS v", "'a' AS tag"))
    assert [dml.placed_epoch(p) for p in staged_paths(engine)] == [None]


def test_a_placed_load_with_a_bad_value_stages_nothing(engine, spark):
    engine.sql(KV)
    bad = spark.createDataFrame([(1, "7", "a"), (2, "x", "b")], "id bigint, v string, tag string")
    with pytest.raises(DataError, match="BIGINT"):
        engine.insert("kv", bad)
    assert staged_paths(engine) == []
    assert [p.name for p in (engine.warehouse.local_path / "staging" / "dml").iterdir()] == []


def test_a_placed_load_survives_a_reopen(warehouse, spark):
    """Staged placed, then the engine closed before the epoch: the reopened engine
    links it in (the staged batch and its observation are durable)."""
    eng = Engine(warehouse, spark=spark)
    try:
        eng.sql(KV)
        eng.insert("kv", spark.range(1_200).selectExpr("id", "id + 1 AS v", "'z' AS tag"))
        assert dml.placed_epoch(staged_paths(eng)[0]) is not None
    finally:
        eng.close()
    eng = Engine(warehouse, spark=spark)
    try:
        eng.step()
        model = TableModel(KV_COLS, key="id")
        model.insert(kv_rows(range(1_200), v_of=lambda k: k + 1, tag="z"))
        model.step()
        assert_rows_equal(eng.read("kv"), model.rows(), label="kv after reopen")
        assert eng.read("kv", as_of=eng.committed_epoch - 1).count() == 0
    finally:
        eng.close()


# --------------------------------------------------------------------------- #
# A crash at each durable act of a placed first load
# --------------------------------------------------------------------------- #

#: the child: creates ``kv`` and an MV over it (an epoch), loads 1,500 rows of a Spark
#: DataFrame (staged placed), says so once the call returned, and steps
CHILD = """
import sys
sys.path.insert(0, {tests!r})
import durability_points
durability_points.install()
from sparkfill import Engine
from sparkfill.session import build_spark_session
spark = build_spark_session(remote=sys.argv[2])
eng = Engine(sys.argv[1], spark=spark)
eng.sql({kv!r})
eng.sql({mv!r})
eng.step()
eng.insert("kv", spark.range(1500).selectExpr("id", "id * 2 AS v",
                                             "IF(id % 2 = 0, 'a', 'b') AS tag"))
print("RETURNED", flush=True)
eng.step()
print("STEPPED", flush=True)
"""

#: the placed load's own durable acts: its files written (not registered yet), what
#: their write observed, the files linked into the table, the table's Delta commit
#: (the epoch not committed yet)
CRASH_SITES = ["spark.write:_write_placed#1", "text:_write_placed#1",
               "link:_link_prepared#1", "delta.commit:_commit_append#1"]
#: CI crashes at the link (the epoch then links the batch again); ``make torture`` at all
CI_SITES = ["link:_link_prepared#1"]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    from connect_server import ConnectServer
    from session_conf import TEST_SPARK_CONF

    with ConnectServer(tmp_path_factory.mktemp("first-load-connect"),
                       extra_conf=TEST_SPARK_CONF) as server:
        yield server.url


@pytest.mark.parametrize("site", [
    s if s in CI_SITES else pytest.param(s, marks=pytest.mark.extended) for s in CRASH_SITES])
def test_a_crash_in_a_placed_load_loses_nothing_and_leaves_nothing(connect_url, spark,
                                                                   tmp_path, site):
    """Killed (``os._exit``) right after one of the load's acts, then reopened and
    stepped: the load applied exactly once if its call returned, not at all
    otherwise; the MV equal to its batch query; no file left that nothing
    references, no staged batch, no pending folder."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import durability_driver as dd
    import durability_points as dp

    warehouse = str(tmp_path / "wh")
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent), kv=KV,
                                   mv=f"CREATE MATERIALIZED VIEW by_tag AS {mv_sql(BY_TAG, 'kv')}"))
    env = {**os.environ, dp.CRASH_ENV: site}
    child = subprocess.run([sys.executable, str(script), warehouse, connect_url], env=env,
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == dp.CRASH_EXIT, (child.returncode, child.stdout, child.stderr[-3000:])
    assert "STEPPED" not in child.stdout
    returned = "RETURNED" in child.stdout
    assert returned == (site in CRASH_SITES[2:]), child.stdout
    eng = Engine(warehouse, spark=spark)
    try:
        eng.step()
        model = TableModel(KV_COLS, key="id")
        if returned:
            model.insert([{"id": k, "v": k * 2, "tag": "a" if k % 2 == 0 else "b"}
                          for k in range(1500)])
        model.step()
        assert_rows_equal(eng.read("kv"), model.rows(), label=f"kv after a crash at {site}")
        check_mv(eng, spark, "by_tag", BY_TAG, "kv", eng.committed_epoch)
        assert dd._check_files(eng) == []
        assert eng.meta.staged() == []
    finally:
        eng.close()
