"""A probe for issue 33's goal 2 (a keyed lookup that reads what the keys need, not the
table): C random keys looked up in a table of N rows laid out as the engine lays out a
table (files by vnode, 256 vnodes, each sorted by ``_vk`` = vnode * 2^40 + key), four
ways in one process, alternating:

- ``spark``: Spark's Parquet scan of every file with ``id IN (keys)`` (as the engine's
  table lookup reads today: 1,000 random keys touch every vnode, so every file);
- ``row groups``: each file's rows sorted by key in row groups of R rows; a Spark job of
  ``mapInArrow`` tasks, one work row per file (its path and the keys of its vnodes, from
  the driver), each task reading with pyarrow only the row groups whose key range holds
  one of its keys (the footer's statistics) and keeping the rows of its keys;
- ``spark or``: Spark's scan with the IN pushed to Parquet as an OR of equalities
  (``spark.sql.parquet.pushdown.inFilterThreshold`` raised) instead of one ``in``;
- ``spark vk or``: the same over ``_vk``, whose ranges do not overlap across files: each
  equality keeps the one row group (and, with ``--page-rows``, the pages) that can hold
  it. Integer keys only.

Prints each attempt's seconds and rows read (Spark's input metric for the scan; the
decoded row groups' rows for the other), the medians of the warm attempts and their
ratio. A probe, not the engine: bench/RESULTS.md says what it found.

    python bench/lookup_probe.py [--rows 4000000] [--row-group-rows 1000] [--page-rows 0]
        [--keys 1000] [--repeat 4] [--dir /tmp/lookup_probe]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sparkfill.session import build_spark_session  # noqa: E402


def groups_holding(md: pq.FileMetaData, keys: list[int]) -> list[int]:
    """The row groups of a file whose ``id`` range holds one of the sorted ``keys``."""
    idx = md.schema.names.index("id")
    out = []
    for i in range(md.num_row_groups):
        st = md.row_group(i).column(idx).statistics
        j = bisect.bisect_left(keys, st.min)
        if j < len(keys) and keys[j] <= st.max:
            out.append(i)
    return out


def read_keys(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow: for each (path, keys) work row, the rows of those keys in that file."""
    for b in batches:
        for path, keys in zip(b.column("path").to_pylist(), b.column("keys").to_pylist(),
                              strict=True):
            keys = sorted(keys)
            pf = pq.ParquetFile(path)  # sorted by _vk: by id within the file's one vnode
            groups = groups_holding(pf.metadata, keys)
            if groups:
                t = pf.read_row_groups(groups)
                t = t.filter(pc.is_in(t.column("id"), value_set=pa.array(keys, pa.int64())))
                yield from t.to_batches()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--row-group-rows", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/lookup_probe")
    ap.add_argument("--page-rows", type=int, default=0,
                    help="rows per Parquet page (0: Parquet's default)")
    args = ap.parse_args()
    spark = build_spark_session(master="local[2]", shuffle_partitions=4,
                                extra_conf={"spark.ui.enabled": "true"})
    n = args.rows
    base = os.path.join(args.dir, f"t_{n}_{args.row_group_rows}_{args.page_rows}_vk")
    if not os.path.exists(base):
        df = (spark.range(n).withColumn("g", F.col("id") % 1000)
              .withColumn("k", (F.col("id") * 7) % 10000)
              .withColumn("v", (F.col("id") * 13) % 1000)
              .withColumn("s", F.concat(F.lit("s"), (F.col("id") % 97).cast("string")))
              .withColumn("_vnode", F.pmod(F.hash("id"), F.lit(256)))
              .withColumn("_vk", F.col("_vnode") * F.lit(1 << 40) + F.col("id")))
        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
        t0 = time.time()
        writer = (df.repartition(256, "_vnode").sortWithinPartitions("_vk").write
                  .mode("overwrite")
                  .option("parquet.block.row.count.limit", str(args.row_group_rows)))
        if args.page_rows:
            writer = writer.option("parquet.page.row.count.limit", str(args.page_rows))
        writer.parquet(base)
        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "true")
        print(f"wrote {n:,} rows in {time.time() - t0:.1f} s", flush=True)
    # the catalog's knowledge: which files hold which vnodes
    by_vnode: dict[int, list[str]] = {}
    for f, v in (spark.read.parquet(base).select(F.input_file_name(), "_vnode")
                 .distinct().collect()):
        by_vnode.setdefault(v, []).append(f.replace("file://", ""))
    schema = spark.read.parquet(base).schema

    def input_rows() -> int:
        sc = spark.sparkContext  # a bench script on a classic session
        url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages?status=complete"
        return sum(s["inputRecords"] for s in json.load(urllib.request.urlopen(url)))

    rng = random.Random(2)
    seconds: dict[str, list[float]] = {"spark": [], "row groups": [], "spark or": [],
                                       "spark vk or": [], "spark pair or": []}
    for attempt in range(args.repeat):
        keys = rng.sample(range(n), args.keys)
        vnodes = spark.createDataFrame([(k,) for k in keys], "id long").select(
            "id", F.pmod(F.hash("id"), F.lit(256))).collect()
        per_file: dict[str, list[int]] = {}
        for k, v in vnodes:
            for f in by_vnode.get(v, []):
                per_file.setdefault(f, []).append(k)
        decoded = 0
        for f, ks in per_file.items():
            md = pq.ParquetFile(f).metadata  # each footer read once
            decoded += sum(md.row_group(i).num_rows for i in groups_holding(md, sorted(ks)))
        for mode in seconds:
            r0 = input_rows()
            t0 = time.time()
            if mode in ("spark", "spark or"):
                # "spark or": the IN pushed to Parquet as an OR of equalities (each
                # prunes row groups and pages by itself), not as one ``in``
                spark.conf.set("spark.sql.parquet.pushdown.inFilterThreshold",
                               "100000" if mode == "spark or" else "10")
                got = spark.read.parquet(base).where(F.col("id").isin(keys)).collect()
                read = input_rows() - r0
            elif mode == "spark vk or":
                # the key placed after its vnode (files sorted by it): each equality
                # keeps the one row group (page) of its vnode's file that can hold it
                spark.conf.set("spark.sql.parquet.pushdown.inFilterThreshold", "100000")
                vks = [v * (1 << 40) + k for k, v in vnodes]
                got = spark.read.parquet(base).where(F.col("_vk").isin(vks)).collect()
                read = input_rows() - r0
            else:
                work = spark.createDataFrame(list(per_file.items()),
                                             "path string, keys array<long>")
                got = work.repartition(2).mapInArrow(read_keys, schema).collect()
                read = decoded
            dt = time.time() - t0
            assert sorted(r["id"] for r in got) == sorted(keys), mode
            if attempt:
                seconds[mode].append(dt)
            print(f"attempt {attempt} {mode}: {dt:.2f} s, rows read {read:,} "
                  f"({read / n:.1%})", flush=True)
    med = {m: statistics.median(v) for m, v in seconds.items()}
    print("medians of the warm attempts: " + ", ".join(
        f"{m} {v:.2f} s ({v / med['spark']:.2f}x spark)" for m, v in med.items()))


if __name__ == "__main__":
    main()
