"""Where a steady epoch's time goes (a script, not a test).

Loads the steady benchmark's tables and MVs (``steady_bench``: ``t`` of N rows, ``d``,
``agg``, ``join``, ``proj``), then runs epochs of C random-key changes and splits each
``step()`` into:

- the Spark jobs' own time: the sum of their durations from submission to completion
  (Spark's status REST API), and their stages (tasks, run time, input rows);
- the driver's Py4J round trips while the epoch builds its plans (a counter wrapped
  around pyspark's Py4J connection: calls and seconds, by the sparkfill line that
  made them), counted over as many further epochs (the counter slows the driver, so
  those epochs are not timed);
- the rest: Catalyst planning before each job, Delta commits, the meta store, the
  driver's own Parquet writes.

Classic sessions only (it reads the Spark UI and Py4J). Usage:
    python bench/epoch_anatomy.py [--rows 1000000] [--changes 1000] [--epochs 3]
        [--profile N] [--rules] [--phases] [--mvs [agg join proj]]
        [--refresh auto|incremental|full] [--update]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import py4j.clientserver as py4j_cs
from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steady_bench as sb  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402


class Py4jCalls:
    """Counts Py4J round trips (and their seconds) by the sparkfill line that made them."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        #: commands by kind (their first two lines: ``c`` a call, ``r u`` the lookup of
        #: a name of the JVM view, ``m d`` a free, ...)
        self.kinds: collections.Counter[str] = collections.Counter()
        #: the JVM view's name lookups (``sc._jvm.X``) by name and sender: the JVM
        #: tries ``Class.forName`` in each package pyspark imports until one holds X
        self.lookups: collections.Counter[str] = collections.Counter()
        #: the JVM's seconds and calls by the method a ``c`` command called (what the
        #: driver waits on: analysis in ``sql``/``selectExpr``, a view's creation, ...)
        self.method_seconds: collections.Counter[str] = collections.Counter()
        self.method_calls: collections.Counter[str] = collections.Counter()
        self.active = False
        original = py4j_cs.ClientServerConnection.send_command
        counter = self

        def send_command(conn: Any, command: str) -> Any:
            if not counter.active:
                return original(conn, command)
            t0 = time.perf_counter()
            try:
                return original(conn, command)
            finally:
                took = time.perf_counter() - t0  # the round trip, not the look below
                where = "(outside sparkfill: e.g. freeing JVM objects)"
                for frame in reversed(traceback.extract_stack(limit=40)):
                    if "/sparkfill/" in frame.filename:
                        where = f"{frame.filename.split('/sparkfill/')[-1]}:{frame.lineno}"
                        break
                counter.calls[where] += 1
                counter.seconds[where] += took
                lines = command.split("\n", 3)
                counter.kinds[" ".join(lines[:2]) if lines[0] in ("r", "m") else lines[0]] += 1
                if lines[0] == "c" and len(lines) > 2:
                    counter.method_seconds[lines[2]] += took
                    counter.method_calls[lines[2]] += 1
                if lines[:2] == ["r", "u"]:
                    counter.lookups[f"{lines[2]} <- {where}"] += 1

        py4j_cs.ClientServerConnection.send_command = send_command  # type: ignore[method-assign]


class QueryPhases:
    """Times each Arrow collect of the engine (``toArrow``: every append's write of a
    small Δ goes through one) in its phases — the JVM's optimization and physical
    planning of its plan, then its execution (code generation, broadcasts, jobs) —
    by the sparkfill line that made it."""

    def __init__(self) -> None:
        from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

        self.seconds: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)
        self.active = False
        original = ClassicFrame.toArrow
        phases = self

        def to_arrow(df: Any) -> Any:
            if not phases.active:
                return original(df)
            where = next((f"{f.filename.split('/sparkfill/')[-1]}:{f.lineno}"
                          for f in reversed(traceback.extract_stack(limit=40))
                          if "/sparkfill/" in f.filename), "?")
            qe = df._jdf.queryExecution()
            qe.analyzed()
            t0 = time.perf_counter()
            qe.optimizedPlan()
            t1 = time.perf_counter()
            qe.executedPlan()
            t2 = time.perf_counter()
            out = original(df)
            phases.seconds[where].append((t1 - t0, t2 - t1, time.perf_counter() - t2))
            return out

        ClassicFrame.toArrow = to_arrow  # type: ignore[method-assign]

    def report(self, epochs: int) -> None:
        print("\nArrow collects per epoch (median seconds: optimize / plan / execute):")
        for where, runs in sorted(self.seconds.items()):
            medians = [statistics.median(r[k] for r in runs) for k in range(3)]
            print(f"  {len(runs) / epochs:4.1f} x  {medians[0]:.3f} / {medians[1]:.3f} / "
                  f"{medians[2]:.3f}  {where}")


def session_with_status_api() -> tuple[SparkSession, Callable[[str], Any]]:
    """The benchmark's classic session with its UI on, and a reader of Spark's status
    REST API for its application (``api("jobs")``, ``api(f"stages/{id}")``)."""
    spark = build_spark_session(master="local[2]", shuffle_partitions=4, driver_memory="6g",
                                extra_conf={"spark.ui.enabled": "true"})
    ui = spark.sparkContext.uiWebUrl
    app = json.load(urllib.request.urlopen(f"{ui}/api/v1/applications"))[0]["id"]

    def api(path: str) -> Any:
        return json.load(urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/{path}"))

    return spark, api


def job_seconds(job: dict[str, Any]) -> float:
    """A job's seconds from submission to completion, from Spark's status API."""
    def at(key: str) -> datetime:
        return datetime.strptime(job[key].replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")

    return (at("completionTime") - at("submissionTime")).total_seconds()


def print_jobs(api: Callable[[str], Any], jobs: list[dict[str, Any]]) -> None:
    """Each finished job of ``jobs`` (from ``api("jobs")``) and its completed stages:
    tasks, run time, input, shuffle read and written rows. A stage the status API no
    longer holds (skipped, or past its retention) is left out."""
    for j in jobs:
        if not j.get("completionTime"):
            continue
        print(f"  job {j['jobId']} {job_seconds(j):.2f} s, {len(j['stageIds'])} stages: "
              f"{j['name'][:80]}")
        for sid in sorted(j["stageIds"]):
            try:
                s = api(f"stages/{sid}")[0]
            except urllib.error.HTTPError:
                continue
            if s["status"] == "COMPLETE":
                print(f"    stage {sid}: {s['numTasks']} tasks, run "
                      f"{s.get('executorRunTime', 0)} ms, input "
                      f"{s.get('inputRecords', 0):,} rows, shuffle read "
                      f"{s.get('shuffleReadRecords', 0):,} rows, written "
                      f"{s.get('outputRecords', 0):,}")


def rule_executor(spark: SparkSession) -> Any:
    """Catalyst's rule executor object (its time per rule, summed over every plan)."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    return getattr(getattr(jvm.org.apache.spark.sql.catalyst.rules, "RuleExecutor$"), "MODULE$")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile the timed epochs (cProfile) and print the N "
                        "functions of most own time and of most cumulative time")
    parser.add_argument("--profile-dump", type=Path, default=None,
                        help="also write the timed epochs' profile to this file (pstats)")
    parser.add_argument("--rules", action="store_true",
                        help="also print Catalyst's time per rule over the timed epochs "
                        "(analysis and optimization of every plan the driver builds)")
    parser.add_argument("--phases", action="store_true",
                        help="also time each Arrow collect's optimization, planning and "
                        "execution in the timed epochs")
    parser.add_argument("--mvs", nargs="*", choices=list(sb.MVS), default=list(sb.MVS),
                        help="the MVs to create (default: all three; none: the table's "
                        "own epoch alone)")
    parser.add_argument("--refresh", choices=["auto", "incremental", "full"], default=None,
                        help="set every MV's refresh mode (default: as created, auto)")
    parser.add_argument("--update", action="store_true",
                        help="make each epoch a bulk UPDATE t SET v = v + 1 (every row "
                        "changes) in place of C random-key changes")
    parser.add_argument("--inserts", action="store_true",
                        help="make each epoch C inserts of new ids (the peer's epochs) in "
                        "place of C random-key changes")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile or args.profile_dump else None
    spark, api = session_with_status_api()
    work = Path(tempfile.mkdtemp(prefix="anatomy-"))
    eng = Engine(work / "warehouse", spark=spark)
    calls = Py4jCalls()
    phases = QueryPhases() if args.phases else None
    keys = sb.Keys(args.rows, random.Random(7))
    try:
        sb.load(eng, spark, args.rows, args.mvs, with_d="join" in args.mvs)
        for name in args.mvs if args.refresh else ():
            eng.sql(f"ALTER MATERIALIZED VIEW {name} SET refresh = '{args.refresh}'")
        walls, job_secs = [], []
        timed = range(2, 2 + args.epochs)  # after two warm-ups; then the counted ones
        for i in range(2 + 2 * args.epochs):
            if args.update:
                eng.sql("UPDATE t SET v = v + 1")
            elif args.inserts:
                eng.insert("t", [keys.row(k) for k in keys.new_ids(args.changes)])
            else:
                upserts, deletes = keys.changes(args.changes)
                eng.insert("t", upserts)
                eng.delete("t", deletes)
            before = max((j["jobId"] for j in api("jobs")), default=-1)
            calls.active = i >= timed.stop
            profiling = profile is not None and i in timed
            if args.rules and i == timed.start:
                rule_executor(spark).resetMetrics()
            if profiling:
                profile.enable()
            if phases is not None:
                phases.active = i in timed
            t0 = time.perf_counter()
            report = eng.step()
            wall = time.perf_counter() - t0
            if profiling:
                profile.disable()
            calls.active = False
            if phases is not None:
                phases.active = False
            if i not in timed:
                continue
            time.sleep(1.0)  # the status store catches up
            jobs = sorted((j for j in api("jobs") if j["jobId"] > before),
                          key=lambda j: j["jobId"])
            spent = sum(job_seconds(j)
                        for j in jobs)
            walls.append(wall)
            job_secs.append(spent)
            print(f"epoch {report.epoch}: step {wall:.2f} s, {len(jobs)} Spark jobs "
                  f"{spent:.2f} s, rows read {report.rows_read}")
            print_jobs(api, jobs)
        n = args.epochs
        total_calls = sum(calls.calls.values())
        print(f"\nmedian step {statistics.median(walls):.2f} s; Spark jobs "
              f"{statistics.median(job_secs):.2f} s; outside jobs "
              f"{statistics.median(w - j for w, j in zip(walls, job_secs, strict=True)):.2f} s")
        print(f"Py4J round trips per epoch: {total_calls / n:,.0f} "
              f"({sum(calls.seconds.values()) / n:.2f} s waiting on the JVM, "
              "blocking job calls included)")
        for where, k in calls.calls.most_common(40):
            print(f"  {k / n:6,.0f} calls {calls.seconds[where] / n:6.3f} s  {where}")
        print("by command: " + ", ".join(f"{kind!r} {k / n:,.0f}"
                                         for kind, k in calls.kinds.most_common()))
        print("the JVM's calls per epoch by method (seconds, calls):")
        for method, secs in calls.method_seconds.most_common(20):
            print(f"  {secs / n:6.3f} s {calls.method_calls[method] / n:5.1f}  {method}")
        print("the JVM view's name lookups per epoch, by name and sender:")
        for what, k in calls.lookups.most_common(25):
            print(f"  {k / n:6,.1f}  {what}")
        if phases is not None:
            phases.report(n)
        if args.rules:
            print("\nCatalyst over the timed epochs (and the counted ones after them):")
            print(rule_executor(spark).dumpTimeSpent())
        if profile is not None and args.profile_dump is not None:
            profile.dump_stats(str(args.profile_dump))
        if profile is not None and args.profile:
            for order in ("tottime", "cumulative"):
                print(f"\nprofile of the timed epochs by {order}:")
                pstats.Stats(profile).sort_stats(order).print_stats(args.profile)
    finally:
        eng.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
