"""A snapshot-backfill job's checkpoints on an object store (``s3://``, the loopback
server ``s3_server``): the plan, each chunk's attempt and marker, the manifest and the
job directory's removal, through the job's own helpers (not an Engine).

Only the attempt a chunk's marker names is read; the files of an attempt no marker
names (a killed client's write that went on) and files beside the marker are not."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
from pyspark.sql import types as T

from sparkfill.backfill.snapshot import chunk_files, job_status, read_plan, write_chunk
from sparkfill.backfill.snapshot_jobs import SnapshotJobs
from sparkfill.storage.spark_files import read_parquet
from sparkfill.storage.warehouse import Warehouse

PLAN = [{"leaf": 0, "lo": 0, "hi": 127, "estimate": 10},
        {"leaf": 0, "lo": 128, "hi": 255, "estimate": 10},
        {"leaf": 1, "lo": 0, "hi": 255, "estimate": 2}]


def test_snapshot_job_checkpoints_on_s3(spark, s3_server, s3_warehouse):
    wh = Warehouse(s3_warehouse)
    assert not wh.is_local
    jobs = SnapshotJobs(spark, None, SimpleNamespace(root=wh.join("relations"), warehouse=wh),
                        None, None)  # type: ignore[arg-type]
    mv = SimpleNamespace(id=7)
    job_dir = jobs.job_dir(mv)  # type: ignore[arg-type]
    assert job_dir == f"{s3_warehouse}/relations/_jobs/000007"
    assert not jobs.has_started(mv)  # type: ignore[arg-type]
    assert job_status(wh, job_dir) == {"rows": {}, "chunks_done": 0, "chunks": 0,
                                       "manifest": None}

    wh.write_text(f"{job_dir}/plan.json", json.dumps(PLAN))
    assert jobs.has_started(mv)  # type: ignore[arg-type]
    assert read_plan(wh, job_dir) == PLAN

    # chunk 0 done: an attempt (3 files, one per partition) and its marker
    # in the relation's schema, every column nullable (as the job reads its chunks back)
    schema = T.StructType([T.StructField("id", T.LongType(), True),
                           T.StructField("v", T.LongType(), True)])
    df = spark.createDataFrame([(i, 2 * i) for i in range(10)], schema).repartition(3)
    assert write_chunk(wh, job_dir, PLAN[0], df, lambda: 10) == 10
    chunk0 = f"{job_dir}/leaf0/v000-127"
    marker = json.loads(wh.read_text(f"{chunk0}/_DONE.json") or "null")
    assert marker["rows"] == 10 and len(marker["files"]) == 3
    # strays: an attempt no marker names, files beside the marker, an undone chunk's
    stray = pa.table({"id": pa.array([100], pa.int64()), "v": pa.array([0], pa.int64())})
    for where in (f"{chunk0}/a-zombie", chunk0, f"{job_dir}/leaf0/v128-255/a-zombie"):
        wh.write_parquet(stray, f"{where}/part-zombie.parquet")
    # chunk 2 (leaf 1) done under an earlier layout: a marker naming no attempt
    wh.write_parquet(pa.table({"id": pa.array([5, 6], pa.int64()),
                               "v": pa.array([1, 1], pa.int64())}),
                     f"{job_dir}/leaf1/v000-255/part-0.parquet")
    wh.write_text(f"{job_dir}/leaf1/v000-255/_DONE.json", json.dumps({"rows": 2}))

    status = job_status(wh, job_dir)
    assert status == {"rows": {0: 10, 1: 2}, "chunks_done": 2, "chunks": 3, "manifest": None}
    files0 = chunk_files(wh, job_dir, PLAN, 0)
    assert len(files0) == 3
    assert all(f.startswith(f"{chunk0}/{marker['attempt']}/") for f in files0)
    assert all(wh.is_file(f) for f in files0)
    assert chunk_files(wh, job_dir, PLAN, 1) == [f"{job_dir}/leaf1/v000-255/part-0.parquet"]
    rows0 = read_parquet(spark, wh, schema, files0).collect()
    assert sorted((r.id, r.v) for r in rows0) == [(i, 2 * i) for i in range(10)]
    rows1 = read_parquet(spark, wh, schema, chunk_files(wh, job_dir, PLAN, 1)).collect()
    assert sorted(r.id for r in rows1) == [5, 6]

    manifest = {"12": {"rows": 10, "files": []}}
    wh.write_text(f"{job_dir}/manifest.json", json.dumps(manifest))
    assert job_status(wh, job_dir)["manifest"] == manifest

    # the job's files are removed with it; nothing else in the bucket is touched
    wh.write_text(wh.join("keep.txt"), "x")
    jobs.stop(7, job_dir)
    assert not wh.exists(job_dir) and not jobs.has_started(mv)  # type: ignore[arg-type]
    bucket, prefix = s3_warehouse.split("://", 1)[1].split("/", 1)
    keys = s3_server.keys(bucket, prefix)
    assert f"{prefix}/keep.txt" in keys
    assert not [k for k in keys if k.startswith(f"{prefix}/relations/_jobs/000007")], keys
