"""Faults that are not crashes (issue 35, item 2): a write that fails (``ENOSPC`` at
each durability point an epoch and its DML reach), a Delta commit that conflicts or
whose success is reported as a failure, a Spark job that fails once (the PostgreSQL
meta store restarting between epochs: ``test_meta_postgres.py``).

Invariant checked after every fault: the call either succeeded or raised a
``SparkfillError`` naming the fault; the warehouse is consistent (each table equals
the pure-Python model of the DML calls that returned, every MV equals its batch query,
the sink equals its MV); and the next call succeeds. The faults are injected by
``durability_points`` (the functions that make things durable, wrapped from here).
"""

from __future__ import annotations

import os
import random

import durability_points as dp
import pytest
from helpers import TableModel, assert_rows_equal, rows_of

from sparkfill import Engine, SparkfillError

#: ``make torture`` sets it: every point an epoch reaches, each twice; CI's slice takes
#: the points of ``CI_POINTS`` (the kinds of act, one each) once
FULL = os.environ.get("SPARKFILL_TORTURE") == "1"
CI_POINTS = ("meta:commit_epoch",)

QUERIES = {
    "agg": "SELECT g, COUNT(*) AS c, SUM(v) AS sv FROM t GROUP BY g",
    "proj": "SELECT id, v FROM t WHERE v % 2 = 0",
}


@pytest.fixture
def points():
    dp.install()
    yield dp
    dp.inject(None)


class Warehouse:
    """A table ``t``, two MVs over it and a sink, with its model."""

    def __init__(self, eng: Engine, sink_path: str, seed: int = 7) -> None:
        self.eng = eng
        self.rng = random.Random(seed)
        self.model = TableModel(["id", "g", "v"])
        self.sink_path = sink_path
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        self.insert(60)
        eng.step()
        self.model.step()
        for name, query in QUERIES.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS {query}")
        eng.sql(f"CREATE SINK s FROM agg WITH (connector = 'delta', path = '{sink_path}', "
                "buckets = 2)")
        # housekeeping every few epochs (compaction folds and merges)
        eng.store.max_log_files, eng.store.min_compact_rows, eng.store.log_fraction = 3, 40, 1.0
        eng.step()
        self.model.step()

    def insert(self, n: int) -> None:
        rows = [{"id": self.rng.randrange(200), "g": self.rng.randrange(4),
                 "v": self.rng.randrange(50)} for _ in range(n)]
        rows = list({r["id"]: r for r in rows}.values())
        self.eng.insert("t", rows)
        self.model.insert(rows)

    def delete(self, n: int) -> None:
        keys = [{"id": self.rng.randrange(200)} for _ in range(n)]
        self.eng.delete("t", keys)
        self.model.delete(keys)

    def dml(self, spark) -> None:
        """Some DML (a call that raises applies nothing: it is not modelled)."""
        for call in (lambda: self.insert(12), lambda: self.delete(5), lambda: self.insert(6)):
            try:
                call()
            except SparkfillError as exc:
                assert_names_fault(exc)
        rows = [(self.rng.randrange(200), self.rng.randrange(4), 99) for _ in range(3)]
        rows = list({r[0]: r for r in rows}.values())
        try:
            self.eng.insert("t", spark.createDataFrame(rows, "id BIGINT, g INT, v BIGINT"))
        except SparkfillError as exc:
            assert_names_fault(exc)
        else:
            self.model.insert([{"id": i, "g": g, "v": v} for i, g, v in rows])

    def step(self) -> bool:
        """One epoch; False when it raised (a SparkfillError naming the fault)."""
        try:
            self.eng.step()
        except SparkfillError as exc:
            assert_names_fault(exc)
            return False
        self.model.step()
        return True

    def check(self, spark, label: str) -> None:
        eng = self.eng
        epoch = eng.committed_epoch
        assert_rows_equal(eng.read("t"), self.model.rows(), label=f"{label}: t vs model")
        for name in QUERIES:
            diff = eng.verify(name).collect()
            assert not diff, f"{label}: MV {name} differs from its query at {epoch}: {diff}"
        from deltalake import DeltaTable

        sink = DeltaTable(self.sink_path)
        assert sink.transaction_version(f"sparkfill-sink-{eng.meta.sinks()[0].id}") == epoch, \
            f"{label}: sink not synced to {epoch}"
        got = sorted(tuple(r.values()) for r in sink.to_pyarrow_table()
                     .select(["g", "c", "sv"]).to_pylist())
        assert got == rows_of(eng.read("agg")), f"{label}: sink differs from agg"


def assert_names_fault(exc: BaseException) -> None:
    text = str(exc)
    assert "injected" in text or "No space left" in text or "conflict" in text.lower(), \
        f"the error does not name the fault: {type(exc).__name__}: {text}"


def _epoch_points(wh: Warehouse, spark) -> list[str]:
    """The points one epoch with DML reaches (its DML's staging included)."""
    before = dict(dp.counts)
    wh.dml(spark)
    assert wh.step()
    return sorted(p for p, n in dp.counts.items() if n > before.get(p, 0) and p != dp.ANY)


def test_enospc_at_every_write_point_raises_clearly_and_the_next_call_succeeds(
        points, warehouse, spark, tmp_path):
    with Engine(warehouse, spark=spark, retain_epochs=3) as eng:
        wh = Warehouse(eng, str(tmp_path / "sink"))
        reached = [p for p in _epoch_points(wh, spark) if not p.startswith("rm:")
                   and (FULL or p in CI_POINTS)]
        fired = []
        for n, point in enumerate(reached * 2 if FULL else reached):
            # the next occurrence of the point fails; for the second round, the one after
            points.inject((point, points.counts[point] + 1 + (n >= len(reached))))
            wh.dml(spark)
            wh.step()
            points.inject(None)
            fired += [f for f in points.fired if f not in fired]
            assert wh.step(), f"the epoch after ENOSPC at {point} failed"
            wh.check(spark, f"after ENOSPC at {point}")
        # most points an epoch reached failed at least once (timing moves a few)
        hit = {f.rpartition("#")[0] for f in fired}
        assert len(hit) >= len(reached) * 3 // 4, (sorted(hit), reached)
        assert len(hit) >= (12 if FULL else 1), sorted(hit)
        print(f"ENOSPC: {len(fired)} faults at {len(hit)} points, all consistent")


def test_delta_commit_conflict_or_lost_reply_retries_exactly(points, warehouse, spark,
                                                              tmp_path):
    from deltalake.exceptions import CommitFailedError

    def conflict() -> BaseException:
        return CommitFailedError("Commit failed: a concurrent transaction conflicts (injected)")

    with Engine(warehouse, spark=spark, retain_epochs=3) as eng:
        wh = Warehouse(eng, str(tmp_path / "sink"))
        commits = [p for p in _epoch_points(wh, spark) if p.startswith("delta.commit:")
                   and (FULL or p == "delta.commit:_write")]
        assert commits
        for point in commits:
            # refused (nothing committed), then committed but reported failed
            for after_act in (False, True) if FULL else (True,):
                points.inject((point, points.counts[point] + 1), conflict, after_act)
                wh.dml(spark)
                wh.step()
                points.inject(None)
                assert wh.step(), f"the epoch after a conflict at {point} failed"
                where = "after" if after_act else "instead of"
                wh.check(spark, f"after a conflict at {point} ({where} the commit)")


def test_a_spark_job_that_fails_once(points, warehouse, spark, tmp_path):
    def failed_job() -> BaseException:
        try:
            spark.range(1).selectExpr("raise_error('task killed (injected)')").collect()
        except Exception as exc:  # noqa: BLE001 - the failed job's own error
            return exc
        raise AssertionError("the failing job did not fail")

    with Engine(warehouse, spark=spark, retain_epochs=3) as eng:
        wh = Warehouse(eng, str(tmp_path / "sink"))
        writes = [p for p in _epoch_points(wh, spark) if p.startswith(("spark.write:",
                                                                         "parquet:"))
                  and (FULL or p == "spark.write:_write")]
        assert any(p.startswith("spark.write:") for p in writes), writes
        for point in writes:
            points.inject((point, points.counts[point] + 1), failed_job)
            wh.dml(spark)
            wh.step()
            points.inject(None)
            assert wh.step(), f"the epoch after a failed job at {point} failed"
            wh.check(spark, f"after a failed Spark job at {point}")


def test_dml_between_a_failed_epoch_and_its_retry_applies_once(points, warehouse, spark,
                                                               tmp_path):
    """An epoch fails after some of its appends landed (the table's), the user keeps
    calling: DML, then ``step()``. The retry keeps the failed run's DML bound (the
    landed append holds that DML only); the DML staged since applies in the epoch
    after (before, the retry's new bound marked it applied: lost)."""
    with Engine(warehouse, spark=spark, retain_epochs=3) as eng:
        wh = Warehouse(eng, str(tmp_path / "sink"))
        for point in (("delta.commit:_commit_append", "meta:commit_epoch") if FULL
                      else ("delta.commit:_commit_append",)):
            wh.dml(spark)
            # the epoch's second append (the table's landed first), or its commit
            points.inject((point, points.counts[point] + (2 if "append" in point else 1)))
            assert not wh.step(), f"the fault at {point} did not fail the epoch"
            points.inject(None)
            wh.dml(spark)  # staged after the failed attempt: applied by the epoch after
            eng.step()  # the retry: the failed run's DML
            assert wh.step()  # then the DML staged since (the model: both, in order)
            wh.check(spark, f"after DML between a failed epoch ({point}) and its retry")


def test_an_object_store_request_that_fails_once(spark, s3_server, pg_url, tmp_path,
                                                 monkeypatch):
    """A warehouse on S3 behind a proxy that cuts one request (as one that timed out):
    at several places of an epoch and its DML. The clients retry, or the call raises a
    SparkfillError; the warehouse stays exact and the next call succeeds."""
    from s3_server import FlakyProxy

    proxy = FlakyProxy(s3_server.endpoint.split("://", 1)[1])
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.chdir(tmp_path)
    uri = f"s3://{s3_server.new_bucket()}/wh"
    model = TableModel(["id", "g", "v"])
    rng = random.Random(5)
    raised = 0
    try:
        with Engine(uri, spark=spark, meta=pg_url) as eng:
            eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
            eng.sql(f"CREATE MATERIALIZED VIEW agg WITH (backfill = 'blocking') AS "
                    f"{QUERIES['agg']}")
            for n in (1, 4, 12, 30, 80) if FULL else (4,):
                proxy.fail_after(n)
                rows = list({r["id"]: r for r in ({"id": rng.randrange(300),
                                                   "g": rng.randrange(4),
                                                   "v": rng.randrange(9)} for _ in range(20))}
                            .values())
                try:
                    eng.insert("t", rows)
                    model.insert(rows)
                    eng.step()
                    model.step()
                except SparkfillError:
                    raised += 1
                proxy.fail_after(None)
                eng.step()
                model.step()
                assert_rows_equal(eng.read("t"), model.rows(), label=f"t after cut #{n}")
                assert not eng.verify("agg").collect(), f"agg after cut #{n}"
    finally:
        proxy.close()
    assert proxy.dropped >= (4 if FULL else 1), proxy.dropped
    print(f"object store: {proxy.dropped} requests cut, {raised} calls raised")


class Crash(BaseException):
    """A crash at a durability point, in-process: nothing after the point runs (no
    ``except Exception`` catches it); the engine is then reopened."""


def test_a_crash_between_the_catalog_and_the_files_leaves_no_folder(points, warehouse,
                                                                       spark):
    """DROP commits the catalog, then removes the folders; a job restarted on open
    creates fresh folders, then switches the catalog to them, then removes the old
    ones: a crash between any two of those leaves folders that recovery must remove
    (before, they stayed forever: found by the crash harness)."""
    import durability_driver as dd

    def reopen() -> Engine:
        eng = Engine(warehouse, spark=spark)
        problems = dd._check_files(eng)
        assert not problems, problems
        return eng

    eng = Engine(warehouse, spark=spark)
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", [{"id": i, "g": i % 3, "v": i} for i in range(300)])
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW d AS SELECT g, COUNT(*) AS c FROM t GROUP BY g")
    eng.step()
    points.inject(("meta:_drop_relations", points.counts["meta:_drop_relations"] + 1), Crash,
                  after_act=True)
    with pytest.raises(Crash):
        eng.sql("DROP MATERIALIZED VIEW d")
    eng.close()
    eng = reopen()
    # a buffer job restarts on open: crash after its first fresh folder, then after the
    # catalog switched to them
    eng.sql("CREATE MATERIALIZED VIEW b WITH (backfill = 'buffer', backfill_chunk_rows = 50, "
            "backfill_target_epoch_ms = 0) AS SELECT id, v FROM t WHERE g = 1")
    eng.step()
    assert eng.progress("b").state == "backfilling"
    eng.close()
    for point in ("delta.create:create", "meta:_restart_job"):
        points.inject((point, points.counts[point] + 1), Crash, after_act=True)
        with pytest.raises(Crash):
            Engine(warehouse, spark=spark)
        points.inject(None)
    eng = reopen()
    while eng.progress("b").state != "created":
        eng.step()
    assert not eng.verify("b").collect()
    eng.close()
