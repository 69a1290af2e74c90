"""TPC-H benchmark (a script, not a test): every query sparkfill accepts, created
online with the default strategy while refresh pairs flow, next to a batch run of
the same query on the same data.

Data: ``tpchgen-cli`` at ``--scale`` (Parquet), loaded through the engine. Per
accepted query, in one warehouse, one query at a time (the MV is dropped before the
next, so an epoch maintains that MV alone):

- time to created: from CREATE to the epoch that reports it created, with one
  refresh pair (``--orders`` new orders with their line items in, as many old
  orders out) before each epoch;
- steady epoch: median ``step()`` of ``--epochs`` epochs after it, same refresh;
- batch: median of 3 runs of the query by Spark over the same snapshots, written
  to Parquet (what a user would run instead);
- exact: ``verify`` at the end is empty.

Queries sparkfill refuses are listed with the reason. Usage:
    python bench/tpch_bench.py [--scale 0.01] [--orders 10] [--epochs 3]
        [--queries q1 q5 ...] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tpch  # noqa: E402
from query_bench import TABLE_HEAD, log, measure, refused_table  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402


def run(args: argparse.Namespace) -> str:
    work = Path(tempfile.mkdtemp(prefix="sf-tpch-"))
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory)
    data = tpch.generate(args.scale, work / "data")
    eng = Engine(work / "wh", spark=spark)
    rows: list[str] = []
    refused: list[str] = []
    try:
        start = time.perf_counter()
        tpch.create_and_load(eng, spark, data)
        eng.step()
        load_s = time.perf_counter() - start
        log(f"loaded scale {args.scale} in {load_s:.1f}s")
        refresh = tpch.Refresh(spark, data, seed=args.seed)
        for name in args.queries or list(tpch.QUERIES):
            row = measure(spark, eng, name, tpch.QUERIES[name], tpch.batch,
                          lambda: refresh.apply(eng, args.orders), args.epochs, work, refused)
            if row is not None:
                rows.append(row)
    finally:
        eng.close()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    head = [
        f"## TPC-H at scale {args.scale} — {dt.date.today().isoformat()}",
        "",
        f"Produced by `bench/tpch_bench.py --scale {args.scale} --orders {args.orders} "
        f"--epochs {args.epochs}`. Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, Spark master `{args.master}`; load average "
        f"{load:.2f} at the end. Data from `tpchgen-cli`, loaded in {load_s:.1f}s. Each "
        f"query alone (its MV dropped before the next): created online with the default "
        f"strategy while a refresh pair ({args.orders} new orders with their line items "
        "in, as many old orders out) runs before each epoch; steady: median epoch after; "
        "batch: median of 3 Spark runs of the query over the same snapshots, written to "
        "Parquet. Links: internal MVs of the query's join chain.",
        "",
        *TABLE_HEAD,
        *rows,
        "",
        *refused_table(refused, len(tpch.QUERIES)),
    ]
    return "\n".join(head)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--orders", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--queries", nargs="*")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    text = run(args)
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
