"""TPC-DS as incremental MVs: for each of the 103 statements of the 99 queries,
accepted or the refusal; for each accepted one, created online with the default
strategy over the tables it reads (``tpcgen-cli`` data at scale 0.01) while
refresh rounds insert, update and delete fact rows; checked against Spark's batch
query at every epoch once created. Reports the time until created, the steady
epoch time (median of the epochs after it was created) next to the batch query's time
over the same snapshot, and appends a table to bench/RESULTS.md.

    PYTHONPATH=. python bench/tpcds_bench.py [--only q3 q7 ...] [--epochs 4] [--no-append]

Invariant: the statements run one after another in one warehouse (each created,
checked, then dropped: no other MV's job shares its epochs; the tables' history
grows); a difference from the batch query is reported, never hidden.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tpcds  # noqa: E402
from helpers import assert_same_rows  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.errors import SparkfillError  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def run_one(eng: Engine, spark, refresh: tpcds.Refresh, name: str, sql: str, epochs: int,
            limit: int) -> dict:
    """CREATE ``name`` online in ``eng`` (its tables loaded), step with refresh
    rounds until created and checked at ``epochs`` epochs, then DROP it."""
    try:
        eng.explain(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    except SparkfillError as e:
        return {"name": name, "refused": f"{type(e).__name__}: {e}".split("\n")[0]}
    t0 = time.time()
    created_s = None
    steady: list[float] = []
    batch_s: list[float] = []
    checked = 0
    ansi_off = False
    try:
        eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill_chunk_rows = 1000000) "
                f"AS {sql}")
        for _ in range(limit):
            refresh.apply(eng, 6)
            report = eng.step()
            if eng.progress(name).state != "created":
                continue
            if created_s is None:
                created_s = time.time() - t0
            else:
                steady.append(report.seconds)
            b0 = time.time()
            ansi_off |= check(spark, eng, name, sql, report.epoch)
            batch_s.append(time.time() - b0)
            checked += 1
            if checked >= epochs:
                break
        return {"name": name, "created_s": created_s, "checked": checked, "ansi_off": ansi_off,
                "steady_s": statistics.median(steady) if steady else None,
                "batch_s": statistics.median(batch_s) if batch_s else None}
    except AssertionError as e:
        print(e, flush=True)  # the whole difference, rows included
        return {"name": name, "error": "DIFFERS: " + str(e).split("\n")[0]}
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        print(f"{name}: {type(e).__name__}: {e}", flush=True)
        return {"name": name, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        try:
            eng.sql(f"DROP MATERIALIZED VIEW IF EXISTS {name}")
        except SparkfillError:
            pass


#: Spark's errors of a division or an overflow under ANSI mode, where an MV's
#: ``try_divide`` holds NULL (README: "a division a / b is try_divide(a, b)")
ANSI_ERRORS = ("DIVIDE_BY_ZERO", "ARITHMETIC_OVERFLOW", "NUMERIC_VALUE_OUT_OF_RANGE")


def check(spark, eng: Engine, name: str, sql: str, epoch: int) -> bool:
    """The MV ``name`` at ``epoch`` against Spark's batch query; where Spark's query
    raises a division's error over this data (ANSI mode), against the same query with
    ANSI mode off, whose division gives NULL there as the MV's ``try_divide`` does.
    Returns whether ANSI mode had to be off."""
    got = eng.read(name, as_of=epoch)
    label = f"TPC-DS {name} at epoch {epoch}"
    try:
        want = tpcds.batch(spark, eng, sql, epoch)
        want.collect()
    except Exception as e:  # noqa: BLE001 - only the division's errors are tolerated
        if not any(code in str(e) for code in ANSI_ERRORS):
            raise
        ansi = spark.conf.get("spark.sql.ansi.enabled")
        spark.conf.set("spark.sql.ansi.enabled", "false")
        try:
            assert_same_rows(got, tpcds.batch(spark, eng, sql, epoch),
                             label=f"{label} (Spark's query with ANSI mode off)")
        finally:
            spark.conf.set("spark.sql.ansi.enabled", ansi)
        return True
    assert_same_rows(got, want, label=label)
    return False


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--limit", type=int, default=15)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    queries = tpcds.queries()
    names = args.only or tpcds.NAMES
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    spark = build_spark_session(master="local[2]", shuffle_partitions=2)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = tpcds.generate(0.01, Path(tmp) / "data")
        tables = sorted({t for n in names for t in tpcds.tables_of(queries[n])})
        eng = Engine(Path(tmp) / "wh", spark=spark)
        try:
            tpcds.create(eng, data, tables)
            tpcds.load(eng, spark, data, tables)
            eng.step()
            refresh = tpcds.Refresh(spark, data, tables, seed=11)
            for name in names:
                r = run_one(eng, spark, refresh, name, queries[name], args.epochs, args.limit)
                rows.append(r)
                print(r, flush=True)
        except KeyboardInterrupt:  # (SIGTERM too, below): report what ran
            print(f"stopped after {len(rows)} of {len(names)}", flush=True)
        finally:
            eng.close()
    ok = [r for r in rows if "checked" in r and r["checked"] > 0]
    refused = [r for r in rows if "refused" in r]
    lines = ["", "## TPC-DS as incremental MVs (2026-11-28)", "",
             "`bench/tpcds_bench.py`: each statement of Spark's 99 TPC-DS queries (103 "
             "statements) over `tpcgen-cli` data at scale 0.01, created online (default "
             "strategy) while refresh rounds insert, update and delete fact rows, checked "
             "against Spark's batch query at every epoch once created. Machine: 2 cores, "
             "24 GiB, shared load.", "",
             f"Ran {len(rows)} of {len(names)}: exact {len(ok)}, refused {len(refused)}, other "
             f"{len(rows) - len(ok) - len(refused)}.", "",
             "| statement | result | created (s) | steady epoch (s) | batch query (s) |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            result = "refused: " + r["refused"][:120].replace("|", "\\|")
        elif "error" in r:
            result = r["error"][:120].replace("|", "\\|")
        else:
            result = f"exact ({r['checked']} epochs)" if r["checked"] else "not created"
            if r.get("ansi_off"):
                result += ", against Spark's query with ANSI mode off (with it, it divides by 0)"
        lines.append(f"| {r['name']} | {result} | {fmt(r.get('created_s'))} | "
                     f"{fmt(r.get('steady_s'))} | {fmt(r.get('batch_s'))} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_append:
        with RESULTS.open("a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
