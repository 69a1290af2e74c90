"""Issue 36's constructs created online under random DML, equal to Spark's batch
query at every epoch once created: ROLLUP/CUBE/GROUPING SETS with grouping() and
grouping_id() (a UNION ALL of one grouped link per set), window functions over a
grouped query, a UNION ALL of joined and aggregated branches, one-row aggregates
cross joined, LIMIT over one row, and ORDER BY ... LIMIT by an expression the
SELECT list does not hold. The rewrites are also checked as SQL (no Spark)."""

from __future__ import annotations

import random

import pytest
import sqlglot
from test_incremental_sql import NEW_SHAPES, start_workload, step_checking_until_created

from sparkfill.sql.rewrite import rewrite_query

#: the shapes CI creates online: one of each rewrite (grouping sets with a join and
#: grouping_id, a window over a grouped query, one-row aggregates cross joined, a
#: hidden ORDER BY under LIMIT, an OR of subqueries); the others are an extended run
CI_NEW_SHAPES = ("rollup", "cube", "window_over_agg", "one_row_cross", "order_hidden",
                 "or_subqueries")


@pytest.mark.parametrize("part", [
    "ci", pytest.param("others", marks=pytest.mark.extended)])
def test_new_shapes_created_online_match_batch_every_epoch(engine, spark, part):
    assert set(CI_NEW_SHAPES) <= set(NEW_SHAPES)
    shapes = {name: shape for name, shape in NEW_SHAPES.items()
              if (name in CI_NEW_SHAPES) == (part == "ci")}
    rng = random.Random(36)
    work, _ = start_workload(engine, spark, rng, key_space=400, rows=250)
    for name, (sql, tables) in shapes.items():
        engine.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill_chunk_rows = 400) AS "
                   + sql.format(**{t: t for t in tables}))
    checks = step_checking_until_created(engine, spark, shapes,
                                         work.random_epoch_dml, limit=20, min_checks=2)
    assert checks >= 2 * len(shapes)
    for name in shapes:
        assert engine.read(name).count() > 0, name
        assert engine.verify(name).count() == 0, name


def _rewrite(sql: str) -> str:
    return rewrite_query(sqlglot.parse_one(sql, read="spark")).sql(dialect="spark")


def test_rollup_is_a_union_of_one_grouped_query_per_set():
    out = _rewrite("SELECT a, b, sum(x) AS s, grouping_id(a, b) AS gid FROM t "
                   "GROUP BY ROLLUP(a, b)")
    assert out.count("UNION ALL") == 2, out
    assert "GROUP BY a, b" in out and "GROUP BY a " in out + " ", out
    # the grand total keeps its row only over some input, as a grouped query does
    assert "HAVING COUNT(*) > 0" in out, out
    assert "CAST(__sf_r0 * 2 + __sf_r1 AS BIGINT) AS `gid`" in out, out
    cube = _rewrite("SELECT a, b, count(*) AS c FROM t GROUP BY CUBE(a, b)")
    assert cube.count("UNION ALL") == 3, cube


def test_windows_over_a_grouped_query_read_it_as_a_derived_table():
    out = _rewrite("SELECT a, sum(x) AS s, sum(sum(x)) OVER (PARTITION BY a) AS t "
                   "FROM t GROUP BY a, b")
    assert "SUM(__sf_a0) OVER (PARTITION BY __sf_g0)" in out, out
    assert "GROUP BY a, b) AS __sf_grouped" in out, out


def test_limit_over_one_row_parens_and_cross_joins():
    assert "LIMIT" not in _rewrite("SELECT sum(x) AS s FROM t LIMIT 100")
    assert "LIMIT 100" in _rewrite("SELECT a, sum(x) AS s FROM t GROUP BY a "
                                   "ORDER BY a LIMIT 100")
    assert "ON a.k = b.k AND a.j = b.j" in _rewrite(
        "SELECT a.x FROM a LEFT JOIN b ON (a.k = b.k AND a.j = b.j)")
    out = _rewrite("SELECT * FROM (SELECT count(*) AS n FROM t) p, (SELECT max(x) AS m FROM t) q")
    assert "JOIN (SELECT MAX(x) AS m, 1 AS __sf_one FROM t) AS q ON 1 = q.__sf_one" in out, out
    assert out.startswith("SELECT `p`.`n`, `q`.`m` FROM"), out
