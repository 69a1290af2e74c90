"""The demo: create a materialized view online over a table that keeps changing.

Run with ``make demo`` (or ``python -m sparkfill.demo``). It loads a table of a
few hundred thousand rows, streams random inserts, updates and deletes into it
every epoch, creates an MV with a live progress bar beside the upstream's epoch
time, verifies the MV against Spark's batch query, and prints a summary.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import time
from pathlib import Path

from pyspark.sql import functions as F
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
)
from rich.table import Table

from .engine import Engine

MV_SQL = ("SELECT id, customer, amount * 2 AS doubled, status FROM orders "
          "WHERE amount % 3 <> 0")


def _dml(eng: Engine, rng: random.Random, epoch: int, rows: int, id_space: int) -> None:
    statuses = ["new", "paid", "shipped", "returned"]
    eng.insert("orders", [
        {"id": rng.randrange(id_space), "customer": rng.randrange(5000),
         "amount": rng.randrange(1, 10_000), "status": rng.choice(statuses)}
        for _ in range(rows)])
    eng.delete("orders", [{"id": rng.randrange(id_space)} for _ in range(rows // 5)])
    eng.sql(f"UPDATE orders SET amount = amount + 1, status = 'paid' "
            f"WHERE id % 997 = {epoch % 997}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="sparkfill demo: online MV creation")
    parser.add_argument("--warehouse", default="demo-warehouse")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--dml-rows", type=int, default=500)
    parser.add_argument("--chunk-rows", type=int, default=40_000)
    parser.add_argument("--strategy", default="no_shuffle")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    console = Console()
    rng = random.Random(args.seed)
    shutil.rmtree(args.warehouse, ignore_errors=True)
    started = time.time()
    console.print(f"[bold]sparkfill demo[/bold]: warehouse {Path(args.warehouse).resolve()}")
    with Engine(args.warehouse) as eng:
        spark = eng.spark
        eng.sql("CREATE TABLE orders (id BIGINT, customer INT, amount BIGINT, status STRING, "
                "PRIMARY KEY (id))")
        id_space = int(args.rows * 1.1)
        initial = spark.range(args.rows).select(
            F.col("id"), (F.col("id") * 7919 % 5000).cast("int").alias("customer"),
            (F.col("id") * 104729 % 10_000 + 1).alias("amount"),
            F.element_at(F.array(*[F.lit(s) for s in ("new", "paid", "shipped")]),
                         (F.col("id") % 3 + 1).cast("int")).alias("status"))
        eng.insert("orders", initial)
        report = eng.step()
        console.print(f"loaded {args.rows:,} rows into [cyan]orders[/cyan] at epoch "
                      f"{report.epoch} ({report.seconds:.1f}s)")
        before: list[float] = []
        for _ in range(3):
            _dml(eng, rng, eng.committed_epoch + 1, args.dml_rows, id_space)
            before.append(eng.step().seconds)
        console.print("upstream epoch time without backfill: "
                      f"median {statistics.median(before):.2f}s")

        eng.sql(f"CREATE MATERIALIZED VIEW big_orders WITH (backfill = '{args.strategy}', "
                f"backfill_chunk_rows = {args.chunk_rows}) AS {MV_SQL}")
        console.print(f"CREATE MATERIALIZED VIEW big_orders AS {MV_SQL}")
        during: list[float] = []
        created_at = time.time()
        console.print("progress counts the rows of the upstream snapshot scanned; the MV "
                      "keeps those its WHERE passes")
        columns = (TextColumn("[bold blue]{task.description}"), BarColumn(),
                   MofNCompleteColumn(), TextColumn("{task.fields[rate]:>9,.0f} rows/s"),
                   TextColumn("ETA {task.fields[eta]}"), TextColumn("{task.fields[epoch]}"))
        # a terminal gets a live bar; a pipe or a log file one plain line per epoch
        with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
            task = bar.add_task("big_orders", total=args.rows, rate=0.0, eta="-", epoch="")
            while True:
                _dml(eng, rng, eng.committed_epoch + 1, args.dml_rows, id_space)
                report = eng.step()
                during.append(report.seconds)
                job = eng.progress("big_orders")
                epoch_text = (f"epoch {report.epoch}: {report.seconds:.2f}s, "
                              f"{sum(report.changes.values()):,} changes")
                if console.is_terminal:
                    bar.update(task, total=max(1, job.rows_total_estimate),
                               completed=job.rows_done, rate=job.rows_per_second,
                               eta="-" if job.eta_seconds is None
                               else f"{job.eta_seconds:,.0f}s", epoch=epoch_text)
                else:
                    console.print(f"{epoch_text} | {job.describe()}", highlight=False,
                                  soft_wrap=True)
                if job.state == "created":
                    break
        ready_seconds = time.time() - created_at

        mv = eng.read("big_orders")
        eng.read("orders").createOrReplaceTempView("orders_snapshot")
        batch = spark.sql(MV_SQL.replace("FROM orders", "FROM orders_snapshot"))
        missing = batch.exceptAll(mv).count()
        extra = mv.exceptAll(batch).count()
        rows = mv.count()

        table = Table(title="summary")
        table.add_column("what")
        table.add_column("value", justify="right")
        table.add_row("epochs committed", str(eng.committed_epoch))
        table.add_row("MV rows", f"{rows:,}")
        table.add_row("time to ready", f"{ready_seconds:.1f}s over {len(during)} epochs")
        table.add_row("upstream epoch p50 before / during",
                      f"{statistics.median(before):.2f}s / {statistics.median(during):.2f}s")
        table.add_row("MV = batch query", "yes" if missing == extra == 0 else
                      f"NO: {missing} missing, {extra} extra")
        table.add_row("total demo time", f"{time.time() - started:.0f}s")
        console.print(table)
        return 0 if missing == extra == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
