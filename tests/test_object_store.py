"""A warehouse on object storage: ``Engine("s3://bucket/wh", meta="postgresql://...")``.

Against an S3-compatible server on loopback (moto, ``s3_server``) and a throwaway
PostgreSQL (``pg_url``), with nothing but pyspark's own jars (no Hadoop S3A): the
executors read and write the Parquet files through pyarrow, the driver commits
through delta-rs. Each test checks the oracle at every epoch and that the files
are in the bucket and nothing appeared on the local disk.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import crash_driver as cd
import pytest
from helpers import assert_rows_equal, check_mv, subprocess_env
from test_oracle import Scenario
from workload import Workload, create_table_sql

MV_MAIN = "SELECT id, g, v * 2 AS w, s FROM {src} WHERE v % 3 <> 0"
MV_AGG = "SELECT g, count(*) AS c, sum(w) AS sw, max(w) AS mw FROM {src} GROUP BY g"


def _bucket_of(uri: str) -> str:
    return uri.split("://", 1)[1].split("/", 1)[0]


def _files_under(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_every_strategy_on_an_s3_warehouse(spark, s3_server, s3_warehouse, pg_url, tmp_path,
                                           monkeypatch):
    """Tables, DML, an MV per strategy with storage of its own created while DML
    flows (``blocking``'s whole read; ``snapshot``'s chunk files and manifests;
    ``arrangement``'s per-vnode reads; ``no_shuffle`` and ``buffer`` read as these do,
    and every strategy is checked on a local warehouse), an aggregate over an MV,
    VERIFY and time travel: exact at every epoch, all of it in the bucket. (It passes
    on Spark Connect too, SPARKFILL_TEST_CONNECT=1: the server's executors reach the
    bucket through the options the jobs carry; not in CI's subset, for time.)"""
    from sparkfill import Engine

    monkeypatch.chdir(tmp_path)
    before = _files_under(tmp_path)
    rng = random.Random("s3-every-strategy")
    with Engine(s3_warehouse, spark=spark, meta=pg_url) as eng:
        assert eng.path == s3_warehouse
        eng.sql(create_table_sql("t"))
        wl = Workload(eng, spark, "t", rng, key_space=800)
        sc = Scenario(eng, spark, "t", wl)
        wl.initial_load(300)
        sc.step()
        for strategy in ("blocking", "snapshot", "arrangement"):
            sc.create_mv(f"m_{strategy}", MV_MAIN, "t", strategy, 100)
        n = 0
        while n < 3 or not sc.all_created():
            n += 1
            assert n <= 30, f"not created after {n} epochs"
            wl.random_epoch_dml()
            sc.step()
        sc.create_mv("agg", MV_AGG, "m_blocking", "snapshot", 100)
        for _ in range(3):
            wl.random_epoch_dml()
            sc.step()
        assert sc.all_created()
        for mv in sc.mvs:
            assert mv.checked_epochs, mv.name
            check_mv(eng, spark, mv.name, mv.template, mv.upstream, eng.committed_epoch)
        assert eng.sql("VERIFY MATERIALIZED VIEW agg").count() == 0
        assert sc.recheck_time_travel() >= 1
    keys = s3_server.keys(_bucket_of(s3_warehouse))
    assert any("/relations/" in k and "/_delta_log/" in k for k in keys), keys[:20]
    assert any(k.endswith(".parquet") and "/log/" in k for k in keys), keys[:20]
    assert _files_under(tmp_path) == before, "files appeared on the local disk"


@pytest.mark.extended
def test_sigkill_on_an_s3_warehouse_loses_nothing(spark, s3_server, s3_warehouse, pg_url,
                                                  tmp_path, monkeypatch):
    """The crash workload's writer SIGKILLed mid-backfill, reopened: the table equals
    the journal's replay and the MV the batch query, at every epoch of the last run."""
    from sparkfill import Engine

    seed = 7
    journal = str(tmp_path / "journal.jsonl")
    env = {**subprocess_env("local[1]"), cd.META_ENV: pg_url}
    kills = 0
    for delay in (6.0, 4.0):
        proc = subprocess.Popen([sys.executable, cd.__file__, s3_warehouse, journal, str(seed)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                start_new_session=True, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
    assert kills >= 1
    monkeypatch.chdir(tmp_path)
    before = _files_under(tmp_path)
    with Engine(s3_warehouse, spark=spark, meta=pg_url) as eng:
        final_steps = cd.run_workload(eng, journal, seed)
        assert eng.progress(cd.MV).state == "created"
        entries = cd.read_journal(journal)
        final_state, after_step = cd.model_states(entries)
        assert_rows_equal(eng.read(cd.TABLE), final_state.values(), label="table vs journal")
        by_epoch = {e["epoch"]: n for n, e in enumerate(entries) if e["op"] == "step"}
        for st in final_steps:
            e = st["epoch"]
            assert_rows_equal(eng.read(cd.TABLE, as_of=e), after_step[by_epoch[e]].values(),
                              label=f"table at epoch {e}")
            if st["state"] == "created":
                check_mv(eng, spark, cd.MV, cd.MV_TEMPLATE, cd.TABLE, e)
        assert eng.sql(f"VERIFY MATERIALIZED VIEW {cd.MV}").count() == 0
    assert _files_under(tmp_path) == before, "files appeared on the local disk"


def test_an_object_store_warehouse_needs_its_meta_store_and_a_bucket(spark, s3_server, pg_url,
                                                                     tmp_path, monkeypatch):
    from sparkfill import Engine, InvalidOption, SparkfillError

    monkeypatch.chdir(tmp_path)
    bucket = s3_server.new_bucket()
    with pytest.raises(InvalidOption, match="PostgreSQL"):
        Engine(f"s3://{bucket}/wh", spark=spark)
    with pytest.raises(SparkfillError):
        Engine(f"s3://no-such-bucket-{bucket}/wh", spark=spark, meta=pg_url)
    assert s3_server.keys(bucket) == []
    assert list(tmp_path.iterdir()) == []


def test_other_locations_take_the_warehouses_options_only_on_the_same_kind_of_store(tmp_path):
    """A sink's table or a source's folder on the warehouse's kind of object store is
    opened with the warehouse's storage options; any other with the environment's."""
    from sparkfill.storage.warehouse import Warehouse

    options = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_REGION": "us-east-1",
               "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    wh = Warehouse("s3://bucket/wh", options)
    for same in ("s3://bucket/wh/sinks/m", "s3://other/landing", "s3a://other/x"):
        got = wh.options_for(same)
        assert got is not None and got["AWS_ENDPOINT_URL"] == "http://127.0.0.1:1", same
        got["AWS_REGION"] = "changed"  # a copy: the warehouse's own stay as they were
        assert wh.storage_options["AWS_REGION"] == "us-east-1"
    for other in ("gs://bucket/x", str(tmp_path / "local"), f"file://{tmp_path}"):
        assert wh.options_for(other) is None, other
    local = Warehouse(tmp_path / "wh")
    assert local.options_for("s3://bucket/x") is None
