"""Benchmark of incremental SQL (a script, not a test): how an epoch's cost scales
with the size of the state.

For each upstream size N: a fact table ``t`` of N rows and a dimension ``d`` of
1,000 rows; an aggregate MV (``GROUP BY`` 10,000 groups of ``t``) and a join MV
(``t JOIN d``) created with the blocking strategy, then the same steady DML load
(upserts and deletes of ``t`` and a few ``d`` rows per epoch). Reported per N and
MV, from the steady epochs after creation: epoch seconds (median), rows read per
epoch by the MV's operators (from the files its state reads select), and the
same ratios between sizes. Each MV is checked exact against Spark's batch query.

Usage: python bench/sql_bench.py [--rows 1000000 4000000] [--out bench/RESULTS.md]
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
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql import functions as F

from sparkfill import Engine
from sparkfill.session import build_spark_session

MVS = {
    "agg": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx FROM t GROUP BY g",
    "join": "SELECT t.id, t.v, d.name FROM t JOIN d ON t.k = d.k WHERE t.v % 2 = 0",
}
GROUPS = 10_000
DIM_ROWS = 1_000


def dml(eng: Engine, rng: random.Random, rows: int, id_space: int) -> None:
    eng.insert("t", [{"id": rng.randrange(id_space), "g": rng.randrange(GROUPS),
                      "k": rng.randrange(DIM_ROWS), "v": rng.randrange(1000)}
                     for _ in range(rows)])
    eng.delete("t", [{"id": rng.randrange(id_space)} for _ in range(rows // 4)])
    eng.insert("d", [{"k": rng.randrange(DIM_ROWS), "name": f"n{rng.randrange(99)}"}])


def run_size(spark: Any, n: int, args: argparse.Namespace) -> dict[str, Any]:
    warehouse = Path(tempfile.mkdtemp(prefix="sparkfill-sqlbench-"))
    rng = random.Random(args.seed)
    out: dict[str, Any] = {}
    try:
        eng = Engine(warehouse, spark=spark)
        eng.sql("CREATE TABLE t (id BIGINT, g INT, k INT, v BIGINT, PRIMARY KEY (id))")
        eng.sql("CREATE TABLE d (k INT, name STRING, PRIMARY KEY (k))")
        eng.insert("t", spark.range(n).select(
            "id", (F.col("id") * 7 % GROUPS).cast("int").alias("g"),
            (F.col("id") * 13 % DIM_ROWS).cast("int").alias("k"),
            (F.col("id") * 7919 % 1000).alias("v")))
        eng.insert("d", [{"k": i, "name": f"n{i % 99}"} for i in range(DIM_ROWS)])
        eng.step()
        for name, sql in MVS.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS {sql}")
        while any(eng.progress(m).state != "created" for m in MVS):
            eng.step()
        epochs: list[dict[str, Any]] = []
        for _ in range(args.epochs):
            dml(eng, rng, args.dml_rows, int(n * 1.1))
            report = eng.step()
            epochs.append({"seconds": report.seconds, "rows_read": dict(report.rows_read),
                           "changes": dict(report.changes)})
        for name in MVS:
            out[name] = {
                "epoch_p50": statistics.median(e["seconds"] for e in epochs),
                "rows_read_p50": statistics.median(e["rows_read"].get(name, 0)
                                                   for e in epochs),
                "changes_p50": statistics.median(e["changes"].get(name, 0) for e in epochs),
                "exact": eng.verify(name).count() == 0,
            }
        out["table_rows_read_p50"] = statistics.median(e["rows_read"].get("t", 0)
                                                       for e in epochs)
        print(json.dumps({n: out}, indent=1), flush=True)
        eng.close()
    finally:
        shutil.rmtree(warehouse, ignore_errors=True)
    return out


def markdown(args: argparse.Namespace, results: dict[int, dict[str, Any]]) -> str:
    mem = psutil.virtual_memory().total / 2**30
    sizes = sorted(results)
    lines = [
        f"## Incremental SQL: per-epoch cost vs state size — {dt.date.today().isoformat()}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
        f"Python {platform.python_version()}, Spark master `{args.master}`. "
        f"DML per epoch: {args.dml_rows} upserts + {args.dml_rows // 4} deletes of `t`, one "
        f"`d` upsert; {args.epochs} steady epochs after creation; medians.",
        "",
        "| MV | upstream rows | epoch s (all MVs) | MV rows changed / epoch "
        "| MV operator rows read / epoch | table-Δ rows read / epoch | exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, sql in MVS.items():
        for n in sizes:
            r = results[n][name]
            lines.append(f"| {name} | {n:,} | {r['epoch_p50']:.2f} | {r['changes_p50']:,.0f} "
                         f"| {r['rows_read_p50']:,.0f} "
                         f"| {results[n]['table_rows_read_p50']:,.0f} "
                         f"| {'yes' if r['exact'] else 'NO'} |")
        if len(sizes) >= 2:
            a, b = results[sizes[0]][name], results[sizes[-1]][name]
            lines.append(f"| {name} ratio {sizes[-1] // sizes[0]}x rows | | "
                         f"{b['epoch_p50'] / a['epoch_p50']:.2f} | | "
                         f"{b['rows_read_p50'] / max(1, a['rows_read_p50']):.2f} | | |")
        lines.append(f"| `{sql}` | | | | | | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--dml-rows", type=int, default=1_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", default=None, help="append the results to this markdown file")
    args = parser.parse_args()
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory)
    try:
        results = {n: run_size(spark, n, args) for n in args.rows}
    finally:
        spark.stop()
    text = markdown(args, results)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
