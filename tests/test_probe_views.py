"""A planning's probe views: made once per schema, dropped when the planning ends,
whether it succeeds or raises; an MV planned over shared views equals Spark's query."""

from __future__ import annotations

import pytest

from sparkfill.errors import SparkfillError
from sparkfill.sql import probe_views


def _probe_views(spark) -> list[str]:
    # SHOW VIEWS names the session's temporary views without resolving any table:
    # catalog.listTables() describes every table, and fails on one another test of the
    # shared session left behind
    return [r.viewName for r in spark.sql("SHOW VIEWS").collect()
            if r.viewName.startswith("__sf_plan_")]


def test_probe_views_are_shared_per_schema_and_dropped_even_when_planning_fails(engine, spark,
                                                                                 monkeypatch):
    engine.sql("CREATE TABLE a (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.sql("CREATE TABLE b (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.insert("a", [{"id": i, "g": i % 3, "v": i} for i in range(6)])
    engine.insert("b", [{"id": i, "g": i % 2, "v": 10 * i} for i in range(4)])
    engine.step()
    made: list[str] = []
    real_view = probe_views._ProbeViews.view

    def counting_view(self, struct):
        name = real_view(self, struct)
        made.append(name)
        return name

    monkeypatch.setattr(probe_views._ProbeViews, "view", counting_view)
    # a self-join and a join of two tables of one schema: one view serves the three
    # leaves, one more the join-chain link (x JOIN y) the third joins
    sql = ("SELECT x.id, y.v, z.v AS w FROM a x JOIN a y ON x.g = y.id "
           "JOIN b z ON y.g = z.id WHERE x.v > 1")
    engine.sql(f"CREATE MATERIALIZED VIEW j WITH (backfill = 'blocking') AS {sql}")
    assert len(set(made)) == 2 and len(made) > 4, made
    assert _probe_views(spark) == []
    engine.step()
    assert engine.verify("j").count() == 0
    assert engine.read("j").count() == spark.sql(
        sql.replace(" a ", " {a} ").replace(" b ", " {b} "),
        a=engine.read("a"), b=engine.read("b")).count()
    with pytest.raises(SparkfillError):
        engine.sql("CREATE MATERIALIZED VIEW bad AS SELECT x.id, y.nope FROM a x JOIN b y "
                   "ON x.g = y.id")
    assert _probe_views(spark) == []
