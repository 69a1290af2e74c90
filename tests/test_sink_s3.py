"""Delta sinks on an object store: ``CREATE SINK ... WITH (path = 's3://bucket/...')``.

Against an S3-compatible server on loopback (moto, ``s3_server``), beside a LOCAL
warehouse. Oracle: ``Engine.read(mv)``. After every epoch the sink's Delta table,
read from the bucket by delta-rs, equals the MV and records that epoch; its data
files are in the bucket (nothing of it on the local disk), and after a vacuum the
bucket holds no data file the table does not reference.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from helpers import assert_rows_equal

from sparkfill import SinkError
from sparkfill.sinks import APP_PREFIX, SinkManager, synced_epoch
from sparkfill.storage.warehouse import Warehouse


def _rows(uri: str, columns: list[str]) -> list[tuple]:
    return [tuple(r[c] for c in columns) for r in DeltaTable(uri).to_pyarrow_table().to_pylist()]


def test_a_sink_on_s3_beside_a_local_warehouse(engine, s3_server, tmp_path):
    eng = engine
    bucket = s3_server.new_bucket()
    uri = f"s3://{bucket}/sink"
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", [{"id": i, "g": i % 5, "v": i * 3} for i in range(120)])
    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS "
            "SELECT id, g, v * 2 AS w FROM t WHERE v % 4 <> 1")
    eng.step()
    eng.sql(f"CREATE SINK s FROM m WITH (connector = 'delta', path = '{uri}', buckets = 4, "
            "vacuum_retention_hours = 0)")
    sink = eng.sinks.find("s")
    assert sink is not None and sink.path == uri
    app = f"{APP_PREFIX}{sink.id}"
    cols = ["id", "g", "w"]
    assert DeltaTable(uri).transaction_version(app) == eng.committed_epoch
    assert_rows_equal(eng.read("m"), _rows(uri, cols), label="initial sink")

    k = 0
    while eng.committed_epoch < 10:  # epoch 10's sync vacuums
        k += 1
        if k == 2:
            pass  # no change: the sync commits the epoch and writes nothing
        elif k % 3 == 0:  # touches one key: the sync rewrites one bucket
            eng.insert("t", [{"id": 7, "g": 0, "v": 1000 + k}])
        else:
            eng.insert("t", [{"id": i, "g": (i + k) % 7, "v": i + k} for i in range(k, k + 30)])
            eng.delete("t", [{"id": i} for i in range(100 + k, 104 + k)])
        rep = eng.step()
        assert DeltaTable(uri).transaction_version(app) == rep.epoch
        assert synced_epoch(uri, sink.id) == rep.epoch
        assert_rows_equal(eng.read("m"), _rows(uri, cols), label=f"sink at epoch {rep.epoch}")

    dt = DeltaTable(uri)
    live = {f.split("://", 1)[1].split("/", 1)[1] for f in dt.file_uris()}
    keys = s3_server.keys(bucket)
    assert live and live <= set(keys)
    assert all(f.startswith("sink/e") and "/sf_bucket=" in f for f in live)
    assert any(key.startswith("sink/_delta_log/") for key in keys)
    # vacuumed with a zero retention: no data file the table stopped referencing
    assert {key for key in keys if key.endswith(".parquet")} == live
    # ... and no folder it emptied (nor the folder markers of one) is left
    folders = {f.rsplit("/", 1)[0] for f in live}
    folders |= {f.rsplit("/", 1)[0] for f in folders}
    left = [key for key in keys if key not in live and not key.startswith("sink/_delta_log/")
            and key.rstrip("/") not in folders | {"sink"}]
    assert left == [], left
    assert all(p.is_relative_to(tmp_path / "warehouse") for p in tmp_path.rglob("*"))

    # a non-empty prefix is refused, and nothing is written there
    s3_server.client().put_object(Bucket=bucket, Key="busy/file.txt", Body=b"mine")
    with pytest.raises(SinkError, match="not empty"):
        eng.sql(f"CREATE SINK s2 FROM m WITH (connector = 'delta', path = 's3://{bucket}/busy')")
    assert s3_server.keys(bucket, "busy/") == ["busy/file.txt"]
    with pytest.raises(SinkError, match="scheme"):
        eng.sql("CREATE SINK s2 FROM m WITH (connector = 'delta', path = 'ftp://host/x')")
    assert [r.name for r in eng.sql("SHOW SINKS").collect()] == ["s"]
    assert eng.sql("SHOW SINKS").collect()[0].epoch == eng.committed_epoch


def test_sink_paths_beside_an_object_store_warehouse(s3_server, tmp_path):
    bucket = s3_server.new_bucket()
    wh = Warehouse(f"s3://{bucket}/wh")
    sinks = SinkManager(None, None, None, wh)  # type: ignore[arg-type]
    assert sinks._location("sinks/m") == f"s3://{bucket}/wh/sinks/m"
    assert sinks._location("{warehouse}/sinks/m") == f"s3://{bucket}/wh/sinks/m"
    assert sinks._location(f"s3://{bucket}/other") == f"s3://{bucket}/other"
    assert sinks._location(str(tmp_path / "local")) == str((tmp_path / "local").resolve())
    assert sinks._location(f"file://{tmp_path}/x") == str((tmp_path / "x").resolve())


def test_a_relative_sink_path_on_an_s3_warehouse(spark, s3_server, s3_warehouse, pg_url):
    """Beside an S3 warehouse a relative sink path lands under the warehouse's URI."""
    from sparkfill import Engine

    with Engine(s3_warehouse, spark=spark, meta=pg_url) as eng:
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        eng.insert("t", [{"id": i, "g": i % 5, "v": i * 3} for i in range(100)])
        eng.step()
        eng.sql("CREATE MATERIALIZED VIEW m AS SELECT g, count(*) AS c, sum(v) AS sv "
                "FROM t GROUP BY g")
        eng.step()
        eng.sql("CREATE SINK ms FROM m WITH (connector = 'delta', path = 'sinks/m')")
        uri = f"{s3_warehouse}/sinks/m"
        assert eng.sinks.find("ms").path == uri
        for k in range(3):
            eng.insert("t", [{"id": i, "g": (i + k) % 7, "v": i}
                             for i in range(k * 30, k * 30 + 50)])
            eng.delete("t", [{"id": i} for i in range(90, 92 + k)])
            eng.step()
            got = DeltaTable(uri).to_pyarrow_table().to_pylist()
            assert_rows_equal(eng.read("m"), [(r["g"], r["c"], r["sv"]) for r in got],
                              label=f"sink at epoch {eng.committed_epoch}")
            assert synced_epoch(uri, eng.sinks.find("ms").id) == eng.committed_epoch
