"""Engine API semantics: DML order within an epoch, visibility of staged DML,
reopening a warehouse, SHOW / SET / DROP, cancelling a creating MV, options."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from helpers import TableModel, assert_rows_equal, assert_same_rows, check_mv, mv_sql

from sparkfill import Engine, UnknownRelation, WarehouseLocked, WarehouseReadOnly

KV = "CREATE TABLE kv (id BIGINT, v BIGINT, tag STRING, PRIMARY KEY (id))"
KV_COLS = ["id", "v", "tag"]


def kv_rows(keys, v_of=lambda k: k * 10, tag="a"):
    return [{"id": k, "v": v_of(k), "tag": tag} for k in keys]


def step_until_created(eng, name: str, limit: int = 40) -> int:
    """Step until ``name`` is created; return how many steps it took."""
    for n in range(1, limit + 1):
        eng.step()
        if eng.progress(name).state == "created":
            return n
    raise AssertionError(f"{name} not created after {limit} steps: {eng.progress(name)}")


def test_new_warehouse_starts_at_epoch_zero(engine):
    assert engine.committed_epoch == 0
    engine.sql(KV)
    engine.insert("kv", kv_rows([1]))
    assert engine.committed_epoch == 0
    rep = engine.step()
    assert rep.epoch == engine.committed_epoch >= 1
    assert rep.changes.get("kv") == 1


def test_keys_staged_by_the_driver_spare_the_epoch_the_job_that_finds_them(engine, spark):
    """Rows given as Python values are staged by the driver, which notes their keys
    in the staged file: the epoch reads the old rows of those keys on the driver and
    computes the table's change there, with no Spark job. A batch staged by Spark (a
    DataFrame) has no such note, and an epoch with one finds the keys of all its
    batches by a job, then computes the change by another; both are exact."""
    engine.sql(KV)
    model = TableModel(KV_COLS, key="id")

    def apply(rows, deletes, as_frame=False):
        engine.insert("kv", spark.createDataFrame(rows, "id bigint, v bigint, tag string")
                      if as_frame else rows)
        engine.delete("kv", [{"id": k} for k in deletes])
        model.insert(rows)
        model.delete([{"id": k} for k in deletes])
        model.step()
        report = engine.step()
        assert_rows_equal(engine.read("kv"), model.rows(), label=f"kv at {report.epoch}")
        return report

    engine.store.target_file_rows = 10  # 20 files, each a narrow range of vnodes
    apply(kv_rows(range(1, 201)), [])
    listed = apply(kv_rows([103, 270], v_of=lambda k: 5), [104, 299])
    framed = apply(kv_rows([105, 271], v_of=lambda k: 6), [106, 298], as_frame=True)
    assert listed.spark_jobs == 0 and framed.spark_jobs == 2, \
        (listed.spark_jobs, framed.spark_jobs)
    # both read only the files of the touched keys' vnodes (most files' key ranges
    # hold 103-106)
    assert listed.rows_read["kv"] <= 60 and framed.rows_read["kv"] <= 60, \
        (listed.rows_read, framed.rows_read)



def test_small_deltas_of_mvs_nothing_reads_are_written_by_one_job(engine, spark):
    """The small Δs of created MVs that no other MV reads are brought to the driver
    together, in one Spark job, and each committed as its own Delta version: three
    such MVs cost an epoch no more jobs than one. An MV read by another MV is still
    written first (its Δ is read back downstream). Every MV matches the batch query
    at every epoch."""
    engine.sql(KV)
    engine.insert("kv", kv_rows(range(1, 101)))
    engine.step()
    queries = {"p1": "SELECT id, v * 2 AS w FROM {src} WHERE v % 3 <> 0",
               "p2": "SELECT id, tag, v FROM {src} WHERE v > 300",
               "p3": "SELECT id, v + 1 AS v1 FROM {src}"}

    def epoch(n: int, names: list[str]) -> int:
        engine.insert("kv", kv_rows([n, 200 + n], v_of=lambda k: k * 7 + n))
        engine.delete("kv", [{"id": n + 50}])
        report = engine.step()
        for name in names:
            check_mv(engine, spark, name, queries[name], "kv", report.epoch)
        return report.spark_jobs

    engine.sql(f"CREATE MATERIALIZED VIEW p1 AS {mv_sql(queries['p1'], 'kv')}")
    step_until_created(engine, "p1")
    one = epoch(1, ["p1"])
    for name in ("p2", "p3"):
        engine.sql(f"CREATE MATERIALIZED VIEW {name} AS {mv_sql(queries[name], 'kv')}")
        step_until_created(engine, name)
    three = epoch(2, ["p1", "p2", "p3"])
    assert three == one, (one, three)
    # an MV over p3 makes p3's Δ one that is read this epoch: written on its own
    engine.sql("CREATE MATERIALIZED VIEW over_p3 AS SELECT id, v1 FROM p3 WHERE v1 > 10")
    step_until_created(engine, "over_p3")
    queries["over_p3"] = "SELECT id, v1 FROM {src} WHERE v1 > 10"
    engine.insert("kv", kv_rows([5, 205], v_of=lambda k: k * 3))
    report = engine.step()
    assert report.spark_jobs > three, (three, report.spark_jobs)
    check_mv(engine, spark, "over_p3", queries.pop("over_p3"), "p3", report.epoch)
    for name in queries:
        check_mv(engine, spark, name, queries[name], "kv", report.epoch)

@pytest.mark.connect
def test_dml_applies_in_call_order_within_epoch(engine, spark):
    engine.sql(KV)
    model = TableModel(KV_COLS, key="id")
    base = kv_rows(range(1, 10))
    engine.insert("kv", base)
    model.insert(base)
    engine.step()
    model.step()

    def ins(rows):
        engine.insert("kv", rows)
        model.insert(rows)

    def dele(keys):
        engine.delete("kv", [{"id": k} for k in keys])
        model.delete([{"id": k} for k in keys])

    ins(kv_rows([40]))
    dele([40])  # insert then delete: absent
    dele([1])
    ins(kv_rows([1], v_of=lambda k: 11))  # delete then insert: present
    ins(kv_rows([2], v_of=lambda k: 21))
    ins(kv_rows([2], v_of=lambda k: 22))  # last write wins
    dele([99])  # missing key: no-op
    # UPDATE sees the committed snapshot (v=30), not the staged insert of 33,
    # and being later in call order its key-level change wins
    ins(kv_rows([3], v_of=lambda k: 33))
    engine.sql("UPDATE kv SET v = v + 100 WHERE id = 3")
    model.sql_update(lambda r: r["id"] == 3, lambda r: {"v": r["v"] + 100})
    # UPDATE does not see a key that is only staged
    ins(kv_rows([50]))
    engine.sql("UPDATE kv SET v = -1 WHERE id = 50")
    model.sql_update(lambda r: r["id"] == 50, lambda r: {"v": -1})
    # SQL DELETE after a staged overwrite removes the key; an insert after it restores it
    ins(kv_rows([6], v_of=lambda k: 66))
    engine.sql("DELETE FROM kv WHERE id = 6")
    model.sql_delete(lambda r: r["id"] == 6)
    engine.sql("DELETE FROM kv WHERE v = 70")
    model.sql_delete(lambda r: r["v"] == 70)
    ins(kv_rows([7], v_of=lambda k: 77))
    # SQL INSERT with an existing key overwrites
    engine.sql("INSERT INTO kv (id, v, tag) VALUES (8, 88, 'sql'), (60, 600, NULL)")
    model.insert([{"id": 8, "v": 88, "tag": "sql"}, {"id": 60, "v": 600, "tag": None}])

    # nothing staged is visible before the step
    committed = model.rows()
    assert_rows_equal(engine.read("kv"), committed, label="kv before step")
    assert engine.sql("SELECT count(*) AS c FROM kv").collect()[0][0] == len(committed)

    engine.step()
    model.step()
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv after step")
    assert_same_rows(
        engine.sql("SELECT tag, count(*) AS c, sum(v) AS s FROM kv GROUP BY tag"),
        spark.sql(
            "SELECT tag, count(*) AS c, sum(v) AS s FROM {t} GROUP BY tag", t=engine.read("kv")
        ),
    )


def test_a_first_load_is_placed_once_and_keeps_call_order(engine, spark, monkeypatch):
    """A load into an empty table, large enough for Spark to write it: its rows are
    placed in the vnode ranges of the write (the last change of each key found there,
    in call order across batches), and the files written hold disjoint vnode ranges."""
    engine.sql(KV)
    engine.store.target_file_rows = 4_000
    engine.store.file_row_groups = 2  # files of 2 ranges of vnodes each
    placed = []
    real = type(engine.store).place_by_vnode_range

    def spy(store, df, rows):
        out = real(store, df, rows)
        placed.append(out is not None)
        return out
    monkeypatch.setattr(type(engine.store), "place_by_vnode_range", spy)
    model = TableModel(KV_COLS, key="id")
    first = spark.range(24_000).selectExpr("id", "id * 10 AS v", "'a' AS tag")
    engine.insert("kv", first)
    model.insert(kv_rows(range(24_000)))
    again = spark.range(0, 24_000, 7).selectExpr("id", "-id AS v", "'b' AS tag")
    engine.insert("kv", again)  # a later batch overwrites these keys
    model.insert(kv_rows(range(0, 24_000, 7), v_of=lambda k: -k, tag="b"))
    gone = [{"id": k} for k in range(0, 24_000, 11)]
    engine.delete("kv", gone)
    model.delete(gone)
    back = kv_rows([22, 33], v_of=lambda k: 5)
    engine.insert("kv", back)  # delete then insert: present
    model.insert(back)
    engine.step()
    model.step()
    assert placed == [True], placed
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv after its first load")
    rel = engine.catalog.get("kv")
    files = sorted(engine.store.files_at(rel.stored, 1), key=lambda f: f.vnode_min)
    staged = 24_000 + len(range(0, 24_000, 7)) + len(gone) + len(back)
    assert len(files) == -(-engine.store.vnode_ranges(staged) // 2) == 4, files
    assert all(a.vnode_max < b.vnode_min for a, b in itertools.pairwise(files)), files
    # a later epoch into the loaded table takes the usual path
    engine.insert("kv", kv_rows([5], v_of=lambda k: 55))
    model.insert(kv_rows([5], v_of=lambda k: 55))
    engine.step()
    model.step()
    assert placed == [True], "only a load into an empty table is placed"
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv after an upsert")


@pytest.mark.connect
def test_reopen_recovers_state_and_staged_dml(warehouse, spark):
    template = "SELECT id, v * 3 AS v3 FROM {src} WHERE v % 20 = 0"
    model = TableModel(KV_COLS, key="id")
    eng = Engine(warehouse, spark=spark)
    try:
        eng.sql(KV)
        rows = kv_rows(range(600))
        eng.insert("kv", rows)
        model.insert(rows)
        eng.step()
        model.step()
        eng.sql(
            "CREATE MATERIALIZED VIEW kvm WITH (backfill = 'no_shuffle', backfill_chunk_rows = 50) "
            f"AS {mv_sql(template, 'kv')}"
        )
        eng.step()
        model.step()
        assert eng.progress("kvm").state != "created"
        # staged but not stepped when the engine closes
        staged = kv_rows(range(590, 650), v_of=lambda k: 40 * k)
        eng.insert("kv", staged)
        model.insert(staged)
        eng.delete("kv", [{"id": k} for k in range(0, 100, 3)])
        model.delete([{"id": k} for k in range(0, 100, 3)])
        epoch = eng.committed_epoch
        progress_before = eng.progress("kvm")
    finally:
        eng.close()

    with Engine(warehouse, spark=spark) as eng2:
        assert eng2.committed_epoch == epoch
        assert eng2.progress("kvm").state == progress_before.state
        assert eng2.progress("kvm").rows_done == progress_before.rows_done
        rep = eng2.step()
        model.step()
        assert_rows_equal(eng2.read("kv"), model.rows(), label="kv after reopen + step")
        step_until_created(eng2, "kvm")
        check_mv(eng2, spark, "kvm", template, "kv", eng2.committed_epoch)
        assert rep.epoch == epoch + 1
        more = kv_rows(range(700, 720), v_of=lambda k: 20 * k)
        eng2.insert("kv", more)
        model.insert(more)
        eng2.step()
        model.step()
        assert_rows_equal(eng2.read("kv"), model.rows(), label="kv")
        check_mv(eng2, spark, "kvm", template, "kv", eng2.committed_epoch)
        final_epoch = eng2.committed_epoch

    # closed cleanly: reopen once more, nothing staged, nothing changes
    with Engine(warehouse, spark=spark) as eng3:
        assert eng3.committed_epoch == final_epoch
        eng3.step()
        assert_rows_equal(eng3.read("kv"), model.rows(), label="kv after second reopen")
        check_mv(eng3, spark, "kvm", template, "kv", eng3.committed_epoch)


def _names(df) -> set[str]:
    return {v for row in df.collect() for v in row if isinstance(v, str)}


@pytest.mark.connect
def test_show_statements(engine):
    engine.sql(KV)
    engine.insert("kv", kv_rows(range(300)))
    engine.step()
    engine.sql(
        "CREATE MATERIALIZED VIEW kvm WITH (backfill = 'no_shuffle', backfill_chunk_rows = 50) "
        "AS SELECT id, v FROM kv"
    )
    assert "kv" in _names(engine.sql("SHOW TABLES"))
    assert "kvm" in _names(engine.sql("SHOW MATERIALIZED VIEWS"))
    assert "kv" not in _names(engine.sql("SHOW MATERIALIZED VIEWS"))
    engine.step()
    assert "kvm" in _names(engine.sql("SHOW JOBS"))
    step_until_created(engine, "kvm")
    engine.sql("DROP MATERIALIZED VIEW kvm")
    assert "kvm" not in _names(engine.sql("SHOW MATERIALIZED VIEWS"))
    assert "kvm" not in {p.name for p in engine.progress()}
    engine.sql("DROP TABLE kv")
    assert "kv" not in _names(engine.sql("SHOW TABLES"))
    # names are free again
    engine.sql(KV)
    engine.step()
    assert_rows_equal(engine.read("kv"), [], label="re-created kv")


def test_set_default_chunk_rows(engine, spark):
    engine.sql(KV)
    engine.insert("kv", kv_rows(range(1000)))
    engine.step()
    engine.sql("SET backfill_chunk_rows = 100")
    engine.sql(
        "CREATE MATERIALIZED VIEW m_set WITH (backfill = 'no_shuffle') AS SELECT id, v FROM kv"
    )
    engine.sql(
        "CREATE MATERIALIZED VIEW m_explicit WITH (backfill = 'no_shuffle', "
        "backfill_chunk_rows = 500) AS SELECT id, v FROM kv"
    )
    created = {}
    for n in range(1, 30):
        engine.step()
        for name, chunk in (("m_set", 100), ("m_explicit", 500)):
            p = engine.progress(name)
            if p.state == "created":
                created.setdefault(name, n)
            else:
                assert p.rows_done <= chunk * n, f"{name}: {p.rows_done} rows after {n} epochs"
        if len(created) == 2:
            break
    assert created["m_set"] >= 9, created
    assert created["m_explicit"] <= 4, created
    for name in ("m_set", "m_explicit"):
        assert_same_rows(engine.read(name), engine.read("kv").select("id", "v"), label=name)


@pytest.mark.connect
def test_drop_creating_mv_cancels_job(engine, spark):
    engine.sql(KV)
    model = TableModel(KV_COLS, key="id")
    rows = kv_rows(range(800))
    engine.insert("kv", rows)
    model.insert(rows)
    engine.step()
    model.step()
    engine.sql(
        "CREATE MATERIALIZED VIEW kvm WITH (backfill = 'no_shuffle', backfill_chunk_rows = 60) "
        "AS SELECT id, v FROM kv WHERE v > 100"
    )
    for _ in range(3):
        engine.insert("kv", kv_rows(range(790, 810), v_of=lambda k: k + 1))
        model.insert(kv_rows(range(790, 810), v_of=lambda k: k + 1))
        engine.step()
        model.step()
    assert engine.progress("kvm").state != "created"
    engine.sql("DROP MATERIALIZED VIEW kvm")
    with pytest.raises(UnknownRelation):
        engine.progress("kvm")
    with pytest.raises(UnknownRelation):
        engine.read("kvm")
    engine.delete("kv", [{"id": 5}])
    model.delete([{"id": 5}])
    engine.step()
    model.step()
    assert_rows_equal(engine.read("kv"), model.rows(), label="kv after cancel")
    # the name can be reused with another query
    template = "SELECT id, v - 1 AS w FROM {src} WHERE v % 7 = 0"
    engine.sql(
        "CREATE MATERIALIZED VIEW kvm WITH (backfill = 'blocking') AS " + mv_sql(template, "kv")
    )
    step_until_created(engine, "kvm")
    check_mv(engine, spark, "kvm", template, "kv", engine.committed_epoch)


@pytest.mark.connect
def test_rate_limit_bounds_backfill_speed(engine, spark):
    engine.sql(KV)
    engine.insert("kv", kv_rows(range(1200)))
    engine.step()
    rate = 400
    engine.sql(
        "CREATE MATERIALIZED VIEW kvr WITH (backfill = 'no_shuffle', backfill_chunk_rows = 100000, "
        f"backfill_rate_limit = {rate}) AS SELECT id, v FROM kv"
    )
    t0 = time.monotonic()
    states = []
    for _ in range(60):
        engine.step()
        p = engine.progress("kvr")
        elapsed = time.monotonic() - t0
        states.append(p.state)
        if p.state == "created":
            break
        # never faster than the limit (one second of burst allowed)
        assert p.rows_done <= rate * (elapsed + 1), (p.rows_done, elapsed)
    assert states[-1] == "created"
    # 1200 rows at 400 rows/s cannot take less than ~2 s
    assert time.monotonic() - t0 >= 1200 / rate - 1.0
    assert_same_rows(engine.read("kvr"), engine.read("kv").select("id", "v"), label="kvr")


def test_mv_on_empty_table(engine, spark):
    engine.sql(KV)
    engine.step()
    template = "SELECT id, upper(tag) AS t FROM {src} WHERE v >= 0"
    engine.sql(
        "CREATE MATERIALIZED VIEW e_mv WITH (backfill = 'no_shuffle', backfill_chunk_rows = 10) "
        "AS " + mv_sql(template, "kv")
    )
    step_until_created(engine, "e_mv", limit=5)
    assert engine.read("e_mv").count() == 0
    engine.insert("kv", kv_rows(range(30)))
    engine.step()
    check_mv(engine, spark, "e_mv", template, "kv", engine.committed_epoch)
    engine.sql("UPDATE kv SET tag = 'zz', v = -1 WHERE id < 10")
    engine.step()
    check_mv(engine, spark, "e_mv", template, "kv", engine.committed_epoch)
    assert engine.read("e_mv").count() == 20


def test_composite_key_table(engine, spark):
    engine.sql("CREATE TABLE ck (a INT, b STRING, v DOUBLE, PRIMARY KEY (a, b))")
    model = TableModel(["a", "b", "v"], key=["a", "b"])
    rows = [{"a": i % 30, "b": f"k{i // 30}", "v": i / 4} for i in range(600)]
    engine.insert("ck", rows)
    model.insert(rows)
    engine.step()
    model.step()
    template = "SELECT a, v * 2 AS v2 FROM {src} WHERE b <> 'k3'"
    engine.sql(
        "CREATE MATERIALIZED VIEW ckm WITH (backfill = 'no_shuffle', backfill_chunk_rows = 70) "
        "AS " + mv_sql(template, "ck")
    )
    for n in range(30):
        if n < 5:
            upd = [{"a": n, "b": f"k{j}", "v": -1.0 * j} for j in range(20)]
            engine.insert("ck", upd)
            model.insert(upd)
            engine.delete("ck", [{"a": 7, "b": f"k{n}"}, {"a": 99, "b": "none"}])
            model.delete([{"a": 7, "b": f"k{n}"}, {"a": 99, "b": "none"}])
        engine.step()
        model.step()
        assert_rows_equal(engine.read("ck"), model.rows(), label=f"ck after {n}")
        if engine.progress("ckm").state == "created":
            check_mv(engine, spark, "ckm", template, "ck", engine.committed_epoch)
            if n >= 5:
                break
    assert engine.progress("ckm").state == "created"


def test_read_only_open_reads_beside_the_writer_and_refuses_writes(engine, warehouse, spark):
    engine.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    engine.insert("t", [{"id": 1, "v": 10}, {"id": 2, "v": 20}])
    engine.sql("CREATE MATERIALIZED VIEW s AS SELECT sum(v) AS total FROM t")
    engine.step()
    engine.step()
    with pytest.raises(WarehouseLocked, match="read_only=True"):
        Engine(warehouse, spark=spark)
    reader = Engine(warehouse, spark=spark, read_only=True)
    try:
        assert reader.read("s").collect()[0]["total"] == 30
        engine.insert("t", [{"id": 3, "v": 5}])
        engine.step()  # the reader sees the writer's next commit
        assert reader.committed_epoch == engine.committed_epoch
        assert reader.read("s").collect()[0]["total"] == 35
        assert reader.sql("VERIFY MATERIALIZED VIEW s").count() == 0
        assert sorted(r[0] for r in reader.sql("SHOW TABLES").collect()) == ["t"]
        plan = [r[0] for r in reader.sql("EXPLAIN MATERIALIZED VIEW s").collect()]
        assert plan[0].startswith("Materialize s") and any("state " in p for p in plan)
        epoch = engine.committed_epoch
        for write in (lambda: reader.step(), lambda: reader.insert("t", [{"id": 9, "v": 1}]),
                      lambda: reader.delete("t", [{"id": 1}]),
                      lambda: reader.sql("CREATE TABLE u (id BIGINT, PRIMARY KEY (id))"),
                      lambda: reader.sql("DROP MATERIALIZED VIEW s")):
            with pytest.raises(WarehouseReadOnly, match="read-only"):
                write()
        assert engine.committed_epoch == epoch and engine.relation("s").kind == "mv"
        assert reader.create_temp_views() == ["t", "s"]
        assert spark.sql("SELECT total FROM s").collect()[0][0] == 35
        assert spark.sql("SELECT count(*) FROM t").collect()[0][0] == 3
    finally:
        reader.close()
    nowhere = Path(warehouse) / "nowhere"
    with pytest.raises(WarehouseReadOnly, match="not a sparkfill warehouse"):
        Engine(nowhere, spark=spark, read_only=True)
    assert not nowhere.exists()


@pytest.mark.connect
def test_a_failure_after_the_commit_is_reported_not_raised(engine, monkeypatch):
    """A step whose epoch committed returns its report, whatever fails after the
    commit (housekeeping, a sink's write): that work is retried later."""
    engine.sql(KV)
    engine.insert("kv", kv_rows(range(5)))
    engine.sql("CREATE MATERIALIZED VIEW s WITH (backfill = 'blocking') AS "
               "SELECT tag, sum(v) AS sv FROM kv GROUP BY tag")
    engine.step()

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(engine.coordinator, "_housekeep", broken)
    real_sync, calls = engine.sinks.sync, []

    def sync_fails_after_commit(catalog, epoch):
        calls.append(epoch)
        if len(calls) == 2:  # the call after the epoch's commit
            raise RuntimeError("sink unreachable")
        return real_sync(catalog, epoch)

    monkeypatch.setattr(engine.sinks, "sync", sync_fails_after_commit)
    engine.insert("kv", kv_rows([7]))
    before = engine.committed_epoch
    report = engine.step()
    assert report.epoch == before + 1 == engine.committed_epoch
    assert len(report.warnings) == 2, report.warnings
    assert "disk full" in report.warnings[0] and "sink unreachable" in report.warnings[1]
    monkeypatch.undo()
    assert engine.step().warnings == []
    assert engine.read("s").collect()[0]["sv"] == sum(k * 10 for k in [*range(5), 7])


def test_a_warehouse_uri_of_another_scheme_is_refused_creating_nothing(spark, tmp_path,
                                                                      monkeypatch):
    from sparkfill import InvalidOption, SparkfillError

    monkeypatch.chdir(tmp_path)
    for uri in ("hdfs://nn:8020/wh", "ftp://host/wh", "s3:///no-bucket"):
        with pytest.raises(SparkfillError, match="unknown scheme|no bucket"):
            Engine(uri, spark=spark)
    # an object store needs a meta store off the local disk; refused before any I/O
    for uri in ("s3://bucket/wh", "gs://b/wh"):
        with pytest.raises(InvalidOption, match="keeps its meta store in PostgreSQL"):
            Engine(uri, spark=spark)
    assert list(tmp_path.iterdir()) == []
    eng = Engine(f"file://{tmp_path / 'wh'}", spark=spark)
    try:
        assert eng.path == tmp_path / "wh" and (tmp_path / "wh" / "meta.sqlite").is_file()
    finally:
        eng.close()


#: what only a classic (JVM-backed) session has: not used, so Spark Connect runs it too
CLASSIC_ONLY_ATTRIBUTES = {"sparkContext", "_jdf", "_jsc", "_jvm", "_jsparkSession", "rdd"}


@pytest.mark.connect
def test_the_engine_uses_no_classic_only_spark_api():
    """No module of the package reads an attribute only a classic session has (the
    SparkContext, the JVM handles, RDDs) or imports py4j."""
    import ast

    import sparkfill

    found = []
    root = Path(sparkfill.__file__).parent
    paths = sorted(root.rglob("*.py"))  # every subpackage too
    assert {p.parent.name for p in paths} >= {"sql", "dataflow", "backfill", "storage"}
    for path in paths:
        name = path.relative_to(root)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in CLASSIC_ONLY_ATTRIBUTES:
                found.append(f"{name}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] == "py4j" for n in names):
                    found.append(f"{name}:{node.lineno} import py4j")
    assert not found, found
