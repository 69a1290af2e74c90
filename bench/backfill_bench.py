"""Benchmark of online backfill strategies (a script, not a test).

One run, one machine, one data set: the steady-state benchmark's tables (``t`` of
N rows, ``d`` of 10,000) under a steady load of C changes to ``t`` per epoch; each
of its MVs (``agg``, ``join``, ``proj``) created with each strategy in turn (the
engine's default, no options, and ``snapshot`` unless told otherwise). Reported
per MV and strategy, as ratios taken within this run:

- upstream epoch seconds p50 / p99 during the backfill ÷ the same just before it;
- time to created ÷ a plain Spark batch query of the MV's SQL on the same
  snapshots (a CTAS: read, compute, write Parquet; median of three);
- peak memory: driver (Python) RSS, JVM RSS, and what the strategy itself holds
  (the buffer baseline's buffered upstream changes);
- rows read per epoch by the backfill scan (rows in the files its reads select)
  against the chunk size.

Usage: python bench/backfill_bench.py [--rows 1000000] [--mvs agg join proj]
       [--strategies default snapshot arrangement:2@200000 ...] [--out bench/RESULTS.md]
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
from steady_bench import D_DDL, MVS, T_DDL, Keys, initial_d, initial_t

from sparkfill import Engine
from sparkfill.session import build_spark_session

#: goals of issue 12 by strategy: (created ÷ batch, upstream epoch p99 during ÷ before)
GOALS = {"snapshot": (1.5, 1.5), "default": (3.0, 2.0)}


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


def dml(eng: Engine, keys: Keys, changes: int) -> None:
    """C changes to ``t``: 80% upserts (half new ids, half existing), 20% deletes."""
    upserts, deletes = keys.changes(changes)
    eng.insert("t", upserts)
    eng.delete("t", deletes)


def with_clause(strategy: str, par: str, chunk: str) -> str:
    """The MV's options: none for ``default`` (the engine's defaults, chunk too)."""
    opts = [] if strategy == "default" else [f"backfill = '{strategy}'"]
    if par:
        opts.append(f"backfill_parallelism = {par}")
    if chunk:
        opts.append(f"backfill_chunk_rows = {int(chunk)}")
    return f"WITH ({', '.join(opts)}) " if opts else ""


def batch_seconds(spark: Any, eng: Engine, sql: str, epoch: int, out: Path) -> float:
    """The MV's SQL as a plain batch query over the snapshots of ``epoch``, written to
    Parquet (a CTAS); median of three runs."""
    for table in ("t", "d"):  # temporary views of the snapshots, under their own names
        eng.read(table, as_of=epoch).createOrReplaceTempView(table)
    runs = []
    for _ in range(3):
        t0 = time.time()
        spark.sql(sql).write.mode("overwrite").parquet(str(out))
        runs.append(time.time() - t0)
    return statistics.median(runs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory)
    warehouse = Path(tempfile.mkdtemp(prefix="sparkfill-bench-"))
    keys = Keys(args.rows, random.Random(args.seed))
    mem = Memory()
    results: dict[str, Any] = {"runs": {}}
    try:
        eng = Engine(warehouse, spark=spark)
        eng.sql(T_DDL)
        eng.sql(D_DDL)
        t0 = time.time()
        eng.insert("t", initial_t(spark, args.rows))
        eng.insert("d", initial_d(spark))
        eng.step()
        results["load_seconds"] = time.time() - t0
        for mv_name in args.mvs:
            sql = MVS[mv_name]
            for spec in args.strategies:
                head, _, chunk = spec.partition("@")
                strategy, _, par = head.partition(":")
                before = []
                for _ in range(args.baseline_epochs):
                    dml(eng, keys, args.changes)
                    before.append(eng.step().seconds)
                mem.reset()
                mem.sample()
                start_driver, start_jvm = mem.sample()
                name = f"{mv_name}_{strategy}_{par or 'd'}_{chunk or 'd'}"
                created = time.time()
                eng.sql(f"CREATE MATERIALIZED VIEW {name} {with_clause(strategy, par, chunk)}"
                        f"AS {sql}")
                during: list[float] = []
                reads: list[int] = []
                chunks: list[int] = []
                held: list[int] = []
                while True:
                    dml(eng, keys, args.changes)
                    report = eng.step()
                    during.append(report.seconds)
                    reads.append(report.rows_read.get(name, 0))
                    chunks.append(report.backfill_rows.get(name, 0))
                    held.append(eng.coordinator.scan.buffered_bytes())
                    mem.sample()
                    if eng.progress(name).state == "created":
                        break
                    if len(during) >= args.max_epochs:
                        break
                ready = time.time() - created
                done = eng.progress(name).state == "created"
                epoch = eng.committed_epoch
                out = Path(tempfile.mkdtemp(prefix="batch-", dir=warehouse))
                batch = batch_seconds(spark, eng, sql, epoch, out / "q")
                exact = done and eng.verify(name).count() == 0
                shutil.rmtree(out, ignore_errors=True)
                key = f"{mv_name} {spec}"
                results["runs"][key] = {
                    "mv": mv_name, "strategy": spec, "goal": GOALS.get(strategy),
                    "created": done,
                    "epochs": len(during),
                    "epoch_p50_before": statistics.median(before),
                    "epoch_p99_before": p(before, 0.99),
                    "epoch_p50_during": statistics.median(during),
                    "epoch_p99_during": p(during, 0.99),
                    "ready_seconds": ready,
                    "batch_seconds": batch,
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
                print(json.dumps({key: results["runs"][key]}, indent=1), flush=True)
                eng.sql(f"DROP MATERIALIZED VIEW {name}")
        eng.close()
    finally:
        shutil.rmtree(warehouse, ignore_errors=True)
        spark.stop()
    return results


def markdown(args: argparse.Namespace, results: dict[str, Any]) -> str:
    mem = psutil.virtual_memory().total / 2**30
    lines = [
        f"## Backfill vs a batch query — {dt.date.today().isoformat()}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"Spark master `{args.master}`; load average (1 min) {os.getloadavg()[0]:.2f} at the "
        "end. Read ratios, not seconds.",
        "",
        f"Upstream: `t` of {args.rows:,} rows (loaded in {results['load_seconds']:.1f}s) and "
        f"`d` of 10,000, as in the steady-state benchmark; {args.changes:,} changes to `t` "
        "per epoch (80% upserts, half of new ids, 20% deletes) before, during and between "
        f"the backfills; {args.baseline_epochs} epochs before each MV. Each MV is created "
        "with each strategy in turn (`default`: no options). Created ÷ batch: the wall "
        "clock from CREATE to the epoch that made it `created`, over the MV's SQL as a batch "
        "query on the snapshots of that epoch written to Parquet (median of 3). Goals "
        "(issue 12): created ÷ batch ≤ 1.5 with `snapshot`, ≤ 3 by default; upstream epoch "
        "p99 during ÷ before ≤ 1.5 and ≤ 2.",
        "",
        "| MV | strategy | epochs | created ÷ batch | goal | epoch p99 during ÷ before "
        "| goal | epoch p50 during ÷ before | created (s) | batch (s) "
        "| JVM RSS peak (growth) MB | held by strategy MB "
        "| backfill rows read / epoch (median, max) | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def goal(value: float, limit: float | None) -> str:
        return "—" if limit is None else f"≤ {limit:g}: {'yes' if value <= limit else 'NO'}"

    for r in results["runs"].values():
        ratio = r["ready_seconds"] / r["batch_seconds"]
        p99 = r["epoch_p99_during"] / r["epoch_p99_before"]
        limits = r["goal"] or (None, None)
        lines.append(
            f"| {r['mv']} | {r['strategy']} | {r['epochs']}"
            f"{'' if r['created'] else ' (not created)'} "
            f"| {ratio:.1f} | {goal(ratio, limits[0])} | {p99:.2f} | {goal(p99, limits[1])} "
            f"| {r['epoch_p50_during'] / r['epoch_p50_before']:.2f} "
            f"({r['epoch_p50_during']:.2f}s / {r['epoch_p50_before']:.2f}s) "
            f"| {r['ready_seconds']:.1f} | {r['batch_seconds']:.2f} "
            f"| {r['peak_jvm_rss_mb']:.0f} ({r['jvm_rss_growth_mb']:+.0f}) "
            f"| {r['peak_held_mb']:.1f} "
            f"| {r['rows_read_median']:,.0f}, {r['rows_read_max']:,.0f} "
            f"| {'yes' if r['exact'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000, help="changes to t per epoch")
    parser.add_argument("--baseline-epochs", type=int, default=5)
    parser.add_argument("--max-epochs", type=int, default=200,
                        help="stop a backfill that is not created after this many epochs")
    parser.add_argument("--mvs", nargs="+", default=list(MVS), choices=list(MVS))
    parser.add_argument("--strategies", nargs="+", default=["default", "snapshot"],
                        help="strategy[:backfill_parallelism][@chunk_rows] ...; "
                             "'default': no options")
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
