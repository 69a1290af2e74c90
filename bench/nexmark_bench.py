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
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import nexmark  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.errors import UnsupportedQuery  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def batch_seconds(spark, eng, query: str, work: Path) -> float:
    times = []
    epoch = eng.committed_epoch
    for i in range(3):
        start = time.perf_counter()
        nexmark.batch(spark, eng, query, epoch).write.mode("overwrite").parquet(
            str(work / f"batch{i}"))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(args: argparse.Namespace) -> str:
    work = Path(tempfile.mkdtemp(prefix="sf-nexmark-"))
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory)
    eng = Engine(work / "wh", spark=spark)
    rows: list[str] = []
    refused: list[str] = []
    try:
        start = time.perf_counter()
        nexmark.create(eng, rows=args.events)
        for _ in range(args.history):
            eng.step()
        load_s = time.perf_counter() - start
        bids = eng.read("bid").count()
        log(f"{args.history} epochs of {args.events} events in {load_s:.1f}s ({bids:,} bids)")
        for name in args.queries or list(nexmark.QUERIES):
            query = nexmark.QUERIES[name]
            try:
                eng.sql(f"CREATE MATERIALIZED VIEW {name} AS {query}")
            except UnsupportedQuery as exc:
                refused.append(f"| {name} | {str(exc).splitlines()[0]} |")
                log(f"{name}: refused ({exc})")
                continue
            start = time.perf_counter()
            epochs = 0
            while eng.progress(name).state != "created":
                eng.step()
                epochs += 1
            created_s = time.perf_counter() - start
            steady = []
            for _ in range(args.epochs):
                t0 = time.perf_counter()
                eng.step()
                steady.append(time.perf_counter() - t0)
            batch_s = batch_seconds(spark, eng, query, work)
            exact = eng.verify(name).count() == 0
            mv_rows = eng.read(name).count()
            links = len([r for r in eng.catalog.all() if r.owner == eng.relation(name).id
                         and r.kind == "mv"])
            steady_s = statistics.median(steady)
            rows.append(f"| {name} | {links} | {mv_rows:,} | {epochs} | {created_s:.1f} | "
                        f"{batch_s:.2f} | {created_s / batch_s:.1f} | {steady_s:.2f} | "
                        f"{steady_s / batch_s:.2f} | {'yes' if exact else 'NO'} |")
            log(rows[-1])
            eng.sql(f"DROP MATERIALIZED VIEW {name}")
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
        "| query | links | MV rows | epochs to created | created (s) | batch (s) | "
        "created ÷ batch | steady epoch (s) | steady ÷ batch | exact |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Refused ({len(refused)} of {len(nexmark.QUERIES)}):",
        "",
        "| query | reason |",
        "|---|---|",
        *refused,
        "",
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
    args = parser.parse_args()
    text = run(args)
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
