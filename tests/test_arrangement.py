"""Arrangement backfill: per-vnode progress, exact under the oracle, rescalable
across restarts (SIGKILL included), pausable, cancellable, and live under heavy
writes into the range being backfilled."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import check_mv, mv_sql, subprocess_env
from workload import create_table_sql, random_row

from sparkfill import Engine, MaterializedViewNotReady

MV = "SELECT id, g, v * 2 AS w, s FROM {src} WHERE v % 3 <> 0"
MV_ON_MV = "SELECT id, w + g AS x FROM {src} WHERE w % 4 <> 2"


def _dml(eng, rng: random.Random, key_space: int, rows: int = 40) -> None:
    eng.insert("t", [random_row(rng, rng.randrange(key_space)) for _ in range(rows)])
    eng.delete("t", [{"id": rng.randrange(key_space)} for _ in range(rows // 4)])
    eng.sql(f"UPDATE t SET v = v + 1 WHERE g = {rng.randrange(5)}")


def test_arrangement_is_default_and_exact_every_epoch(engine, spark):
    rng = random.Random(5)
    engine.sql(create_table_sql("t"))
    engine.insert("t", [random_row(rng, k) for k in range(1500)])
    engine.step()
    engine.sql("SET backfill_chunk_rows = 300")
    engine.sql(f"CREATE MATERIALIZED VIEW m AS {mv_sql(MV, 't')}")
    first = engine.progress("m")
    assert first.strategy == "arrangement" and first.vnodes_done == 0
    vnodes_seen = []
    epochs = 0
    while engine.progress("m").state != "created":
        _dml(engine, rng, 2000)
        engine.step()
        p = engine.progress("m")
        vnodes_seen.append(p.vnodes_done)
        epochs += 1
        assert epochs < 60, "backfill did not finish"
        if p.state != "created":
            with pytest.raises(MaterializedViewNotReady):
                engine.read("m")
    assert epochs >= 3, "a small chunk must spread the backfill over epochs"
    assert vnodes_seen == sorted(vnodes_seen) and vnodes_seen[-1] == 256
    assert 0 < vnodes_seen[0] < 256
    engine.sql(f"CREATE MATERIALIZED VIEW m2 WITH (backfill_chunk_rows = 250) AS "
               f"{mv_sql(MV_ON_MV, 'm')}")
    for _ in range(40):
        _dml(engine, rng, 2000)
        report = engine.step()
        check_mv(engine, spark, "m", MV, "t", report.epoch)
        if engine.progress("m2").state == "created":
            check_mv(engine, spark, "m2", MV_ON_MV, "m", report.epoch)
            break
    assert engine.progress("m2").state == "created"


def test_pause_resume_and_rate_limit_from_sql(engine, spark):
    rng = random.Random(9)
    engine.sql(create_table_sql("t"))
    engine.insert("t", [random_row(rng, k) for k in range(800)])
    engine.step()
    engine.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill_chunk_rows = 100) AS {mv_sql(MV, 't')}")
    engine.step()
    done = engine.progress("m").rows_done
    assert 0 < done < 800
    engine.sql("ALTER MATERIALIZED VIEW m SET backfill_rate_limit = 0")
    for _ in range(3):
        _dml(engine, rng, 900)
        engine.step()
        p = engine.progress("m")
        assert p.state == "paused" and p.paused and not p.stalled
        assert p.rows_done == done, "a paused job reads no snapshot rows"
    assert "paused" in {r.state for r in engine.sql("SHOW JOBS").collect()}
    engine.sql("ALTER MATERIALIZED VIEW m SET backfill_rate_limit = DEFAULT")
    for _ in range(40):
        _dml(engine, rng, 900)
        report = engine.step()
        if engine.progress("m").state == "created":
            break
    assert engine.progress("m").state == "created"
    check_mv(engine, spark, "m", MV, "t", report.epoch)


def test_cancel_removes_job_and_leaves_upstream(engine, spark, warehouse):
    rng = random.Random(3)
    engine.sql(create_table_sql("t"))
    engine.insert("t", [random_row(rng, k) for k in range(600)])
    engine.step()
    engine.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill_chunk_rows = 50) AS {mv_sql(MV, 't')}")
    engine.sql(f"CREATE MATERIALIZED VIEW other WITH (backfill_chunk_rows = 100000) AS "
               f"{mv_sql(MV, 't')}")
    engine.step()
    before = sorted(map(tuple, engine.read("t").collect()))
    dirs = {p.name for p in (Path(warehouse) / "relations").iterdir()}
    engine.sql("CANCEL JOBS m")
    assert [j.name for j in engine.progress()] == ["other"]
    after_dirs = {p.name for p in (Path(warehouse) / "relations").iterdir()}
    assert len(after_dirs) == len(dirs) - 1 and not any(d.endswith("-m") for d in after_dirs)
    assert sorted(map(tuple, engine.read("t").collect())) == before
    report = engine.step()
    check_mv(engine, spark, "other", MV, "t", report.epoch)


def _table_and_fixed_chunk_mv(engine, rng: random.Random, rows: int, chunk: int) -> None:
    """``t`` of ``rows`` rows, committed, and ``m`` over it created with a fixed chunk
    (no epoch target: the chunk does not adapt)."""
    engine.sql(create_table_sql("t"))
    engine.insert("t", [random_row(rng, k) for k in range(rows)])
    engine.step()
    engine.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill_chunk_rows = {chunk}, "
               f"backfill_target_epoch_ms = 0) AS {mv_sql(MV, 't')}")


def test_liveness_under_heavy_writes_into_backfilled_range(engine, spark):
    """Every epoch writes 4x the chunk into the very key range being backfilled;
    the job still finishes in a bounded number of epochs (RisingWave #26421)."""
    rng = random.Random(21)
    _table_and_fixed_chunk_mv(engine, rng, 2000, 200)
    next_key = 2000
    epochs = 0
    while engine.progress("m").state != "created":
        engine.insert("t", [random_row(rng, k) for k in range(next_key, next_key + 800)])
        engine.insert("t", [random_row(rng, rng.randrange(next_key)) for _ in range(200)])
        next_key += 800
        report = engine.step()
        epochs += 1
        assert epochs <= 40, f"backfill made too little progress: {engine.progress('m')}"
    assert engine.read("t").count() > 2000 + 800 * (epochs - 1)
    check_mv(engine, spark, "m", MV, "t", report.epoch)


DRIVER = textwrap.dedent("""
    import random, sys
    sys.path.insert(0, sys.argv[2])
    from workload import create_table_sql, random_row
    from sparkfill import Engine
    eng = Engine(sys.argv[1])
    rng = random.Random(4)
    eng.sql(create_table_sql("t"))
    eng.insert("t", [random_row(rng, k) for k in range(1500)])
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW m WITH (backfill_chunk_rows = 200, "
            "backfill_parallelism = 1, backfill_target_epoch_ms = 0) AS "
            "SELECT id, g, v * 2 AS w, s FROM t WHERE v % 3 <> 0")
    while True:
        eng.insert("t", [random_row(rng, rng.randrange(1800)) for _ in range(30)])
        eng.step()
        print("epoch", eng.committed_epoch, eng.progress("m").vnodes_done, flush=True)
""")


def test_rescale_after_sigkill_mid_backfill(tmp_path, spark):
    """Started on one Spark task (local[1], parallelism 1), killed mid-backfill,
    finished with parallelism 2 on another session: still exact."""
    warehouse = tmp_path / "wh"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, str(script), str(warehouse), tests_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=subprocess_env("local[1]"), start_new_session=True)
    epochs_seen = 0
    deadline = time.time() + 240
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("epoch"):
            epochs_seen += 1
            if epochs_seen >= 3 and int(line.split()[2]) > 0:
                break
        assert time.time() < deadline, "driver made no progress"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    with Engine(warehouse, spark=spark) as eng:
        p = eng.progress("m")
        assert p.state == "backfilling" and 0 < p.vnodes_done < 256
        eng.sql("ALTER MATERIALIZED VIEW m SET backfill_parallelism = 2")
        rng = random.Random(8)
        for _ in range(80):
            eng.insert("t", [random_row(rng, rng.randrange(1800)) for _ in range(30)])
            report = eng.step()
            if eng.progress("m").state == "created":
                break
        assert eng.progress("m").state == "created"
        check_mv(eng, spark, "m", MV, "t", report.epoch)


def test_queued_jobs_wait_in_creation_order(engine, spark):
    rng = random.Random(13)
    engine.sql(create_table_sql("t"))
    engine.insert("t", [random_row(rng, k) for k in range(600)])
    engine.step()
    engine.sql("SET max_concurrent_creating_jobs = 1")
    engine.sql(f"CREATE MATERIALIZED VIEW a WITH (backfill_chunk_rows = 200) AS {mv_sql(MV, 't')}")
    engine.sql(f"CREATE MATERIALIZED VIEW b WITH (backfill = 'no_shuffle', "
               f"backfill_chunk_rows = 200) AS {mv_sql(MV, 't')}")
    assert engine.progress("b").state == "queued"
    ready: dict[str, int] = {}
    for _ in range(40):
        _dml(engine, rng, 700)
        report = engine.step()
        states = {j.name: j.state for j in engine.progress()}
        if states["a"] != "created":
            assert states["b"] == "queued" and engine.progress("b").rows_done == 0
        for name, state in states.items():
            if state == "created":
                ready.setdefault(name, report.epoch)
        if len(ready) == 2:
            break
    assert ready["a"] < ready["b"]
    check_mv(engine, spark, "a", MV, "t", report.epoch)
    check_mv(engine, spark, "b", MV, "t", report.epoch)


def _vnode_states(eng, name: str) -> list[str]:
    """Each vnode's persisted backfill state, in vnode order."""
    mv = eng.catalog.get(name)
    by_vnode = {r.vnode: r.state for r in eng.meta.progress(mv.id)}
    return [by_vnode.get(v, "not_started") for v in range(256)]


@pytest.mark.parametrize("chunk, whole", [(100, True), (1, False)])
def test_a_chunk_reads_whole_vnodes_when_they_fit_and_stops_inside_one_otherwise(
        engine, spark, chunk, whole):
    """A budget that holds whole vnodes (2-3 rows each here) reads them whole: after
    each epoch every vnode is done or not started, never stopped at a position. A
    budget smaller than a vnode reads a quota of each active vnode and leaves them in
    progress at their last key; once the chunk grows (a target set), the rest of those
    vnodes is read whole from their positions. Both reach created and are exact."""
    rng = random.Random(21)
    _table_and_fixed_chunk_mv(engine, rng, 600, chunk)
    in_progress = []
    for _ in range(20):
        _dml(engine, rng, 700)
        report = engine.step()
        in_progress.append(_vnode_states(engine, "m").count("in_progress"))
        if engine.progress("m").state == "created":
            break
        if len(in_progress) == 1:  # let the chunk grow (doubling) from here
            engine.sql("ALTER MATERIALIZED VIEW m SET backfill_target_epoch_ms = 600000")
    assert engine.progress("m").state == "created", in_progress
    check_mv(engine, spark, "m", MV, "t", report.epoch)
    assert len(in_progress) >= 2, "the chunk must spread the backfill over epochs"
    if whole:
        assert not any(in_progress), in_progress
    else:
        assert in_progress[0] > 0, in_progress


def test_a_budget_over_the_whole_snapshot_reads_it_in_one_epoch_uncounted(engine, spark):
    """A budget that holds the whole snapshot reads it in the job's first epoch as a
    blocking CREATE does: no cache and no count job (its rows are the table's count
    in the catalog); the MV is created and exact while DML flows, every vnode is done
    and the vnodes' rows add up to the table's rows when the job started."""
    rng = random.Random(31)
    engine.sql(create_table_sql("t"))
    engine.insert("t", [random_row(rng, k) for k in range(900)])
    engine.step()
    _dml(engine, rng, 1200)
    engine.step()
    rows_then = engine.read("t").count()
    engine.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill_chunk_rows = 5000) AS "
               f"{mv_sql(MV, 't')}")
    _dml(engine, rng, 1200)
    report = engine.step()
    assert engine.progress("m").state == "created"
    assert report.spark_jobs <= 3, f"a count job ran: {report.spark_jobs} Spark jobs"
    states = _vnode_states(engine, "m")
    assert states == ["done"] * 256, states
    assert engine.progress("m").rows_done == rows_then
    check_mv(engine, spark, "m", MV, "t", report.epoch)


@pytest.mark.parametrize(("total", "weights", "expected"), [
    (10, [1.0, 1.0, 1.0], [4, 3, 3]),
    (7, [0.0, 0.0], [4, 3]),
    (5, [0.0, 3.0, 1.0], [0, 4, 1]),
    (0, [1.0, 2.0], [0, 0]),
    (3, [], []),
])
def test_a_whole_snapshot_count_is_apportioned_to_vnodes_exactly(total, weights, expected):
    """The rows of a whole snapshot read in one epoch are the catalog's count, split
    over the vnodes by their estimates: whole numbers summing to the count."""
    from sparkfill.backfill.arrangement import apportion
    shares = apportion(total, weights)
    assert shares == expected
    assert sum(shares) == (total if weights else 0)
