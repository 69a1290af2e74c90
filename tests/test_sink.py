"""Delta sinks: a plain Delta table equal to its MV at every committed epoch.

Oracle: ``Engine.read(mv, as_of=e)``. After every epoch the sink read by
delta-rs and by Spark (the Parquet files the Delta log lists) equals the MV as
a multiset, and every version of the Delta table equals the MV at the epoch
that version records as its application transaction.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from helpers import assert_rows_equal, assert_same_rows

from sparkfill import (
    CatalogError,
    DependentObjects,
    InvalidOption,
    SinkError,
    UnknownRelation,
)
from sparkfill.sinks import APP_PREFIX


def _delta_rows(path, columns, version=None) -> list[tuple]:
    dt = DeltaTable(str(path), version=version) if version is not None else DeltaTable(str(path))
    return [tuple(r[c] for c in columns) for r in dt.to_pyarrow_table().to_pylist()]


def _app(eng, name: str) -> str:
    sink = eng.sinks.find(name)
    return f"{APP_PREFIX}{sink.id}"


@pytest.mark.connect
def test_sink_equals_the_mv_at_every_epoch(engine, spark, tmp_path):
    eng = engine
    # compact often, both ways: a merge of the MV's log files keeps its changes (the
    # sync rewrites the touched buckets), a fold into base drops them (it rewrites all)
    eng.store.max_log_files, eng.store.min_compact_rows, eng.store.log_fraction = 2, 200, 0.0
    compactions: list[str] = []

    def counted(kind, run):
        def wrapper(*args):
            compactions.append(kind)
            return run(*args)
        return wrapper
    eng.store.merge_log = counted("merge", eng.store.merge_log)
    eng.store.compact = counted("fold", eng.store.compact)
    paths: list[str] = []
    original = eng.sinks._touched_vnodes

    def record(rel, done, epoch):
        out = original(rel, done, epoch)
        paths.append("full" if out is None else "none" if not out else "buckets")
        return out
    eng.sinks._touched_vnodes = record

    eng.sql("CREATE TABLE g (id BIGINT, k INT, v BIGINT, s STRING, PRIMARY KEY (id)) WITH ("
            "connector = 'datagen', rows_per_epoch = 60, seed = 11, insert_ratio = 0.5, "
            "update_ratio = 0.3, delete_ratio = 0.2, key_lifetime = 2, value_range = 40)")
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'no_shuffle', backfill_chunk_rows = 20)"
            " AS SELECT id AS k, v AS n, v * k AS total, s AS top FROM g WHERE k % 3 <> 0")
    path = tmp_path / "out" / "m"
    eng.sql(f"CREATE SINK s FROM m WITH (connector = 'delta', path = '{path}', buckets = 32)")
    row = eng.sql("SHOW SINKS").collect()[0]
    assert (row.name, row["from"], row.state, row.epoch) == ("s", "m", "waiting", None)
    assert _delta_rows(path, ["k"]) == []  # a readable, empty table until m is created
    cols = ["k", "n", "total", "top"]
    synced = []
    for _ in range(7):
        rep = eng.step()
        dt = DeltaTable(str(path))
        if eng.progress("m").state != "created":
            assert dt.transaction_version(_app(eng, "s")) is None
            continue
        assert dt.transaction_version(_app(eng, "s")) == rep.epoch
        mv = eng.read("m")
        assert_rows_equal(mv, _delta_rows(path, cols),
                          label=f"sink via delta-rs, epoch {rep.epoch}")
        files = dt.file_uris()
        assert files and all(f.endswith(".parquet") for f in files)
        assert_same_rows(spark.read.parquet(*files).select(*cols), mv,
                         label=f"sink via Spark over the log's files, epoch {rep.epoch}")
        synced.append(rep.epoch)
    assert len(synced) >= 3, synced
    assert {"full", "buckets"} <= set(paths), paths  # both ways of syncing were checked
    assert {"merge", "fold"} <= set(compactions), compactions
    assert eng.sql("SHOW SINKS").collect()[0].epoch == eng.committed_epoch

    # every version is the MV at the epoch it records
    dt = DeltaTable(str(path))
    seen = set()
    for version in range(dt.version() + 1):
        at = DeltaTable(str(path), version=version).transaction_version(_app(eng, "s"))
        if at is None:
            assert _delta_rows(path, cols, version) == []
            continue
        seen.add(at)
        assert_rows_equal(eng.read("m", as_of=at), _delta_rows(path, cols, version),
                          label=f"sink version {version} vs m at epoch {at}")
    assert seen == set(synced)


@pytest.mark.parametrize("refresh", ["incremental", "full"])
def test_a_sink_follows_its_mv_emptied_by_a_rewrite(engine, tmp_path, refresh):
    """Every row deleted in the epoch that folds the MV's files (or recomputes it):
    the MV's new base holds no row, yet it must say where its log starts, or a sink
    synced up to the epoch before finds no change since and keeps every row (its
    fold once wrote no file at all). Then rows come back, and the sink follows."""
    eng = engine
    eng.store.min_compact_rows, eng.store.log_fraction = 10, 0.5  # fold at 20 log rows
    eng.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", [{"id": i, "v": i} for i in range(40)])
    eng.step()
    eng.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking', refresh = '{refresh}') "
            "AS SELECT id, v FROM t WHERE v >= 0")
    eng.step()
    path = tmp_path / "out"
    eng.sql(f"CREATE SINK s FROM m WITH (connector = 'delta', path = '{path}')")
    eng.step()
    eng.sql("UPDATE t SET v = v + 1")
    eng.step()
    assert_rows_equal(eng.read("m"), _delta_rows(path, ["id", "v"]), label="after the update")
    eng.delete("t", [{"id": i} for i in range(40)])
    rep = eng.step()
    assert eng.read("m").count() == 0
    assert _delta_rows(path, ["id", "v"]) == [], "the sink kept rows its MV deleted"
    files = eng.store.files_at(eng.catalog.get("m").stored, rep.epoch)
    assert [(f.kind, f.rows) for f in files] == [("base", 0)], files
    eng.insert("t", [{"id": 7, "v": 70}])
    eng.step()
    assert_rows_equal(eng.read("m"), _delta_rows(path, ["id", "v"]), label="rows back")
    assert _delta_rows(path, ["id", "v"]) == [(7, 70)]


def test_sink_statements_and_errors_change_nothing(engine, tmp_path):
    eng = engine
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", [{"id": i, "g": i % 3, "v": i * 10} for i in range(20)])
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS "
            "SELECT id, v FROM t WHERE g <> 1")
    eng.sql("CREATE MATERIALIZED VIEW agg WITH (backfill = 'blocking') AS "
            "SELECT g, count(*) FROM t GROUP BY g")
    eng.step()
    out = tmp_path / "sinks"
    # an MV that is created: the sink holds its snapshot as soon as it exists
    eng.sql(f"CREATE SINK s FROM m WITH (connector = 'delta', path = '{out}/m')")
    assert DeltaTable(str(out / "m")).transaction_version(_app(eng, "s")) == eng.committed_epoch
    assert_rows_equal(eng.read("m"), _delta_rows(out / "m", ["id", "v"]), label="initial sink")
    eng.sql("CREATE SINK IF NOT EXISTS s FROM m WITH (connector = 'delta', path = 'x')")
    (out / "busy").mkdir()
    (out / "busy" / "file.txt").write_text("mine")
    before = [tuple(r) for r in eng.sql("SHOW SINKS").collect()]
    bad = [
        (CatalogError, "already exists", f"CREATE SINK s FROM m WITH (connector = 'delta', "
                                         f"path = '{out}/m2')"),
        (InvalidOption, "connector must be 'delta'",
         f"CREATE SINK s2 FROM m WITH (connector = 'kafka', path = '{out}/m2')"),
        (InvalidOption, "needs path", "CREATE SINK s2 FROM m WITH (connector = 'delta')"),
        (InvalidOption, "unknown option", f"CREATE SINK s2 FROM m WITH (connector = 'delta', "
                                          f"path = '{out}/m2', mode = 'append')"),
        (SinkError, "not empty", f"CREATE SINK s2 FROM m WITH (connector = 'delta', "
                                 f"path = '{out}/busy')"),
        (UnknownRelation, "nope", f"CREATE SINK s2 FROM nope WITH (connector = 'delta', "
                                  f"path = '{out}/m2')"),
        (SinkError, "not valid Delta column names",
         f"CREATE SINK s2 FROM agg WITH (connector = 'delta', path = '{out}/agg')"),
    ]
    for exc, msg, stmt in bad:
        with pytest.raises(exc, match=msg):
            eng.sql(stmt)
    assert [tuple(r) for r in eng.sql("SHOW SINKS").collect()] == before
    assert not (out / "m2").exists() and not (out / "agg").exists()
    assert (out / "busy" / "file.txt").read_text() == "mine"

    with pytest.raises(DependentObjects, match="sink"):
        eng.sql("DROP MATERIALIZED VIEW m")
    # a sink on a table works too; {warehouse} names the warehouse folder
    eng.sql("CREATE SINK ts FROM t WITH (connector = 'delta', path = '{warehouse}/sinks/t')")
    eng.insert("t", [{"id": 100, "g": 0, "v": 1}])
    eng.delete("t", [{"id": 0}])
    eng.step()
    assert_rows_equal(eng.read("t"), _delta_rows(eng.path / "sinks" / "t", ["id", "g", "v"]),
                      label="sink of a table")
    assert_rows_equal(eng.read("m"), _delta_rows(out / "m", ["id", "v"]), label="sink of m")
    eng.sql("DROP SINK s")
    eng.sql("DROP SINK IF EXISTS s")
    with pytest.raises(CatalogError, match="no sink"):
        eng.sql("DROP SINK s")
    assert [r.name for r in eng.sql("SHOW SINKS").collect()] == ["ts"]
    eng.sql("DROP MATERIALIZED VIEW m")  # the sink is gone; its Delta table stays
    assert len(_delta_rows(out / "m", ["id", "v"])) > 0
