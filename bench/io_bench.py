"""Spark's own Parquet path against the pyarrow path (an object store's), one run.

The engine reads and writes a local warehouse with Spark's Parquet source and writer
and an object-store warehouse through pyarrow on the executors (a Python data source
and a ``mapInArrow`` writer: ``sparkfill/storage/object_files.py``). This measures
both on the same local files, so the local default is the faster, and the pyarrow
path once more against an S3-compatible server on loopback (moto), in three
workloads, each the same engine work in each mode:

- load: ``--rows`` rows of the steady benchmark's ``t`` and the three MVs created
  (blocking);
- steady: ``--epochs`` epochs of ``--changes`` random-key changes (80% upserts,
  20% deletes), median ``step()``;
- exact: VERIFY of the three MVs at the end.

Modes run in fresh processes (one Spark session each, ``local[2]``):
``native`` (local folder, Spark's Parquet), ``arrow`` (local folder, the pyarrow
path), ``s3`` (the pyarrow path into a bucket of the loopback server, meta store in
a throwaway PostgreSQL). Reported: seconds and ratios to ``native``.

    python bench/io_bench.py [--rows 200000] [--changes 1000] [--epochs 7]
        [--modes native arrow s3] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

MVS = ("agg", "join", "proj")


def workload(args: argparse.Namespace, mode: str, location: str, meta: str | None) -> dict:
    import steady_bench as sb

    import sparkfill.storage.spark_files as spark_files
    from sparkfill import Engine
    from sparkfill.session import build_spark_session

    if mode == "arrow":  # the object-store path on the local folder
        spark_files.spark_native = lambda warehouse: False  # type: ignore[assignment]
    spark = build_spark_session(master="local[2]", shuffle_partitions=4, driver_memory="4g")
    out: dict[str, object] = {"mode": mode}
    eng = Engine(location, spark=spark, meta=meta)
    try:
        load_s, create_s, _ = sb.load(eng, spark, args.rows, MVS, with_d=True)
        out["load_s"], out["create_s"] = load_s, create_s
        keys = sb.Keys(args.rows, random.Random(7))
        times = []
        for _ in range(args.epochs):
            up, de = keys.changes(args.changes)
            eng.insert("t", up)
            eng.delete("t", de)
            t0 = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t0)
        out["steady_s"] = statistics.median(times[2:] if len(times) > 3 else times)
        out["exact"] = all(eng.verify(name).count() == 0 for name in MVS)
    finally:
        eng.close()
        spark.stop()
    return out


def child(args: argparse.Namespace) -> None:
    if args.mode == "s3":
        from pg_server import pg_server
        from s3_server import S3Server

        with S3Server() as server, pg_server() as url:
            location = f"s3://{server.new_bucket()}/wh"
            print(json.dumps(workload(args, "s3", location, url)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="sf-io-bench-") as tmp:
        print(json.dumps(workload(args, args.mode, str(Path(tmp) / "wh"), None)), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--changes", type=int, default=1_000)
    p.add_argument("--epochs", type=int, default=7)
    p.add_argument("--modes", nargs="+", default=["native", "arrow", "s3"])
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.mode:
        child(args)
        return
    results = []
    for mode in args.modes:
        cmd = [sys.executable, __file__, "--mode", mode, "--rows", str(args.rows),
               "--changes", str(args.changes), "--epochs", str(args.epochs)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode != 0:
            sys.exit(f"{mode} failed:\n{proc.stderr[-4000:]}")
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
        results.append(json.loads(line))
        print(f"{mode}: {results[-1]} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    base = next((r for r in results if r["mode"] == "native"), results[0])
    lines = [
        f"## Parquet paths: Spark's own vs pyarrow (object store) — {time.strftime('%Y-%m-%d')}",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Spark `local[2]`. `bench/io_bench.py`: {args.rows:,} "
        f"rows of `t` (+ `d`), the three MVs created with `blocking`, then {args.epochs} "
        f"epochs of C = {args.changes:,} (median of the last {max(1, args.epochs - 2)}).",
        "",
        "| mode | load (s) | create 3 MVs (s) | steady step (s) | load ÷ native | create ÷ "
        "native | step ÷ native | exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['mode']} | {r['load_s']:.1f} | {r['create_s']:.1f} | {r['steady_s']:.2f} | "
            f"{r['load_s'] / base['load_s']:.2f} | {r['create_s'] / base['create_s']:.2f} | "
            f"{r['steady_s'] / base['steady_s']:.2f} | {'yes' if r['exact'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        with open(args.out, "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
