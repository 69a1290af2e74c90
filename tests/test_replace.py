"""``CREATE OR REPLACE MATERIALIZED VIEW``: an MV switches to a new query online,
its dependents and sinks untouched.

Oracle: at every epoch, ``m`` equals Spark's batch query of the definition it had
then (the old one before the switch, time travel included; the new one from the
switch on), ``m2`` (an MV over ``m``) equals its query over ``m``, and the Delta sink
on ``m2`` equals ``m2``; ``m2``'s state tables keep their identity across every
switch. Refusals change nothing; a crash before the switch's commit re-runs it.
"""

from __future__ import annotations

import os
import random
import time

import pytest
from deltalake import DeltaTable
from helpers import assert_same_rows
from test_crash import READY_TIMEOUT, Child, _tail
from workload import Workload, create_table_sql

from sparkfill import DependentObjects, Engine, SqlError, UnsupportedQuery
from sparkfill.ui.facts import status_facts

M_SQL = [
    # the first definition, then: a changed filter, a changed aggregate, an added column
    "SELECT g, count(*) AS n, sum(v) AS total FROM t WHERE v % 2 = 0 GROUP BY g",
    "SELECT g, count(*) AS n, sum(v) AS total FROM t WHERE v % 3 = 0 GROUP BY g",
    "SELECT g, count(*) AS n, max(v) AS total FROM t WHERE v % 3 = 0 GROUP BY g",
    "SELECT g, count(*) AS n, max(v) AS total, min(s) AS low FROM t GROUP BY g",
]
M2_SQL = "SELECT n % 3 AS b, count(*) AS groups, sum(n) AS rows_ FROM m GROUP BY n % 3"


def _batch(spark, eng, sql: str, epoch: int, over: str = "t"):
    return spark.sql(sql.replace(f"FROM {over}", "FROM {src}"),
                     src=eng.read(over, as_of=epoch))


def _sink_rows(spark, path):
    return spark.createDataFrame(DeltaTable(str(path)).to_pandas())


def _identity(eng, name):
    return sorted((r.id, r.dir) for r in eng.catalog.states_of(eng.relation(name)))


def test_replaced_three_times_online_dependents_and_sink_never_rebuilt(spark, tmp_path):
    rng = random.Random(34)
    eng = Engine(tmp_path / "wh", spark=spark)
    sink_path = tmp_path / "sink"
    try:
        eng.sql(create_table_sql("t"))
        work = Workload(eng, spark, "t", rng, key_space=400)
        work.initial_load(240)
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS {M_SQL[0]}")
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m2 WITH (backfill = 'blocking') AS {M2_SQL}")
        eng.step()
        eng.sql(f"CREATE SINK out FROM m2 WITH (connector = 'delta', path = '{sink_path}')")
        eng.step()
        m2_states = _identity(eng, "m2")
        m2_id = eng.relation("m2").id
        definition = {e: M_SQL[0] for e in range(eng.committed_epoch + 1)}
        switches = []
        strategies = ["arrangement", "snapshot", "arrangement"]
        for i, sql in enumerate(M_SQL[1:]):
            before = eng.committed_epoch
            eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW m WITH (backfill = "
                    f"'{strategies[i]}', backfill_chunk_rows = 150) AS {sql}")
            assert eng.relation("m").sql == M_SQL[i]  # serving the old query
            for _ in range(12):
                work.random_epoch_dml()
                report = eng.step()
                e = report.epoch
                now = eng.relation("m").sql
                definition[e] = now
                assert_same_rows(eng.read("m", as_of=e), _batch(spark, eng, now, e),
                                 label=f"m ({i}) at epoch {e}")
                assert_same_rows(eng.read("m2", as_of=e),
                                 _batch(spark, eng, M2_SQL, e, over="m"),
                                 label=f"m2 at epoch {e}")
                assert_same_rows(_sink_rows(spark, sink_path), eng.read("m2", as_of=e),
                                 label=f"sink at epoch {e}", check_schema=False)
                if now == sql:
                    assert report.refresh["m"].reason.startswith("CREATE OR REPLACE")
                    break
            else:
                pytest.fail(f"replacement {i} did not switch within 12 epochs")
            switches.append(e)
            assert e > before + 1, "the switch came at once: nothing ran online"
            assert eng.progress("m").state == "created"
            # the dependent and its state tables are the same relations as before
            assert eng.relation("m2").id == m2_id and _identity(eng, "m2") == m2_states
        # time travel: each epoch in the columns and contents of the query it had then
        for e in (switches[0] - 1, switches[1] - 1, switches[2] - 1, switches[2]):
            assert_same_rows(eng.read("m", as_of=e), _batch(spark, eng, definition[e], e),
                             label=f"m as of {e}")
            assert eng.verify("m", as_of=e).count() == 0
        assert eng.read("m", as_of=switches[2] - 1).columns == ["g", "n", "total"]
        assert eng.read("m").columns == ["g", "n", "total", "low"]
        # no internal relation of an old definition or of a replacement is left
        names = {r.name for r in eng.catalog.all()}
        assert not any(n.startswith("__sf_r") and "_m" in n and
                       eng.catalog.find(n).owner is None and eng.catalog.find(n).kind == "mv"
                       for n in names), names
    finally:
        eng.close()


def test_a_refused_replacement_names_the_dependent_and_changes_nothing(spark, tmp_path):
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        eng.sql(create_table_sql("t"))
        Workload(eng, spark, "t", random.Random(1), key_space=100).initial_load(50)
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS {M_SQL[0]}")
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m2 WITH (backfill = 'blocking') AS {M2_SQL}")
        eng.sql("CREATE MATERIALIZED VIEW everything WITH (backfill = 'blocking') AS "
                "SELECT * FROM m")
        eng.step()
        meta_before = eng.meta.relations()
        cases = [
            # m2 reads n, which the new query drops
            ("SELECT g, sum(v) AS total FROM t GROUP BY g", DependentObjects, ["'m2'", "'n'"]),
            # SELECT * over m would change its columns
            (M_SQL[3], DependentObjects, ["'everything'", "SELECT *"]),
            # a column kept under another type
            ("SELECT g, count(*) AS n, CAST(sum(v) AS DOUBLE) AS total FROM t GROUP BY g",
             UnsupportedQuery, ["'total'", "bigint", "double"]),
            # another key
            ("SELECT id, g, v AS total FROM t", UnsupportedQuery, ["keyed by (id)"]),
            # over itself, or over what reads it
            ("SELECT g, n, total FROM m", UnsupportedQuery, ["itself"]),
            ("SELECT b AS g, groups AS n, rows_ AS total FROM m2", UnsupportedQuery, ["'m2'"]),
        ]
        for sql, error, words in cases:
            with pytest.raises(error) as info:
                eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW m AS {sql}")
            for word in words:
                assert word.lower() in str(info.value).lower(), (word, str(info.value))
            assert eng.meta.relations() == meta_before, sql
        with pytest.raises(SqlError, match="IF NOT EXISTS"):
            eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW IF NOT EXISTS m AS {M_SQL[1]}")
        with pytest.raises(SqlError, match="table"):
            eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW t AS {M_SQL[1]}")
        # CREATE OR REPLACE of a new name creates it
        eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW fresh WITH (backfill = 'blocking') AS "
                f"{M_SQL[1]}")
        eng.step()
        assert eng.verify("fresh").count() == 0
        # a replacement is cancelled by CANCEL JOBS: m keeps its query
        eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW m WITH (backfill_rate_limit = 0) AS "
                f"{M_SQL[2]}")
        assert eng.progress("m").state == "paused"
        assert any(j.name == "m" and j.state == "paused" for j in eng.progress())
        jobs = status_facts(eng.meta, eng.path)["jobs"]  # sparkfill status and ui
        assert [(j["name"], j["replacing"], j["state"]) for j in jobs] == [("m", True, "paused")]
        eng.sql("CANCEL JOBS m")
        eng.step()
        assert eng.relation("m").sql == M_SQL[0] and eng.progress("m").state == "created"
        assert eng.catalog.replacement_of(eng.relation("m")) is None
        assert not [r.name for r in eng.meta.relations() if r.name.startswith("__sf_r")]
    finally:
        eng.close()


def test_a_crash_before_the_switch_commits_reruns_it(spark, tmp_path, monkeypatch):
    rng = random.Random(8)
    path = tmp_path / "wh"
    eng = Engine(path, spark=spark)
    eng.sql(create_table_sql("t"))
    work = Workload(eng, spark, "t", rng, key_space=300)
    work.initial_load(150)
    eng.step()
    eng.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS {M_SQL[0]}")
    eng.step()
    eng.sql(f"CREATE MATERIALIZED VIEW m2 WITH (backfill = 'blocking') AS {M2_SQL}")
    eng.step()
    eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS {M_SQL[3]}")
    work.random_epoch_dml()
    eng.step()  # the replacement is created
    assert eng.relation("m").sql == M_SQL[0]
    work.random_epoch_dml()
    commit = eng.meta.commit_epoch

    def crash(c):
        if c.dropped:
            raise KeyboardInterrupt("killed before the switch's commit")
        return commit(c)
    monkeypatch.setattr(eng.meta, "commit_epoch", crash)
    with pytest.raises(KeyboardInterrupt):
        eng.step()
    eng.close()  # the epoch stays pending, as a crash leaves it
    eng = Engine(path, spark=spark)  # recovery re-runs the pending epoch: the switch
    try:
        e = eng.committed_epoch
        assert eng.relation("m").sql == M_SQL[3]
        assert_same_rows(eng.read("m", as_of=e), _batch(spark, eng, M_SQL[3], e))
        assert_same_rows(eng.read("m", as_of=e - 1), _batch(spark, eng, M_SQL[0], e - 1))
        assert_same_rows(eng.read("m2", as_of=e), _batch(spark, eng, M2_SQL, e, over="m"))
        work.eng = eng
        work.random_epoch_dml()
        e = eng.step().epoch
        assert_same_rows(eng.read("m", as_of=e), _batch(spark, eng, M_SQL[3], e))
        assert_same_rows(eng.read("m2", as_of=e), _batch(spark, eng, M2_SQL, e, over="m"))
    finally:
        eng.close()


def test_swap_exchanges_two_created_mvs_and_their_dependents_follow_the_names(spark, tmp_path):
    rng = random.Random(21)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        eng.sql(create_table_sql("t"))
        work = Workload(eng, spark, "t", rng, key_space=300)
        work.initial_load(150)
        eng.step()
        blue, green = M_SQL[0], M_SQL[2]
        eng.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS {blue}")
        eng.sql(f"CREATE MATERIALIZED VIEW green WITH (backfill = 'blocking') AS {green}")
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m2 WITH (backfill = 'blocking') AS {M2_SQL}")
        work.random_epoch_dml()
        before = eng.step().epoch
        pending = work.eng.meta.staged()  # DML staged before the swap waits for the next
        work.random_epoch_dml()
        eng.sql("ALTER MATERIALIZED VIEW m SWAP WITH green")
        e = eng.committed_epoch
        assert e == before + 1 and len(eng.meta.staged()) > len(pending)
        assert eng.relation("m").sql == green and eng.relation("green").sql == blue
        for name, sql in (("m", green), ("green", blue)):
            assert_same_rows(eng.read(name, as_of=e), _batch(spark, eng, sql, e))
            assert_same_rows(eng.read(name, as_of=before),
                             _batch(spark, eng, blue if name == "m" else green, before))
        assert_same_rows(eng.read("m2", as_of=e), _batch(spark, eng, M2_SQL, e, over="m"))
        for _ in range(2):
            work.random_epoch_dml()
            e = eng.step().epoch
            assert_same_rows(eng.read("m", as_of=e), _batch(spark, eng, green, e))
            assert_same_rows(eng.read("green", as_of=e), _batch(spark, eng, blue, e))
            assert_same_rows(eng.read("m2", as_of=e), _batch(spark, eng, M2_SQL, e, over="m"))
        # the names' internal relations went with the definitions: a new MV of a
        # swapped name gets internal names of its own
        eng.sql("DROP MATERIALIZED VIEW green")
        eng.sql(f"CREATE MATERIALIZED VIEW green WITH (backfill = 'blocking') AS {blue}")
        e = eng.step().epoch
        assert_same_rows(eng.read("green", as_of=e), _batch(spark, eng, blue, e))
        for bad, words in [("ALTER MATERIALIZED VIEW m SWAP WITH m2", ["reads 'm'"]),
                           ("ALTER MATERIALIZED VIEW m SWAP WITH t", ["'t'"]),
                           ("ALTER MATERIALIZED VIEW m SWAP WITH m", ["twice"])]:
            meta_before = eng.meta.relations()
            with pytest.raises(UnsupportedQuery) as info:
                eng.sql(bad)
            assert all(w in str(info.value) for w in words), str(info.value)
            assert eng.meta.relations() == meta_before
    finally:
        eng.close()


def test_a_sigkill_while_replacing_leaves_the_old_or_the_new_definition(spark, tmp_path):
    """The writer SIGKILLed at a random moment while a replacement is built or the MV
    switches: reopened, it finishes; at every epoch ``m`` equals the query it had then
    (the old one up to the switch, the new one from it; checked at the replacement's
    start, on both sides of the switch and at the end) and ``m2`` its query over
    ``m``."""
    path = tmp_path / "wh"
    rng = random.Random(35)
    eng = Engine(path, spark=spark)
    try:
        eng.sql(create_table_sql("t"))
        work = Workload(eng, spark, "t", rng, key_space=300)
        work.initial_load(200)
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS {M_SQL[0]}")
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m2 WITH (backfill = 'blocking') AS {M2_SQL}")
        eng.step()
        eng.sql("CREATE OR REPLACE MATERIALIZED VIEW m WITH (backfill = 'arrangement', "
                f"backfill_chunk_rows = 100) AS {M_SQL[3]}")
        first = eng.committed_epoch
    finally:
        eng.close()
    log = str(tmp_path / "driver.log")
    driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replace_driver.py")
    child = Child(str(path), "-", 35, log, driver, M_SQL[3])
    assert child.wait_for(lambda ln: ln == "READY", READY_TIMEOUT) is not None, _tail(log)
    assert child.wait_for(lambda ln: ln.startswith("STEP"), 300) is not None, _tail(log)
    time.sleep(rng.uniform(0.0, 4.0))
    killed = child.kill()
    eng = Engine(path, spark=spark)  # recovers the epoch the kill cut off, if any
    try:
        work = Workload(eng, spark, "t", rng, key_space=300)
        for _ in range(30):
            if eng.relation("m").sql == M_SQL[3]:
                break
            work.random_epoch_dml()
            eng.step()
        assert eng.relation("m").sql == M_SQL[3], "no switch after the kill"
        work.random_epoch_dml()
        last = eng.step().epoch
        switch = next(e for e in range(first, last + 1) if eng.relation("m").at(e).sql
                      == M_SQL[3])
        assert first < switch < last, (first, switch, last)
        for e in sorted({first, first + 1, switch - 1, switch, last}):
            then = eng.relation("m").at(e).sql
            assert_same_rows(eng.read("m", as_of=e), _batch(spark, eng, then, e),
                             label=f"m at epoch {e} (switched at {switch}, killed {killed})")
            assert_same_rows(eng.read("m2", as_of=e), _batch(spark, eng, M2_SQL, e, over="m"),
                             label=f"m2 at epoch {e}")
        assert not [r.name for r in eng.meta.relations() if r.name.startswith("__sf_r")
                    and eng.catalog.find(r.name).kind == "mv"]
    finally:
        eng.close()
