"""The Nexmark queries on sparkfill's Nexmark datagen: every query is accepted or
refused by name as ``nexmark.REFUSED`` says; a representative subset is created
online with the default strategy while the streams flow (bids also updated and
deleted) and equals Spark's batch query at every epoch once created. The
benchmark runs every accepted query."""

from __future__ import annotations

import nexmark
import pytest
from helpers import step_checking_queries

from sparkfill import Engine
from sparkfill.errors import UnsupportedQuery

#: the subsets the tests run, each in a warehouse of its own: a top-1 per auction over
#: a join with a time condition (row_number) and session windows (CI); a tumbling
#: window's maximum joined back and a join on an expression of one side (``make
#: torture``). Tumbling windows on processing time, q12's shape, are
#: tests/test_proctime.py's
CI_QUERIES = [["q9", "q11"], pytest.param(["q7", "q13"], marks=pytest.mark.extended)]


def test_nexmark_acceptance_is_what_the_docs_say(engine):
    nexmark.create(engine)
    for name, query in nexmark.QUERIES.items():
        statement = f"CREATE MATERIALIZED VIEW {name} AS {query}"
        if name in nexmark.REFUSED:
            with pytest.raises(UnsupportedQuery):
                engine.explain(statement)
        else:
            assert engine.explain(statement)


@pytest.mark.parametrize("names", CI_QUERIES, ids=["q9-q11", "q7-q13"])
def test_nexmark_queries_created_online_match_batch(spark, tmp_path, names):
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        nexmark.create(eng, rows=200)
        for _ in range(3):
            eng.step()
        for name in names:
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill_chunk_rows = 2000) AS "
                    f"{nexmark.QUERIES[name]}")
        # every epoch generates the streams' next batch: nothing to add before it
        checked = step_checking_queries(
            eng, spark, {name: nexmark.QUERIES[name] for name in names}, nexmark.batch,
            lambda: None, 12, "Nexmark")
        assert min(checked.values()) >= 2, checked
        for name in names:
            assert eng.read(name).count() > 0, f"{name} is empty on this data"
            assert eng.verify(name).count() == 0
    finally:
        eng.close()
