"""Query rewrites of the same meaning (no Spark): what each produces, and what it
leaves alone. That the rewritten queries return the same rows is checked by the
oracle tests of test_incremental_sql.py."""

from __future__ import annotations

import sqlglot

from sparkfill.rewrite import rewrite_query

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
    # k is a column of both: unqualified, it names no one relation
    assert "CROSS JOIN" in rewrite("SELECT id FROM t, d WHERE k = k")
    # no equality between the two: still a cross join (refused by the planner)
    assert "CROSS JOIN" in rewrite("SELECT t.id FROM t, d WHERE t.v < d.k")
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
