"""Processing-time columns: ``p_time TIMESTAMP AS PROCTIME()`` in a table's column
list holds the processing time of the epoch that wrote the row version (one time
per epoch, chosen when the epoch is planned, the same for every table), is
never written by users, survives reopening, and MVs window over it like over any
stored column: exact against the batch query at every epoch."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import sqlglot
from helpers import step_checking_queries
from pyspark.sql import functions as F

from sparkfill import DataError, Engine, SqlError, UnsupportedQuery
from sparkfill.sql.frontend import CreateTable, parse_statement
from sparkfill.sql.rewrite import time_windows_to_derived

DDL = ("CREATE TABLE t (id BIGINT, g INT, v BIGINT, p_time TIMESTAMP AS PROCTIME(), "
       "PRIMARY KEY (id))")


def times(eng, table: str = "t", as_of: int | None = None) -> dict[int, int]:
    """id -> the row's processing time in microseconds since the Unix epoch."""
    df = eng.read(table, as_of=as_of).select("id", F.unix_micros("p_time").alias("us"))
    return {r.id: r.us for r in df.collect()}


def timed_step(eng) -> tuple[int, int, int]:
    """Step; the epoch and the wall clock (µs) before and after it."""
    before = int(time.time() * 1_000_000)
    epoch = eng.step().epoch
    return epoch, before, int(time.time() * 1_000_000) + 1


def rows(ids, g: int = 1, v: int = 0) -> list[dict]:
    return [{"id": i, "g": g, "v": v} for i in ids]


# --------------------------------------------------------------------------- #
# Declaring one
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("column", [
    "p_time TIMESTAMP AS PROCTIME()", "p_time TIMESTAMP AS (proctime())",
    "p_time TIMESTAMP GENERATED ALWAYS AS (PROCTIME())", "p_time TIMESTAMPTZ AS PROCTIME()",
    "p_time TIMESTAMP_LTZ AS PROCTIME()", "p_time AS PROCTIME()"])
def test_proctime_column_is_parsed(column):
    cmd = parse_statement(f"CREATE TABLE t (id BIGINT, {column}, v INT, PRIMARY KEY (id)) "
                          "WITH (connector = 'datagen')")
    assert isinstance(cmd, CreateTable)
    assert cmd.proctime == "p_time"
    assert [(c.name, c.type) for c in cmd.columns] == [
        ("id", "bigint"), ("p_time", "timestamp"), ("v", "int")]
    assert cmd.options == {"connector": "datagen"}
    # a cast's AS inside a column's definition is left alone
    plain = parse_statement("CREATE TABLE u (id BIGINT, d DECIMAL(10,2) DEFAULT "
                            "CAST(1 AS DECIMAL(10,2)), PRIMARY KEY (id))")
    assert isinstance(plain, CreateTable) and plain.proctime is None


BAD_DECLARATIONS = [
    # two processing-time columns
    ("CREATE TABLE b (id BIGINT, p TIMESTAMP AS PROCTIME(), q TIMESTAMP AS PROCTIME(), "
     "PRIMARY KEY (id))", SqlError, ("b", "p", "q", "PROCTIME")),
    # in the primary key, either way it is declared
    ("CREATE TABLE b (id BIGINT, p TIMESTAMP AS PROCTIME(), PRIMARY KEY (id, p))", SqlError,
     ("b", "p", "PRIMARY KEY")),
    ("CREATE TABLE b (id BIGINT, p TIMESTAMP AS PROCTIME() PRIMARY KEY)", SqlError,
     ("b", "p", "PRIMARY KEY")),
    # other generated columns
    ("CREATE TABLE b (id BIGINT, p TIMESTAMP AS now(), PRIMARY KEY (id))", UnsupportedQuery,
     ("b", "p", "NOW()", "PROCTIME()")),
    ("CREATE TABLE b (id BIGINT, p BIGINT AS abs(id), PRIMARY KEY (id))", UnsupportedQuery,
     ("b", "p", "ABS(id)", "PROCTIME()")),
    ("CREATE TABLE b (id BIGINT, p BIGINT GENERATED ALWAYS AS (id + 1), PRIMARY KEY (id))",
     UnsupportedQuery, ("b", "p", "id + 1", "PROCTIME()")),
    ("CREATE TABLE b (id BIGINT, p BIGINT GENERATED ALWAYS AS IDENTITY, PRIMARY KEY (id))",
     UnsupportedQuery, ("b", "p", "IDENTITY", "PROCTIME()")),
    ("CREATE TABLE b (id BIGINT, p TIMESTAMP AS PROCTIME(1), PRIMARY KEY (id))",
     UnsupportedQuery, ("b", "p", "PROCTIME(1)")),
    # not a timestamp
    ("CREATE TABLE b (id BIGINT, p BIGINT AS PROCTIME(), PRIMARY KEY (id))", SqlError,
     ("b", "p", "TIMESTAMP", "BIGINT")),
]


@pytest.mark.parametrize("sql,error,words", BAD_DECLARATIONS,
                         ids=[str(i) for i in range(len(BAD_DECLARATIONS))])
def test_bad_proctime_declarations_are_refused(sql, error, words):
    with pytest.raises(error) as info:
        parse_statement(sql)
    for word in words:
        assert word.lower() in str(info.value).lower(), (word, str(info.value))


def test_bad_declaration_creates_nothing(engine):
    with pytest.raises(SqlError, match="PRIMARY KEY"):
        engine.sql("CREATE TABLE b (id BIGINT, p TIMESTAMP AS PROCTIME(), PRIMARY KEY (p))")
    assert engine.catalog.find("b") is None
    engine.sql("CREATE TABLE b (id BIGINT, p TIMESTAMP AS PROCTIME(), PRIMARY KEY (id))")
    assert engine.relation("b").proctime == "p"


def test_clock_functions_in_an_mv_point_to_proctime(engine):
    engine.sql(DDL)
    for fn in ("now()", "current_timestamp()"):
        with pytest.raises(UnsupportedQuery, match="PROCTIME") as info:
            engine.sql(f"CREATE MATERIALIZED VIEW m AS SELECT id, {fn} AS at FROM t")
        assert "non-deterministic" in str(info.value)


# --------------------------------------------------------------------------- #
# Its values
# --------------------------------------------------------------------------- #


def test_one_time_per_epoch_refreshed_when_a_row_is_written(engine, spark):
    eng = engine
    eng.sql(DDL)
    eng.sql("CREATE TABLE other (id BIGINT, at TIMESTAMP AS PROCTIME(), PRIMARY KEY (id))")
    assert "p_time TIMESTAMP AS PROCTIME()" in eng.sql("SHOW TABLES").where(
        "name = 't'").first()["columns"]
    # epoch 1: dicts, and another table in the same epoch
    eng.insert("t", rows(range(5)))
    eng.insert("other", [{"id": 1}])
    e1, lo, hi = timed_step(eng)
    t1 = times(eng)
    assert set(t1) == set(range(5)) and len(set(t1.values())) == 1
    first = t1[0]
    assert lo <= first <= hi
    assert eng.read("other").select(F.unix_micros("at")).first()[0] == first
    # epoch 2: a pandas upsert of an existing key and new keys, INSERT without a
    # column list (the processing time is not one of its values), an UPDATE
    eng.insert("t", pd.DataFrame(rows([1, 10, 11], v=7)))
    eng.sql("INSERT INTO t VALUES (12, 2, 5)")
    eng.sql("UPDATE t SET v = v + 1 WHERE id = 2")
    e2, lo, hi = timed_step(eng)
    t2 = times(eng)
    second = t2[10]
    assert lo <= second <= hi and second > first
    assert {i: t2[i] for i in (1, 2, 10, 11, 12)} == dict.fromkeys((1, 2, 10, 11, 12), second)
    assert {i: t2[i] for i in (0, 3, 4)} == dict.fromkeys((0, 3, 4), first), \
        "rows not written in epoch 2 keep their time"
    # epoch 3: a Spark DataFrame, a delete; an upsert of the same values still
    # writes a new version of the row, with the new time
    eng.insert("t", spark.createDataFrame(rows([3, 20], v=0), "id bigint, g int, v bigint"))
    eng.delete("t", [{"id": 4}])
    e3, _, _ = timed_step(eng)
    t3 = times(eng)
    third = t3[20]
    assert third > second and t3[3] == third and 4 not in t3
    assert t3[0] == first and t3[1] == second
    # an epoch that writes nothing to t changes none of its times
    eng.insert("other", [{"id": 2}])
    e4, _, _ = timed_step(eng)
    assert times(eng) == t3
    assert eng.read("other").select(F.unix_micros("at")).distinct().count() == 2
    # time travel shows each epoch's times
    assert times(eng, as_of=e1) == t1 and times(eng, as_of=e2) == t2
    assert sorted({first, second, third}) == [first, second, third]
    assert e1 < e2 < e3 < e4


def test_reopen_keeps_the_column_and_a_pending_epoch_keeps_its_time(spark, warehouse):
    eng = Engine(warehouse, spark=spark)
    try:
        eng.sql(DDL)
        eng.insert("t", rows(range(3)))
        eng.step()
        before = times(eng)
    finally:
        eng.close()
    eng = Engine(warehouse, spark=spark)
    try:
        assert eng.relation("t").proctime == "p_time"
        eng.insert("t", rows([3]))
        eng.step()
        after = times(eng)
        assert {i: after[i] for i in range(3)} == before
        assert after[3] > before[0]
        with pytest.raises(DataError, match="p_time"):
            eng.insert("t", [{"id": 5, "p_time": None}])
        # an epoch planned (its plan persisted) but not run, as after a crash: the
        # re-run on open writes the processing time its plan chose
        eng.insert("t", rows([4]))
        plan = eng.coordinator.plan()
        eng.meta.begin_epoch(plan["epoch"], plan)
    finally:
        eng.close()
    eng = Engine(warehouse, spark=spark)
    try:
        assert eng.committed_epoch == plan["epoch"]
        recovered = times(eng)
        assert recovered[4] == plan["proctime_us"] > after[3]
        assert {i: recovered[i] for i in range(4)} == after
    finally:
        eng.close()


def test_writing_the_column_is_refused_and_changes_nothing(engine, spark):
    eng = engine
    eng.sql(DDL)
    eng.insert("t", rows(range(3)))
    eng.step()
    epoch, before = eng.committed_epoch, times(eng)
    bad_calls = {
        "dicts": lambda: eng.insert("t", [{"id": 7, "g": 1, "v": 1},
                                          {"id": 1, "g": 1, "v": 1, "p_time": None}]),
        "pandas": lambda: eng.insert("t", pd.DataFrame(
            [{"id": 7, "g": 1, "v": 1, "P_TIME": pd.Timestamp("2024-01-01")}])),
        "spark": lambda: eng.insert("t", spark.createDataFrame(
            [(7, 1, 1)], "id bigint, g int, v bigint").withColumn("p_time", F.current_timestamp())),
        "insert": lambda: eng.sql("INSERT INTO t (id, g, v, p_time) VALUES "
                                  "(7, 1, 1, TIMESTAMP '2024-01-01 00:00:00')"),
        "update": lambda: eng.sql("UPDATE t SET v = 5, p_time = now() WHERE id = 1"),
    }
    for name, call in bad_calls.items():
        with pytest.raises(DataError) as info:
            call()
        message = str(info.value)
        assert "'t'" in message or " t:" in message, (name, message)
        assert "p_time" in message and "PROCTIME" in message, (name, message)
        assert eng.committed_epoch == epoch, name
    assert not eng.meta.staged(), "a refused call staged rows"
    # deleting by rows that carry the column is fine (only the key is read)
    eng.delete("t", eng.read("t").where("id = 2"))
    eng.step()
    assert times(eng) == {i: before[i] for i in (0, 1)}
    assert sorted(r.id for r in eng.read("t").collect()) == [0, 1]


# --------------------------------------------------------------------------- #
# Windows over it, and sources
# --------------------------------------------------------------------------- #

WINDOWED = {
    "w10": ("SELECT g, count(*) AS n, sum(v) AS total, window_start, window_end FROM "
            "TUMBLE(t, p_time, INTERVAL '10' SECOND) GROUP BY g, window_start, window_end"),
    "w1": ("SELECT g, count(*) AS n, window_start, window_end FROM "
           "TUMBLE(t, p_time, INTERVAL '1' SECOND) GROUP BY g, window_start, window_end"),
}


def batch(spark, eng, query: str, epoch: int):
    """Spark running ``query`` (TUMBLE as its definition) over t's snapshot at ``epoch``."""
    eng.read("t", as_of=epoch).createOrReplaceTempView("t")
    return spark.sql(time_windows_to_derived(sqlglot.parse_one(query, read="spark"))
                     .sql(dialect="spark"))


def test_tumble_over_proctime_matches_the_batch_query(engine, spark):
    eng = engine
    eng.sql(DDL)
    # w10 from the start, w1 created online over history
    eng.sql(f"CREATE MATERIALIZED VIEW w10 AS {WINDOWED['w10']}")
    eng.insert("t", [{"id": i, "g": i % 3, "v": i} for i in range(20)])
    eng.step()
    eng.insert("t", [{"id": i, "g": i % 3, "v": i} for i in range(20, 30)])
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW w1 WITH (backfill = 'no_shuffle', "
            f"backfill_chunk_rows = 20) AS {WINDOWED['w1']}")
    counter = iter(range(100, 10_000))

    def writes():
        n = next(counter)
        eng.insert("t", [{"id": n, "g": n % 3, "v": n}, {"id": n % 30, "g": 2, "v": -n}])
        eng.delete("t", [{"id": (n * 7) % 30}])
        eng.sql(f"UPDATE t SET v = v + 1 WHERE id = {(n * 11) % 30}")

    checked = step_checking_queries(eng, spark, WINDOWED, batch, writes, 8, "proctime")
    assert min(checked.values()) >= 2, checked
    for name in WINDOWED:
        assert eng.verify(name).count() == 0
    # rows of several epochs: several processing-time windows of 1 s
    assert eng.read("w1").select("window_start").distinct().count() >= 2


def test_a_source_fills_the_column(engine):
    eng = engine
    eng.sql("CREATE TABLE bid (id BIGINT, auction BIGINT, bidder BIGINT, price BIGINT, "
            "date_time TIMESTAMP, p_time TIMESTAMP AS PROCTIME(), PRIMARY KEY (id)) WITH "
            "(connector = 'datagen', mode = 'nexmark', nexmark_stream = 'bid', "
            "rows_per_epoch = 100, seed = 3, insert_ratio = 0.8, update_ratio = 0.2)")
    with pytest.raises(SqlError, match="source"):
        eng.insert("bid", rows([1]))
    e1, lo, hi = timed_step(eng)
    t1 = times(eng, "bid")
    assert t1 and all(lo <= us <= hi for us in t1.values())
    assert len(set(t1.values())) == 1
    e2, lo, hi = timed_step(eng)
    t2 = times(eng, "bid")
    written = {k for k in t2 if k not in t1 or t2[k] != t1[k]}
    new = set(t2) - set(t1)
    assert new and new <= written
    assert len(written) > len(new), "an update of a bid refreshes its time"
    assert {t2[k] for k in written} == {t2[min(new)]} and lo <= t2[min(new)] <= hi
    assert all(t2[k] == t1[k] for k in set(t1) & set(t2) - written)
