"""Benchmark of ``CREATE OR REPLACE MATERIALIZED VIEW`` online (a script, not a test).

One run, one machine; every figure is a ratio of two things measured in this run.
The table ``t`` of N rows and ``proj`` of ``steady_bench.py`` (created with
``backfill = 'blocking'``), and an MV ``down`` over ``proj`` (its dependent). Then,
per backfill strategy, ``proj`` is replaced by a new filter while C random-key
changes flow into ``t`` every epoch, and the epochs run until the switch. Reported:
the time from the statement to the switch's commit ÷ a blocking ``CREATE`` of the new
query alone (an MV of another name, created and dropped in the same warehouse); the
switch epoch's seconds ÷ the median epoch before the statement; the upstream's epoch
p99 while the replacement is built ÷ before; and whether ``proj`` and ``down`` equal
their queries at the end (VERIFY).

Usage: python bench/replace_bench.py [--rows 1000000] [--changes 1000]
       [--strategies snapshot arrangement] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from steady_bench import Keys, load, log, median  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402

NEW_QUERIES = ["SELECT id, g, v * 2 AS w FROM t WHERE v % 5 <> 0",
               "SELECT id, g, v * 2 AS w FROM t WHERE v % 7 <> 0"]
DOWN = "SELECT g, count(*) AS n, sum(w) AS sw FROM proj GROUP BY g"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="sparkfill-replace-bench-"))
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory,
                                app_name="sparkfill-replace-bench")
    rows: list[str] = []
    n = args.rows
    try:
        eng = Engine(tmp / "warehouse", spark=spark)
        keys = Keys(n, random.Random(args.seed))
        load(eng, spark, n, ["proj"], with_d=False)
        eng.sql(f"CREATE MATERIALIZED VIEW down WITH (backfill = 'blocking') AS {DOWN}")
        eng.step()

        def epoch() -> float:
            upserts, deletes = keys.changes(args.changes)
            eng.insert("t", upserts)
            eng.delete("t", deletes)
            t0 = time.perf_counter()
            eng.step()
            return time.perf_counter() - t0

        for strategy, query in zip(args.strategies, NEW_QUERIES, strict=False):
            before = [epoch() for _ in range(args.epochs)]
            # the blocking create of the new query alone, in the same warehouse
            t0 = time.perf_counter()
            eng.sql(f"CREATE MATERIALIZED VIEW alone WITH (backfill = 'blocking') AS {query}")
            while eng.progress("alone").state != "created":
                eng.step()
            blocking = time.perf_counter() - t0
            eng.sql("DROP MATERIALIZED VIEW alone")
            log(f"{strategy}: blocking create {blocking:.1f}s")
            t0 = time.perf_counter()
            eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW proj WITH (backfill = "
                    f"'{strategy}') AS {query}")
            during: list[float] = []
            while eng.relation("proj").sql != query:
                during.append(epoch())
                if len(during) > args.limit:
                    raise RuntimeError(f"{strategy}: no switch after {args.limit} epochs")
            to_switch = time.perf_counter() - t0
            switch_s = during[-1]
            building = during[:-1] or during
            exact = all(eng.verify(m).count() == 0 for m in ("proj", "down"))
            log(f"{strategy}: switch after {to_switch:.1f}s in {len(during)} epochs, "
                f"switch epoch {switch_s:.2f}s, exact {exact}")
            rows.append(
                f"| {strategy} | {to_switch:.1f}s in {len(during)} epochs "
                f"({to_switch / blocking:.2f}x) | {blocking:.1f}s | {switch_s:.2f}s "
                f"({switch_s / median(before):.2f}x) | {median(before):.2f}s / "
                f"{p99(before):.2f}s | {p99(building):.2f}s "
                f"({p99(building) / p99(before):.2f}x) | {exact} |")
        version = spark.version
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    mem = psutil.virtual_memory().total / 2**30
    return "\n".join([
        f"### replace_bench, N = {n:,}, C = {args.changes:,} ({dt.date.today()}, "
        f"{platform.node()}, {os.cpu_count()} cores, {mem:.0f} GiB, Spark {version}, load "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f})",
        "",
        "`proj` replaced by a new filter while C random-key changes per epoch flow into "
        "`t`; `down` (an aggregate over `proj`) takes the switch's difference. Time to "
        "switch ÷ a blocking CREATE of the new query alone; the switch epoch ÷ the "
        "median epoch before; the upstream epoch p99 while building ÷ before.",
        "",
        "| strategy | statement → switch committed | blocking CREATE alone | switch "
        "epoch | epoch before: p50 / p99 | p99 while building | exact |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--strategies", nargs="+", default=["snapshot", "arrangement"])
    parser.add_argument("--epochs", type=int, default=5, help="epochs measured before each")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None, help="append the results to this markdown file")
    args = parser.parse_args()
    text = run(args)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
