"""A running min/max over one leaf keeps no input rows: each group keeps, beside
its extreme, how many of its rows are at it, and a group that loses the last of
them finds its extreme again in the rows the MV held of its leaf before the epoch
(``AggSpec.extremes = 'leaf'``). Checked against Spark's batch query: while the
MV is created online by every strategy (the rows it held are then only the
backfilled ones), with ties retracted one by one, and with a tied extreme that
stays and reads nothing of the leaf."""

from __future__ import annotations

import random

import pytest
from helpers import assert_rows_equal, assert_same_rows

from sparkfill import Engine

SQL = ("SELECT g % 3 AS h, count(*) AS c, max(v) AS mx, min(v) AS mn, max(s) AS ms, "
       "min(w) AS mw, sum(v) AS sv FROM {t} WHERE v <> 13 GROUP BY g % 3")
VALUES = 40  # few values: every group has several rows at its extremes


def _row(rng: random.Random, id_: int) -> dict:
    return {"id": id_, "g": rng.randrange(7), "v": rng.randrange(VALUES),
            "s": rng.choice(["a", "b", "zz", None]),
            "w": rng.choice([0.5, -0.0, 0.0, 2.5, float("nan"), None])}


def _check(eng: Engine, spark, epoch: int) -> None:
    assert_same_rows(eng.read("a", as_of=epoch),
                     spark.sql(SQL, t=eng.read("t", as_of=epoch)),
                     label=f"MV a at epoch {epoch}")


# a lost extreme is found by the aggregate's rule, whichever strategy backfills: CI runs
# the two bulk cases (the default strategy among them), the other cases are extended
# (a small change's lost extreme: test_incremental_sql's running-aggregate tests)
@pytest.mark.parametrize("strategy,bulk", [
    pytest.param("arrangement", "", marks=pytest.mark.extended),
    pytest.param("no_shuffle", "", marks=pytest.mark.extended),
    pytest.param("snapshot", "", marks=pytest.mark.extended),
    pytest.param("buffer", "", marks=pytest.mark.extended),
    # every size threshold at 40 rows, so chunks and changes are bulk ones: a first
    # epoch computed as a batch query, then ties counted by a broadcast of the Δ's
    # few groups, or (no group is "few") by a window and per (group, value)
    ("no_shuffle", "few"), ("arrangement", "many")])
def test_lost_extremes_are_found_in_the_held_rows_while_created_online(
        spark, tmp_path, monkeypatch, strategy, bulk):
    """Each epoch deletes every row at the table's top value (the max of most groups,
    backfilled or not), some at its bottom, and upserts and deletes at random; the
    MV, created in chunks meanwhile and restarted once, equals the batch query at
    every epoch once created, and its aggregate's state table stays empty."""
    if bulk:
        from scale import at_scale

        from sparkfill.dataflow import aggregate
        at_scale(monkeypatch)
        if bulk == "many":
            monkeypatch.setattr(aggregate, "FEW_GROUPS", 1)
    rng = random.Random(7)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, s STRING, w DOUBLE, "
                "PRIMARY KEY (id))")
        eng.insert("t", [_row(rng, i) for i in range(900)])
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW a WITH (backfill = '{strategy}', "
                f"backfill_chunk_rows = 150) AS " + SQL.format(t="t"))
        ids, checked, epochs = 900, 0, 0
        while checked < 4:
            epochs += 1
            assert epochs <= 60, "the MV was not created in 60 epochs"
            top = eng.read("t").agg({"v": "max"}).collect()[0][0]
            if top is not None:
                eng.sql(f"DELETE FROM t WHERE v = {top}")
            if epochs % 2:
                eng.sql("DELETE FROM t WHERE v = 0 AND g % 2 = 0")
            eng.insert("t", [_row(rng, rng.randrange(ids + 40)) for _ in range(25)])
            ids += 40
            eng.delete("t", [{"id": rng.randrange(ids)} for _ in range(8)])
            report = eng.step()
            if epochs == 3:
                eng.close()
                eng = Engine(tmp_path / "wh", spark=spark)
            if eng.progress("a").state == "created":
                _check(eng, spark, report.epoch)
                checked += 1
        state = eng.relation(eng.relation("a").plan.states[-1])
        assert not eng.store.files_at(state.stored, eng.committed_epoch), \
            "the aggregate kept input rows"
        assert eng.verify("a").count() == 0
    finally:
        eng.close()


def test_a_tied_extreme_stays_without_reading_the_leaf(engine, spark):
    """Of two rows at a group's max, one leaves: the max stays, found from the
    group's count at it, and nothing of the leaf is read. The second leaves: the
    max is found again in the leaf. An update that moves a row off the max, and new
    rows at it, count too."""
    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, s STRING, w DOUBLE, "
               "PRIMARY KEY (id))")
    filler = [{"id": 100 + i, "g": 3 + 2 * (i % 2), "v": i % 50, "s": "f", "w": 1.0}
              for i in range(3000)]  # the other groups (h = 0, 2)
    engine.insert("t", [{"id": 1, "g": 1, "v": 9, "s": "x", "w": 2.0},
                        {"id": 2, "g": 1, "v": 9, "s": "x", "w": 2.0},
                        {"id": 3, "g": 1, "v": 5, "s": "y", "w": float("nan")},
                        {"id": 4, "g": 1, "v": 9, "s": None, "w": float("nan")},
                        *filler])
    engine.step()
    engine.sql("CREATE MATERIALIZED VIEW a WITH (backfill = 'blocking') AS "
               + SQL.format(t="t"))
    while engine.progress("a").state != "created":
        engine.step()
    assert "found again in the leaf" in engine.explain("a")

    def group_1() -> list[tuple]:
        return engine.read("a").where("h = 1").select("mx", "mn", "ms", "mw").collect()

    def step_checked() -> int:
        report = engine.step()
        _check(engine, spark, report.epoch)
        return report.rows_read.get("a", 0)

    engine.delete("t", [{"id": 1}])  # two rows at 9 stay, one at the min of w
    assert step_checked() < 100, "a tied max that stays read the leaf"
    engine.insert("t", [{"id": 2, "g": 1, "v": 4, "s": "x", "w": 2.0}])  # off the max
    assert step_checked() < 100
    assert_rows_equal(engine.read("a").where("h = 1").select("mx"), [(9,)])
    engine.delete("t", [{"id": 4}])  # the last row at 9: found again (5) in the leaf
    assert step_checked() >= 3000, "a lost max was not looked for in the leaf"
    assert [tuple(r) for r in group_1()] == [(5, 4, "y", 2.0)]
    engine.insert("t", [{"id": 5, "g": 1, "v": 5, "s": "y", "w": 7.0},
                        {"id": 6, "g": 1, "v": 5, "s": "y", "w": 7.0}])  # three at 5
    step_checked()
    engine.delete("t", [{"id": 3}, {"id": 5}])  # one row at 5 stays; NaN leaves mw
    assert step_checked() < 100
    engine.delete("t", [{"id": 6}, {"id": 2}])  # group 1 empties: its row leaves
    step_checked()
    assert group_1() == []
    assert engine.verify("a").count() == 0


ONE_ARG_SQL = ("SELECT g, count(*) AS c, count(v) AS cv, count_if(v > 20) AS cf, "
               "sum(v) AS sv, sum(d) AS sd, count(s) AS cs, max(v) AS mx, min(v) AS mn "
               "FROM {t} GROUP BY g")


def _one_arg_row(rng: random.Random, id_: int) -> dict:
    return {"id": id_, "g": rng.choice([0, 1, 2, 3, None]),
            "v": rng.choice([*range(VALUES), None]),
            "d": rng.choice([None, "1.25", "-3.50", "0.01"]),
            "s": rng.choice(["a", "b", "zz", None])}


def test_values_by_extreme_equal_the_two_read_aggregation(engine, spark):
    """Aggregated per (group, max's argument) and then per group, every value of
    an aggregate whose min/max share one argument equals the aggregation with a
    separate count of the rows at each extreme (NULL groups and values, decimal
    sums); and an MV recomputed every epoch by it
    (``refresh = 'full'``) equals Spark's batch query under random DML."""
    from decimal import Decimal

    from sparkfill.dataflow import aggregate

    rng = random.Random(11)
    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, d DECIMAL(12,2), s STRING, "
               "PRIMARY KEY (id))")

    def rows(n: int, start: int) -> list[dict]:
        out = [_one_arg_row(rng, start + i) for i in range(n)]
        for r in out:
            r["d"] = None if r["d"] is None else Decimal(r["d"])
        return out

    engine.insert("t", rows(600, 0))
    engine.step()
    engine.sql("CREATE MATERIALIZED VIEW a WITH (backfill = 'blocking', refresh = 'full') "
               "AS " + ONE_ARG_SQL.format(t="t"))
    engine.step()
    plan = engine.relation("a").plan
    spec = plan.agg
    assert spec.extremes == "leaf", spec
    rows_df = engine.read("t").alias("t").selectExpr(
        *[f"{sql} AS {name}" for name, sql in plan.rows])
    by_extreme = aggregate.values_by_extreme(spec, rows_df)
    assert by_extreme is not None, f"values_by_extreme declined {spec}"
    assert_same_rows(by_extreme, aggregate.with_ties(
        spec, rows_df, aggregate.grouped_values(spec, rows_df), few=False),
        label="values by extreme")
    for epoch in range(4):
        engine.insert("t", rows(40, 600 + 40 * epoch))
        engine.delete("t", [{"id": rng.randrange(600)} for _ in range(30)])
        if epoch == 2:
            engine.sql(f"DELETE FROM t WHERE v >= {VALUES - 3}")  # the top values leave
        report = engine.step()
        assert report.refresh["a"].mode == "full"
        assert_same_rows(engine.read("a", as_of=report.epoch),
                         spark.sql(ONE_ARG_SQL, t=engine.read("t", as_of=report.epoch)),
                         label=f"MV a at epoch {report.epoch}")
