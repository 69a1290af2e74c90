"""An MV whose query fails on certain rows (``sparkfill.pipelines.failures``): the
epoch that brings such a row commits every other relation; the MV (and what reads
it) is refused to readers, naming the error, until the rows are fixed and
``ALTER ... RECOMPUTE`` rebuilds it — then it equals Spark's query again."""

from __future__ import annotations

import time

import pytest
from helpers import assert_same_rows

from sparkfill import MaterializedViewNotReady, SqlError


def _step_until_created(engine, *names: str, limit: int = 8) -> None:
    for _ in range(limit):
        if all(engine.progress(n).state == "created" for n in names):
            return
        engine.step()
    raise AssertionError(f"{names} not created after {limit} epochs")


def _oracle(engine, spark, name: str, sql: str, tables: list[str], epoch: int) -> None:
    for t in tables:
        engine.read(t, as_of=epoch).createOrReplaceTempView(t)
    assert_same_rows(engine.read(name, as_of=epoch), spark.sql(sql), label=f"{name}@{epoch}")


def _sink_epoch(engine) -> int | None:
    return engine.sql("SHOW SINKS").collect()[0].epoch


def test_an_mv_failing_on_a_row_stops_alone_and_recompute_repairs_it(engine, spark, tmp_path):
    engine.sql("CREATE TABLE t (id BIGINT, s STRING, v INT, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "s": str(i * 2), "v": i} for i in range(8)])
    engine.step()
    bad_sql = "SELECT id, s FROM t WHERE s > 1.5"
    agg_sql = "SELECT count(*) AS n, sum(v) AS sv FROM t"
    engine.sql(f"CREATE MATERIALIZED VIEW picky AS {bad_sql}")
    engine.sql(f"CREATE MATERIALIZED VIEW total AS {agg_sql}")
    _step_until_created(engine, "picky", "total")
    # an MV over the failing one
    engine.sql("CREATE MATERIALIZED VIEW over_picky AS SELECT count(*) AS n FROM picky")
    _step_until_created(engine, "over_picky")
    # a sink of the MV over the failing one
    engine.sql(f"CREATE SINK out FROM over_picky WITH (connector = 'delta', "
               f"path = '{tmp_path / 'out'}')")
    engine.step()
    before = engine.meta.committed_epoch
    engine.insert("t", [{"id": 100, "s": "k7", "v": 5}])  # 'k7' > 1.5 raises in Spark
    report = engine.step()
    assert report.epoch == before + 1
    assert any("'picky' failed" in w and "CAST_INVALID_INPUT" in w for w in report.warnings), \
        report.warnings
    # the table and the other MV committed the epoch
    _oracle(engine, spark, "total", agg_sql, ["t"], report.epoch)
    assert engine.read("t").where("id = 100").count() == 1
    # the failed MV, and the MV over it, are refused from that epoch on, naming why
    for name in ("picky", "over_picky"):
        with pytest.raises(MaterializedViewNotReady, match="CAST_INVALID_INPUT"):
            engine.read(name)
        assert engine.read(name, as_of=before).count() >= 1  # before it: readable
    assert engine.progress("picky").failed is not None
    # its sink holds the epoch before the failure: no later epoch it could write is right
    assert _sink_epoch(engine) == before
    shown = {r.name: r.state for r in engine.sql("SHOW MATERIALIZED VIEWS").collect()}
    assert shown == {"picky": "failed", "over_picky": "failed", "total": "created"}
    # ``sparkfill status`` and the watch page say so too
    from sparkfill.ui.facts import watch_facts

    facts = watch_facts(engine.meta, engine.warehouse)
    states = {r["name"]: r["state"] for r in facts["status"]["relations"]}
    assert states["picky"] == states["over_picky"] == "failed", states
    assert states["total"] == "created", states
    assert sorted(e["text"].split("'")[1] for e in facts["errors"]
                  if e["kind"] == "mv") == ["over_picky", "picky"], facts["errors"]
    # later epochs go on; the MV stays failed while the row is there (and a sampled
    # VERIFY passes it by: the failure was said once)
    engine.sql("SET verify_every = 1")
    engine.insert("t", [{"id": 101, "s": "9", "v": 1}])
    report = engine.step()
    assert not report.warnings, report.warnings
    _oracle(engine, spark, "total", agg_sql, ["t"], report.epoch)
    with pytest.raises(MaterializedViewNotReady):
        engine.read("picky")
    # a RECOMPUTE while the row is still there fails again: still refused
    engine.sql("ALTER MATERIALIZED VIEW picky RECOMPUTE")
    report = engine.step()
    assert any("'picky' failed" in w for w in report.warnings), report.warnings
    with pytest.raises(MaterializedViewNotReady, match=f"epoch {report.epoch}"):
        engine.read("picky")
    # the row fixed, RECOMPUTE rebuilds it; the MV over it takes its difference
    engine.delete("t", [{"id": 100}])
    engine.sql("ALTER MATERIALIZED VIEW picky RECOMPUTE")
    report = engine.step()
    assert any("readable again" in w for w in report.warnings), report.warnings
    _oracle(engine, spark, "picky", bad_sql, ["t"], report.epoch)
    _oracle(engine, spark, "over_picky", "SELECT count(*) AS n FROM picky", ["picky"],
            report.epoch)
    assert engine.progress("picky").failed is None
    # the sink catches up: the MV at the rebuilt epoch
    assert _sink_epoch(engine) == report.epoch
    from deltalake import DeltaTable

    sunk = DeltaTable(str(tmp_path / "out")).to_pyarrow_table().to_pylist()
    assert [r["n"] for r in sunk] == [r.n for r in engine.read("over_picky").collect()]
    engine.insert("t", [{"id": 102, "s": "11", "v": 2}])
    report = engine.step()
    assert not report.warnings, report.warnings
    _oracle(engine, spark, "picky", bad_sql, ["t"], report.epoch)
    _oracle(engine, spark, "total", agg_sql, ["t"], report.epoch)


@pytest.mark.connect  # Spark Connect's errors are classified as a classic session's
def test_a_failed_link_fails_its_mv_and_drop_clears_it(engine, spark):
    """A failure inside an MV's internal link (an aggregate under a join): the MV
    names itself as failed; CREATE OR REPLACE with a query that does not fail
    replaces it (the failure forgotten), and DROP leaves no mark."""
    engine.sql("CREATE TABLE a (id BIGINT, g STRING, PRIMARY KEY (id))")
    engine.sql("CREATE TABLE b (g STRING, w INT, PRIMARY KEY (g))")
    engine.insert("a", [{"id": i, "g": str(i % 3)} for i in range(9)])
    engine.insert("b", [{"g": str(i), "w": i} for i in range(3)])
    engine.step()
    engine.sql("CREATE MATERIALIZED VIEW j AS SELECT x.g, x.n, b.w FROM "
               "(SELECT g, count(*) AS n FROM a WHERE cast(g AS INT) >= 0 GROUP BY g) x "
               "JOIN b ON x.g = b.g")
    _step_until_created(engine, "j")
    engine.insert("a", [{"id": 50, "g": "oops"}])
    report = engine.step()
    assert any("'j' failed" in w for w in report.warnings), report.warnings
    with pytest.raises(MaterializedViewNotReady, match="ALTER MATERIALIZED VIEW j RECOMPUTE"):
        engine.read("j")
    # a query that does not fail replaces it; the switch forgets the failure
    fixed = ("SELECT x.g, x.n, b.w FROM (SELECT g, count(*) AS n FROM a "
             "WHERE try_cast(g AS INT) >= 0 GROUP BY g) x JOIN b ON x.g = b.g")
    engine.sql(f"CREATE OR REPLACE MATERIALIZED VIEW j AS {fixed}")
    for _ in range(10):
        report = engine.step()
        if engine.progress("j").failed is None:
            break
    assert engine.progress("j").failed is None
    _oracle(engine, spark, "j", fixed, ["a", "b"], report.epoch)
    engine.insert("a", [{"id": 52, "g": "oops"}, {"id": 53, "g": "2"}])
    report = engine.step()
    _oracle(engine, spark, "j", fixed, ["a", "b"], report.epoch)
    engine.sql("DROP MATERIALIZED VIEW j")
    engine.insert("a", [{"id": 51, "g": "1"}])
    report = engine.step()
    assert not report.warnings, report.warnings
    assert engine.meta.get("failed_relations") in (None, "{}")


@pytest.mark.parametrize("strategy", [
    pytest.param("arrangement", marks=pytest.mark.extended),  # the epoch's path: as above
    "snapshot"])
def test_a_backfill_that_fails_on_a_row_fails_the_creating_mv_alone(engine, spark, strategy):
    """The row is there before CREATE (its probe over no rows passes): the backfill
    raises — in the epoch, or in the snapshot strategy's job beside the epochs, which
    retried it forever — the MV fails while creating, the other MV is created;
    RECOMPUTE says to drop it; DROP and CREATE again once the row is gone."""
    engine.sql("CREATE TABLE t (id BIGINT, s STRING, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "s": "k7" if i == 3 else str(i)} for i in range(6)])
    engine.step()
    engine.sql(f"CREATE MATERIALIZED VIEW picky WITH (backfill = '{strategy}') AS "
               "SELECT id FROM t WHERE s > 1.5")
    engine.sql("CREATE MATERIALIZED VIEW fine AS SELECT id, s FROM t")
    report = None
    for _ in range(12):
        report = engine.step()
        if engine.progress("fine").state == "created" and engine.progress("picky").failed:
            break
        time.sleep(0.5)  # the snapshot job runs beside the epochs
    assert engine.progress("fine").state == "created"
    assert engine.progress("picky").failed is not None
    assert "while being created" in engine.progress("picky").failed
    _oracle(engine, spark, "fine", "SELECT id, s FROM t", ["t"], report.epoch)
    with pytest.raises(SqlError, match="DROP MATERIALIZED VIEW picky"):
        engine.sql("ALTER MATERIALIZED VIEW picky RECOMPUTE")
    engine.sql("DROP MATERIALIZED VIEW picky")
    engine.delete("t", [{"id": 3}])
    engine.step()
    engine.sql("CREATE MATERIALIZED VIEW picky AS SELECT id FROM t WHERE s > 1.5")
    _step_until_created(engine, "picky")
    report = engine.step()
    _oracle(engine, spark, "picky", "SELECT id FROM t WHERE s > 1.5", ["t"], report.epoch)


def test_a_row_deleted_after_its_fold_never_fails_a_new_mv(engine, spark):
    """A row the query raises on, folded into the table's base, then deleted (the
    delete in the log): an MV created after it reads only live rows (the read merges
    base and log before the query's filter runs), so it is created, and exact. Spark
    once ran the filter below the merge's anti-join, on the base's deleted row."""
    engine.store.min_compact_rows, engine.store.log_fraction = 1, 0.0
    engine.sql("CREATE TABLE t (id BIGINT, s STRING, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "s": "k7" if i == 3 else str(i)} for i in range(6)])
    engine.step()
    engine.store.min_compact_rows, engine.store.log_fraction = 10_000, 1.0
    engine.delete("t", [{"id": 3}])
    engine.step()
    files = engine.store.files_at(engine.catalog.get("t").stored, engine.committed_epoch)
    assert sorted(f.kind for f in files) == ["base", "log"], files
    engine.sql("CREATE MATERIALIZED VIEW picky AS SELECT id FROM t WHERE s > 1.5")
    _step_until_created(engine, "picky")
    report = engine.step()
    assert not engine.progress("picky").failed
    _oracle(engine, spark, "picky", "SELECT id FROM t WHERE s > 1.5", ["t"], report.epoch)


# the fold and the read it fixed are the same under every strategy: blocking and
# snapshot are extended variants of the default's
@pytest.mark.parametrize("backfill", [
    pytest.param("blocking", marks=pytest.mark.extended), "arrangement",
    pytest.param("snapshot", marks=pytest.mark.extended)])
def test_a_row_deleted_after_its_fold_never_fails_a_new_mv_over_a_large_table(
        engine, spark, backfill):
    """The same over a table of more rows than a read merges in its own job
    (``LOCAL_WRITE_ROWS``): its read drops the base rows the log replaced by an
    anti-join, below which Spark pushes the query's filter, so the first run of the
    epoch raises on the deleted row; the epoch runs again with every read merged by
    key, and the MV is created, and exact (the snapshot strategy's job, beside the
    epochs, reads its chunks guarded against that push). A row the query raises on
    that is live still fails the MV (alone) after that retry."""
    from sparkfill.storage.relation_store import LOCAL_WRITE_ROWS

    n = LOCAL_WRITE_ROWS + 5_000
    engine.store.min_compact_rows, engine.store.log_fraction = 1, 0.0
    engine.sql("CREATE TABLE t (id BIGINT, s STRING, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "s": "k7" if i == 3 else str(i)} for i in range(n)])
    engine.step()
    engine.store.min_compact_rows, engine.store.log_fraction = 10_000, 1.0
    engine.delete("t", [{"id": 3}])
    engine.insert("t", [{"id": 5, "s": "50"}])
    engine.step()
    files = engine.store.files_at(engine.catalog.get("t").stored, engine.committed_epoch)
    assert {f.kind for f in files} == {"base", "log"}, files
    assert sum(f.rows for f in files) > LOCAL_WRITE_ROWS
    sql = "SELECT id, s FROM t WHERE s > 1.5"
    engine.sql(f"CREATE MATERIALIZED VIEW picky WITH (backfill = '{backfill}') AS {sql}")
    engine.sql("CREATE MATERIALIZED VIEW fine AS SELECT id FROM t WHERE id % 7 = 0")
    _step_until_created(engine, "picky", "fine")
    assert not engine.progress("picky").failed
    report = engine.step()
    _oracle(engine, spark, "picky", sql, ["t"], report.epoch)
    # a live row the query raises on still fails it, alone
    engine.insert("t", [{"id": n + 1, "s": "k8"}])
    report = engine.step()
    assert any("'picky' failed" in w for w in report.warnings), report.warnings
    assert engine.progress("fine").failed is None
    _oracle(engine, spark, "fine", "SELECT id FROM t WHERE id % 7 = 0", ["t"], report.epoch)


def test_a_deferred_delta_that_fails_is_found_and_fails_its_mv_alone(engine, spark):
    """A created MV nothing reads writes its small Δ with the epoch's others in one job
    at the end: when that job raises, the epoch runs again writing each Δ alone, to
    find whose it was."""
    engine.sql("CREATE TABLE t (id BIGINT, s STRING, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "s": str(i)} for i in range(6)])
    engine.step()
    engine.sql("CREATE MATERIALIZED VIEW lone AS SELECT id FROM t WHERE s > 1.5")
    engine.sql("CREATE MATERIALIZED VIEW other AS SELECT id, s FROM t WHERE id > 2")
    _step_until_created(engine, "lone", "other")
    engine.insert("t", [{"id": 9, "s": "k7"}, {"id": 10, "s": "10"}])
    report = engine.step()
    assert any("'lone' failed" in w for w in report.warnings), report.warnings
    assert engine.progress("other").failed is None
    _oracle(engine, spark, "other", "SELECT id, s FROM t WHERE id > 2", ["t"], report.epoch)
