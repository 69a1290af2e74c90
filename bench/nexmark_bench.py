"""Nexmark benchmark (a script, not a test): every Nexmark query sparkfill accepts,
created online with the default strategy while the generated streams flow, next to
a batch run of the same query on the same data.

Data: the Nexmark datagen (``tests/nexmark.py``: person, auction and bid tables,
``--events`` events per epoch, bids also updated and deleted), ``--history`` epochs
generated before the first query. Per accepted query, in one warehouse, one query at
a time (the MV is dropped before the next, so an epoch maintains that MV alone):

- time to created: from CREATE to the epoch that reports it created (every epoch
  generates the streams' next batch);
- steady epoch: median ``step()`` of ``--epochs`` epochs after it;
- batch: median of 3 runs of the query by Spark over the same snapshots, written to
  Parquet (what a user would run instead);
- exact: ``verify`` at the end is empty.

Queries sparkfill refuses are listed with the reason. Usage:
    python bench/nexmark_bench.py [--events 2000] [--history 5] [--epochs 3]
        [--queries q0 q9 ...] [--out bench/RESULTS.md]
        [--keep-history DIR | --history-from DIR]
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

import nexmark  # noqa: E402
from query_bench import TABLE_HEAD, log, measure, refused_table  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402


def run(args: argparse.Namespace) -> str:
    work = Path(tempfile.mkdtemp(prefix="sf-nexmark-"))
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory)
    eng = Engine(work / "wh", spark=spark)
    rows: list[str] = []
    refused: list[str] = []
    try:
        start = time.perf_counter()
        if args.history_from:
            # a history generated once (``--keep-history``) and copied: the streams
            # are seeded, so the data is the same as generating it again
            eng.close()
            shutil.rmtree(work / "wh")
            shutil.copytree(args.history_from, work / "wh")
            eng = Engine(work / "wh", spark=spark)
        else:
            nexmark.create(eng, rows=args.events)
            for _ in range(args.history):
                eng.step()
            if args.keep_history:
                eng.close()
                shutil.copytree(work / "wh", args.keep_history, dirs_exist_ok=True)
                eng = Engine(work / "wh", spark=spark)
        load_s = time.perf_counter() - start
        bids = eng.read("bid").count()
        log(f"{args.history} epochs of {args.events} events in {load_s:.1f}s ({bids:,} bids)")
        for name in args.queries or list(nexmark.QUERIES):
            # every epoch generates the streams' next batch: nothing to add before it
            row = measure(spark, eng, name, nexmark.QUERIES[name], nexmark.batch,
                          lambda: None, args.epochs, work, refused)
            if row is not None:
                rows.append(row)
    finally:
        eng.close()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    head = [
        f"## Nexmark — {dt.date.today().isoformat()}",
        "",
        f"Produced by `bench/nexmark_bench.py --events {args.events} --history "
        f"{args.history} --epochs {args.epochs}`. Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, Spark master "
        f"`{args.master}`; load average {load:.2f} at the end. The Nexmark datagen, "
        f"{args.events} events per epoch (bids 8% updated, 2% deleted), {args.history} "
        f"epochs before the first query ({load_s:.1f}s). Each query alone (its MV dropped "
        "before the next): created online with the default strategy while the streams "
        "flow; steady: median epoch after; batch: median of 3 Spark runs of the query "
        "over the same snapshots, written to Parquet. Links: the query's internal MVs.",
        "",
        *TABLE_HEAD,
        *rows,
        "",
        *refused_table(refused, len(nexmark.QUERIES)),
    ]
    return "\n".join(head)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--history", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--queries", nargs="*")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--out", default=None)
    parser.add_argument("--keep-history", default=None, metavar="DIR",
                        help="copy the warehouse to DIR once the history is generated")
    parser.add_argument("--history-from", default=None, metavar="DIR",
                        help="start from a copy of a warehouse kept by --keep-history "
                             "(--events and --history are then those of that run)")
    args = parser.parse_args()
    text = run(args)
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
