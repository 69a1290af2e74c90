"""The backfill controller: the adaptive chunk is budgeted from the backfill's own
share of the epoch (epochs slow for other reasons do not starve it), it has a
floor that finishes any job in a bounded number of epochs, and a rate limit is
honoured smoothly (no chunk above about one second of the rate) by the epoch
strategies and by the snapshot strategy's phase 1."""

from __future__ import annotations

import json
import os
import statistics
import time
import types

from helpers import check_mv, mv_sql

from sparkfill import Engine
from sparkfill.pipelines import coordinator

KV = "CREATE TABLE kv (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))"
TEMPLATE = "SELECT id, g, v * 2 AS w FROM {src} WHERE v % 3 <> 0"


def _load(engine: Engine, rows: int) -> None:
    engine.sql(KV)
    engine.insert("kv", [{"id": i, "g": i % 7, "v": i * 31 % 1000} for i in range(rows)])
    engine.step()


def _slow_epochs(engine: Engine, monkeypatch, seconds: float) -> None:
    """Every epoch takes ``seconds`` more reading its inputs, as the coordinator's
    clock sees it: slow for reasons that are not a backfill's own. (The clock jumps
    rather than the test sleeping: the slowness is then exactly ``seconds``, however
    fast this machine runs the backfill's own work, and costs no wall time.)"""
    staged = engine.meta.staged
    ahead = [0.0]
    monkeypatch.setattr(coordinator, "time",
                        types.SimpleNamespace(time=lambda: time.time() + ahead[0]))

    def slow(*args, **kwargs):
        if args or kwargs:  # the epoch's own read of its pinned DML (not planning)
            ahead[0] += seconds
        return staged(*args, **kwargs)
    monkeypatch.setattr(engine.meta, "staged", slow)


def _adaptive_mv(engine, rows: int, chunk_rows: int, target_ms: int):
    """``kv`` loaded with ``rows`` rows and an arrangement MV ``m`` over it with that
    chunk and target; returns the coordinator and the MV."""
    _load(engine, rows)
    engine.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'arrangement', "
               f"backfill_chunk_rows = {chunk_rows}, backfill_target_epoch_ms = {target_ms}) "
               "AS " + mv_sql(TEMPLATE, "kv"))
    return engine.coordinator, engine.catalog.get("m")


def test_slow_epochs_do_not_shrink_the_chunk(engine, spark, monkeypatch):
    _load(engine, 3000)
    _slow_epochs(engine, monkeypatch, 30.0)
    for i in range(3):  # epochs without backfill: the base cost the controller learns
        engine.insert("kv", [{"id": 10_000 + i, "g": 1, "v": 5}])
        engine.step()
    assert engine.coordinator.base_seconds is not None
    assert engine.coordinator.base_seconds >= 30.0
    # every epoch takes longer than the target (30 s against 20 s) for reasons of
    # its own: budgeting from the whole epoch time would shrink the chunk by a third
    # every epoch down to its floor (100 rows; ~25 epochs here); the backfill's own
    # share (reading 400-800 rows, a few seconds at most) stays below the half of the
    # target it is left
    engine.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'arrangement', "
               "backfill_chunk_rows = 400, backfill_parallelism = 1, "
               "backfill_target_epoch_ms = 20000) AS " + mv_sql(TEMPLATE, "kv"))
    chunks = []
    for i in range(40):
        engine.insert("kv", [{"id": 20_000 + i, "g": 2, "v": 7}])
        report = engine.step()
        chunks.append(report.backfill_rows.get("m", 0))
        if engine.progress("m").state == "created":
            break
    assert engine.progress("m").state == "created", chunks
    # (whole vnodes per chunk: the chunk is about 400 rows or more)
    assert len(chunks) <= 15, chunks
    assert statistics.median(chunks) >= 250, chunks
    check_mv(engine, spark, "m", TEMPLATE, "kv", engine.committed_epoch)


def test_floor_finishes_any_job_in_bounded_epochs(engine, spark, monkeypatch):
    bound = 10  # the floor finishes a job in about this many epochs
    monkeypatch.setattr(coordinator, "MAX_BACKFILL_EPOCHS", bound)
    coord, mv = _adaptive_mv(engine, 5000, 4, 1)
    for _ in range(30):  # every epoch far above the target, all of it the backfill's
        coord._adapt_budget(mv, 60.0)
    assert coord._budget_of(mv) >= 5000 / bound
    epochs = 0
    while engine.progress("m").state != "created":
        engine.step()
        coord._adapt_budget(mv, 60.0)
        epochs += 1
        # whole vnodes per chunk and estimated row counts: some slack over the bound
        assert epochs <= 2 * bound, epochs
    check_mv(engine, spark, "m", TEMPLATE, "kv", engine.committed_epoch)


def test_rate_limit_is_smooth_for_epoch_strategies(engine, spark, monkeypatch):
    _load(engine, 3000)
    rate = 300
    engine.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'no_shuffle', "
               f"backfill_chunk_rows = 100000, backfill_rate_limit = {rate}) AS "
               + mv_sql(TEMPLATE, "kv"))
    _slow_epochs(engine, monkeypatch, 1.5)  # more than a second between chunks
    chunks = []
    for _ in range(4):
        chunks.append(engine.step().backfill_rows.get("m", 0))
    # never more than about one second of the rate in one chunk, however long
    # the epochs take; and the job keeps moving
    assert max(chunks) <= rate, chunks
    assert sum(chunks) > 0, chunks


def test_rate_limit_is_smooth_for_snapshot_phase_1(engine, spark, warehouse):
    _load(engine, 4000)
    rate = 500
    engine.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'snapshot', "
               f"backfill_rate_limit = {rate}) AS " + mv_sql(TEMPLATE, "kv"))
    jobs = os.path.join(warehouse, "relations", "_jobs")
    deadline = time.monotonic() + 120
    plan = None
    while plan is None and time.monotonic() < deadline:
        for job in os.listdir(jobs) if os.path.isdir(jobs) else []:
            path = os.path.join(jobs, job, "plan.json")
            if os.path.exists(path):
                with open(path) as f:
                    plan = json.load(f)
        if plan is None:
            engine.step()
    assert plan is not None, "the snapshot job wrote no plan"
    # chunks of about one second of the rate (a chunk is whole vnodes: ~16 rows each
    # here), where the default chunk would read the whole table at once
    assert len(plan) >= 4000 // rate - 1, plan
    assert max(c["estimate"] for c in plan) <= rate * 1.2, plan
    while engine.progress("m").state != "created":
        engine.step()
        assert time.monotonic() < deadline + 120
    check_mv(engine, spark, "m", TEMPLATE, "kv", engine.committed_epoch)


def test_the_chunk_follows_the_mvs_own_time_not_other_mvs(engine, spark):
    """With every epoch backfilling something (no epoch measures the base cost), an
    epoch slow because of other work leaves the chunk growing when the MV's own Δ
    took little of it, and shrinks it when the MV's own Δ was the slow part."""
    coord, mv = _adaptive_mv(engine, 3000, 400, 4000)
    coord._base_samples.clear()
    coord._adapt_budget(mv, 20.0, own_seconds=0.3)  # 19.7 s of others' work
    assert coord._budget_of(mv) == 800
    coord._adapt_budget(mv, 20.0, own_seconds=8.0)  # the MV's own work is the slow part
    assert coord._budget_of(mv) == 400
    coord._adapt_budget(mv, 20.0)  # nothing known of its own share: the whole epoch
    assert coord._budget_of(mv) == 200


def test_the_chunk_grows_when_the_mvs_fixed_work_is_the_slow_part(engine, spark):
    """An MV's own time holds a fixed part too (its steady work on its upstream's
    changes, the chunk's bookkeeping), which no chunk size changes: when that fixed
    part alone overruns the target, the chunk grows until its rows take as long as
    the fixed part (shrinking would stretch the job over more epochs that each pay
    it); when the time does follow the chunk, the chunk settles at what the target
    leaves it. Alike chunks over the target are probed larger, not shrunk to the
    floor, so a fit comes."""
    coord, mv = _adaptive_mv(engine, 3000, 400, 4000)

    def epochs(fixed: float, per_row: float, n: int) -> list[int]:
        coord._base_samples.clear()
        coord._own_samples.clear()
        coord._cost_fits.clear()
        coord._budget[mv.id] = 400
        seen = []
        for _ in range(n):
            rows = coord._budget_of(mv)
            own = fixed + per_row * rows
            coord._adapt_budget(mv, own, own_seconds=own, rows=rows)
            seen.append(coord._budget_of(mv))
        return seen

    # 5 s of fixed work per epoch against a 4 s target, 1 ms per chunk row: the
    # proportional rule alone would halve the chunk to its floor (100) in two epochs;
    # the rows get as much time as the fixed part: 5 s, 5,000 rows
    grown = epochs(5.0, 0.001, 12)
    assert grown[0] == 800, grown  # the first epoch over the target: a probe, twice
    assert 4500 <= grown[-1] <= 5500 and grown[-1] == grown[-2], grown
    # 10 ms per chunk row and no fixed part: the chunk settles near 400 rows (4 s)
    settled = epochs(0.0, 0.01, 12)
    assert 300 <= settled[-1] <= 450, settled
    # 1 s fixed, 10 ms per row: near (4 - 1) / 0.01 = 300 rows
    mixed = epochs(1.0, 0.01, 12)
    assert 200 <= mixed[-1] <= 350, mixed
