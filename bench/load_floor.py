"""The floor under a first load that places its rows by vnode (a script, not a test).

A first load (``Engine.insert`` of a DataFrame into an empty table, then ``step()``)
writes the table's files placed by vnode and sorted by key within each file, keeping
the last row of each key: one shuffle, one sort, a window, a write in the store's
row groups (``storage/dml.py``, ``_write_placed``). This script times that write and
its parts stripped away one at a time, next to Spark writing the same DataFrame as
Parquet, all in one session and alternated, so the cost of each layer is a ratio
taken in one run:

- ``plain``: Spark writes the DataFrame (the baseline of issue 32, goal 1);
- ``shuffle``: placed by vnode (the shuffle by file), written in the store's row groups;
- ``sort``: and sorted by vnode and key within each file;
- ``window``: and only the last row of each key kept (what the engine writes);
- ``window_large_groups``: the same in Spark's default row groups.

The engine's own load adds to ``window`` only its checks of the values and the
observation of the rows written (``bulk_anatomy.py`` times the whole).

Usage:
    python bench/load_floor.py [--rows 16000000] [--repeat 3]
        [--variants plain shuffle sort window window_large_groups]
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steady_bench as sb  # noqa: E402

from sparkfill.session import build_spark_session  # noqa: E402
from sparkfill.storage.relation_store import RelationStore  # noqa: E402
from sparkfill.storage.schema import VNODE_COUNT, vnode_sql  # noqa: E402

#: files of a placed load at 4 shuffle partitions (``min(PLACED_FILES, partitions)``)
FILES = 4
#: the store's row groups (``RelationStore.row_group_rows`` at its default file size)
ROW_GROUP_ROWS: int = inspect.signature(RelationStore).parameters["target_file_rows"].default // 5


def _placed(spark: SparkSession, rows: int) -> DataFrame:
    """``t``'s rows with a call-order index and their vnode, shuffled by file."""
    return (sb.initial_t(spark, rows)
            .withColumn("_sf_idx", F.monotonically_increasing_id())
            .withColumn("_vnode", F.expr(vnode_sql(["id"])))
            .withColumn("_f", F.expr(f"CAST(_vnode * {FILES} DIV {VNODE_COUNT} AS INT)"))
            .repartitionById(FILES, F.col("_f")))


def _as_stored(df: DataFrame) -> DataFrame:
    return (df.withColumn("_epoch", F.lit(1).cast("long")).withColumn("_op", F.lit("+"))
            .select("id", "g", "k", "v", "s", "_vnode", "_epoch", "_op"))


def _latest(df: DataFrame) -> DataFrame:
    order = Window.partitionBy("_f", "_vnode", "id").orderBy(F.col("_sf_idx").desc())
    return df.withColumn("_rn", F.row_number().over(order)).where("_rn = 1")


VARIANTS: dict[str, Callable[[SparkSession, int], tuple[DataFrame, int | None]]] = {
    "plain": lambda s, n: (sb.initial_t(s, n), None),
    "shuffle": lambda s, n: (_as_stored(_placed(s, n)), ROW_GROUP_ROWS),
    "sort": lambda s, n: (_as_stored(_placed(s, n).sortWithinPartitions("_vnode", "id")),
                          ROW_GROUP_ROWS),
    "window": lambda s, n: (_as_stored(_latest(_placed(s, n))), ROW_GROUP_ROWS),
    "window_large_groups": lambda s, n: (_as_stored(_latest(_placed(s, n))), None),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                        default=list(VARIANTS))
    args = parser.parse_args()
    spark = build_spark_session(master="local[2]", shuffle_partitions=FILES,
                                driver_memory="6g")
    work = Path(tempfile.mkdtemp(prefix="load-floor-"))
    seconds: dict[str, list[float]] = {v: [] for v in args.variants}
    try:
        for attempt in range(args.repeat):
            for name in args.variants:
                df, row_group_rows = VARIANTS[name](spark, args.rows)
                writer = df.write.mode("overwrite")
                if row_group_rows is not None:
                    writer = writer.option("parquet.block.row.count.limit", str(row_group_rows))
                t0 = time.perf_counter()
                writer.parquet(str(work / name))
                seconds[name].append(time.perf_counter() - t0)
                print(f"[{attempt}] {name}: {seconds[name][-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(seconds["plain"]) if "plain" in seconds else None
    print(f"\n{args.rows:,} rows, medians of {args.repeat}:")
    for name, runs in seconds.items():
        ratio = "" if base is None else f" ({statistics.median(runs) / base:.1f}x plain)"
        print(f"  {name}: {statistics.median(runs):.2f} s{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
