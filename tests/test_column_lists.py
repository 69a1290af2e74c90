"""Column alias lists on derived tables and CTEs (``AS x (a, b)``, ``WITH x (a, b)``):
MVs that use them, created online under random DML, equal Spark's batch query (which
reads the lists itself) at every epoch; a list of the wrong length, or over a ``*``
whose columns are unknown, is refused with the counts or the relation named, and
nothing is created."""

from __future__ import annotations

import random

import pytest
import sqlglot
from helpers import step_checking_queries
from workload import Workload, create_table_sql

from sparkfill.errors import SqlError, UnknownRelation, UnsupportedQuery
from sparkfill.sql.column_lists import name_columns

#: name -> query over t (id, g, v, s)
QUERIES = {
    # TPC-H q13's shape: an aggregate's unnamed count named by the list, grouped again
    "counts": "SELECT c, count(*) AS n FROM (SELECT g, count(*) FROM {t} GROUP BY g) "
              "AS x (grp, c) GROUP BY c",
    # TPC-H q15's shape: a CTE's list, the CTE read twice (once under a scalar subquery)
    "top_total": "WITH r (grp, total) AS (SELECT g, sum(v) FROM {t} GROUP BY g) "
                 "SELECT grp, total FROM r WHERE total = (SELECT max(total) FROM r)",
    # Nexmark q18/q19's shape: SELECT * and an unnamed row_number() renamed by position
    "top_two": "SELECT id, grp, val FROM (SELECT *, row_number() OVER (PARTITION BY g "
               "ORDER BY v DESC, id) FROM {t}) AS b (id, grp, val, str, rn) WHERE rn <= 2",
    # a list over a list: the inner names are the outer query's input
    "nested": "SELECT k2, sum(m) AS sm FROM (SELECT * FROM (SELECT g, v * 2 FROM {t}) "
              "AS i (k, m)) AS o (k2, m) GROUP BY k2",
}


def _batch(spark, eng, sql: str, epoch: int):
    return spark.sql(sql, t=eng.read("t", as_of=epoch))


def test_column_lists_created_online_match_batch_every_epoch(engine, spark):
    rng = random.Random(36)
    engine.sql(create_table_sql("t"))
    work = Workload(engine, spark, "t", rng, key_space=600)
    work.initial_load(300)
    engine.step()
    for name, sql in QUERIES.items():
        engine.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill_chunk_rows = 200) AS "
                   + sql.format(t="t"))
    assert [c.name for c in engine.relation("top_two").visible_columns] == ["id", "grp", "val"]
    checked = step_checking_queries(engine, spark, QUERIES, _batch,
                                    work.random_epoch_dml, limit=30, label="column list")
    assert min(checked.values()) >= 2, checked
    for name in QUERIES:
        assert engine.verify(name).count() == 0, name


@pytest.mark.parametrize("sql,error,words", [
    ("SELECT * FROM (SELECT g, v FROM {t}) AS x (a)", SqlError,
     ["derived table 'x'", "1 column", "returns 2"]),
    ("WITH r (a, b, c) AS (SELECT g, v FROM {t}) SELECT * FROM r", SqlError,
     ["CTE 'r'", "3 column", "returns 2"]),
    ("SELECT * FROM (SELECT * FROM nowhere) AS x (a)", Exception, ["nowhere"]),
])
def test_a_bad_column_list_is_refused_and_creates_nothing(engine, sql, error, words):
    engine.sql(create_table_sql("t"))
    engine.step()
    with pytest.raises(error) as exc:
        engine.sql(f"CREATE MATERIALIZED VIEW bad AS {sql.format(t='t')}")
    for word in words:
        assert word in str(exc.value), str(exc.value)
    with pytest.raises(UnknownRelation):
        engine.relation("bad")


def test_a_star_under_a_list_over_an_unnamed_derived_column_is_refused(engine):
    engine.sql(create_table_sql("t"))
    with pytest.raises(UnsupportedQuery, match="list the columns instead of"):
        engine.sql("CREATE MATERIALIZED VIEW bad AS SELECT * FROM (SELECT * FROM "
                   "(SELECT g, count(*) FROM t GROUP BY g) AS i) AS o (a, b)")


#: query with lists -> the query name_columns makes of it (Spark SQL)
REWRITES = {
    # a set operation's columns are its first branch's
    "SELECT a, b FROM (SELECT g, v FROM t UNION ALL SELECT g, w FROM d) AS u (a, b)":
        "SELECT a, b FROM (SELECT g AS a, v AS b FROM t UNION ALL SELECT g, w FROM d) AS u",
    # ORDER BY and HAVING that used an old alias follow the rename
    "SELECT * FROM (SELECT id, v AS val FROM t ORDER BY val DESC LIMIT 3) AS q (i, amount)":
        "SELECT * FROM (SELECT id AS i, v AS amount FROM t ORDER BY amount DESC LIMIT 3) AS q",
    "SELECT * FROM (SELECT g AS k, count(*) AS n FROM t GROUP BY g HAVING n > 1) AS s (a, b)":
        "SELECT * FROM (SELECT g AS a, COUNT(*) AS b FROM t GROUP BY g HAVING b > 1) AS s",
    # a CTE's * over an earlier CTE named by its list
    "WITH a (x, y) AS (SELECT g, count(*) FROM t GROUP BY g), b (p, q) AS (SELECT * FROM a) "
    "SELECT p FROM b":
        "WITH a AS (SELECT g AS x, COUNT(*) AS y FROM t GROUP BY g), b AS (SELECT `a`.`x` AS p, "
        "`a`.`y` AS q FROM a) SELECT p FROM b",
}


@pytest.mark.parametrize("written", list(REWRITES))
def test_a_column_list_moves_into_the_select_list_it_names(written):
    columns = {"t": ["id", "g", "v", "s"], "d": ["g", "name", "w"]}.get
    rewritten = name_columns(sqlglot.parse_one(written, dialect="spark"), columns)
    assert rewritten.sql(dialect="spark") == REWRITES[written]
