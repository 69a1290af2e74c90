"""``sparkfill ui``: its facts, JSON and Prometheus endpoints on a synthetic warehouse
(no Spark), and the page in a real headless Chromium following an MV being created
online while a writer commits epochs beside it.

The browser test fails (never skips) when Chromium or chromedriver is missing,
naming what is missing; its screenshots are kept in ``test-artifacts/ui/``
(``SPARKFILL_TEST_ARTIFACTS`` to put them elsewhere)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from browser import Browser, BrowserMissing  # noqa: E402
from ui_bench import build_meta  # noqa: E402

from sparkfill.cli import main  # noqa: E402
from sparkfill.errors import SparkfillError  # noqa: E402
from sparkfill.storage.meta_store import MetaStore  # noqa: E402
from sparkfill.storage.warehouse import Warehouse  # noqa: E402
from sparkfill.ui.facts import open_meta, status_facts  # noqa: E402
from sparkfill.ui.server import UiServer  # noqa: E402

ARTIFACTS = Path(os.environ.get("SPARKFILL_TEST_ARTIFACTS", REPO / "test-artifacts")) / "ui"
#: a sample line of the Prometheus text format: name{labels} value
METRIC = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$')


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _metrics(text: str) -> dict[str, float]:
    """The samples of a Prometheus text, by ``name{labels}``; every line checked."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert METRIC.match(line), f"not a Prometheus sample line: {line!r}"
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    return samples


def _dag_nodes(browser: Browser) -> dict[str, list[str]]:
    """The page's graph nodes: id -> [kind, state, text]."""
    return {n[0]: n[1:] for n in browser.run(
        "return Array.from(document.querySelectorAll('#dag .node'), "
        "n => [n.dataset.id, n.dataset.kind, n.dataset.state, n.textContent])")}


def _dag_edges(browser: Browser) -> set[tuple[str, str]]:
    return {tuple(e) for e in browser.run(
        "return Array.from(document.querySelectorAll('#dag .edge'), "
        "e => [e.dataset.from, e.dataset.to])")}


@pytest.fixture(scope="module")
def browser():
    try:
        b = Browser()
    except BrowserMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield b
    finally:
        b.quit()


def test_synthetic_warehouse_endpoints_and_page(tmp_path, capsys, browser):
    """Every endpoint over a synthetic warehouse (tables, a source, MVs over MVs, two
    creating arrangement jobs, a sink that wrote nothing, a sampled VERIFY that found
    differences, an epoch planned long ago that never committed): the graph, the
    jobs' rates from the epochs' rows, the warnings and errors, the metrics."""
    wh = tmp_path / "wh"
    built = build_meta(wh, mvs=6, epochs=300, creating=2)
    meta = MetaStore(wh / "meta.sqlite")
    meta.begin_epoch(301, {"epoch": 301, "proctime_us": int((time.time() - 900) * 1e6)})
    meta.close()
    server = UiServer(Warehouse(wh), port=0)
    server.reader.sizes.budget = 60.0  # every size in one read, however slow the machine
    url = server.start()
    try:
        status, kind, body = _get(url + "api/watch?epochs=50")
        assert status == 200 and kind.startswith("application/json"), body
        facts = json.loads(body)
        status_code, _, status_body = _get(url + "api/status")
        metrics_status, metrics_kind, metrics_body = _get(url + "metrics")
        page_status, page_kind, page = _get(url)
        script = _get(url + "static/vendor/uPlot.iife.min.js")
        bad = _get(url + "api/watch?epochs=x")
        # the page: sources, sinks, stalled or behind nodes, warnings, errors
        browser.get(url + "?epochs=50")
        browser.wait_for("return window.sparkfill && window.sparkfill.updates > 0", 30,
                         "the page's first facts")
        page_nodes = _dag_nodes(browser)
        page_edges = _dag_edges(browser)
        page_jobs = browser.run("return Array.from(document.querySelectorAll('.job'), "
                                "j => [j.dataset.name, j.querySelectorAll('.strip span.d')"
                                ".length])")
        page_notes = browser.run("return [Array.from(document.querySelectorAll("
                                 "'#warnings li'), li => li.className + ' ' + li.textContent),"
                                 " document.getElementById('errors').textContent]")
        browser.screenshot(ARTIFACTS / "synthetic.png")
    finally:
        server.stop()
    # the same facts as `sparkfill status --json`
    assert status_code == 200
    assert main(["status", str(wh), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    api = json.loads(status_body)
    for facts_ in (cli, api):
        for job in facts_["jobs"]:  # the time a job has run grows between two reads
            job.pop("running_seconds")
    assert api == cli
    assert facts["status"]["committed_epoch"] == 300
    # the graph: tables, MVs, the source and the sink, with their edges
    nodes = {n["id"]: n for n in facts["dag"]["nodes"]}
    assert set(nodes) == ({f"rel:{n}" for n in built["relations"]}
                          | {"source:orders", "sink:mv_000_sink"})
    edges = {(e["from"], e["to"]) for e in facts["dag"]["edges"]}
    assert ("source:orders", "rel:orders") in edges
    assert ("rel:mv_000", "sink:mv_000_sink") in edges
    assert ("rel:orders", "rel:mv_000") in edges and ("rel:customers", "rel:mv_001") in edges
    assert len(edges) == 6 + 2
    for name in built["creating"]:
        assert nodes[f"rel:{name}"]["state"] == "creating"
        assert nodes[f"rel:{name}"]["bytes"] == 0  # an empty Delta table
    assert nodes["sink:mv_000_sink"]["state"] == "behind"
    assert nodes["rel:orders"]["last_epoch"] == 300
    # the jobs: 8,000 rows in each of the last 60 epochs, 3 seconds or so apart
    jobs = {j["name"]: j for j in facts["status"]["jobs"]}
    assert set(jobs) == set(built["creating"])
    for job in jobs.values():
        assert job["rows_done"] == 60 * 8000 and job["phase"] == "snapshot"
        assert 1000 < job["rows_per_second"] < 8000, job
        assert job["eta_seconds"] is None or job["eta_seconds"] >= 0
        assert job["vnodes"][0].count("d") == job["vnodes_done"] == 120
        assert len(job["vnodes"][0]) == 256 and not job["stalled"]
    assert {j["rate_limit"] for j in jobs.values()} == {None, 20_000}
    # the timeline: the last 50 epochs and each one's parts
    timeline = facts["timeline"]
    assert timeline["epoch"] == list(range(251, 301))
    assert all(c is not None for c in timeline["commit_seconds"][:-1])
    assert all(b > 0 for b in timeline["backfill_seconds"][-50:])
    assert {b["name"] for b in timeline["backfills"]} == set(built["creating"])
    # warnings and errors
    texts = [w["text"] for w in facts["warnings"]]
    assert any("mv_000_sink" in t and "written nothing" in t for t in texts), texts
    assert any("VERIFY of mv_001" in t and "2 differing rows" in t for t in texts), texts
    assert [e["epoch"] for e in facts["errors"]] == [301]
    assert "has not committed" in facts["errors"][0]["text"]
    assert facts["pending"]["epoch"] == 301
    # Prometheus text format
    assert metrics_status == 200 and metrics_kind.startswith("text/plain; version=0.0.4")
    samples = _metrics(metrics_body)
    assert samples["sparkfill_committed_epoch"] == 300
    assert samples["sparkfill_epoch_in_flight"] == 1 and samples["sparkfill_errors"] == 1
    for name in built["creating"]:
        labels = f'{{mv="{name}",strategy="arrangement"}}'
        assert samples[f"sparkfill_job_rows_done{labels}"] == 480_000
        assert 0 < samples[f"sparkfill_job_progress_ratio{labels}"] <= 1
        assert samples[f"sparkfill_job_rows_per_second{labels}"] > 1000
    assert samples['sparkfill_sink_lag_epochs{sink="mv_000_sink",mv="mv_000"}'] == 300
    assert samples["sparkfill_commit_lag_seconds"] >= 0
    # the page and its vendored chart library are served by the package itself
    assert page_status == 200 and page_kind.startswith("text/html")
    assert "static/vendor/uPlot.iife.min.js" in page and "http" not in page.split("<body>")[1]
    assert script[0] == 200 and "uPlot" in script[2][:200]
    assert bad[0] == 400
    assert set(page_nodes) == set(nodes) and page_edges == edges
    assert page_nodes["source:orders"][:2] == ["source", "running"]
    assert page_nodes["sink:mv_000_sink"][:2] == ["sink", "behind"]
    assert sorted(page_jobs) == [[name, 120] for name in sorted(built["creating"])]
    warned, errors = page_notes
    assert any(w.startswith("warning") and "2 differing rows" in w for w in warned), warned
    assert any(w.startswith("error") and "epoch 301" in w for w in warned), warned
    assert "has not committed" in errors


def test_ui_command_errors_and_an_older_meta_store(tmp_path, capsys):
    """A folder that is not a warehouse is a clear error (exit 2), as is a port in
    use; a writer adds the epochs' new columns to an older meta store, which a
    reader reads as not recorded."""
    assert main(["ui", str(tmp_path / "nowhere"), "--port", "0"]) == 2
    assert "not a sparkfill warehouse" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["ui", str(tmp_path), "--port", "70000"])
    assert exit_.value.code == 2
    wh = tmp_path / "old"
    wh.mkdir()
    old = sqlite3.connect(wh / "meta.sqlite")
    old.executescript("CREATE TABLE epochs (epoch INTEGER PRIMARY KEY, seconds REAL NOT NULL, "
                      "finished_at REAL NOT NULL); INSERT INTO epochs VALUES (1, 0.5, 10.0);")
    old.commit()
    old.close()
    reader = MetaStore(wh / "meta.sqlite", read_only=True)
    (row,) = reader.epoch_rows()
    assert (row.epoch, row.seconds, row.backfill_seconds, row.jobs) == (1, 0.5, None, {})
    reader.close()
    writer = MetaStore(wh / "meta.sqlite")  # adds the columns
    writer.close()
    columns = [r[1] for r in sqlite3.connect(wh / "meta.sqlite").execute(
        "PRAGMA table_info(epochs)")]
    assert columns[-6:] == ["backfill_seconds", "commit_seconds", "changes", "spark_jobs",
                            "jobs", "warnings"]
    # a port in use
    server = UiServer(Warehouse(wh), port=0)
    port = int(server.url.rsplit(":", 1)[1].strip("/"))
    with pytest.raises(SparkfillError, match=f"cannot listen on 127.0.0.1:{port}"):
        UiServer(Warehouse(wh), port=port)
    server.close()


def test_postgres_meta_store_beside_its_writer(tmp_path, pg_url):
    """A warehouse whose meta store is PostgreSQL: the server reads it (through the URL
    the warehouse records, or ``--meta``) while a writer holds the warehouse's lock,
    and sees each epoch the writer commits."""
    from sparkfill.storage.meta_store import EpochCommit, open_postgres

    wh = tmp_path / "pgwh"
    built = build_meta(wh, mvs=4, epochs=40, creating=1, meta_url=pg_url)
    target, lock = open_postgres(Warehouse(wh), pg_url, read_only=False)  # the writer's lock
    writer = MetaStore(target)
    server = UiServer(Warehouse(wh), meta_url=pg_url, port=0)
    url = server.start()
    try:
        facts = json.loads(_get(url + "api/watch")[2])
        assert facts["status"]["committed_epoch"] == 40
        assert {n["id"] for n in facts["dag"]["nodes"]} >= {f"rel:{n}" for n in
                                                             built["relations"]}
        (job,) = facts["status"]["jobs"]
        assert job["name"] == built["creating"][0] and job["rows_per_second"] > 0
        writer.commit_epoch(EpochCommit(41, 0.5, time.time(), {}, {}, [], [], 0,
                                        backfill_seconds=0.0, changes=1, spark_jobs=1))
        facts = json.loads(_get(url + "api/watch")[2])
        assert facts["status"]["committed_epoch"] == 41
        assert facts["timeline"]["epoch"][-1] == 41
        assert _metrics(_get(url + "metrics")[2])["sparkfill_committed_epoch"] == 41
    finally:
        server.stop()
        writer.close()
        lock.release()
    # a writer adds the epochs' newer columns to an older meta store
    target, lock = open_postgres(Warehouse(wh), pg_url, read_only=False)
    lock.conn.execute(f'ALTER TABLE "{target.schema}".epochs DROP COLUMN warnings')
    MetaStore(target).close()
    columns = [r[0] for r in lock.conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'epochs'", (target.schema,)).fetchall()]
    lock.release()
    assert "warnings" in columns and "jobs" in columns
    # the command line refuses a --meta other than the one the warehouse records
    assert main(["ui", str(wh), "--meta", "postgresql://nobody@127.0.0.1:1/none",
                 "--port", "0"]) == 2


def test_page_follows_an_mv_created_online(spark, tmp_path, browser):
    """The page in headless Chromium beside a writer creating an MV online (rate
    limited, so it takes several epochs): the graph, the job's percent rising
    between two refreshes without a reload, the chart's points, the end of the
    backfill; the JSON and metrics endpoints read directly; screenshots kept."""
    from sparkfill import Engine

    wh = tmp_path / "wh"
    eng = Engine(str(wh), spark=spark)
    server = None
    writer = None
    stop = threading.Event()
    seen = threading.Event()
    reports = []
    failures = []
    try:
        # few epochs (each costs Spark's fixed cost): `evens`, created over the empty
        # table, takes the load as changes in epoch 1; m then reads 1,000 snapshot
        # rows an epoch (its rate limit): epochs 2, 3 and 4
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        eng.sql("CREATE MATERIALIZED VIEW evens AS SELECT id, v FROM t WHERE v % 2 = 0")
        eng.insert("t", [{"id": i, "g": i % 10, "v": i} for i in range(2400)])
        reports.append(eng.step())
        assert eng.progress("evens").state == "created"
        eng.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'arrangement', "
                "backfill_rate_limit = 1000) AS SELECT id, g, v * 2 AS w FROM t "
                "WHERE v % 3 <> 0")
        reports.append(eng.step())

        def write() -> None:
            # the page sees the job's first epoch before the second commits
            try:
                seen.wait(timeout=120)
                n = 0
                while not stop.is_set() and n < 20:
                    eng.insert("t", [{"id": 10_000 + n, "g": n % 10, "v": n}])
                    reports.append(eng.step())
                    n += 1
                    if eng.progress("m").state == "created":
                        break
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        # the server reads beside the writer, which holds the warehouse's lock
        server = UiServer(Warehouse(wh), port=0)
        url = server.start()
        browser.get(url + "?interval=300")
        browser.wait_for("return window.sparkfill && window.sparkfill.updates > 0 && "
                         "document.querySelector('.job[data-name=\"m\"]')", 30,
                         "the page's first facts with the job of m")
        browser.run("window.__not_reloaded = true;")
        first = float(browser.run(
            "return document.querySelector('.job[data-name=\"m\"]').dataset.percent"))
        assert 0 < first < 100
        # the graph: the table and MVs (created, creating), edges along the data
        nodes = _dag_nodes(browser)
        assert set(nodes) == {"rel:t", "rel:evens", "rel:m"}, nodes
        assert nodes["rel:t"][:2] == ["table", "created"]
        assert nodes["rel:evens"][:2] == ["mv", "created"]
        assert nodes["rel:m"][:2] == ["mv", "creating"] and "arrangement" in nodes["rel:m"][2]
        assert "2,400 rows" in nodes["rel:t"][2] and "KiB" in nodes["rel:t"][2]
        assert "e2" in nodes["rel:m"][2]  # its last epoch
        assert _dag_edges(browser) == {("rel:t", "rel:evens"), ("rel:t", "rel:m")}
        # the job's card: strategy, phase, rate limit, a vnode strip of 256
        card = browser.run("const j = document.querySelector('.job[data-name=\"m\"]'); "
                           "return [j.textContent, j.dataset.phase, "
                           "j.querySelectorAll('.strip span').length, "
                           "j.querySelectorAll('.strip span.d').length]")
        assert "arrangement" in card[0] and "1,000 rows/s" in card[0] and card[1] == "snapshot"
        assert card[2] == 256 and card[3] > 0
        # /metrics during the backfill
        samples = _metrics(_get(url + "metrics")[2])
        ratio = samples['sparkfill_job_progress_ratio{mv="m",strategy="arrangement"}']
        assert 0 < ratio < 1
        browser.screenshot(ARTIFACTS / "during-backfill.png")
        seen.set()
        # the page refreshes itself: the percent rises, the page is the same page
        browser.wait_for(
            "const j = document.querySelector('.job[data-name=\"m\"]'); "
            f"return j && Number(j.dataset.percent) > {first}", 60,
            f"m's percent to rise above {first}")
        assert browser.run("return window.__not_reloaded === true")
        # the chart: one point per committed epoch the page knows, parts stacked
        chart = browser.run("const s = window.sparkfill; return {x: s.charts.seconds.data[0], "
                            "top: s.charts.seconds.data[1], changes: s.charts.seconds.data[3], "
                            "epoch: s.facts.status.committed_epoch, "
                            "backfill: s.facts.timeline.backfill_seconds, "
                            "marks: s.facts.timeline.backfills, "
                            "counts: s.charts.counts.data[2]}")
        assert chart["x"] == list(range(1, chart["epoch"] + 1)), chart
        assert all(t >= c > 0 for t, c in zip(chart["top"], chart["changes"], strict=True))
        assert chart["backfill"][1] > 0  # epoch 2: m's first backfill epoch
        assert {"name": "m", "start_epoch": 2, "end_epoch": None} in chart["marks"]
        assert all(n >= 1 for n in chart["counts"])  # Spark jobs per epoch
        writer.join(timeout=120)
        assert not writer.is_alive() and not failures, failures
        assert eng.progress("m").state == "created"
        done = reports[-1].epoch
        browser.wait_for("const s = window.sparkfill.facts; return s.status.committed_epoch "
                         f"== {done} && !document.querySelector('.job')", 30,
                         f"the page at epoch {done} without creating jobs")
        assert browser.run("return document.querySelector('#dag .node[data-id=\"rel:m\"]')"
                           ".dataset.state") == "created"
        marks = browser.run("return window.sparkfill.facts.timeline.backfills")
        assert {"name": "m", "start_epoch": 2, "end_epoch": done} in marks
        browser.screenshot(ARTIFACTS / "after-backfill.png")
        assert (ARTIFACTS / "during-backfill.png").stat().st_size > 10_000

        # the endpoints, read directly: /api/status is `status --json`'s facts
        api = json.loads(_get(url + "api/status")[2])
        meta = open_meta(Warehouse(wh), None)
        try:
            assert api == json.loads(json.dumps(status_facts(meta, Warehouse(wh))))
            rows = {r.epoch: r for r in meta.epoch_rows(50)}
        finally:
            meta.close()
        assert api["committed_epoch"] == done and api["jobs"] == []
        samples = _metrics(_get(url + "metrics")[2])
        assert samples["sparkfill_committed_epoch"] == done
        m_rows = next(r["rows"] for r in api["relations"] if r["name"] == "m")
        assert samples['sparkfill_relation_rows{relation="m",kind="mv",state="created"}'] \
            == m_rows
        # each epoch's row holds what its report said
        for report in reports:
            row = rows[report.epoch]
            assert row.spark_jobs == report.spark_jobs
            assert row.changes == sum(report.changes.values())
            assert abs(row.seconds - report.seconds) < 1e-6
            assert 0 <= (row.backfill_seconds or 0) <= row.seconds
            assert (row.backfill_seconds or 0) > 0 if "m" in report.backfill_rows else True
            assert (row.commit_seconds is None) == (report.epoch == done)
        assert rows[2].jobs and max(rows[done].jobs.values()) >= 2400
    finally:
        stop.set()
        seen.set()
        if writer is not None:
            writer.join(timeout=120)
        if server is not None:
            server.stop()
        eng.close()
