"""A runtime Spark setting's effect on a steady epoch, paired in one run (a script,
not a test).

Loads the steady benchmark's ``t`` (N rows), ``d`` and its three MVs, then runs
epochs of C random-key changes, switching one runtime SQL setting between two
values before each epoch (A, B, A, B, ...), so both sides see the same machine
load and the same table as it grows. Reports each side's median ``step()``, its
Spark jobs and the ratio B ÷ A.

Usage:
    python bench/conf_ab.py KEY A_VALUE B_VALUE [--rows 4000000] [--changes 1000]
        [--pairs 5] [--set OTHER_KEY=VALUE ...] [--b-set B_KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import platform
import random
import shutil
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steady_bench as sb  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("key")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting both sides run with")
    parser.add_argument("--b-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a further setting side B runs with (side A: the session's)")
    args = parser.parse_args()
    spark = build_spark_session(master="local[2]", shuffle_partitions=4, driver_memory="6g")
    for setting in args.set:
        key, _, value = setting.partition("=")
        spark.conf.set(key, value)
    b_only = dict(s.partition("=")[::2] for s in args.b_set)
    a_values = {k: spark.conf.get(k, None) for k in b_only}
    jobs = sb.JobCounter(spark.sparkContext)
    work = Path(tempfile.mkdtemp(prefix="conf-ab-"))
    try:
        eng = Engine(work / "warehouse", spark=spark)
        load_s, create_s, _ = sb.load(eng, spark, args.rows, list(sb.MVS), with_d=True)
        sb.log(f"loaded {args.rows:,} rows in {load_s:.1f} s, MVs in {create_s:.1f} s")
        keys = sb.Keys(args.rows, random.Random(11))
        walls: dict[str, list[float]] = {"A": [], "B": []}
        counts: dict[str, list[int]] = {"A": [], "B": []}
        for i in range(2 * (args.warmup + args.pairs)):
            side = "AB"[i % 2]
            spark.conf.set(args.key, args.a if side == "A" else args.b)
            for key, value in b_only.items():
                if side == "B":
                    spark.conf.set(key, value)
                elif a_values[key] is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, a_values[key])
            upserts, deletes = keys.changes(args.changes)
            eng.insert("t", upserts)
            eng.delete("t", deletes)
            _, n_jobs, wall = sb.step(eng, jobs)
            if i >= 2 * args.warmup:
                walls[side].append(wall)
                counts[side].append(n_jobs)
        a, b = statistics.median(walls["A"]), statistics.median(walls["B"])
        print(f"{date.today()} {platform.machine()}, {args.rows:,} rows, C = {args.changes:,}, "
              f"{args.pairs} pairs")
        print(f"{args.key} = {args.a}: median step {a:.2f} s, "
              f"{statistics.median(counts['A'])} Spark jobs  {[round(w, 2) for w in walls['A']]}")
        print(f"{args.key} = {args.b}: median step {b:.2f} s, "
              f"{statistics.median(counts['B'])} Spark jobs  {[round(w, 2) for w in walls['B']]}")
        print(f"B / A = {b / a:.2f}")
        assert all(sb.exactness(eng, list(sb.MVS)).values()), "an MV differs from its query"
        eng.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
