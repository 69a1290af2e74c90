"""Staged DML and a source's staging and scratch on an object-store warehouse (the
loopback S3 server): every file goes through the ``Warehouse``, none to local disk."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from sparkfill.errors import InvalidOption, SourceError
from sparkfill.sources.base import BatchContext, TableShape
from sparkfill.sources.cdc_files import CdcFilesConnector
from sparkfill.sources.delta_cdf import DeltaCdfConnector
from sparkfill.sources.manager import SourceManager
from sparkfill.storage.catalog import Relation
from sparkfill.storage.dml import DELETE, UPSERT, DmlStager, _stage_struct, table_delta
from sparkfill.storage.meta_store import MetaStore
from sparkfill.storage.relation_store import RelationStore
from sparkfill.storage.schema import Column
from sparkfill.storage.spark_files import read_parquet
from sparkfill.storage.warehouse import Warehouse

COLUMNS = (Column("id", "bigint", False), Column("v", "string"))


def _rel() -> Relation:
    return Relation(id=1, name="t", kind="table", columns=COLUMNS, key=("id",),
                    state="created", created_epoch=0, dir="t-1")


def _bucket_and_prefix(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.split("://", 1)[1].partition("/")
    return bucket, prefix


def test_dml_is_staged_read_and_removed_on_s3(spark, s3_server, s3_warehouse, tmp_path):
    wh = Warehouse(s3_warehouse)
    assert not wh.is_local
    meta = MetaStore(tmp_path / "meta.sqlite")
    try:
        stager = DmlStager(spark, meta, wh)
        rel = _rel()
        assert stager.stage(rel, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], UPSERT) == 2
        df = spark.createDataFrame([(2, "B"), (3, "c")], "id bigint, v string")
        assert stager.stage(rel, df, UPSERT) == 2
        assert stager.stage(rel, [{"id": 1}], DELETE) == 1
        assert stager.stage(rel, spark.createDataFrame([], "id bigint, v string"), UPSERT) == 0

        batches = meta.staged()
        assert [b.rows for b in batches] == [2, 2, 1]
        dml_dir = wh.join("staging", "dml")
        assert all(b.path.startswith(dml_dir + "/") for b in batches)

        bucket, prefix = _bucket_and_prefix(dml_dir)
        keys = s3_server.keys(bucket, prefix + "/")
        arrow_files = [b.path for b in batches if b.path.endswith(".parquet")]
        assert len(arrow_files) == 2
        for path in arrow_files:
            assert _bucket_and_prefix(path)[1] in keys
        spark_dir = _bucket_and_prefix(batches[1].path)[1]
        parts = [k for k in keys if k.startswith(spark_dir + "/part-")]
        assert parts and all(k.endswith(".parquet") for k in parts)

        # the driver-staged file reads back as staged
        first = read_parquet(spark, wh, _stage_struct(rel), [batches[0].path]).collect()
        assert sorted((r["id"], r["v"], r["_sf_kind"]) for r in first) == [
            (1, "a", "U"), (2, "b", "U")]

        # the epoch's Δ of the three batches (no earlier rows): the last change wins
        store = RelationStore(spark, wh, meta)
        delta = table_delta(spark, store, rel, batches, 0).delta.collect()
        assert sorted((r["id"], r["v"], r["_op"]) for r in delta) == [
            (2, "B", "+"), (3, "c", "+")]

        # a file no batch names is an orphan; applied batches go away
        stray = wh.join("staging", "dml", ".stray.tmp")
        wh.write_text(stray, "partial")
        stager.remove_orphans()
        assert not wh.exists(stray)
        assert all(wh.exists(b.path) for b in batches)
        stager.remove_applied([b.path for b in batches])
        assert [k for k in s3_server.keys(bucket, prefix + "/")
                if not k.endswith("/")] == []
    finally:
        meta.close()


def test_sources_stage_and_scratch_on_s3(spark, s3_server, s3_warehouse, tmp_path):
    wh = Warehouse(s3_warehouse)
    meta = MetaStore(tmp_path / "meta.sqlite")
    try:
        sources = SourceManager(spark, meta, wh)
        assert sources.scratch == wh.join("staging", "sources")

        # a batch staged by the manager is written through the warehouse
        df = spark.createDataFrame([(1, "a", 0, "U"), (2, "b", 1, "U")],
                                   "id bigint, v string, _sf_idx long, _sf_kind string")
        path, rows = sources._write(df, COLUMNS, 7)
        assert rows == 2 and path.startswith(wh.join("staging", "dml") + "/")
        bucket, prefix = _bucket_and_prefix(path)
        assert any(k.startswith(prefix + "/part-") for k in s3_server.keys(bucket, prefix))

        # delta_cdf streams its snapshot into the batch's scratch on the object store
        ext = str(tmp_path / "ext")
        write_deltalake(ext, pa.table({"id": [1, 2], "v": ["a", "b"]}),
                        configuration={"delta.enableChangeDataFeed": "true"})
        shape = TableShape("d", COLUMNS, ("id",))
        opts = DeltaCdfConnector.validate(shape, {"path": ext}, wh)
        scratch = f"{sources.scratch}/1-test"
        batch = DeltaCdfConnector(spark, shape, opts).read(
            BatchContext(1, 1, None, scratch=scratch, warehouse=wh))
        assert batch.rows is not None
        assert sorted((r["id"], r["v"]) for r in batch.rows.collect()) == [(1, "a"), (2, "b")]
        _, scratch_prefix = _bucket_and_prefix(scratch)
        assert any(k.endswith(".parquet") for k in s3_server.keys(bucket, scratch_prefix + "/"))

        # a relative external path means nothing under an object-store warehouse
        with pytest.raises(InvalidOption, match="relative"):
            sources.define("c", COLUMNS, ("id",), {"connector": "cdc_files", "path": "landing"})
        # an object-store folder nothing has landed in yet is accepted; a missing bucket not
        with pytest.raises(SourceError, match="does not exist"):
            sources.define("c", COLUMNS, ("id",),
                           {"connector": "cdc_files", "path": "s3://no-such-bucket/landing"})
        # an absolute local folder is still read
        (tmp_path / "landing").mkdir()
        defined = sources.define("c", COLUMNS, ("id",),
                                 {"connector": "cdc_files", "path": str(tmp_path / "landing")})
        assert defined.options["path"] == str(tmp_path / "landing")
    finally:
        meta.close()


def test_cdc_files_lands_in_a_bucket_and_is_read_by_the_executors(spark, s3_server,
                                                                   s3_warehouse, tmp_path):
    """A cdc_files folder on the object store: listed by the driver in arrival order,
    read by Spark's executors through pyarrow, malformed lines to the dead letters."""
    wh = Warehouse(s3_warehouse)
    meta = MetaStore(tmp_path / "meta.sqlite")
    try:
        sources = SourceManager(spark, meta, wh)
        shape = TableShape("c", COLUMNS, ("id",))
        opts = CdcFilesConnector.validate(shape, {"path": "{warehouse}/landing"}, wh)
        assert opts["path"] == wh.join("landing")
        bucket, prefix = _bucket_and_prefix(wh.join("landing"))
        client = s3_server.client()
        client.put_object(Bucket=bucket, Key=f"{prefix}/a.json", Body=(
            b'{"op": "c", "after": {"id": 1, "v": "x"}}\n'
            b'{"op": "c", "after": {"id": 2, "v": "y"}}\n'))
        client.put_object(Bucket=bucket, Key=f"{prefix}/_incomplete.json", Body=b"{")
        client.put_object(Bucket=bucket, Key=f"{prefix}/b+c.json", Body=(
            b'{"payload": {"op": "u", "before": {"id": 1}, "after": {"id": 1, "v": "z"}}}\n'
            b'not json\n\n{"op": "d", "before": {"id": 2}}\n'))
        connector = CdcFilesConnector(spark, shape, opts)
        batch = connector.read(BatchContext(1, 1, None, frozenset(), f"{sources.scratch}/x", wh))
        assert batch.files == ["a.json", "b+c.json"]
        assert batch.rows is not None and batch.dead_letters is not None
        changes = sorted(((r["id"], r["v"], r["_sf_kind"]) for r in batch.rows.collect()),
                         key=repr)
        assert changes == sorted([(1, "x", UPSERT), (1, "z", UPSERT), (2, None, DELETE),
                                  (2, "y", UPSERT)], key=repr)
        dead = [(r["file"], r["line"], r["raw"]) for r in batch.dead_letters.collect()]
        assert dead == [("b+c.json", 2, "not json")]
        # consumed files are not listed again
        again = connector.read(BatchContext(2, 2, batch.position, frozenset(batch.files),
                                            f"{sources.scratch}/y", wh))
        assert again.rows is None
        for df in batch.cached:
            df.unpersist()
    finally:
        meta.close()
