"""Benchmark of steady-state epochs and of a streaming peer (a script, not a test).

One run, one machine; every figure it prints is a ratio of two things measured in
this same run, so the machine's speed (and, mostly, its noise) cancels out.

1. Steady state. A table ``t(id, g, k, v, s)`` of N rows (g: 1,000 values, k in
   [0, 10000), v in [0, 1000)) and a dimension ``d(k, name)`` of 10,000 rows; three
   MVs created together with ``backfill = 'blocking'`` (an aggregate ``agg``, a join
   ``join`` and a filtered projection ``proj``). Then, per C in ``--changes``, epochs
   of C random-key changes to ``t`` (80% upserts: half new ids, half existing ids;
   20% deletes of existing ids): 2 warm-up epochs, then ``--epochs`` measured ones.
   Reported per (N, C):

   - median wall-clock ``step()`` ÷ a full recompute of the three MVs (read a
     Parquet copy of ``t`` and ``d``, run the three queries with ``spark.sql``,
     write each result to Parquet; median of 3) — goal ≤ 0.1 at 4M rows and
     ≤ 0.25 at 1M rows, both with C = 1,000;
   - Spark jobs per epoch (median), counted by Spark's status tracker through a job
     group per epoch, beside the engine's own ``spark_jobs`` when it reports one —
     goal ≤ 8;
   - rows read per epoch (median) per relation (``t``, ``agg``, ``join``, ``proj``)
     and the largest of those per-relation medians over every relation the epochs
     read, ÷ C — goal ≤ 50;
   - exactness: ``Engine.verify`` of each MV at the end is empty.

2. Peer. ``agg`` alone (its own warehouse) under insert-only epochs of 1,000 new
   rows, against a Spark Structured Streaming query of the same SQL over the same
   rows: a Parquet file source (one new file per batch, dropped in by rename),
   RocksDB state store, ``outputMode("update")``, ``foreachBatch`` appending each
   batch's result to Parquet. The initial N rows are the stream's first batch
   (reported against sparkfill's load + create). A batch's time is the wall clock
   from the file's rename to the return of ``processAllAvailable()``: the stream
   polls its folder on its own, so it may start the batch before that call is made;
   timing from the rename counts the whole batch either way (the stream's own
   ``triggerExecution`` duration is reported beside it). Reported: median
   wall-clock ``step()`` ÷ median streaming batch — goal ≤ 1.0 (issue 33, goal 4).

Usage: python bench/steady_bench.py [--rows 1000000 4000000] [--changes 100 1000 10000]
       [--epochs 5] [--out bench/RESULTS.md] [--skip-peer] [--skip-steady]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from sparkfill import Engine
from sparkfill.session import build_spark_session

T_DDL = "CREATE TABLE t (id BIGINT, g INT, k INT, v BIGINT, s STRING, PRIMARY KEY (id))"
D_DDL = "CREATE TABLE d (k INT, name STRING, PRIMARY KEY (k))"
MVS: dict[str, str] = {
    "agg": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx FROM t GROUP BY g",
    "join": "SELECT t.id, t.v, d.name FROM t JOIN d ON t.k = d.k WHERE t.v % 2 = 0",
    "proj": "SELECT id, g, v * 2 AS w FROM t WHERE v % 3 <> 0",
}
RELATIONS = ("t", "agg", "join", "proj")

G_VALUES = 1_000
K_VALUES = 10_000
V_VALUES = 1_000
D_ROWS = 10_000
S_VALUES = 100
WARMUP_EPOCHS = 2
RECOMPUTE_RUNS = 3
PEER_CHANGES = 1_000

#: step ÷ recompute goals, by (N, C)
RATIO_GOALS: dict[tuple[int, int], float] = {(4_000_000, 1_000): 0.1, (1_000_000, 1_000): 0.25}
JOBS_GOAL = 8
ROWS_READ_GOAL = 50  # rows read per touched relation ÷ C
PEER_GOAL = 1.0

T_SCHEMA = T.StructType([
    T.StructField("id", T.LongType()),
    T.StructField("g", T.IntegerType()),
    T.StructField("k", T.IntegerType()),
    T.StructField("v", T.LongType()),
    T.StructField("s", T.StringType()),
])
T_ARROW = pa.schema([("id", pa.int64()), ("g", pa.int32()), ("k", pa.int32()),
                     ("v", pa.int64()), ("s", pa.string())])
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

Row = dict[str, Any]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def on_tables(sql: str, t: str, d: str = "d") -> str:
    """The MV's SQL over other tables (aliased back to ``t`` and ``d``)."""
    sql = re.sub(r"\bFROM t\b", f"FROM {t} AS t", sql)
    return re.sub(r"\bJOIN d\b", f"JOIN {d} AS d", sql)


# --- data -----------------------------------------------------------------------------------


def initial_t(spark: SparkSession, n: int) -> DataFrame:
    """N rows of ``t`` from ``spark.range``; deterministic, so two loads match."""
    idc = F.col("id")
    return spark.range(n).select(
        idc,
        F.pmod(idc, F.lit(G_VALUES)).cast("int").alias("g"),
        F.pmod(F.xxhash64(idc, F.lit(1)), F.lit(K_VALUES)).cast("int").alias("k"),
        F.pmod(F.xxhash64(idc, F.lit(2)), F.lit(V_VALUES)).cast("long").alias("v"),
        F.concat(F.lit("s"), F.pmod(idc, F.lit(S_VALUES)).cast("string")).alias("s"))


def initial_d(spark: SparkSession) -> DataFrame:
    return spark.range(D_ROWS).select(
        F.col("id").cast("int").alias("k"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"))


class Keys:
    """The ids ``t`` holds: ``[0, next_id)`` minus the deleted ones."""

    def __init__(self, n: int, rng: random.Random) -> None:
        self.next_id = n
        self.deleted: set[int] = set()
        self.rng = rng

    def row(self, id_: int) -> Row:
        r = self.rng
        return {"id": id_, "g": r.randrange(G_VALUES), "k": r.randrange(K_VALUES),
                "v": r.randrange(V_VALUES), "s": f"u{r.randrange(S_VALUES)}"}

    def new_ids(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    def existing_ids(self, count: int) -> list[int]:
        """``count`` distinct ids present in ``t``, at random."""
        chosen: set[int] = set()
        while len(chosen) < count:
            id_ = self.rng.randrange(self.next_id)
            if id_ not in self.deleted:
                chosen.add(id_)
        return list(chosen)

    def changes(self, c: int) -> tuple[list[Row], list[Row]]:
        """One epoch's C changes: (upsert rows, delete keys), ids all distinct."""
        upserts = round(0.8 * c)
        new = upserts // 2
        existing = self.existing_ids(upserts - new + c - upserts)
        updated, deleted = existing[:upserts - new], existing[upserts - new:]
        self.deleted.update(deleted)
        rows = [self.row(i) for i in updated + self.new_ids(new)]
        return rows, [{"id": i} for i in deleted]


# --- Spark jobs -----------------------------------------------------------------------------


class JobCounter:
    """Spark jobs run under a job group, as the status tracker sees them."""

    def __init__(self, sc: SparkContext) -> None:
        self.sc = sc
        self.n = 0

    @contextmanager
    def group(self) -> Iterator[str]:
        self.n += 1
        name = f"bench-epoch-{self.n}"
        self.sc.setJobGroup(name, "bench")
        try:
            yield name
        finally:
            self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            self.sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]

    def count(self, name: str) -> int:
        """Jobs of the group, once the listener bus has delivered their events."""
        tracker = self.sc.statusTracker()
        try:
            self.sc._jsc.sc().listenerBus().waitUntilEmpty(30_000)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - internal API; fall back to a stable count
            last, stable = -1, 0
            while stable < 3:
                time.sleep(0.1)
                now = len(tracker.getJobIdsForGroup(name))
                stable, last = (stable + 1, last) if now == last else (0, now)
        return len(tracker.getJobIdsForGroup(name))


def step(eng: Engine, jobs: JobCounter) -> tuple[Any, int, float]:
    """One epoch: its report, the Spark jobs it ran, and the wall-clock seconds of the
    whole ``step()`` call (commit and housekeeping included)."""
    with jobs.group() as name:
        t0 = time.perf_counter()
        report = eng.step()
        wall = time.perf_counter() - t0
    return report, jobs.count(name), wall


def step_until_created(eng: Engine, names: Sequence[str], limit: int = 50) -> int:
    for epochs in range(1, limit + 1):
        eng.step()
        if all(eng.progress(n).state == "created" for n in names):
            return epochs
    raise RuntimeError(f"{list(names)} not created after {limit} epochs")


def load(eng: Engine, spark: SparkSession, n: int, mvs: Sequence[str],
         with_d: bool) -> tuple[float, float, int]:
    """Create and load the tables, then the MVs: (load s, create s, create epochs)."""
    eng.sql(T_DDL)
    if with_d:
        eng.sql(D_DDL)
    t0 = time.perf_counter()
    eng.insert("t", initial_t(spark, n))
    if with_d:
        eng.insert("d", initial_d(spark))
    eng.step()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for name in mvs:
        eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS {MVS[name]}")
    epochs = step_until_created(eng, mvs)
    return load_s, time.perf_counter() - t0, epochs


def exactness(eng: Engine, names: Sequence[str]) -> dict[str, bool]:
    return {name: eng.verify(name).count() == 0 for name in names}


# --- 1. steady state ------------------------------------------------------------------------


@dataclass
class SteadyCase:
    n: int
    c: int
    steps: list[float] = field(default_factory=list)
    tracker_jobs: list[int] = field(default_factory=list)
    engine_jobs: list[int] = field(default_factory=list)
    rows_read: list[dict[str, int]] = field(default_factory=list)

    def read_p50(self, rel: str) -> float:
        return median([r.get(rel, 0) for r in self.rows_read])

    def max_read(self) -> tuple[str, float]:
        rels = sorted({k for r in self.rows_read for k in r} | set(RELATIONS))
        return max(((rel, self.read_p50(rel)) for rel in rels), key=lambda x: x[1])


@dataclass
class SteadyResult:
    n: int
    load_s: float
    create_s: float
    create_epochs: int
    cases: list[SteadyCase] = field(default_factory=list)
    recompute: list[float] = field(default_factory=list)
    exact: dict[str, bool] = field(default_factory=dict)


def recompute(spark: SparkSession, eng: Engine, work: Path) -> list[float]:
    """Seconds of RECOMPUTE_RUNS full recomputes of the MVs from a Parquet copy of the
    committed ``t`` and ``d`` (the copy is not timed)."""
    t_dir, d_dir, out = work / "t.parquet", work / "d.parquet", work / "out"
    eng.read("t").write.mode("overwrite").parquet(str(t_dir))
    eng.read("d").write.mode("overwrite").parquet(str(d_dir))
    runs = []
    for _ in range(RECOMPUTE_RUNS):
        t0 = time.perf_counter()
        spark.read.parquet(str(t_dir)).createOrReplaceTempView("bench_recompute_t")
        spark.read.parquet(str(d_dir)).createOrReplaceTempView("bench_recompute_d")
        for name, sql in MVS.items():
            spark.sql(on_tables(sql, "bench_recompute_t", "bench_recompute_d")) \
                .write.mode("overwrite").parquet(str(out / name))
        runs.append(time.perf_counter() - t0)
    spark.catalog.dropTempView("bench_recompute_t")
    spark.catalog.dropTempView("bench_recompute_d")
    return runs


def steady(args: argparse.Namespace, spark: SparkSession, jobs: JobCounter,
           n: int) -> SteadyResult:
    work = Path(tempfile.mkdtemp(prefix=f"steady-{n}-", dir=args.tmp))
    rng = random.Random(args.seed)
    eng = Engine(work / "warehouse", spark=spark)
    try:
        load_s, create_s, create_epochs = load(eng, spark, n, list(MVS), with_d=True)
        log(f"steady N={n:,}: loaded in {load_s:.1f}s, MVs created in {create_s:.1f}s "
            f"({create_epochs} epoch(s))")
        result = SteadyResult(n, load_s, create_s, create_epochs)
        keys = Keys(n, rng)
        for c in args.changes:
            case = SteadyCase(n, c)
            for i in range(WARMUP_EPOCHS + args.epochs):
                upserts, deletes = keys.changes(c)
                eng.insert("t", upserts)
                eng.delete("t", deletes)
                report, counted, wall = step(eng, jobs)
                engine_jobs = getattr(report, "spark_jobs", None)
                log(f"  N={n:,} C={c:,} epoch {report.epoch}"
                    f"{' (warm-up)' if i < WARMUP_EPOCHS else ''}: {wall:.2f}s, "
                    f"jobs {counted} (engine {engine_jobs}), rows read {report.rows_read}")
                if i < WARMUP_EPOCHS:
                    continue
                case.steps.append(wall)
                case.tracker_jobs.append(counted)
                if engine_jobs is not None:
                    case.engine_jobs.append(int(engine_jobs))
                case.rows_read.append(dict(report.rows_read))
            result.cases.append(case)
        result.recompute = recompute(spark, eng, work)
        log(f"steady N={n:,}: recompute runs {[round(r, 2) for r in result.recompute]}")
        result.exact = exactness(eng, list(MVS))
        log(f"steady N={n:,}: exact {result.exact}")
        return result
    finally:
        eng.close()
        shutil.rmtree(work, ignore_errors=True)


# --- 2. peer: agg alone vs Structured Streaming ---------------------------------------------


@dataclass
class PeerResult:
    n: int
    batches: int
    #: batches each side takes before the measured ones (a new JVM's first minute is
    #: mostly its JIT compiling Spark's code)
    warmup: int = WARMUP_EPOCHS
    sf_load_s: float = math.nan
    sf_create_s: float = math.nan
    sf_steps: list[float] = field(default_factory=list)
    sf_jobs: list[int] = field(default_factory=list)
    sf_exact: bool = False
    ss_first_s: float = math.nan
    ss_batches: list[float] = field(default_factory=list)
    ss_calls: list[float] = field(default_factory=list)
    ss_triggers: list[float] = field(default_factory=list)
    ss_one_batch_each: bool = True
    ss_matches: bool = False


def peer_batches(args: argparse.Namespace, n: int) -> list[list[Row]]:
    """The insert-only batches both sides take: PEER_CHANGES new ids each."""
    keys = Keys(n, random.Random(args.seed + 1))
    return [[keys.row(i) for i in keys.new_ids(PEER_CHANGES)]
            for _ in range(args.peer_warmup + args.epochs)]


def peer_sparkfill(spark: SparkSession, jobs: JobCounter, res: PeerResult,
                   batches: list[list[Row]], work: Path) -> Path:
    """Run sparkfill's side; returns a Parquet copy of the final ``agg``."""
    eng = Engine(work / "warehouse", spark=spark)
    try:
        res.sf_load_s, res.sf_create_s, _ = load(eng, spark, res.n, ["agg"], with_d=False)
        log(f"peer N={res.n:,}: sparkfill loaded in {res.sf_load_s:.1f}s, agg created in "
            f"{res.sf_create_s:.1f}s")
        for i, rows in enumerate(batches):
            eng.insert("t", rows)
            report, counted, wall = step(eng, jobs)
            log(f"  peer sparkfill epoch {report.epoch}"
                f"{' (warm-up)' if i < res.warmup else ''}: {wall:.2f}s, "
                f"jobs {counted}, rows read {report.rows_read}")
            if i >= res.warmup:
                res.sf_steps.append(wall)
                res.sf_jobs.append(counted)
        res.sf_exact = exactness(eng, ["agg"])["agg"]
        final = work / "sparkfill-agg.parquet"
        eng.read("agg").write.mode("overwrite").parquet(str(final))
        return final
    finally:
        eng.close()
        shutil.rmtree(work / "warehouse", ignore_errors=True)


def last_progress(query: StreamingQuery) -> dict[str, Any]:
    """The query's last progress as a plain dict (updated before processAllAvailable
    returns: that waits for the trigger after the batch, which finds no new data)."""
    return dict(query.lastProgress or {})


def trigger_seconds(progress: dict[str, Any] | None) -> float:
    if not progress:
        return math.nan
    return float(progress.get("durationMs", {}).get("triggerExecution", math.nan)) / 1000


def peer_streaming(spark: SparkSession, res: PeerResult, batches: list[list[Row]],
                   work: Path, sparkfill_agg: Path) -> None:
    src, out, ckpt = work / "ss-source", work / "ss-output", work / "ss-checkpoint"
    src.mkdir()
    # the initial N rows: the same rows as sparkfill's load, moved in before the start
    staging = work / "ss-initial"
    initial_t(spark, res.n).write.parquet(str(staging))
    for i, part in enumerate(sorted(staging.glob("part-*.parquet"))):
        os.replace(part, src / f"initial-{i:05d}.parquet")
    shutil.rmtree(staging)

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.readStream.schema(T_SCHEMA).parquet(str(src)).createOrReplaceTempView("bench_ss_t")

    def sink(batch: DataFrame, batch_id: int) -> None:
        batch.withColumn("batch_id", F.lit(batch_id)).write.mode("append").parquet(str(out))

    query = None
    try:
        t0 = time.perf_counter()
        query = (spark.sql(on_tables(MVS["agg"], "bench_ss_t")).writeStream
                 .outputMode("update").foreachBatch(sink)
                 .option("checkpointLocation", str(ckpt)).queryName("bench_ss_agg").start())
        query.processAllAvailable()
        res.ss_first_s = time.perf_counter() - t0
        first = last_progress(query)
        log(f"peer N={res.n:,}: SS first batch {res.ss_first_s:.1f}s "
            f"(batch {first.get('batchId')}, {first.get('numInputRows')} rows)")
        last_id = first.get("batchId", -1)
        for i, rows in enumerate(batches):
            name = f"batch-{i:05d}.parquet"
            tmp = src / f".{name}.tmp"  # the file source skips names starting with . or _
            pq.write_table(pa.Table.from_pylist(rows, schema=T_ARROW), tmp)
            t0 = time.perf_counter()
            os.replace(tmp, src / name)
            t1 = time.perf_counter()
            query.processAllAvailable()
            t2 = time.perf_counter()
            progress = last_progress(query)
            one = (progress.get("batchId") == last_id + 1
                   and progress.get("numInputRows") == len(rows))
            last_id = progress.get("batchId", last_id)
            log(f"  peer SS batch {last_id}{' (warm-up)' if i < res.warmup else ''}: "
                f"{t2 - t0:.2f}s from the drop, {t2 - t1:.2f}s in processAllAvailable, "
                f"trigger {trigger_seconds(progress):.2f}s, "
                f"{progress.get('numInputRows')} rows{'' if one else ' (NOT one batch)'}")
            if i >= res.warmup:
                res.ss_batches.append(t2 - t0)
                res.ss_calls.append(t2 - t1)
                res.ss_triggers.append(trigger_seconds(progress))
                res.ss_one_batch_each &= one
    finally:
        if query is not None:
            query.stop()
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        spark.catalog.dropTempView("bench_ss_t")

    # the stream's final result (each group's row from its latest batch) = sparkfill's agg
    cols = ["g", "c", "sv", "mx"]
    ss = spark.read.parquet(str(out))
    latest = ss.groupBy("g").agg(F.max("batch_id").alias("batch_id"))
    ss_final = ss.join(latest, ["g", "batch_id"]).select(*[F.col(c).cast("long") for c in cols])
    sf_final = spark.read.parquet(str(sparkfill_agg)).select(
        *[F.col(c).cast("long") for c in cols])
    res.ss_matches = (ss_final.exceptAll(sf_final).count() == 0
                      and sf_final.exceptAll(ss_final).count() == 0)


def peer(args: argparse.Namespace, spark: SparkSession, jobs: JobCounter, n: int) -> PeerResult:
    work = Path(tempfile.mkdtemp(prefix=f"peer-{n}-", dir=args.tmp))
    res = PeerResult(n, args.epochs, args.peer_warmup)
    try:
        batches = peer_batches(args, n)
        final = peer_sparkfill(spark, jobs, res, batches, work)
        peer_streaming(spark, res, batches, work, final)
        log(f"peer N={n:,}: sparkfill {median(res.sf_steps):.2f}s, SS "
            f"{median(res.ss_batches):.2f}s, SS result matches: {res.ss_matches}")
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- 3. output ------------------------------------------------------------------------------


def goal(value: float, limit: float) -> str:
    if math.isnan(value):
        return f"≤ {limit:g}: n/a"
    return f"≤ {limit:g}: {'yes' if value <= limit else 'NO'}"


def fmt_rows(value: float) -> str:
    return f"{value:,.0f}"


def exact_cell(exact: dict[str, bool]) -> str:
    if not exact:
        return "n/a"
    wrong = [name for name, ok in exact.items() if not ok]
    return "yes" if not wrong else "NO: " + ", ".join(wrong)


def markdown(args: argparse.Namespace, spark_version: str, load_before: float,
             load_after: float, steady_results: list[SteadyResult],
             peer_results: list[PeerResult]) -> str:
    mem = psutil.virtual_memory().total / 2**30
    lines = [
        f"## Steady state and peer — {dt.date.today().isoformat()}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
        f"Python {platform.python_version()}, Spark {spark_version} master `{args.master}` "
        f"({args.shuffle_partitions} shuffle partitions, driver memory {args.driver_memory}); "
        f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after. "
        "Read ratios, not seconds.",
        "",
    ]
    if steady_results:
        lines += [
            f"Steady state: `t` of N rows (g: {G_VALUES:,} values, k < {K_VALUES:,}, "
            f"v < {V_VALUES:,}), `d` of {D_ROWS:,} rows; MVs "
            + "; ".join(f"{k} = `{v}`" for k, v in MVS.items())
            + ", created with `backfill = 'blocking'`. Per epoch: C changes to `t` (80% "
            "upserts, half new ids and half existing ones; 20% deletes); "
            f"{WARMUP_EPOCHS} warm-up and {args.epochs} measured epochs per C. Step: median "
            "the wall clock of `step()`. Recompute: read a Parquet copy of `t` and `d`, run the "
            f"three queries, write each to Parquet; median of {RECOMPUTE_RUNS}. Jobs: "
            "status tracker by job group (engine's `spark_jobs` in brackets). Rows read: "
            "median per epoch; max ÷ C takes the largest per-relation median over every "
            "relation read. Exact: `verify` of each MV empty at the end.",
            "",
            "| N | C | step p50 (s) | recompute p50 (s) | step ÷ recompute | goal "
            "| Spark jobs / epoch p50 (engine) | goal | rows read / epoch p50 t / agg / join "
            "/ proj | max rows read ÷ C | goal | exact |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in steady_results:
            rc = median(r.recompute)
            for case in r.cases:
                step_p50 = median(case.steps)
                ratio = step_p50 / rc
                limit = RATIO_GOALS.get((r.n, case.c))
                jobs_p50 = median(case.tracker_jobs)
                engine = (f" ({median(case.engine_jobs):g})" if case.engine_jobs else
                          " (not reported)")
                worst_rel, worst = case.max_read()
                per_c = worst / case.c
                reads = " / ".join(fmt_rows(case.read_p50(rel)) for rel in RELATIONS)
                lines.append(
                    f"| {r.n:,} | {case.c:,} | {step_p50:.2f} | {rc:.2f} | {ratio:.3f} "
                    f"| {goal(ratio, limit) if limit is not None else '—'} "
                    f"| {jobs_p50:g}{engine} | {goal(jobs_p50, JOBS_GOAL)} | {reads} "
                    f"| {per_c:.1f} ({worst_rel}) | {goal(per_c, ROWS_READ_GOAL)} "
                    f"| {exact_cell(r.exact)} |")
        lines.append("")
        lines.append("Setup per N: " + "; ".join(
            f"{r.n:,} rows loaded in {r.load_s:.1f}s, MVs created in {r.create_s:.1f}s "
            f"({r.create_epochs} epoch)" for r in steady_results) + ".")
        lines.append("")
    if peer_results:
        lines += [
            f"Peer: `agg` alone vs Spark Structured Streaming (Parquet file source, one "
            f"file per batch; RocksDB state store; update mode; `foreachBatch` appending to "
            f"Parquet), same SQL over the same rows; insert-only batches of "
            f"{PEER_CHANGES:,} new rows, {args.peer_warmup} warm-up and {args.epochs} "
            "measured. SS batch: wall clock from the file's rename to the return of "
            "`processAllAvailable()` (the call alone and the stream's own "
            "`triggerExecution` beside it). First batch: the initial N rows, from "
            "`start()`, against sparkfill's load + create.",
            "",
            "| N | C | sparkfill step p50 (s) | SS batch p50 (s) | step ÷ SS batch | goal "
            "| SS call p50 / trigger p50 (s) | sparkfill jobs / epoch p50 "
            "| sparkfill load + create (s) | SS first batch (s) | exact | SS result "
            "= sparkfill |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in peer_results:
            sf, ss = median(p.sf_steps), median(p.ss_batches)
            ratio = sf / ss
            one = "" if p.ss_one_batch_each else " (not one batch per file!)"
            lines.append(
                f"| {p.n:,} | {PEER_CHANGES:,} | {sf:.2f} | {ss:.2f}{one} | {ratio:.2f} "
                f"| {goal(ratio, PEER_GOAL)} "
                f"| {median(p.ss_calls):.2f} / {median(p.ss_triggers):.2f} "
                f"| {median(p.sf_jobs):g} "
                f"| {p.sf_load_s + p.sf_create_s:.1f} ({p.sf_load_s:.1f} + "
                f"{p.sf_create_s:.1f}) | {p.ss_first_s:.1f} "
                f"| {'yes' if p.sf_exact else 'NO'} | {'yes' if p.ss_matches else 'NO'} |")
    return "\n".join(lines) + "\n"


# --- main -----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    args.tmp = tempfile.mkdtemp(prefix="sparkfill-steady-bench-")
    spark = build_spark_session(master=args.master, shuffle_partitions=args.shuffle_partitions,
                                driver_memory=args.driver_memory,
                                app_name="sparkfill-steady-bench",
                                extra_conf=dict(c.split("=", 1) for c in args.conf))
    jobs = JobCounter(spark.sparkContext)
    steady_results: list[SteadyResult] = []
    peer_results: list[PeerResult] = []
    try:
        for n in args.rows:
            if not args.skip_steady:
                steady_results.append(steady(args, spark, jobs, n))
            if not args.skip_peer:
                peer_results.append(peer(args, spark, jobs, n))
        version = spark.version
    finally:
        spark.stop()
        shutil.rmtree(args.tmp, ignore_errors=True)
    return markdown(args, version, load_before, os.getloadavg()[0], steady_results,
                    peer_results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--changes", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--epochs", type=int, default=5, help="measured epochs per C")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None, help="append the results to this markdown file")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--peer-warmup", type=int, default=WARMUP_EPOCHS,
                        help="peer batches each side takes before the measured ones")
    parser.add_argument("--skip-steady", action="store_true")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra Spark setting of the session (repeatable)")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    if args.skip_peer and args.skip_steady:
        parser.error("nothing to run: both --skip-peer and --skip-steady")
    text = run(args)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
