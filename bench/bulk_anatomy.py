"""Where a bulk load's time goes (a script, not a test).

Loads ``t`` of N rows (the steady benchmark's table: ``id`` PK, ``g``, ``k``, ``v``,
``s`` from ``spark.range``) the way a new user does, ``Engine.insert`` of the
DataFrame then ``step()``, next to what a user would do instead, Spark writing the
same DataFrame as Parquet, measured in the same run. For the insert and the step it
lists each Spark job (from Spark's status REST API): its duration, stages, tasks,
rows read and shuffled, and the code that ran it; the time outside jobs is the
driver's (planning, Delta commits, the meta store).

With ``--create``, after the load (and ``d``'s), each MV of the steady benchmark
(``agg``, ``join``, ``proj``) is created with ``backfill = 'blocking'`` and stepped
until created, next to a batch CTAS of the same query by Spark over Parquet copies of
the committed ``t`` and ``d`` (the copies are not timed), with the same job listing.

With ``--row-groups A B``, the attempts alternate between files of A and of B row
groups (``RelationStore.file_row_groups``; 1: a file per range of vnodes), and the
medians are reported per variant: a paired before/after of the file layout.

Classic sessions only (it reads the Spark UI). Usage:
    python bench/bulk_anatomy.py [--rows 1000000] [--repeat 2] [--create]
        [--row-groups 1 10] [--mvs agg proj]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steady_bench as sb  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402


def _ts(text: str) -> datetime:
    return datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")


class Jobs:
    """The Spark jobs that ran since ``mark()``, from the status REST API."""

    def __init__(self, spark: Any) -> None:
        self.ui = spark.sparkContext.uiWebUrl
        self.app = self._get(f"{self.ui}/api/v1/applications")[0]["id"]
        self.before = -1

    @staticmethod
    def _get(url: str) -> Any:
        return json.load(urllib.request.urlopen(url))

    def api(self, path: str) -> Any:
        return self._get(f"{self.ui}/api/v1/applications/{self.app}/{path}")

    def mark(self) -> None:
        self.before = max((j["jobId"] for j in self.api("jobs")), default=-1)

    def report(self, label: str, wall: float) -> float:
        time.sleep(1.0)  # the status store catches up
        jobs = sorted((j for j in self.api("jobs") if j["jobId"] > self.before),
                      key=lambda j: j["jobId"])
        spent = 0.0
        lines = []
        for j in jobs:
            dur = (_ts(j["completionTime"]) - _ts(j["submissionTime"])).total_seconds()
            spent += dur
            lines.append(f"  job {j['jobId']} {dur:.2f} s, {len(j['stageIds'])} stages: "
                         f"{j['name'][:80]}")
            for sid in sorted(j["stageIds"]):
                s = self.api(f"stages/{sid}")[0]
                if s["status"] == "COMPLETE":
                    lines.append(f"    stage {sid}: {s['numTasks']} tasks, run "
                                 f"{s.get('executorRunTime', 0)} ms, input "
                                 f"{s.get('inputRecords', 0):,} rows, shuffle write "
                                 f"{s.get('shuffleWriteRecords', 0):,} read "
                                 f"{s.get('shuffleReadRecords', 0):,} rows")
        print(f"{label}: {wall:.2f} s, {len(jobs)} Spark jobs {spent:.2f} s, outside jobs "
              f"{wall - spent:.2f} s")
        print("\n".join(lines))
        return spent


#: the MVs ``--create`` creates (``--mvs``)
MVS_CHOSEN: list[str] = list(sb.MVS)


def create_anatomy(spark: Any, eng: Engine, jobs: Jobs, work: Path, attempt: int,
                   ctas_s: dict[str, list[float]], create_s: dict[str, list[float]]) -> None:
    """Each MV: Spark's CTAS over Parquet copies of ``t`` and ``d``, then the blocking
    CREATE, each with its jobs listed."""
    eng.sql(sb.D_DDL)
    eng.insert("d", sb.initial_d(spark))
    eng.step()
    t_dir, d_dir = work / "t.parquet", work / "d.parquet"
    eng.read("t").write.parquet(str(t_dir))
    eng.read("d").write.parquet(str(d_dir))
    for name, sql in sb.MVS.items():
        if name not in MVS_CHOSEN:
            continue
        jobs.mark()
        t0 = time.perf_counter()
        spark.read.parquet(str(t_dir)).createOrReplaceTempView("anatomy_t")
        spark.read.parquet(str(d_dir)).createOrReplaceTempView("anatomy_d")
        spark.sql(sb.on_tables(sql, "anatomy_t", "anatomy_d")).write.parquet(
            str(work / f"ctas-{name}"))
        wall = time.perf_counter() - t0
        ctas_s[name].append(wall)
        jobs.report(f"[{attempt}] {name}: batch CTAS", wall)
        jobs.mark()
        t0 = time.perf_counter()
        eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS {sql}")
        epochs = sb.step_until_created(eng, [name])
        wall = time.perf_counter() - t0
        create_s[name].append(wall)
        jobs.report(f"[{attempt}] {name}: blocking CREATE ({epochs} epochs)", wall)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--create", action="store_true",
                        help="also blocking CREATE of each MV next to a batch CTAS")
    parser.add_argument("--mvs", nargs="+", choices=list(sb.MVS), default=list(sb.MVS),
                        help="with --create: only these MVs")
    parser.add_argument("--row-groups", type=int, nargs="+", default=[],
                        help="alternate the attempts between files of these row groups")
    args = parser.parse_args()
    MVS_CHOSEN[:] = args.mvs
    variants = args.row_groups or [None]
    spark = build_spark_session(master="local[2]", shuffle_partitions=4, driver_memory="6g",
                                extra_conf={"spark.ui.enabled": "true"})
    jobs = Jobs(spark)
    spark_s: list[float] = []
    engine_v: dict[int | None, list[float]] = {v: [] for v in variants}
    ctas_s: dict[str, list[float]] = {name: [] for name in sb.MVS}
    create_v: dict[int | None, dict[str, list[float]]] = {
        v: {name: [] for name in sb.MVS} for v in variants}
    for attempt in range(args.repeat * len(variants)):
        variant = variants[attempt % len(variants)]
        engine_s, create_s = engine_v[variant], create_v[variant]
        work = Path(tempfile.mkdtemp(prefix="bulk-anatomy-"))
        try:
            df = sb.initial_t(spark, args.rows)
            jobs.mark()
            t0 = time.perf_counter()
            df.write.parquet(str(work / "plain"))
            wall = time.perf_counter() - t0
            spark_s.append(wall)
            jobs.report(f"[{attempt}] Spark writes {args.rows:,} rows as Parquet", wall)
            eng = Engine(work / "warehouse", spark=spark)
            if variant is not None:
                eng.store.file_row_groups = variant
                print(f"[{attempt}] files of {variant} row groups")
            try:
                eng.sql(sb.T_DDL)
                jobs.mark()
                t0 = time.perf_counter()
                eng.insert("t", df)
                insert_s = time.perf_counter() - t0
                jobs.report(f"[{attempt}] Engine.insert", insert_s)
                jobs.mark()
                t0 = time.perf_counter()
                report = eng.step()
                step_s = time.perf_counter() - t0
                jobs.report(f"[{attempt}] step (epoch {report.epoch}, "
                            f"{report.spark_jobs} jobs by the engine's count)", step_s)
                engine_s.append(insert_s + step_s)
                assert eng.read("t").count() == args.rows
                if args.create:
                    create_anatomy(spark, eng, jobs, work, attempt, ctas_s, create_s)
            finally:
                eng.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    spark_med = statistics.median(spark_s)
    for variant in variants:
        label = "" if variant is None else f" [files of {variant} row groups]"
        engine_med = statistics.median(engine_v[variant])
        print(f"\nmedian{label}: Spark's Parquet write {spark_med:.2f} s; insert + step "
              f"{engine_med:.2f} s ({engine_med / spark_med:.1f}x)")
        for name in args.mvs if args.create else ():
            ctas = statistics.median(ctas_s[name])
            create = statistics.median(create_v[variant][name])
            print(f"median{label} {name}: batch CTAS {ctas:.2f} s; blocking CREATE "
                  f"{create:.2f} s ({create / ctas:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
