"""Benchmark of an epoch with a large change: incremental, recomputed, or chosen
(``refresh = 'incremental' | 'full' | 'auto'``) against a recompute of the MVs
(a script, not a test).

One run, one machine; every figure is a ratio of two things measured in this run.
The table ``t`` of N rows and ``d`` of 10,000 rows and the three MVs ``agg``,
``join``, ``proj`` of ``steady_bench.py``, created with ``backfill = 'blocking'``.
Then, per C in ``--changes`` (random-key changes: 80% upserts, half of new ids,
20% deletes), ``--epochs`` rounds, each one epoch per mode (the three MVs set to
that mode by ``ALTER MATERIALIZED VIEW``), modes in turn, so drift hits each alike.
Last, a bulk ``UPDATE t SET v = v + 1`` per mode, and the same UPDATE in a
warehouse of the tables alone (no MV). Reported: the median ``step()`` of each
mode ÷ the median recompute of the three MVs (read a Parquet copy of ``t`` and
``d``, the three queries, each result written to Parquet; ``steady_bench``'s),
the choice ``auto`` made, and whether every MV equals its query at the end; and the
same epochs of C changes in a warehouse of the tables alone, so the MVs' share of a
step (the step less the table's own write) is reported beside the whole.

Goal (issue "Epochs that do not grow with the table", 3): C = N/10 at 1,000,000
rows: ``auto`` ≤ 1.1× the recompute; the bulk UPDATE: ≤ 1.1× the recompute plus
the UPDATE with no MV.

Usage: python bench/refresh_bench.py [--rows 1000000] [--changes 10000 30000 100000]
       [--epochs 2] [--log-fraction F] [--out bench/RESULTS.md]
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
from steady_bench import (  # noqa: E402
    MVS,
    JobCounter,
    Keys,
    exactness,
    load,
    log,
    median,
    recompute,
    step,
)

from sparkfill import Engine  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402

MODES = ("incremental", "full", "auto")


def set_mode(eng: Engine, mode: str) -> None:
    for name in MVS:
        eng.sql(f"ALTER MATERIALIZED VIEW {name} SET refresh = '{mode}'")


def stage_changes(eng: Engine, keys: Keys, c: int) -> None:
    """Stage C random-key changes of ``t`` for the next step."""
    up, dele = keys.changes(c)
    eng.insert("t", up)
    eng.delete("t", dele)


def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="sparkfill-refresh-bench-"))
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory,
                                app_name="sparkfill-refresh-bench")
    jobs = JobCounter(spark.sparkContext)
    rows: list[str] = []
    n = args.rows
    try:
        eng = Engine(tmp / "warehouse", spark=spark)
        if args.log_fraction is not None:
            eng.store.log_fraction = args.log_fraction
        keys = Keys(n, random.Random(args.seed))
        load(eng, spark, n, list(MVS), with_d=True)
        for _ in range(2):  # warm-up epochs
            stage_changes(eng, keys, 1_000)
            eng.step()
        base = recompute(spark, eng, tmp / "recompute")
        log(f"recompute runs {[round(r, 2) for r in base]}")
        auto: dict[int, float] = {}
        alone: dict[int, float] = {}
        for c in args.changes:
            times: dict[str, list[float]] = {m: [] for m in MODES}
            chosen: list[str] = []
            for _ in range(args.epochs):
                for mode in MODES:
                    set_mode(eng, mode)
                    stage_changes(eng, keys, c)
                    report, counted, wall = step(eng, jobs)
                    times[mode].append(wall)
                    if mode == "auto":
                        chosen.extend(f"{k}: {v.mode}" for k, v in report.refresh.items())
                    log(f"C={c:,} {mode}: {wall:.2f}s, {counted} jobs, "
                        f"{ {k: v.mode for k, v in report.refresh.items()} }")
            rec = median(base)
            auto[c] = median(times["auto"])
            rows.append(f"| C = {c:,} ({100 * c / n:.0f}% of N) | "
                        + " | ".join(f"{median(times[m]):.2f} ({median(times[m]) / rec:.2f}x)"
                                     for m in MODES)
                        + f" | {', '.join(sorted(set(chosen)))} |")
        bulk: dict[str, float] = {}
        for mode in MODES:
            set_mode(eng, mode)
            eng.sql("UPDATE t SET v = v + 1")
            report, counted, wall = step(eng, jobs)
            bulk[mode] = wall
            log(f"bulk UPDATE {mode}: {wall:.2f}s, {counted} jobs")
        exact = exactness(eng, list(MVS))
        base_after = recompute(spark, eng, tmp / "recompute")
        eng.close()
        plain = Engine(tmp / "plain", spark=spark)
        if args.log_fraction is not None:
            plain.store.log_fraction = args.log_fraction
        load(plain, spark, n, [], with_d=True)
        # the same epochs of C changes with no MV: the table's own share of a step
        plain_keys = Keys(n, random.Random(args.seed))
        for _ in range(2):
            stage_changes(plain, plain_keys, 1_000)
            plain.step()
        for c in args.changes:
            walls = []
            for _ in range(args.epochs):
                stage_changes(plain, plain_keys, c)
                walls.append(step(plain, jobs)[2])
            alone[c] = median(walls)
            log(f"C={c:,} with no MV: {walls}")
        plain.sql("UPDATE t SET v = v + 1")
        _, _, plain_update = step(plain, jobs)
        plain.close()
        rec = median(base + base_after)
        rows.append("| bulk `UPDATE t SET v = v + 1` | "
                    + " | ".join(f"{bulk[m]:.2f} ({bulk[m] / (rec + plain_update):.2f}x)"
                                 for m in MODES)
                    + f" | update alone {plain_update:.2f}s |")
        version = spark.version
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    mem = psutil.virtual_memory().total / 2**30
    return "\n".join([
        f"### refresh_bench, N = {n:,} ({dt.date.today()}, {platform.node()}, "
        f"{os.cpu_count()} cores, {mem:.0f} GiB, Spark {version}, load "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f})",
        "",
        f"Recompute of the three MVs: median {median(base + base_after):.2f}s "
        f"(runs {', '.join(f'{r:.2f}' for r in base + base_after)}). Each cell: median "
        "`step()` seconds (÷ the recompute; for the bulk UPDATE ÷ the recompute plus the "
        "UPDATE with no MV).",
        "",
        "| epoch | incremental | full | auto | auto chose |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "The same epochs of C changes with no MV (the table's own write), and the MVs' "
        "share of an `auto` step (the step less that) ÷ the recompute: "
        + "; ".join(f"C = {c:,}: {alone[c]:.2f}s, MVs {auto[c] - alone[c]:.2f}s "
                    f"({(auto[c] - alone[c]) / median(base):.2f}x)" for c in args.changes)
        + ".",
        "",
        f"Exact at the end: {exact}.",
        "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None, help="append the results to this markdown file")
    parser.add_argument("--log-fraction", type=float, default=None,
                        help="fold a relation's log into base once it holds this many rows "
                        "per base row (default: the store's)")
    args = parser.parse_args()
    started = time.time()
    text = run(args)
    print(text)
    log(f"done in {time.time() - started:.0f}s")
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
