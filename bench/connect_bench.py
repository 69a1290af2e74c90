"""The same workload on a classic session and on a Spark Connect session, one run.

The parent starts a Spark Connect server from pyspark's own jars (``local[2]``, the
same settings as the tests: ``tests/connect_server.py``) and runs the workload twice,
each in a fresh Python process (a process holds classic or Connect sessions, not
both): first with a classic ``local[2]`` session, then as a Connect client of the
server. The workload: a table of ``--rows`` rows, two MVs over it (an aggregate and a
filtered projection) created online with the default strategy while ``--changes``
random-key changes per epoch flow (80% upserts, 20% deletes), then ``--epochs``
steady epochs; each MV is checked with VERIFY at the end. Reported: time to load,
time to created, median steady epoch and Spark jobs of neither (the server's jobs
are not visible to the client), with the ratio Connect ÷ classic.

    python bench/connect_bench.py [--rows 200000] [--changes 1000] [--epochs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MVS = {
    "agg": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mv FROM t GROUP BY g",
    "proj": "SELECT id, g, v * 2 AS v2 FROM t WHERE v % 3 <> 0",
}


def workload(args: argparse.Namespace, remote: str | None) -> dict[str, object]:
    from pyspark.sql import functions as F

    from sparkfill import Engine
    from sparkfill.session import build_spark_session

    spark = build_spark_session(master="local[2]", shuffle_partitions=args.shuffle_partitions,
                                remote=remote)
    rng = random.Random(7)
    out: dict[str, object] = {"mode": "connect" if remote else "classic"}
    with tempfile.TemporaryDirectory(prefix="sf-connect-bench-") as tmp:
        eng = Engine(Path(tmp) / "wh", spark=spark)
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        t0 = time.perf_counter()
        eng.insert("t", spark.range(args.rows).select(
            F.col("id"), (F.col("id") % 1000).cast("int").alias("g"),
            ((F.col("id") * 7919) % 100000).alias("v")))
        eng.step()
        out["load_s"] = time.perf_counter() - t0

        def changes() -> None:
            n_up = int(args.changes * 0.8)
            eng.insert("t", [{"id": rng.randrange(int(args.rows * 1.1)), "g": rng.randrange(1000),
                              "v": rng.randrange(100000)} for _ in range(n_up)])
            eng.delete("t", [{"id": rng.randrange(args.rows)}
                             for _ in range(args.changes - n_up)])

        t0 = time.perf_counter()
        for name, sql in MVS.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        epochs = 0
        while any(eng.progress(n).state != "created" for n in MVS):
            changes()
            eng.step()
            epochs += 1
        out["create_s"] = time.perf_counter() - t0
        out["create_epochs"] = epochs
        steady = []
        for _ in range(args.epochs):
            changes()
            t0 = time.perf_counter()
            eng.step()
            steady.append(time.perf_counter() - t0)
        out["steady_s"] = statistics.median(steady)
        out["exact"] = all(eng.verify(n).count() == 0 for n in MVS)
        eng.close()
    spark.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=7)
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--child", choices=["classic", "connect"])
    ap.add_argument("--remote")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(workload(args, args.remote if args.child == "connect" else None)))
        return

    from connect_server import ConnectServer

    common = [sys.executable, __file__, "--rows", str(args.rows), "--changes",
              str(args.changes), "--epochs", str(args.epochs), "--shuffle-partitions",
              str(args.shuffle_partitions)]
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    results = []
    with tempfile.TemporaryDirectory(prefix="sf-connect-server-") as tmp, \
            ConnectServer(Path(tmp), shuffle_partitions=args.shuffle_partitions) as server:
        for mode in ("classic", "connect"):
            cmd = common + ["--child", mode] + (["--remote", server.url] if mode == "connect"
                                                else [])
            done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(results[-1], file=sys.stderr, flush=True)
    classic, connect = results
    lines = [
        "| session | load (s) | created (s) | epochs to created | steady epoch (s) | exact |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['mode']} | {r['load_s']:.1f} | {r['create_s']:.1f} | "
                     f"{r['create_epochs']} | {r['steady_s']:.2f} | "
                     f"{'yes' if r['exact'] else 'NO'} |")
    lines.append(f"| Connect ÷ classic | {connect['load_s'] / classic['load_s']:.2f} | "
                 f"{connect['create_s'] / classic['create_s']:.2f} | | "
                 f"{connect['steady_s'] / classic['steady_s']:.2f} | |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + text + "\n")


if __name__ == "__main__":
    main()
