"""Where a TPC-H MV's online creation goes (a script, not a test).

Loads the TPC-H tables at ``--scale`` (``tpchgen-cli``), runs two refresh epochs (new
orders with their line items in, as many old orders out), then creates ``--query``
with the default strategy and steps until it is created, one refresh pair before
each epoch. Prints per epoch: the step's wall time, the backfill chunk, the rows each
relation's reads selected, the Spark jobs' time (and the rest: the driver), and, from
``--jobs-after`` epochs on, every job with its stages (tasks, run time, input and
shuffle rows). Classic sessions only (it reads Spark's status API).

    python bench/tpch_backfill_anatomy.py [--scale 1] [--query q1] [--jobs-after 10]
        [--max-epochs 80]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tpch  # noqa: E402
from epoch_anatomy import job_seconds, print_jobs, session_with_status_api  # noqa: E402

from sparkfill import Engine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--query", default="q1", choices=list(tpch.QUERIES))
    parser.add_argument("--orders", type=int, default=10)
    parser.add_argument("--jobs-after", type=int, default=10,
                        help="list each job of the epochs after this many")
    parser.add_argument("--max-epochs", type=int, default=80)
    parser.add_argument("--data", default="", help="a folder to keep the generated data in")
    args = parser.parse_args()
    spark, api = session_with_status_api()
    work = Path(tempfile.mkdtemp(prefix="tpch-anatomy-"))
    data = tpch.generate(args.scale, Path(args.data) if args.data else work / "data")
    eng = Engine(work / "wh", spark=spark)
    try:
        start = time.perf_counter()
        tpch.create_and_load(eng, spark, data)
        eng.step()
        print(f"loaded scale {args.scale} in {time.perf_counter() - start:.1f} s", flush=True)
        refresh = tpch.Refresh(spark, data, seed=7)
        for _ in range(2):
            refresh.apply(eng, args.orders)
            report = eng.step()
            print(f"steady epoch {report.seconds:.2f} s, rows read {report.rows_read}")
        eng.sql(f"CREATE MATERIALIZED VIEW {args.query} AS {tpch.QUERIES[args.query]}")
        created = time.perf_counter()
        for n in range(args.max_epochs):
            refresh.apply(eng, args.orders)
            last = max((j["jobId"] for j in api("jobs")), default=-1)
            t0 = time.perf_counter()
            report = eng.step()
            wall = time.perf_counter() - t0
            time.sleep(0.5)  # the status API's view of the last job
            jobs = sorted((j for j in api("jobs") if j["jobId"] > last),
                          key=lambda j: j["jobId"])
            spent = sum(job_seconds(j) for j in jobs if j.get("completionTime"))
            state = eng.progress(args.query).state
            print(f"epoch {report.epoch}: {wall:.2f} s, chunk "
                  f"{report.backfill_rows.get(args.query, 0):,} rows, {len(jobs)} jobs "
                  f"{spent:.2f} s, outside {wall - spent:.2f} s, rows read "
                  f"{report.rows_read}, {state}", flush=True)
            if n >= args.jobs_after:
                print_jobs(api, jobs)
            if state == "created":
                break
        print(f"created in {time.perf_counter() - created:.1f} s")
    finally:
        eng.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
