"""Where a backfill epoch's time goes (a script, not a test).

Loads the steady benchmark's ``t`` (N rows) and ``d``, runs a few epochs of C
random-key changes, then creates one MV online (``--mv``, ``--strategy``) and, for
each epoch until it is created, prints the step's wall time, the chunk it
backfilled, and its Spark jobs with their stages (tasks, run time, input and shuffle
rows, from Spark's status API), so a chunk's per-row cost can be set against the
epoch's fixed cost and against a blocking CREATE of the same MV.

Classic sessions only (it reads the Spark UI). Usage:
    python bench/backfill_anatomy.py [--rows 1000000] [--changes 1000] [--mv agg]
        [--strategy default|snapshot|blocking] [--max-epochs 40] [--profile N]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steady_bench as sb  # noqa: E402
from backfill_bench import dml, with_clause  # noqa: E402
from epoch_anatomy import job_seconds, print_jobs, session_with_status_api  # noqa: E402

from sparkfill import Engine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--mv", default="agg", choices=list(sb.MVS))
    parser.add_argument("--strategy", default="default")
    parser.add_argument("--max-epochs", type=int, default=40)
    parser.add_argument("--quiet-jobs", action="store_true", help="epoch lines only")
    parser.add_argument("--chunk", default="", help="backfill_chunk_rows (default: the engine's)")
    parser.add_argument("--target-ms", default="",
                        help="backfill_target_epoch_ms (0: a fixed chunk of --chunk rows)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile each backfill epoch; print its N costliest sparkfill "
                             "functions (cumulative; the profiler slows the driver)")
    args = parser.parse_args()
    spark, api = session_with_status_api()
    work = Path(tempfile.mkdtemp(prefix="bf-anatomy-"))
    eng = Engine(work / "warehouse", spark=spark)
    keys = sb.Keys(args.rows, random.Random(7))
    try:
        sb.load(eng, spark, args.rows, [], with_d=True)
        before = []
        for _ in range(4):
            dml(eng, keys, args.changes)
            before.append(eng.step().seconds)
        print(f"steady epochs before: {[round(s, 2) for s in before]}")
        name = f"{args.mv}_{args.strategy}"
        t_create = time.perf_counter()
        options = with_clause(args.strategy, "", args.chunk)
        if args.target_ms:
            options = (options[:-2] + ", " if options else "WITH (") + \
                f"backfill_target_epoch_ms = {int(args.target_ms)}) "
        eng.sql(f"CREATE MATERIALIZED VIEW {name} {options}AS {sb.MVS[args.mv]}")
        walls, chunks = [], []
        for _ in range(args.max_epochs):
            dml(eng, keys, args.changes)
            last_job = max((j["jobId"] for j in api("jobs")), default=-1)
            profiler = cProfile.Profile() if args.profile else None
            t0 = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            report = eng.step()
            wall = time.perf_counter() - t0
            if profiler is not None:
                profiler.disable()
            walls.append(wall)
            chunk = report.backfill_rows.get(name, 0)
            chunks.append(chunk)
            time.sleep(0.5)
            jobs = sorted((j for j in api("jobs") if j["jobId"] > last_job),
                          key=lambda j: j["jobId"])
            spent = sum(job_seconds(j)
                        for j in jobs if j.get("completionTime"))
            print(f"epoch {report.epoch}: step {wall:.2f} s, chunk {chunk:,} rows, "
                  f"{len(jobs)} jobs {spent:.2f} s, outside {wall - spent:.2f} s, "
                  f"state {eng.progress(name).state}", flush=True)
            if not args.quiet_jobs:
                print_jobs(api, jobs)
            if profiler is not None:
                out = io.StringIO()
                stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
                stats.print_stats("sparkfill/", args.profile)
                print(out.getvalue().split("\n\n", 1)[-1].rstrip(), flush=True)
            if eng.progress(name).state == "created":
                break
        total = time.perf_counter() - t_create
        print(f"\ncreated in {total:.1f} s, {len(walls)} epochs; median step "
              f"{statistics.median(walls):.2f} s (before {statistics.median(before):.2f} s); "
              f"median chunk {statistics.median(chunks):,.0f} rows")
    finally:
        eng.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
