"""The ``sparkfill`` command line: help and bad arguments (subprocesses, no Spark),
the two examples run with ``sparkfill run`` and checked against their oracles,
``sql`` and ``status``, and a run stopped by Ctrl-C (SIGINT) between epochs."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable
from helpers import assert_rows_equal, subprocess_env

from sparkfill.cli import main

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "sparkfill.cli"]


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=subprocess_env("local[2]"))


def test_help_and_bad_arguments(tmp_path):
    bad_sql = tmp_path / "bad.sql"
    bad_sql.write_text("CREATE TABLE t (id BIGINT, PRIMARY KEY (id));\n-- ok so far\n"
                       "CREATE MATERIALIZED VIEW m AS SELECT FROM WHERE;\n")
    good = tmp_path / "good.sql"
    good.write_text("SHOW TABLES;\n")
    wh = tmp_path / "wh"
    cases = {
        # args: (exit code, text the output must hold)
        ("--help",): (0, "--spark-logs"),
        ("--version",): (0, "sparkfill "),
        ("run", "--help"): (0, "--until-idle"),
        ("sql", "--help"): (0, "STATEMENT"),
        ("status", "--help"): (0, "Read-only"),
        ("demo", "--help"): (0, "demo"),
        ("run", str(tmp_path / "missing.sql"), "--warehouse", str(wh)): (2, "does not exist"),
        ("run", str(good)): (2, "--warehouse"),
        ("run", str(good), "--warehouse", str(wh), "--epochs", "1", "--until-idle"):
            (2, "not allowed with"),
        ("run", str(good), "--warehouse", str(wh), "--epochs", "x"): (2, "invalid int"),
        ("run", str(bad_sql), "--warehouse", str(wh)): (1, "bad.sql:3"),
        ("status", str(tmp_path / "nowhere")): (2, "not a sparkfill warehouse"),
        ("frobnicate",): (2, "invalid choice"),
    }
    procs = {args: _cli(*args) for args in cases}
    for args, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        code, text = cases[args]
        assert proc.returncode == code, f"sparkfill {' '.join(args)}: exit {proc.returncode}\n{out}"
        assert text in out, f"sparkfill {' '.join(args)}: {text!r} not in\n{out}"
    assert not wh.exists(), "a rejected pipeline must not touch the warehouse"
    script = Path(sys.executable).parent / "sparkfill"
    if script.exists():  # the console script of the editable install
        out = subprocess.run([str(script), "run", "--help"], capture_output=True, text=True,
                             env=subprocess_env(), timeout=120)
        assert out.returncode == 0 and "--epochs" in out.stdout


def _copy_cdc_example(dest: Path) -> None:
    """examples/cdc.sql and its data, with arrival times in name order."""
    shutil.copytree(REPO / "examples", dest / "examples")
    for i, f in enumerate(sorted((dest / "examples" / "cdc_data").rglob("*.json"))):
        os.utime(f, (1_700_000_000 + i, 1_700_000_000 + i))


def test_cdc_example_runs_and_matches_its_data(spark, tmp_path, monkeypatch, capsys):
    from sparkfill import Engine

    _copy_cdc_example(tmp_path)
    monkeypatch.chdir(tmp_path)
    wh = tmp_path / "cdc-wh"
    assert main(["run", "examples/cdc.sql", "--warehouse", str(wh), "--epochs", "3"],
                spark=spark) == 0
    out = capsys.readouterr().out
    assert "epoch 3" in out and "orders: 13 rows, 4 dead letters" in out, out

    ts = dt.datetime
    with Engine(wh, spark=spark) as eng:
        assert eng.committed_epoch == 3
        assert_rows_equal(eng.read("customers"), [
            (1, "Ada", "Cambridge"), (2, "Grace", "New York"), (4, "Barbara", "New York"),
            (5, "Alan", "London")], label="customers")
        assert_rows_equal(eng.read("orders"), [
            (101, 2, Decimal("12.50"), "paid", ts(2024, 1, 1, 9, 5)),
            (102, 2, Decimal("99.99"), "paid", ts(2024, 1, 1, 9, 10)),
            (104, 4, Decimal("42.00"), "paid", ts(2024, 1, 1, 9, 20)),
            (105, 1, Decimal("7.25"), "cancelled", ts(2024, 1, 1, 9, 25)),
            (106, 5, Decimal("60.00"), "open", ts(2024, 1, 1, 9, 0)),
            (109, 1, Decimal("15.00"), "open", ts(2024, 1, 2, 10, 0)),
            (110, 1, Decimal("25.00"), "paid", ts(2024, 1, 1, 9, 0))], label="orders")
        assert_rows_equal(eng.read("orders__dead_letter").select("file", "line", "reason"), [
            ("002-changes.json", 4, "column 'amount': value 'n/a' is not a valid DECIMAL(10,2)"),
            ("002-changes.json", 5, "bad JSON: not a JSON object"),
            ("002-changes.json", 6, "unknown op 't'"),
            ("003-changes.json", 4, "key column 'id' is missing or null")], label="dead letters")
        assert eng.read("customers__dead_letter").count() == 0
        for mv in ("revenue_by_customer", "open_orders"):
            for e in range(eng.relation(mv).ready_epoch, 4):
                assert eng.verify(mv, as_of=e).count() == 0, f"{mv} at epoch {e}"
        cols = ["customer_id", "n_orders", "revenue", "last_order"]
        sink = DeltaTable(str(wh / "sinks" / "revenue_by_customer"))
        assert_rows_equal(eng.read("revenue_by_customer"),
                          [tuple(r[c] for c in cols[:3]) + (r["last_order"].replace(tzinfo=None),)
                           for r in sink.to_pyarrow_table().to_pylist()], label="sink")
        assert sink.transaction_version(f"sparkfill-sink-{eng.sinks.find('revenue_sink').id}") \
            == 3

    # run again: IF NOT EXISTS makes the file re-runnable; --until-idle stops at the
    # first epoch in which no file arrived
    assert main(["run", "examples/cdc.sql", "--warehouse", str(wh), "--until-idle"],
                spark=spark) == 0
    out = capsys.readouterr().out
    assert "done: 1 epochs this run, committed epoch 4" in out, out
    # a statement that fails when it runs: exit 1, naming file and line
    broken = tmp_path / "broken.sql"
    broken.write_text("SHOW TABLES;\nCREATE MATERIALIZED VIEW x AS SELECT id FROM nope;\n")
    assert main(["run", str(broken), "--warehouse", str(wh), "--epochs", "0"],
                spark=spark) == 1
    assert "broken.sql:2" in capsys.readouterr().out
    # sql: a query prints a table; a bad statement is an error (exit 1)
    assert main(["sql", str(wh), "SELECT reason FROM orders__dead_letter ORDER BY line"],
                spark=spark) == 0
    out = capsys.readouterr().out
    assert "unknown op 't'" in out and "reason" in out
    assert main(["sql", str(wh), "SELECT * FROM nope"], spark=spark) == 1
    assert "error" in capsys.readouterr().out
    # status reads beside everything else, without Spark
    proc = _cli("status", str(wh))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    for text in ("committed epoch 4", "cdc_files", "revenue_sink", "orders__dead_letter"):
        assert text in out, f"{text!r} not in\n{out}"
    # the same facts as JSON, for scripts and monitoring
    proc = _cli("status", str(wh), "--json")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    facts = json.loads(out)
    assert facts["committed_epoch"] == 4
    by_name = {r["name"]: r for r in facts["relations"]}
    assert by_name["orders__dead_letter"]["kind"] == "table"
    assert all(r["state"] == "created" and r["vnodes_done"] == 256
               for r in facts["relations"] if r["kind"] == "mv"), facts["relations"]
    assert {s["connector"] for s in facts["sources"]} == {"cdc_files"}
    assert all(s["rows"] > 0 for s in facts["sources"])
    assert sum(s["dead_letters"] or 0 for s in facts["sources"]) >= 1
    assert [s["name"] for s in facts["sinks"]] == ["revenue_sink"]
    assert facts["sinks"][0]["epoch_written"] == 4


def test_nexmark_example_runs_and_its_queries_match_batch(spark, tmp_path, monkeypatch,
                                                          capsys):
    from sparkfill import Engine

    monkeypatch.chdir(REPO)
    wh = tmp_path / "nexmark-wh"
    assert main(["run", "examples/nexmark.sql", "--warehouse", str(wh), "--epochs", "2"],
                spark=spark) == 0
    out = capsys.readouterr().out
    assert "STEP 1" in out and "epoch 3" in out, out
    with Engine(wh, spark=spark) as eng:
        assert eng.committed_epoch == 3
        assert {j.name: j.state for j in eng.progress()} == {
            "q1": "created", "q2": "created", "q3": "created", "q4": "created",
            "q17": "created"}
        for mv in ("q1", "q2", "q3", "q4", "q17"):
            assert eng.read(mv).count() > 0, mv
            for e in sorted({eng.relation(mv).ready_epoch, 3}):
                assert eng.verify(mv, as_of=e).count() == 0, f"{mv} at epoch {e}"
        assert eng.relation("q3").ready_epoch > 2, "q3 was not created online"
        cols = ["category", "bids", "bidders", "avg_price", "max_price"]
        sink = DeltaTable(str(wh / "sinks" / "q4")).to_pyarrow_table().to_pylist()
        assert_rows_equal(eng.read("q4"), [tuple(r[c] for c in cols) for r in sink],
                          label="q4 sink")


def test_run_waits_for_upstreams_and_stops_cleanly_on_sigint(spark, tmp_path):
    from sparkfill import Engine

    pipeline = tmp_path / "p.sql"
    pipeline.write_text("""
        CREATE TABLE t (id BIGINT, k INT, v BIGINT, PRIMARY KEY (id))
        WITH (connector = 'datagen', rows_per_epoch = 50, seed = 1, update_ratio = 0.2);
        STEP 1;
        CREATE MATERIALIZED VIEW f WITH (backfill = 'no_shuffle', backfill_chunk_rows = 30)
        AS SELECT id, v FROM t WHERE k % 2 = 0;
        -- an MV over f: the run steps epochs until f is created
        CREATE MATERIALIZED VIEW ff AS SELECT id FROM f WHERE v > 100;
    """)
    wh = tmp_path / "wh"
    proc = subprocess.Popen([*CLI, "run", str(pipeline), "--warehouse", str(wh),
                             "--interval", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=subprocess_env("local[2]"),
                            start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("epoch ") and "ff" in line and "created" in line:
                proc.send_signal(signal.SIGINT)  # the JVM ignores it; the run stops
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines) + rest
    assert proc.returncode == 0, out
    assert "waiting for f to be created" in out and "done (stopped)" in out, out
    last = max(int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("epoch "))
    # nothing in flight: the epoch running at Ctrl-C committed, no other began
    conn = sqlite3.connect(f"file:{wh / 'meta.sqlite'}?mode=ro", uri=True)
    assert conn.execute("SELECT count(*) FROM pending_epoch").fetchone()[0] == 0
    assert int(conn.execute("SELECT value FROM kv WHERE key = 'committed_epoch'")
               .fetchone()[0]) == last
    conn.close()
    with Engine(wh, spark=spark) as eng:
        assert eng.committed_epoch == last
        for mv in ("f", "ff"):
            assert eng.verify(mv).count() == 0


@pytest.mark.connect
def test_pipeline_is_checked_before_it_runs_and_a_rerun_resumes(spark, tmp_path, capsys):
    wh = tmp_path / "wh"
    head = ("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id));\n"
            "INSERT INTO t VALUES (1, 2), (2, 3), (3, 3);\n"
            "STEP 1;\n")
    bad = tmp_path / "bad.sql"
    bad.write_text(head + "CREATE MATERIALIZED VIEW m AS "
                          "SELECT id, rand() AS r FROM t;\n")
    assert main(["run", str(bad), "--warehouse", str(wh), "--epochs", "0"], spark=spark) == 1
    out = capsys.readouterr().out
    assert "bad.sql:4" in out and "non-deterministic function rand" in out, out
    assert not wh.exists(), "a pipeline that fails its check must leave nothing"
    # the check follows the catalog the file builds: m2 reads m, created two lines up
    good = tmp_path / "good.sql"
    good.write_text(head + "CREATE MATERIALIZED VIEW m AS SELECT v, count(*) AS c FROM t "
                           "GROUP BY v;\n"
                           "CREATE MATERIALIZED VIEW m2 AS SELECT c FROM m WHERE v > 2;\n"
                           "VERIFY MATERIALIZED VIEW m2;\n")
    assert main(["run", str(good), "--warehouse", str(wh), "--check"], spark=spark) == 0
    assert "6 statements" in capsys.readouterr().out
    assert not (wh / "relations").exists() or not any((wh / "relations").iterdir())
    assert main(["run", str(good), "--warehouse", str(wh), "--epochs", "0"], spark=spark) == 0
    out = capsys.readouterr().out
    assert "exact (0 differing rows)" in out, out
    con = sqlite3.connect(wh / "meta.sqlite")
    epoch = con.execute("SELECT value FROM kv WHERE key = 'committed_epoch'").fetchone()[0]
    con.close()
    # a re-run of the same file resumes after its last statement: STEP 1 runs no epoch
    assert main(["run", str(good), "--warehouse", str(wh), "--epochs", "0"], spark=spark) == 0
    assert "resuming after statement 6" in capsys.readouterr().out
    con = sqlite3.connect(wh / "meta.sqlite")
    assert con.execute("SELECT value FROM kv WHERE key = 'committed_epoch'").fetchone()[0] \
        == epoch
    con.close()
    # SHOW and EXPLAIN of an MV answer from the meta store without Spark: no Java needed
    env = {**subprocess_env("local[1]"), "JAVA_HOME": str(tmp_path / "no-java")}
    for statement, needle in (("SHOW MATERIALIZED VIEWS", "m2"), ("SHOW TABLES", "BIGINT"),
                              ("SHOW JOBS", "created"), ("SHOW SINKS", "name"),
                              ("EXPLAIN MATERIALIZED VIEW m", "HashAggregate")):
        out = subprocess.run([*CLI, "sql", str(wh), statement], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0 and needle in out.stdout, (statement, out.stdout, out.stderr)
