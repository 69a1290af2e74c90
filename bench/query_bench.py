"""What the query benchmarks (``tpch_bench.py``, ``nexmark_bench.py``) share: one
query's MV created online and kept, next to a batch run of the same query.

``measure`` creates the MV, steps until it is created (``before_epoch()`` before each
epoch: the benchmark's changes), then ``epochs`` steady epochs, runs the query as a
batch three times over the same snapshots (written to Parquet: what a user would run
instead), checks ``verify`` at the epoch it was created and after every steady epoch
(not timed), drops the MV and returns its row of ``TABLE_HEAD``; None when sparkfill
refuses the query (its reason appended to ``refused``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from sparkfill.errors import UnsupportedQuery

#: runs a query as Spark batch over the engine's snapshots: (spark, eng, sql, epoch)
Batch = Callable[[Any, Any, str, int], Any]

TABLE_HEAD = [
    "| query | links | MV rows | epochs to created | created (s) | batch (s) | "
    "created ÷ batch | steady epoch (s) | steady ÷ batch | exact (epochs checked) |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def batch_seconds(spark: Any, eng: Any, batch: Batch, query: str, work: Path) -> float:
    times = []
    epoch = eng.committed_epoch
    for i in range(3):
        start = time.perf_counter()
        batch(spark, eng, query, epoch).write.mode("overwrite").parquet(str(work / f"batch{i}"))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(spark: Any, eng: Any, name: str, query: str, batch: Batch,
            before_epoch: Callable[[], object], epochs: int, work: Path,
            refused: list[str]) -> str | None:
    try:
        eng.sql(f"CREATE MATERIALIZED VIEW {name} AS {query}")
    except UnsupportedQuery as exc:
        refused.append(f"| {name} | {str(exc).splitlines()[0]} |")
        log(f"{name}: refused ({exc})")
        return None
    start = time.perf_counter()
    to_created = 0
    while eng.progress(name).state != "created":
        before_epoch()
        t0 = time.perf_counter()
        report = eng.step()
        to_created += 1
        log(f"{name}: creating, epoch {report.epoch}: {time.perf_counter() - t0:.2f} s, "
            f"{report.spark_jobs} jobs, backfilled {sum(report.backfill_rows.values()):,} "
            f"rows, read {sum(report.rows_read.values()):,}")
    created_s = time.perf_counter() - start
    wrong: list[str] = []  # "epoch e: m missing, x extra" for each check that failed

    def check() -> bool:
        sides = {r["side"]: int(r["n"]) for r in
                 eng.verify(name).groupBy("side").agg(F.count("*").alias("n")).collect()}
        if sides:
            wrong.append(f"epoch {eng.committed_epoch}: {sides.get('missing', 0)} missing, "
                         f"{sides.get('extra', 0)} extra")
            log(f"{name}: VERIFY differs at {wrong[-1]}")
        return not sides

    checks = [check()]
    steady = []
    for _ in range(epochs):
        before_epoch()
        t0 = time.perf_counter()
        eng.step()
        steady.append(time.perf_counter() - t0)
        checks.append(check())
    batch_s = batch_seconds(spark, eng, batch, query, work)
    exact = all(checks)
    mv_rows = eng.read(name).count()
    links = len([r for r in eng.catalog.all() if r.owner == eng.relation(name).id
                 and r.kind == "mv"])
    steady_s = statistics.median(steady)
    row = (f"| {name} | {links} | {mv_rows:,} | {to_created} | {created_s:.1f} | "
           f"{batch_s:.2f} | {created_s / batch_s:.1f} | {steady_s:.2f} | "
           f"{steady_s / batch_s:.2f} | {'yes' if exact else 'NO: ' + '; '.join(wrong)} "
           f"({len(checks)}) |")
    log(row)
    eng.sql(f"DROP MATERIALIZED VIEW {name}")
    return row


def refused_table(refused: list[str], total: int) -> list[str]:
    return [f"Refused ({len(refused)} of {total}):", "", "| query | reason |", "|---|---|",
            *refused, ""]
