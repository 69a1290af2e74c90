"""Query rewrites of the same meaning: what each produces, and what it leaves alone
(no Spark); and that the decorrelated subqueries return the rows of the original
query, NULLs included, by Spark's batch queries over random tables, and that TUMBLE
are Spark's own tumbling and sliding windows. That the engine
maintains them is checked by the oracle tests of test_incremental_sql.py."""

from __future__ import annotations

import random

import pytest
import sqlglot
from helpers import assert_same_rows
from pyspark.sql import types as T
from sqlglot import exp

from sparkfill.errors import UnsupportedQuery
from sparkfill.sql.rewrite import (
    rewrite_query,
    session_windows_to_derived,
    time_windows_to_derived,
)

COLUMNS = {"orders": ["o_orderkey", "o_custkey"], "lineitem": ["l_orderkey", "l_qty"],
           "t": ["id", "k", "v"], "d": ["k", "name"]}


def rewrite(sql: str) -> str:
    tree = sqlglot.parse_one(sql, read="spark")
    before = tree.sql(dialect="spark")
    out = rewrite_query(tree, COLUMNS.get).sql(dialect="spark")
    assert tree.sql(dialect="spark") == before, "the input tree must stay as it was"
    return out


def test_order_by_without_limit_is_dropped_and_kept_with_it():
    assert rewrite("SELECT id FROM t ORDER BY id DESC") == "SELECT id FROM t"
    assert rewrite("SELECT id FROM t UNION ALL SELECT k FROM d ORDER BY 1") == \
        "SELECT id FROM t UNION ALL SELECT k FROM d"
    assert "ORDER BY id LIMIT 3" in rewrite("SELECT id FROM t ORDER BY id LIMIT 3")
    # an ORDER BY inside a window is not the query's
    assert "OVER (ORDER BY v)" in rewrite("SELECT row_number() OVER (ORDER BY v) AS r FROM t")


def test_filter_clauses_become_case_expressions():
    out = rewrite("SELECT k, count(*) FILTER (WHERE v > 1) AS a, "
                  "count(DISTINCT v) FILTER (WHERE v < 9) AS b, sum(v) FILTER (WHERE k = 2) AS c "
                  "FROM t GROUP BY k")
    assert "FILTER" not in out
    assert "COUNT(CASE WHEN v > 1 THEN 1 END) AS a" in out
    assert "COUNT(DISTINCT CASE WHEN v < 9 THEN v END) AS b" in out
    assert "SUM(CASE WHEN k = 2 THEN v END) AS c" in out


def test_comma_joins_take_their_equalities_from_where():
    assert rewrite("SELECT o_custkey FROM orders, lineitem WHERE o_orderkey = l_orderkey "
                   "AND l_qty > 3") == \
        "SELECT o_custkey FROM orders JOIN lineitem ON o_orderkey = l_orderkey WHERE l_qty > 3"
    assert rewrite("SELECT x.id FROM t x, d y WHERE y.k = x.k") == \
        "SELECT x.id FROM t AS x JOIN d AS y ON y.k = x.k"
    # k is a column of both: unqualified, it names no one relation; without an
    # equality the cross join is a join on a constant (every pair matches)
    assert "AS __sf_one FROM d) AS d ON 1 = d.__sf_one" in \
        rewrite("SELECT id FROM t, d WHERE k = k")
    assert "ON 1 = d.__sf_one" in rewrite("SELECT t.id FROM t, d WHERE t.v < d.k")
    # an explicit join is left as written
    assert rewrite("SELECT t.id FROM t LEFT JOIN d ON t.k = d.k WHERE t.v = d.k") == \
        "SELECT t.id FROM t LEFT JOIN d ON t.k = d.k WHERE t.v = d.k"


def test_conditions_common_to_every_or_branch_are_factored_out():
    out = rewrite("SELECT l_qty FROM lineitem, orders WHERE (o_orderkey = l_orderkey AND "
                  "l_qty > 1 AND o_custkey = 2) OR (o_orderkey = l_orderkey AND l_qty > 9)")
    assert out == ("SELECT l_qty FROM lineitem JOIN orders ON o_orderkey = l_orderkey "
                   "WHERE (l_qty > 1 AND o_custkey = 2) OR l_qty > 9"), out
    # a branch of common terms only makes the OR true
    assert rewrite("SELECT id FROM t WHERE (v = 1 AND k = 2) OR v = 1 OR (k = 3 AND v = 1)") \
        == "SELECT id FROM t WHERE v = 1"
    # nothing in common: unchanged
    assert rewrite("SELECT id FROM t WHERE (v = 1 AND k = 2) OR k = 3") == \
        "SELECT id FROM t WHERE (v = 1 AND k = 2) OR k = 3"


def test_derived_tables_and_ctes_that_filter_and_project_are_merged():
    out = rewrite("SELECT s.k, count(*) AS C FROM (SELECT k, v * 2 AS w FROM t WHERE v > 1) AS s "
                  "GROUP BY s.k")
    assert "SELECT" not in out[6:] and "WHERE `t`.`v` > 1" in out and "AS `C`" in out, out
    out = rewrite("WITH x AS (SELECT id, k FROM t WHERE v > 3) "
                  "SELECT x.id, d.name FROM x JOIN d ON x.k = d.k")
    assert "WITH" not in out and "JOIN `d`" in out and "`t`.`v` > 3" in out, out
    # an aggregate below: left as written (the planner refuses the subquery)
    sql = "SELECT s.k FROM (SELECT k, count(*) AS c FROM t GROUP BY k) AS s WHERE s.c > 2"
    assert rewrite(sql) == sqlglot.parse_one(sql, read="spark").sql(dialect="spark")
    # an unknown relation: left as written
    sql = "SELECT s.id FROM (SELECT id FROM nowhere) AS s"
    assert rewrite(sql) == sqlglot.parse_one(sql, read="spark").sql(dialect="spark")


def test_subqueries_become_joins_with_derived_tables():
    out = rewrite("SELECT id FROM t WHERE v > (SELECT avg(v) FROM t)")
    assert "JOIN (SELECT AVG(v) AS __sf_v, 1 AS __sf_one FROM t) AS __sf_sq1 ON 1 = " \
           "__sf_sq1.__sf_one" in out and "v > __sf_sq1.__sf_v" in out, out
    # correlated, compared (NULL over no rows): an inner join with the grouped aggregate
    out = rewrite("SELECT id FROM t WHERE v < (SELECT max(l_qty) FROM lineitem "
                  "WHERE l_orderkey = t.k)")
    assert " JOIN (SELECT l_orderkey AS __sf_k0, MAX(l_qty) AS __sf_v FROM lineitem GROUP BY " \
           "l_orderkey) AS __sf_sq1 ON t.k = __sf_sq1.__sf_k0" in out and "LEFT" not in out, out
    # a count: LEFT JOIN, 0 for a key without rows
    out = rewrite("SELECT id, (SELECT count(*) FROM lineitem WHERE l_orderkey = t.k) AS n FROM t")
    assert "LEFT JOIN" in out and "CASE WHEN __sf_sq1.__sf_k0 IS NULL THEN 0 ELSE " \
           "__sf_sq1.__sf_v END AS n" in out, out
    out = rewrite("SELECT id FROM t WHERE NOT EXISTS (SELECT * FROM d WHERE d.k = t.k)")
    assert "LEFT JOIN (SELECT DISTINCT d.k AS __sf_k0 FROM d)" in out \
        and "WHERE __sf_sq1.__sf_k0 IS NULL" in out, out
    out = rewrite("SELECT id FROM t WHERE k NOT IN (SELECT k FROM d)")
    assert "COUNT_IF(k IS NULL) AS __sf_nulls" in out and "__sf_sq2.__sf_n = 0" in out, out
    out = rewrite("SELECT id FROM t WHERE EXISTS (SELECT * FROM d WHERE d.k = t.k "
                  "AND d.name <> t.id)")
    assert "MIN(d.name) AS __sf_lo, MAX(d.name) AS __sf_hi" in out and "GROUP BY d.k" in out, out
    out = rewrite("SELECT k, sum(v) AS s FROM t GROUP BY k HAVING sum(v) > (SELECT sum(v) "
                  "FROM t) * 0.1")
    assert out.startswith("SELECT `__sf_grouped`.`k` AS `k`, `__sf_grouped`.`s` AS `s` FROM "
                          "(SELECT k, SUM(v) AS s, SUM(v) AS __sf_h0 FROM t GROUP BY k) AS "
                          "__sf_grouped JOIN"), out
    # correlated by two comparisons: left as written (the planner refuses it)
    sql = "SELECT id FROM t WHERE EXISTS (SELECT * FROM d WHERE d.k < t.k AND d.name > t.v)"
    assert "EXISTS" in rewrite(sql)
    # a scalar subquery that is not one aggregate: its one row's value, NULL over none
    assert "(SELECT CASE WHEN COUNT(*) = 1 THEN MAX(__sf_c) END AS __sf_v, 1 AS __sf_one " \
        "FROM (SELECT k AS __sf_c FROM d WHERE name = 'a') AS __sf_scalar)" in rewrite(
            "SELECT id FROM t WHERE v = (SELECT k FROM d WHERE name = 'a')")
    # correlated: left as written (refused by the planner)
    assert "(SELECT k FROM d WHERE d.id = t.id)" in rewrite(
        "SELECT id FROM t WHERE v = (SELECT k FROM d WHERE d.id = t.id)")


# --- the decorrelated queries mean what the originals do (Spark) ---------------------------

MEANING_QUERIES = [
    "SELECT id, v FROM t WHERE v > (SELECT avg(v) FROM t)",
    "SELECT id FROM t WHERE v >= (SELECT max(v) - 3 FROM t b WHERE b.k = t.k)",
    "SELECT id, (SELECT count(*) FROM d WHERE d.k = t.k) AS n FROM t",
    "SELECT id, (SELECT coalesce(sum(w), -1) FROM d WHERE d.k = t.k) AS n FROM t",
    "SELECT id FROM t WHERE coalesce(v < (SELECT min(w) FROM d WHERE d.k = t.k), true)",
    "SELECT id FROM t WHERE k IN (SELECT k FROM d WHERE w > 2)",
    "SELECT id FROM t WHERE k NOT IN (SELECT k FROM d WHERE w > 2)",
    "SELECT id FROM t WHERE k NOT IN (SELECT k FROM d WHERE w > 100)",
    "SELECT id FROM t WHERE k NOT IN (SELECT k FROM d GROUP BY k)",
    "SELECT id FROM t WHERE EXISTS (SELECT * FROM d WHERE d.k = t.k AND d.w > 3)",
    "SELECT id FROM t WHERE NOT EXISTS (SELECT * FROM d WHERE d.k = t.k AND d.w > 3)",
    "SELECT id FROM t WHERE EXISTS (SELECT * FROM d WHERE d.w > 4)",
    "SELECT id FROM t WHERE NOT EXISTS (SELECT * FROM d WHERE d.w > 100)",
    "SELECT id FROM t WHERE EXISTS (SELECT * FROM d WHERE d.k = t.k AND d.w <> t.v)",
    "SELECT id FROM t WHERE NOT EXISTS (SELECT * FROM d WHERE d.k = t.k AND d.w <> t.v)",
    "SELECT id FROM t WHERE EXISTS (SELECT * FROM d WHERE d.k = t.k AND d.w < t.v)",
    "SELECT id FROM t WHERE NOT EXISTS (SELECT * FROM d WHERE d.k = t.k AND t.v <= d.w)",
    "SELECT k, sum(v) AS s FROM t GROUP BY k HAVING sum(v) > (SELECT avg(w) FROM d)",
    "WITH g AS (SELECT k, sum(v) AS s FROM t GROUP BY k) "
    "SELECT g.k, g.s FROM g WHERE g.s = (SELECT max(s) FROM g)",
    "SELECT id FROM t WHERE k IN (SELECT k FROM d WHERE d.w > (SELECT avg(v) FROM t))",
    "SELECT id FROM t WHERE EXISTS (SELECT * FROM d WHERE d.k = t.k AND d.w > t.v "
    "AND d.w > (SELECT avg(v) FROM t))",
    "SELECT k, v FROM t UNION SELECT k, w FROM d UNION SELECT id % 3, k FROM t",
    "SELECT id FROM t WHERE v IN (SELECT w FROM d WHERE d.k = t.k)",
    "SELECT id FROM t WHERE v NOT IN (SELECT w FROM d WHERE d.k = t.k)",
    "SELECT id FROM t WHERE k NOT IN (SELECT b.v FROM t b WHERE b.id = t.v AND b.k > 1)",
    "SELECT id, v FROM t WHERE v IN (SELECT w FROM d WHERE d.k = t.k AND d.w > 2) "
    "AND k NOT IN (SELECT w FROM d WHERE d.id = t.id)",
    "SELECT k, v FROM t INTERSECT SELECT k, w FROM d",
    "SELECT k, v FROM t EXCEPT SELECT k, w FROM d",
    "SELECT k FROM t WHERE v > 2 INTERSECT SELECT k FROM d EXCEPT SELECT id % 3 AS k FROM t",
    "SELECT k, count(*) AS c FROM t GROUP BY k EXCEPT SELECT k, w FROM d",
]
MEANING_COLUMNS = {"t": ["id", "k", "v"], "d": ["id", "k", "w"]}


def _random_rows(rng: random.Random, n: int) -> list[tuple]:
    def maybe(value: int) -> int | None:
        return None if rng.random() < 0.15 else value
    return [(i, maybe(rng.randrange(5)), maybe(rng.randrange(8))) for i in range(n)]


# more random tables: extended variants
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.extended),
                                  pytest.param(3, marks=pytest.mark.extended)])
def test_decorrelated_queries_return_the_rows_of_the_original(spark, seed):
    """Over random tables with NULL keys and values (``d`` sometimes empty), every
    query above returns the same rows as a multiset before and after the rewrite."""
    rng = random.Random(seed)
    schema = T.StructType([T.StructField(c, T.IntegerType()) for c in ("id", "k", "v")])
    spark.createDataFrame(_random_rows(rng, 30), schema).createOrReplaceTempView("t")
    d_rows = [] if seed == 3 else _random_rows(rng, 12)
    spark.createDataFrame(d_rows, schema).withColumnRenamed("v", "w").createOrReplaceTempView("d")
    try:
        for sql in MEANING_QUERIES:
            tree = sqlglot.parse_one(sql, read="spark")
            rewritten = rewrite_query(tree, MEANING_COLUMNS.get)
            # every subquery is now a derived table of a FROM or JOIN (a UNION a
            # DISTINCT over a derived UNION ALL)
            assert all(isinstance(sub.parent, exp.From | exp.Join)
                       for sub in rewritten.find_all(exp.Subquery)) \
                and rewritten.find(exp.Exists) is None, rewritten.sql(dialect="spark")
            assert_same_rows(spark.sql(rewritten.sql(dialect="spark")), spark.sql(sql),
                             label=f"{sql} (seed {seed})", check_schema=False)
    finally:
        spark.catalog.dropTempView("t")
        spark.catalog.dropTempView("d")


def test_tumble_and_hop_are_the_windows_spark_computes(spark):
    """``TUMBLE(t, ts, size)`` gives each row the window Spark's own ``window(ts,
    size)`` puts it in (aligned to the Unix epoch), for sub-second, second, minute
    and day sizes, timestamps before 1970 included; ``HOP(t, ts, slide, size)`` gives
    it every window ``window(ts, size, slide)`` does, the size a multiple of the
    slide or not."""
    rng = random.Random(5)
    rows = [(i, rng.randrange(-10**15, 10**15)) for i in range(200)]
    spark.createDataFrame(rows, "id INT, us BIGINT").selectExpr(
        "id", "timestamp_micros(us) AS ts").createOrReplaceTempView("tw")
    try:
        for size, spark_size in [("INTERVAL '250' MILLISECOND", "250 milliseconds"),
                                 ("INTERVAL '10' SECOND", "10 seconds"),
                                 ("INTERVAL '5' MINUTE", "5 minutes"),
                                 ("INTERVAL '1' DAY", "1 day")]:
            ours = time_windows_to_derived(sqlglot.parse_one(
                f"SELECT id, window_start, window_end FROM TUMBLE(tw, ts, {size})",
                read="spark")).sql(dialect="spark")
            spark_own = (f"SELECT id, window(ts, '{spark_size}').start AS window_start, "
                         f"window(ts, '{spark_size}').end AS window_end FROM tw")
            assert_same_rows(spark.sql(ours), spark.sql(spark_own), label=size)
        for slide, size, spark_slide, spark_size in [
                ("INTERVAL '2' SECOND", "INTERVAL '10' SECOND", "2 seconds", "10 seconds"),
                ("INTERVAL '4' SECOND", "INTERVAL '10' SECOND", "4 seconds", "10 seconds"),
                ("INTERVAL '1' MINUTE", "INTERVAL '1' HOUR", "1 minute", "1 hour")]:
            ours = time_windows_to_derived(sqlglot.parse_one(
                f"SELECT id, window_start, window_end FROM HOP(tw, ts, {slide}, {size})",
                read="spark")).sql(dialect="spark")
            spark_own = (f"SELECT id, w.start AS window_start, w.end AS window_end FROM "
                         f"(SELECT id, window(ts, '{spark_size}', '{spark_slide}') AS w "
                         "FROM tw)")
            assert_same_rows(spark.sql(ours), spark.sql(spark_own), label=f"{slide} {size}")
        with pytest.raises(UnsupportedQuery, match="HOP takes"):
            time_windows_to_derived(sqlglot.parse_one(
                "SELECT * FROM HOP(tw, ts, INTERVAL '5' SECOND)", read="spark"))
        with pytest.raises(UnsupportedQuery, match="fixed length"):
            time_windows_to_derived(sqlglot.parse_one(
                "SELECT * FROM TUMBLE(tw, ts, INTERVAL '1' MONTH)", read="spark"))
    finally:
        spark.catalog.dropTempView("tw")


def test_session_windows_are_the_sessions_spark_computes(spark):
    """``GROUP BY p, session_window(ts, gap)`` rewritten over window functions gives
    the sessions Spark's own ``session_window`` does: per group, rows apart by at
    most the gap share a session (exactly the gap apart included), equal times share
    one; NULL times and NULL groups; ``start``/``end`` and the whole struct; a WHERE
    applied before the sessions form; no other group column at all."""
    rng = random.Random(11)
    rows = []
    for i in range(300):
        g = rng.choice([1, 2, 3, None])
        us = None if rng.random() < 0.05 else rng.choice(
            [rng.randrange(0, 120) * 5_000_000, rng.randrange(0, 600_000_000)])
        rows.append((i, g, us, rng.randrange(0, 100)))
    spark.createDataFrame(rows, "id INT, g INT, us BIGINT, v INT").selectExpr(
        "id", "g", "timestamp_micros(us) AS ts", "v").createOrReplaceTempView("sw")
    try:
        for sql in [
            "SELECT g, count(*) AS n, sum(v) AS sv, session_window.start AS s, "
            "session_window.end AS e FROM sw GROUP BY g, session_window(ts, '10 seconds')",
            "SELECT g, session_window AS w, max(v) AS mv FROM sw WHERE v % 3 <> 0 "
            "GROUP BY g, session_window(ts, '5 seconds')",
            "SELECT count(*) AS n, session_window.end AS e FROM sw x "
            "GROUP BY session_window(x.ts, '1 minute') HAVING count(*) > 1",
        ]:
            ours = session_windows_to_derived(sqlglot.parse_one(sql, read="spark"))
            assert "session_window(" not in ours.sql(dialect="spark").lower()
            assert_same_rows(spark.sql(ours.sql(dialect="spark")), spark.sql(sql), label=sql)
        with pytest.raises(UnsupportedQuery, match="one table or derived table"):
            session_windows_to_derived(sqlglot.parse_one(
                "SELECT a.g, count(*) FROM sw a JOIN sw b ON a.id = b.id "
                "GROUP BY a.g, session_window(a.ts, '10 seconds')", read="spark"))
        with pytest.raises(UnsupportedQuery, match="fixed length"):
            session_windows_to_derived(sqlglot.parse_one(
                "SELECT count(*) FROM sw GROUP BY session_window(ts, '1 month')",
                read="spark"))
    finally:
        spark.catalog.dropTempView("sw")
