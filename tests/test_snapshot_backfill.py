"""Snapshot backfill: every supported shape exact at every epoch with DML flowing;
the upstream keeps committing epochs while phase 1 runs; cancel in each phase;
SIGKILL in phase 1, in phase 2 and around phase 3, each resumed exactly once.

Phases as progress shows them: "backfilling" = phase 1 (the job's own thread
reads U(s)); "catching_up" = phase 2 (the log store, ``lag_epochs`` behind);
"created" = phase 3 done (joined the epoch loop)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import subprocess_env
from test_incremental_sql import check, dim_dml, start_workload
from workload import Workload

import sparkfill.backfill.snapshot_jobs as snapshot_jobs
from sparkfill import Engine, MaterializedViewNotReady
from sparkfill.options import resolve_options

SHAPES = {
    "proj": ("SELECT id, v * 2 AS w2, upper(s) AS us FROM {t} WHERE v % 3 <> 0", ["t"]),
    "agg": ("SELECT g, count(*) AS c, sum(v) AS sv, avg(v) AS av, min(v) AS mn, max(s) AS mx, "
            "count(DISTINCT v % 5) AS cd FROM {t} GROUP BY g HAVING count(*) > 2", ["t"]),
    "glob": ("SELECT count(*) AS c, sum(v) AS sv, min(s) AS ms FROM {t} WHERE v > 500", ["t"]),
    "dist": ("SELECT DISTINCT g, v % 3 AS r FROM {t}", ["t"]),
    "join": ("SELECT x.id, x.v, y.name, y.w + x.v AS wv FROM {t} x JOIN {d} y ON x.g = y.g",
             ["t", "d"]),
    "ljoin": ("SELECT x.id, y.name FROM {t} x LEFT JOIN {d} y ON x.g = y.g WHERE x.v > 100",
              ["t", "d"]),
    "jagg": ("SELECT y.name, count(*) AS c, sum(x.v) AS sv FROM {t} x JOIN {d} y "
             "ON x.g = y.g GROUP BY y.name", ["t", "d"]),
}


def _setup(eng, spark, seed: int, rows: int = 600) -> tuple[Workload, dict, random.Random]:
    rng = random.Random(seed)
    work, dims = start_workload(eng, spark, rng, key_space=1500, rows=rows)
    return work, dims, rng


def test_every_shape_exact_at_every_epoch_with_dml_throughout(engine, spark, monkeypatch):
    monkeypatch.setattr(snapshot_jobs, "CATCH_UP_EPOCHS", 2)  # make phase 2 span epochs
    work, dims, rng = _setup(engine, spark, 31)
    engine.sql("SET backfill = 'snapshot'")
    for name, (sql, _) in SHAPES.items():
        # a rate that makes phase 1 (about 600 rows) outlast an epoch, so that each
        # job is seen backfilling (at 800 rows a second one once finished between
        # two epochs of a loaded machine)
        engine.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill_chunk_rows = 150, "
                   f"backfill_rate_limit = 400) AS " + sql.format(t="t", d="d"))
    seen: dict[str, set[str]] = {name: set() for name in SHAPES}
    created_at: dict[str, int] = {}
    for _ in range(80):
        work.random_epoch_dml((1, 3))
        dim_dml(engine, rng, dims)
        report = engine.step()
        for name, (sql, tables) in SHAPES.items():
            p = engine.progress(name)
            seen[name].add(p.state)
            if p.state == "created":
                created_at.setdefault(name, report.epoch)
                check(engine, spark, name, sql, tables, report.epoch)
            else:
                with pytest.raises(MaterializedViewNotReady):
                    engine.read(name)
        if len(created_at) == len(SHAPES):
            break
    assert len(created_at) == len(SHAPES), {n: engine.progress(n) for n in SHAPES}
    assert all("backfilling" in s for s in seen.values()), seen
    for _ in range(2):  # after creation, plain incremental maintenance
        work.random_epoch_dml()
        dim_dml(engine, rng, dims)
        engine.step()
    for name in SHAPES:
        assert engine.verify(name).count() == 0, name
        # every retained epoch since creation was exact too
        assert engine.verify(name, as_of=created_at[name]).count() == 0, name


EMPTY_SHAPES = {name: SHAPES[name] for name in ("proj", "agg", "glob", "jagg")}


@pytest.mark.parametrize("strategy", ["snapshot", "blocking"])
def test_every_shape_over_empty_upstreams_is_created_then_follows(engine, spark, strategy):
    """A bulk creation over tables with no rows (a shape per kind of write: the MV
    alone, a join's sides, an aggregate's state and its groups, a global aggregate):
    its writes hold none (each counts its rows in its own job, so a write of nothing
    must still report) and the MV is created empty, then exact as rows arrive."""
    rng = random.Random(33)
    work, dims, _ = _setup(engine, spark, 33, rows=0)
    for g in list(dims):
        engine.delete("d", [{"g": g}])
        dims.pop(g)
    engine.step()
    for name, (sql, _) in EMPTY_SHAPES.items():
        engine.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = '{strategy}') AS "
                   + sql.format(t="t", d="d"))
    deadline = time.monotonic() + 240  # phase 1 runs beside the epochs, in its own thread
    while time.monotonic() < deadline:
        report = engine.step()
        if all(engine.progress(n).state == "created" for n in EMPTY_SHAPES):
            break
        time.sleep(0.5)
    for name, (sql, tables) in EMPTY_SHAPES.items():
        assert engine.progress(name).state == "created", engine.progress(name)
        check(engine, spark, name, sql, tables, report.epoch)
    for _ in range(2):
        work.random_epoch_dml()
        dim_dml(engine, rng, dims)
        report = engine.step()
    for name, (sql, tables) in EMPTY_SHAPES.items():
        check(engine, spark, name, sql, tables, report.epoch)


def test_upstream_commits_many_epochs_while_phase_1_runs(engine, spark):
    work, dims, rng = _setup(engine, spark, 32, rows=1500)
    engine.sql("CREATE MATERIALIZED VIEW live AS SELECT g, count(*) AS c FROM t GROUP BY g")
    engine.sql("CREATE MATERIALIZED VIEW big WITH (backfill = 'snapshot', "
               "backfill_chunk_rows = 100, backfill_rate_limit = 150) AS "
               + SHAPES["jagg"][0].format(t="t", d="d"))
    phase_1_epochs = []
    for _ in range(60):
        work.random_epoch_dml((1, 2))
        t0 = time.monotonic()
        report = engine.step()
        seconds = time.monotonic() - t0
        p = engine.progress("big")
        if p.state == "backfilling":
            phase_1_epochs.append((report.epoch, seconds, p.rows_done))
            # the live pipeline is current while the job reads its snapshot
            assert engine.progress("live").state == "created"
        if p.state == "created":
            break
    assert engine.progress("big").state == "created"
    # the upstream went on: many epochs were committed during phase 1, while its
    # rows advanced, so the job ran beside the epochs instead of inside one
    assert len(phase_1_epochs) >= 5, phase_1_epochs
    rows_seen = [r for _, _, r in phase_1_epochs]
    assert rows_seen == sorted(rows_seen) and rows_seen[-1] > rows_seen[0], phase_1_epochs
    for epoch, _, _ in phase_1_epochs:
        assert engine.verify("live", as_of=epoch).count() == 0
    assert engine.verify("big").count() == 0


def _wait_for(eng, work, name: str, pred, limit: int = 80):
    for _ in range(limit):
        p = eng.progress(name)
        if pred(p):
            return p
        work.random_epoch_dml((1, 2))
        eng.step()
    raise AssertionError(f"{name}: condition never reached; last progress {eng.progress(name)}")


@pytest.mark.parametrize("phase", [pytest.param("phase1", marks=pytest.mark.connect),
                                   "phase2", "phase3"])
def test_cancel_in_each_phase_removes_job_and_keeps_upstream(engine, spark, warehouse,
                                                            monkeypatch, phase):
    monkeypatch.setattr(snapshot_jobs, "CATCH_UP_EPOCHS", 2)
    work, _, _ = _setup(engine, spark, 33, rows=800)
    rate = 300 if phase == "phase1" else 2000
    engine.sql(f"CREATE MATERIALIZED VIEW j WITH (backfill = 'snapshot', backfill_chunk_rows = "
               f"100, backfill_rate_limit = {rate}) AS " + SHAPES["jagg"][0].format(t="t", d="d"))
    job_dir = os.path.join(warehouse, "relations", "_jobs")
    if phase == "phase1":
        _wait_for(engine, work, "j", lambda p: p.state == "backfilling" and p.rows_done > 0)
        assert os.listdir(job_dir)
    elif phase == "phase2":
        _wait_for(engine, work, "j", lambda p: p.state == "catching_up"
                  and (p.lag_epochs or 0) > 2)
    else:
        _wait_for(engine, work, "j", lambda p: p.state == "catching_up"
                  and (p.lag_epochs or 0) <= 2)
    epoch = engine.committed_epoch
    table_before = engine.read("t").count()
    engine.sql("CANCEL JOBS j" if phase == "phase2" else "DROP MATERIALIZED VIEW j")
    names = {r[0] for r in engine.sql("SHOW MATERIALIZED VIEWS").collect()}
    assert "j" not in names
    assert not [n for n in os.listdir(os.path.join(warehouse, "relations"))
                if n.split("-")[1:2] == ["j"]]
    assert not os.path.exists(job_dir) or not os.listdir(job_dir)
    assert engine.read("t").count() == table_before
    work.random_epoch_dml()
    engine.step()
    assert engine.committed_epoch == epoch + 1
    # the name is free again, and a new job over the same upstream is exact
    engine.sql("CREATE MATERIALIZED VIEW j WITH (backfill = 'snapshot') AS "
               + SHAPES["agg"][0].format(t="t"))
    _wait_for(engine, work, "j", lambda p: p.state == "created")
    assert engine.verify("j").count() == 0


def test_chunk_files_no_marker_names_are_never_read(warehouse, spark, monkeypatch):
    """A killed Spark Connect client's chunk write goes on at the server: files it
    leaves in a chunk's directory, done or not, must not reach the MV."""
    monkeypatch.setattr(snapshot_jobs, "CATCH_UP_EPOCHS", 2)
    with Engine(warehouse, spark=spark) as eng:
        work, _, _ = _setup(eng, spark, 34, rows=800)
        eng.sql("CREATE MATERIALIZED VIEW j WITH (backfill = 'snapshot', backfill_chunk_rows"
                " = 100, backfill_rate_limit = 300) AS " + SHAPES["jagg"][0].format(t="t", d="d"))
        _wait_for(eng, work, "j", lambda p: p.state == "backfilling" and p.rows_done > 0)
    job_dir = next(Path(warehouse, "relations", "_jobs").iterdir())
    plan = json.loads((job_dir / "plan.json").read_text())
    done = [c for c in plan if (job_dir / _chunk_dir(c) / "_DONE.json").exists()]
    undone = [c for c in plan if c not in done]
    assert done and undone, (len(done), len(plan))
    stray = sorted((job_dir / _chunk_dir(done[0])).rglob("*.parquet"))
    assert stray
    for c in [*done, undone[0]]:  # a second attempt's files; files of no attempt
        for where in (job_dir / _chunk_dir(c) / "a-zombie", job_dir / _chunk_dir(c)):
            where.mkdir(parents=True, exist_ok=True)
            for i, f in enumerate(stray):
                shutil.copy(f, where / f"part-zombie-{i}.parquet")
    # a job dir no MV owns (a late writer of a cancelled job) is removed on open
    orphan = job_dir.parent / "999999" / "leaf0"
    orphan.mkdir(parents=True)
    shutil.copy(stray[0], orphan / "part-late.parquet")
    with Engine(warehouse, spark=spark) as eng:
        assert not orphan.parent.exists() and job_dir.exists()
        work = Workload(eng, spark, "t", random.Random(78), key_space=1500)
        _wait_for(eng, work, "j", lambda p: p.state == "created")
        assert eng.verify("j").count() == 0


def _chunk_dir(c: dict) -> str:
    return f"leaf{c['leaf']}/v{c['lo']:03d}-{c['hi']:03d}"


DRIVER = r"""
import random, sys
sys.path.insert(0, sys.argv[2])
import sparkfill.backfill.snapshot_jobs as snapshot_jobs
snapshot_jobs.CATCH_UP_EPOCHS = 2
from sparkfill import Engine
from test_incremental_sql import DIM_SQL
from workload import Workload, create_table_sql
from test_snapshot_backfill import SHAPES

eng = Engine(sys.argv[1])
rng = random.Random(eng.committed_epoch * 7919 + 5)
work = Workload(eng, eng.spark, "t", rng, key_space=1500)
if eng.committed_epoch == 0:
    eng.sql(create_table_sql("t"))
    eng.sql(DIM_SQL)
    work.initial_load(1200)
    eng.insert("d", [{"g": g, "name": "n%d" % (g % 3), "w": g} for g in range(5)])
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW j WITH (backfill = 'snapshot', backfill_chunk_rows = 100, "
            "backfill_rate_limit = 200) AS " + SHAPES["jagg"][0].format(t="t", d="d"))
print("READY", flush=True)
while True:
    work.random_epoch_dml((1, 2))
    print("STEPPING", eng.committed_epoch + 1, flush=True)
    eng.step()
    p = eng.progress("j")
    print("EPOCH", eng.committed_epoch, p.state, p.lag_epochs or 0, p.rows_done, flush=True)
    if p.state == "backfilling" and p.rows_done >= 600:
        eng.sql("ALTER MATERIALIZED VIEW j SET backfill_rate_limit = DEFAULT")
"""


def _run_until(script: str, warehouse: str, tests_dir: str, pred, delay: float) -> list[str]:
    """Run the driver until a line satisfies ``pred``, wait ``delay`` s, SIGKILL it."""
    proc = subprocess.Popen([sys.executable, script, warehouse, tests_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=subprocess_env("local[2]"), start_new_session=True)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.time() + 300
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            assert time.time() < deadline, f"driver made no progress: {seen[-5:]}"
            if pred(line.split()):
                time.sleep(delay)
                break
        else:
            raise AssertionError(f"driver exited (rc={proc.wait()}) before the kill point: "
                                 f"{seen[-5:]}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return seen


def test_sigkill_in_each_phase_resumes_exactly_once(tmp_path, spark):
    # (not in the Spark Connect subset: its writer is a child process with a session of
    # its own; reopening on Connect is test_engine_api's reopen test there)
    warehouse = str(tmp_path / "wh")
    script = str(tmp_path / "driver.py")
    with open(script, "w") as f:
        f.write(DRIVER)
    tests_dir = os.path.dirname(os.path.abspath(__file__))

    # phase 1: mid-snapshot, after some chunks are checkpointed
    seen = _run_until(script, warehouse, tests_dir,
                      lambda w: w[0] == "EPOCH" and w[2] == "backfilling" and int(w[4]) >= 200,
                      0.7)
    with Engine(warehouse, spark=spark) as eng:
        p = eng.progress("j")
        assert p.state == "backfilling" and p.rows_done > 0, (p, seen[-3:])
    # phase 2: in the log store, several epochs behind
    seen = _run_until(script, warehouse, tests_dir,
                      lambda w: w[0] == "EPOCH" and w[2] == "catching_up" and int(w[3]) >= 3,
                      0.0)
    with Engine(warehouse, spark=spark) as eng:
        p = eng.progress("j")
        assert p.state == "catching_up", (p, seen[-3:])
    # around phase 3: in the middle of the epoch that joins, or just after it (a fast
    # catch-up joins in the restarted driver's first epoch: its first line says created)
    _run_until(script, warehouse, tests_dir,
               lambda w: w[0] == "EPOCH" and (w[2] == "created" or (
                   w[2] == "catching_up" and int(w[3]) <= 3)), 1.0)
    with Engine(warehouse, spark=spark) as eng:
        work = Workload(eng, spark, "t", random.Random(77), key_space=1500)
        first = eng.committed_epoch
        _wait_for(eng, work, "j", lambda p: p.state == "created")
        for _ in range(2):
            work.random_epoch_dml()
            eng.step()
        created = next(e for e in range(first, eng.committed_epoch + 1)
                       if _created_as_of(eng, e))
        for e in range(created, eng.committed_epoch + 1):
            assert eng.verify("j", as_of=e).count() == 0, f"epoch {e}"


def _created_as_of(eng, epoch: int) -> bool:
    try:
        eng.read("j", as_of=epoch)
    except MaterializedViewNotReady:
        return False
    return True


def test_snapshot_chunks_default_large_and_an_explicit_size_wins():
    # phase 1's chunks run beside the epochs: the default is large, the user's value wins
    assert resolve_options({}, {"backfill": "snapshot"}).chunk_rows == 1_000_000
    assert resolve_options({"backfill": "snapshot"}, {}).chunk_rows == 1_000_000
    assert resolve_options({}, {"backfill": "snapshot", "backfill_chunk_rows": 500}) \
        .chunk_rows == 500
    assert resolve_options({}, {"backfill": "arrangement"}).chunk_rows == 10_000
