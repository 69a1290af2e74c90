"""Benchmark of online backfill strategies (a script, not a test).

One run, one machine, one data set: an upstream table of N rows under a steady
DML load; an MV created with each strategy in turn on the same table. Reported
per strategy, as ratios taken within this run:

- upstream epoch seconds p50 / p99 during the backfill ÷ the same just before it;
- time to ready ÷ a plain Spark batch query of the MV's SQL on the same snapshot
  (written to Parquet, as the backfill writes its result);
- peak memory: driver (Python) RSS, JVM RSS, and what the strategy itself holds
  (the buffer baseline's buffered upstream changes);
- rows read per epoch by the backfill scan (rows in the files its reads select)
  against the chunk size.

Usage: python bench/backfill_bench.py [--rows 1000000] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql import functions as F

from sparkfill import Engine
from sparkfill.session import build_spark_session

MV_SQL = "SELECT id, g, v * 2 AS w, s FROM t WHERE v % 3 <> 0"


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


class Memory:
    """Peak RSS of this process and of the JVM it started."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.peak_driver = 0
        self.peak_jvm = 0

    def jvm(self) -> int:
        return sum(c.memory_info().rss for c in self.me.children(recursive=True)
                   if "java" in c.name())

    def sample(self) -> tuple[int, int]:
        driver, jvm = self.me.memory_info().rss, self.jvm()
        self.peak_driver = max(self.peak_driver, driver)
        self.peak_jvm = max(self.peak_jvm, jvm)
        return driver, jvm

    def reset(self) -> None:
        self.peak_driver = self.peak_jvm = 0


def dml(eng: Engine, rng: random.Random, rows: int, id_space: int) -> None:
    eng.insert("t", [{"id": rng.randrange(id_space), "g": rng.randrange(100),
                      "v": rng.randrange(1000), "s": "u"} for _ in range(rows)])
    eng.delete("t", [{"id": rng.randrange(id_space)} for _ in range(rows // 4)])


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory)
    warehouse = Path(tempfile.mkdtemp(prefix="sparkfill-bench-"))
    rng = random.Random(args.seed)
    mem = Memory()
    results: dict[str, Any] = {"strategies": {}}
    try:
        eng = Engine(warehouse, spark=spark)
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, s STRING, PRIMARY KEY (id))")
        id_space = int(args.rows * 1.2)
        eng.insert("t", spark.range(args.rows).select(
            "id", (F.col("id") % 100).cast("int").alias("g"),
            (F.col("id") * 7919 % 1000).alias("v"), F.lit("initial").alias("s")))
        t0 = time.time()
        eng.step()
        results["load_seconds"] = time.time() - t0
        for spec in args.strategies:
            head, _, chunk = spec.partition("@")
            strategy, _, par = head.partition(":")
            extra = f", backfill_parallelism = {par}" if par else ""
            chunk_rows = int(chunk) if chunk else args.chunk_rows
            before = []
            for _ in range(args.baseline_epochs):
                dml(eng, rng, args.dml_rows, id_space)
                before.append(eng.step().seconds)
            mem.reset()
            mem.sample()
            start_driver, start_jvm = mem.sample()
            name = f"mv_{strategy}_{par or 'd'}_{chunk_rows}"
            created = time.time()
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = '{strategy}', "
                    f"backfill_chunk_rows = {chunk_rows}{extra}) AS {MV_SQL}")
            during: list[float] = []
            reads: list[int] = []
            chunks: list[int] = []
            held: list[int] = []
            while True:
                dml(eng, rng, args.dml_rows, id_space)
                report = eng.step()
                during.append(report.seconds)
                reads.append(report.rows_read.get(name, 0))
                chunks.append(report.backfill_rows.get(name, 0))
                held.append(eng.coordinator.scan.buffered_bytes())
                mem.sample()
                if eng.progress(name).state == "created":
                    break
            ready = time.time() - created
            epoch = eng.committed_epoch
            # the plain batch query of the MV's SQL on the same snapshot
            out = Path(tempfile.mkdtemp(prefix="batch-", dir=warehouse))
            eng.read("t", as_of=epoch).createOrReplaceTempView("t_batch")
            runs = []  # median of three: one sub-second run is too noisy a denominator
            for _ in range(3):
                t0 = time.time()
                spark.sql(MV_SQL.replace("FROM t", "FROM t_batch")).write.mode("overwrite") \
                    .parquet(str(out / "q"))
                runs.append(time.time() - t0)
            batch_seconds = statistics.median(runs)
            batch = spark.read.parquet(str(out / "q"))
            mv = eng.read(name, as_of=epoch)
            exact = batch.exceptAll(mv).count() == 0 and mv.exceptAll(batch).count() == 0
            shutil.rmtree(out, ignore_errors=True)
            results["strategies"][spec] = {
                "epochs": len(during),
                "epoch_p50_before": statistics.median(before),
                "epoch_p99_before": p(before, 0.99),
                "epoch_p50_during": statistics.median(during),
                "epoch_p99_during": p(during, 0.99),
                "ready_seconds": ready,
                "batch_seconds": batch_seconds,
                "peak_driver_rss_mb": mem.peak_driver / 2**20,
                "driver_rss_growth_mb": (mem.peak_driver - start_driver) / 2**20,
                "peak_jvm_rss_mb": mem.peak_jvm / 2**20,
                "jvm_rss_growth_mb": (mem.peak_jvm - start_jvm) / 2**20,
                "peak_held_mb": max(held) / 2**20 if held else 0.0,
                "held_by_epoch_mb": [round(h / 2**20, 2) for h in held],
                "rows_read_median": statistics.median(reads),
                "rows_read_max": max(reads),
                "chunk_rows_median": statistics.median(chunks),
                "exact": exact,
            }
            print(json.dumps({spec: results["strategies"][spec]}, indent=1))
            eng.sql(f"DROP MATERIALIZED VIEW {name}")
        eng.close()
    finally:
        shutil.rmtree(warehouse, ignore_errors=True)
        spark.stop()
    return results


def markdown(args: argparse.Namespace, results: dict[str, Any]) -> str:
    mem = psutil.virtual_memory().total / 2**30
    lines = [
        f"## Backfill strategies — {dt.date.today().isoformat()}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"Spark master `{args.master}`. Noisy shared machine: read ratios, not seconds.",
        "",
        f"Upstream: {args.rows:,} rows (loaded in {results['load_seconds']:.1f}s); DML per "
        f"epoch: {args.dml_rows} upserts + {args.dml_rows // 4} deletes; chunk "
        f"{args.chunk_rows:,} rows; MV `{MV_SQL}`; {args.baseline_epochs} baseline epochs "
        "before each MV.",
        "",
        "| strategy | epochs | epoch p50 during ÷ before | epoch p99 during ÷ before "
        "| ready ÷ batch query | ready (s) | batch (s) | driver RSS peak (growth) MB "
        "| JVM RSS peak (growth) MB | held by strategy MB | backfill rows read / epoch "
        "(median, max) | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["strategies"].items():
        lines.append(
            f"| {name} | {r['epochs']} "
            f"| {r['epoch_p50_during'] / r['epoch_p50_before']:.2f} "
            f"({r['epoch_p50_during']:.2f}s / {r['epoch_p50_before']:.2f}s) "
            f"| {r['epoch_p99_during'] / r['epoch_p99_before']:.2f} "
            f"| {r['ready_seconds'] / r['batch_seconds']:.1f} "
            f"| {r['ready_seconds']:.1f} | {r['batch_seconds']:.1f} "
            f"| {r['peak_driver_rss_mb']:.0f} ({r['driver_rss_growth_mb']:+.0f}) "
            f"| {r['peak_jvm_rss_mb']:.0f} ({r['jvm_rss_growth_mb']:+.0f}) "
            f"| {r['peak_held_mb']:.1f} "
            f"| {r['rows_read_median']:,.0f}, {r['rows_read_max']:,.0f} "
            f"| {'yes' if r['exact'] else 'NO'} |")
    buffer = results["strategies"].get("buffer")
    if buffer:
        lines += ["", "Buffer baseline, upstream changes held in driver memory after each "
                  f"epoch (MB): {buffer['held_by_epoch_mb']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dml-rows", type=int, default=2_000)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--baseline-epochs", type=int, default=5)
    parser.add_argument("--strategies", nargs="+",
                        default=["arrangement:1", "arrangement:2", "no_shuffle", "blocking",
                                 "buffer"],
                        help="strategy[:backfill_parallelism][@chunk_rows] ...")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default=None, help="append the results to this markdown file")
    args = parser.parse_args()
    results = run(args)
    text = markdown(args, results)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
