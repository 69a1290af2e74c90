"""The meta store and writer lock on PostgreSQL (``Engine(..., meta="postgresql://...")``).

A session fixture starts a throwaway PostgreSQL server from Debian's
``postgresql`` package on a free loopback port (as the ``postgres`` user when
the tests run as root: the server refuses to run as root). Without the
package's binaries the fixture fails: install it with
``apt-get install -y postgresql`` (``.ci/run`` does).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import TableModel, assert_rows_equal, check_mv, free_port, mv_sql, subprocess_env

# --- the meta store alone (no Spark) -------------------------------------------------------


@pytest.fixture
def pg_meta(pg_url, tmp_path):
    from sparkfill.storage.meta_store import MetaStore, open_postgres

    target, lock = open_postgres(tmp_path / "wh", pg_url, read_only=False)
    meta = MetaStore(target)
    meta.fence = lock.check
    try:
        yield meta, target, lock
    finally:
        meta.close()
        lock.release()


def test_meta_store_round_trip(pg_meta):
    from sparkfill.storage.meta_store import (
        EpochCommit,
        ProgressRow,
        RelationRow,
        SinkRow,
        SourceRow,
        StagedBatch,
    )

    meta, target, _ = pg_meta
    assert target.schema.startswith("sf_wh_")
    assert meta.committed_epoch == 0 and meta.relations() == []
    big = 3 * 2**40  # BIGINT, not INTEGER
    t = RelationRow(meta.next_relation_id(), "t", "table", {"columns": [["id", "bigint"]]},
                    "created", 0, 0, "000001-t")
    mv = RelationRow(2, "mv", "mv", {"sql": "SELECT 1"}, "creating", 1, 0, "000002-mv")
    with meta.transaction() as conn:
        meta.add_relation(conn, t, 0)
        meta.add_relation(conn, mv, 0)
        meta.put(conn, "option", "x")
    assert [r.name for r in meta.relations()] == ["t", "mv"]
    assert meta.relations()[0] == t and meta.next_relation_id() == 3
    assert meta.get("option") == "x" and meta.get("missing", "d") == "d"

    # DML batches, sequence numbers explicit (max + 1)
    assert meta.next_dml_seq() == 1
    meta.stage_dml(StagedBatch(1, t.id, "/dml/1", 2))
    meta.stage_dml(StagedBatch(2, t.id, "/dml/2", big))
    assert meta.next_dml_seq() == 3
    assert meta.staged() == [StagedBatch(1, t.id, "/dml/1", 2), StagedBatch(2, t.id, "/dml/2", big)]
    assert meta.staged(upto=1) == [StagedBatch(1, t.id, "/dml/1", 2)]

    # an epoch: begun, then committed in one transaction
    meta.begin_epoch(1, {"plan": [1, 2]})
    assert meta.pending_epoch() == (1, {"plan": [1, 2]})
    prog = ProgressRow(mv.id, 0, 7, "backfilling", {"key": [1, "a"]}, 5, 1)
    meta.commit_epoch(EpochCommit(1, 0.25, 1e9 + 0.5, {t.id: 3}, {t.id: big}, [prog],
                                  [mv.id], 1, tagged_versions=[(mv.id, 0, 1)]))
    assert meta.committed_epoch == 1 and meta.pending_epoch() is None
    assert meta.staged() == [StagedBatch(2, t.id, "/dml/2", big)]
    assert meta.next_dml_seq() == 3  # a sequence number is never reused
    assert meta.version_at(t.id, 0) == 0 and meta.version_at(t.id, 5) == 3
    assert meta.first_version_epoch(t.id) == 0
    assert meta.progress(mv.id) == [prog]
    rels = {r.name: r for r in meta.relations()}
    assert rels["t"].row_count == big
    assert rels["mv"].state == "created" and rels["mv"].ready_epoch == 1
    assert meta.recent_epochs() == [(1, 0.25, 1e9 + 0.5)]
    # upserts: the same epoch and progress key again replace their rows
    done = ProgressRow(mv.id, 0, 7, "done", None, 9, None)
    meta.commit_epoch(EpochCommit(1, 0.5, 2.0, {t.id: 4}, {}, [done], [], 0))
    assert meta.progress(mv.id) == [done] and meta.version_at(t.id, 1) == 4
    assert meta.recent_epochs() == [(1, 0.5, 2.0)]
    with meta.transaction() as conn:
        meta.prune_versions(conn, 1)
    assert meta.first_version_epoch(t.id) == 1

    # a transaction that raises leaves nothing behind
    with pytest.raises(RuntimeError), meta.transaction() as conn:
        meta.put(conn, "committed_epoch", "99")
        raise RuntimeError("boom")
    assert meta.committed_epoch == 1

    # sources: staged input and offset in one transaction
    src = SourceRow(t.id, "datagen", {"rows": 10}, None, 0)
    with meta.transaction() as conn:
        meta.add_source(conn, src)
    meta.stage_source(SourceRow(t.id, "datagen", {}, None, 2, 1, {"offset": 10}, 10, 1),
                      [StagedBatch(3, t.id, "/dml/3", 10)], ["a.json", "b.json"])
    (got,) = meta.sources()
    assert (got.epoch, got.batch, got.position, got.rows, got.total_rows,
            got.total_dead_letters) == (2, 1, {"offset": 10}, 10, 10, 1)
    assert meta.source_files(t.id) == {"a.json", "b.json"}
    assert meta.next_dml_seq() == 4

    # sinks
    sink = SinkRow(meta.next_sink_id(), "out", mv.id, "delta", "/out", {"mode": "x"}, 1)
    meta.add_sink(sink)
    assert meta.sinks() == [sink] and meta.next_sink_id() == 2
    meta.drop_sink(sink.id)
    assert meta.sinks() == [] and meta.next_sink_id() == 2

    # files
    meta.add_pending_dir(t.id, "/d1")
    meta.add_pending_dir(mv.id, "/d1")
    assert meta.pending_dirs() == [(mv.id, "/d1")]
    meta.remove_pending_dir("/d1")
    with meta.transaction() as conn:
        meta.add_removed_files(conn, t.id, 1, ["p1", "p2"])
        meta.add_removed_files(conn, t.id, 3, ["p3"])
        meta.add_removed_files(conn, t.id, 4, [])
    assert sorted(meta.removed_files_before(1)) == [(t.id, "p1"), (t.id, "p2")]
    with meta.transaction() as conn:
        meta.forget_removed_files(conn, 2)
    assert meta.removed_files_before(10) == [(t.id, "p3")]

    # rows read by name and by index, like sqlite3.Row
    row = meta._conn.execute("SELECT id, name FROM relations WHERE id = ?", (t.id,)).fetchone()
    assert row[0] == row["id"] == t.id and row["name"] == "t" and row.keys() == ["id", "name"]

    with meta.transaction() as conn:
        meta.drop_relation(conn, mv.id)
    assert [r.name for r in meta.relations()] == ["t"]
    assert meta.next_relation_id() == 3  # an id is never reused


def test_warehouses_share_a_database_in_schemas_of_their_own(pg_url, tmp_path):
    from sparkfill.storage.meta_store import MetaStore, open_postgres

    opened = []
    for name in ("a", "b"):
        target, lock = open_postgres(tmp_path / name, pg_url, read_only=False)
        opened.append((MetaStore(target), lock, target))
    (ma, la, ta), (mb, lb, tb) = opened
    try:
        assert ta.schema != tb.schema
        with ma.transaction() as conn:
            ma.put(conn, "committed_epoch", "5")
        assert ma.committed_epoch == 5 and mb.committed_epoch == 0
        # a reader sees the writer's commits, and cannot write
        reader = MetaStore(ta, read_only=True)
        try:
            assert reader.committed_epoch == 5
            with ma.transaction() as conn:
                ma.put(conn, "committed_epoch", "6")
            assert reader.committed_epoch == 6
            with pytest.raises(Exception, match="read-only"), reader.transaction() as conn:
                reader.put(conn, "committed_epoch", "7")
        finally:
            reader.close()
    finally:
        for m, lock, _ in opened:
            m.close()
            lock.release()


def test_a_write_without_the_lock_commits_nothing(pg_meta):
    from sparkfill import WarehouseLocked

    meta, _, lock = pg_meta
    with meta.transaction() as conn:
        meta.put(conn, "committed_epoch", "1")
    lock.release()  # as if its connection had ended
    with pytest.raises(WarehouseLocked, match="lost its writer lock"), \
            meta.transaction() as conn:
        meta.put(conn, "committed_epoch", "2")
    assert meta.committed_epoch == 1


def test_meta_url_errors_create_nothing(tmp_path, pg_url):
    from sparkfill import Engine, InvalidOption, MetaStoreError

    wh = tmp_path / "wh"
    with pytest.raises(InvalidOption, match="postgresql://") as err:
        Engine(wh, meta="mysql://me:secret@localhost/db")
    assert "secret" not in str(err.value)
    port = free_port()  # nothing listens there
    with pytest.raises(MetaStoreError, match="cannot connect") as err:
        Engine(wh, meta=f"postgres://me:secret@127.0.0.1:{port}/db")
    assert f"postgresql://me@127.0.0.1:{port}/db" in str(err.value)
    assert "secret" not in str(err.value)
    assert not wh.exists()


# --- the Engine ------------------------------------------------------------------------------

KV = "CREATE TABLE kv (id BIGINT, g BIGINT, v BIGINT, PRIMARY KEY (id))"
TEMPLATE = "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {src} GROUP BY g"

# a second writer in a process of its own: opens the warehouse, says so, waits to be killed
_HOLDER = """
import sys, time
from sparkfill import Engine
eng = Engine(sys.argv[1], meta=sys.argv[2])
print("OPEN", flush=True)
time.sleep(300)
"""


def _rows(keys, g_of=lambda k: k % 3):
    return [{"id": k, "g": g_of(k), "v": k * 10} for k in keys]


def test_engine_on_postgres(spark, pg_url, tmp_path, capsys):
    from sparkfill import Engine, MetaStoreError, WarehouseLocked
    from sparkfill.cli import main as cli_main

    wh = tmp_path / "wh"
    url = pg_url.replace("sparkfill@", "sparkfill:pw@")  # trust auth: any password will do
    eng = Engine(wh, spark=spark, meta=url)
    try:
        eng.sql(KV)
        eng.insert("kv", _rows(range(50)))
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m AS {mv_sql(TEMPLATE, 'kv')}")
        eng.insert("kv", _rows(range(40, 60), g_of=lambda k: 7))
        for _ in range(20):
            eng.step()
            if eng.progress("m").state == "created":
                break
        assert eng.progress("m").state == "created"
        eng.delete("kv", [{"id": k} for k in range(0, 30, 4)])
        eng.step()
        epoch = eng.committed_epoch
        check_mv(eng, spark, "m", TEMPLATE, "kv", epoch)
        m_rows = eng.read("m").count()
        # a second writer is refused while this one is open
        with pytest.raises(WarehouseLocked, match="open for writing by another engine"):
            Engine(wh, spark=spark, meta=pg_url)
        # a reader beside the writer sees its epochs
        reader = Engine(wh, spark=spark, meta=pg_url, read_only=True)
        try:
            assert reader.committed_epoch == epoch
            check_mv(reader, spark, "m", TEMPLATE, "kv", epoch)
        finally:
            reader.close()
        # `sparkfill status` reads it too, beside the writer: through the URL the
        # warehouse records, or the one given (with its password); another is refused
        capsys.readouterr()
        for args in ([], ["--meta", url]):
            assert cli_main(["status", str(wh), *args]) == 0
            out = capsys.readouterr().out
            assert f"committed epoch {epoch}" in out and "arrangement" in out, out
            assert re.search(r"\bm\b.*created", out) and re.search(r"\bkv\b.*table", out), out
        other = re.sub(r"/postgres$", "/template1", pg_url)
        assert cli_main(["status", str(wh), "--meta", other]) == 2
        assert "not in" in capsys.readouterr().out
        assert cli_main(["sql", str(wh), "SHOW MATERIALIZED VIEWS"]) == 0
        assert re.search(r"\bm\b", capsys.readouterr().out)
    finally:
        eng.close()
    # `sparkfill sql` as the writer, through the recorded URL
    assert cli_main(["sql", str(wh), "SELECT count(*) AS n FROM m"], spark=spark) == 0
    assert re.search(rf"\b{m_rows}\b", capsys.readouterr().out), m_rows

    assert not (wh / "meta.sqlite").exists() and not (wh / "writer.lock").exists()
    recorded = (wh / "meta.json").read_text()
    assert pg_url in recorded and "pw" not in recorded
    with pytest.raises(MetaStoreError, match="keeps its meta store in PostgreSQL"):
        Engine(wh, spark=spark)
    with pytest.raises(MetaStoreError, match="not in " + re.escape(other)):
        Engine(wh, spark=spark, meta=other)
    sqlite_wh = tmp_path / "sqlite_wh"
    Engine(sqlite_wh, spark=spark).close()
    with pytest.raises(MetaStoreError, match="SQLite"):
        Engine(sqlite_wh, spark=spark, meta=pg_url)

    # reopened with the same meta store (postgres:// names it too): all of it is there
    with Engine(wh, spark=spark, meta=pg_url.replace("postgresql://", "postgres://")) as eng:
        assert eng.committed_epoch == epoch
        assert eng.progress("m").state == "created"
        check_mv(eng, spark, "m", TEMPLATE, "kv", epoch)
        eng.insert("kv", _rows(range(100, 110)))
        eng.step()
        check_mv(eng, spark, "m", TEMPLATE, "kv", eng.committed_epoch)
    assert not (wh / "meta.sqlite").exists()


def test_lock_of_a_killed_writer_is_released(spark, pg_url, tmp_path):
    from sparkfill import Engine, WarehouseLocked

    wh = tmp_path / "wh"
    Engine(wh, spark=spark, meta=pg_url).close()
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(wh), pg_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env("local[1]"))
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.strip() == "OPEN", proc.stderr.read()[-3000:]
        with pytest.raises(WarehouseLocked, match=rf"sparkfill writer pid {proc.pid}@"):
            Engine(wh, spark=spark, meta=pg_url)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while True:  # the server ends the killed writer's session when its socket closes
        try:
            Engine(wh, spark=spark, meta=pg_url).close()
            break
        except WarehouseLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_postgres_meta_store_restarting_between_epochs(spark, pg_url, tmp_path):
    """Between epochs the server restarts (every connection of the engine ends): the
    call that finds out raises MetaStoreError and commits nothing; the next call
    connects again, takes the writer lock again and works; DML applies once."""
    from pg_server import restart

    from sparkfill import Engine, MetaStoreError

    wh = str(tmp_path / "wh")
    rng = random.Random(3)
    model = TableModel(["id", "g", "v"])

    def rows() -> list[dict]:
        return list({r["id"]: r for r in ({"id": rng.randrange(100), "g": rng.randrange(3),
                                           "v": rng.randrange(20)} for _ in range(15))}
                    .values())

    with Engine(wh, spark=spark, meta=pg_url) as eng:
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        first = rows()
        eng.insert("t", first)
        model.insert(first)
        eng.step()
        model.step()
        eng.sql("CREATE MATERIALIZED VIEW agg WITH (backfill = 'blocking') AS "
                "SELECT g, COUNT(*) AS c, SUM(v) AS sv FROM t GROUP BY g")
        eng.step()
        model.step()
        failed = 0
        for _ in range(2):
            restart(pg_url)  # between epochs: every connection of the engine ends
            batch = rows()
            try:  # the first call finds the connection ended: refused, nothing committed
                eng.insert("t", batch)
            except MetaStoreError as exc:
                assert "connection to the meta store ended" in str(exc), exc
                failed += 1
                eng.insert("t", batch)  # the next call connects again
            model.insert(batch)
            eng.step()
            model.step()
            assert_rows_equal(eng.read("t"), model.rows(), label="t after a restart")
            assert not eng.verify("agg").collect()
        assert failed == 2
    # the writer lock was taken again, and released on close
    Engine(wh, spark=spark, meta=pg_url).close()

