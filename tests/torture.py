"""``make torture``'s statement fuzzer at scale (issue 35, item 3): ``N`` fuzzed
statements and API calls from seed ``SEED`` (``tests/fuzz.py``) against fresh
warehouses (a new one every ``--per-warehouse`` calls, so a run covers empty and
grown catalogs alike), printing the counts: statements tried, accepted, refused with
a ``SparkfillError``, internal errors (must be 0), warehouses changed by a refused
call (must be 0). Exits 1 when either is not 0, printing each case.

    python tests/torture.py --seed 1 --n 10000
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import shutil
import sys
import tempfile
import time

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)
sys.path.insert(0, os.path.dirname(TESTS_DIR))

from fuzz import Counts, Fuzzer, Limits  # noqa: E402


def merge(total: Counts, part: Counts) -> None:
    for name in ("statements", "api_calls", "accepted", "refused", "steps", "verified"):
        setattr(total, name, getattr(total, name) + getattr(part, name))
    total.by_error.update(part.by_error)
    total.seconds.update(part.seconds)
    total.internal.extend(part.internal)
    total.changed.extend(part.changed)
    total.inexact.extend(part.inexact)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n", type=int, default=10_000, help="statements and API calls")
    ap.add_argument("--per-warehouse", type=int, default=2_000,
                    help="calls against one warehouse before a fresh one")
    ap.add_argument("--step-every", type=int, default=40)
    ap.add_argument("--dir", default=None, help="where the warehouses go (default: a temp dir)")
    args = ap.parse_args(argv)
    # sqlglot warns of each statement it reads as a bare command: noise at this scale
    logging.getLogger("sqlglot").setLevel(logging.ERROR)

    from sparkfill import Engine
    from sparkfill.session import build_spark_session

    spark = build_spark_session(master="local[2]", shuffle_partitions=2)
    root = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="sparkfill-torture-"))
    total = Counts()
    started = time.time()
    print(f"torture: seed {args.seed}, {args.n} statements and API calls, in {root}",
          flush=True)
    part = 0
    done = 0
    cwd = os.getcwd()
    try:
        while done < args.n:
            n = min(args.per_warehouse, args.n - done)
            wh = os.path.join(root, f"wh{part}")
            sinks = os.path.join(root, f"sinks{part}")
            os.makedirs(sinks, exist_ok=True)
            # relative paths (a sink's, a source's) land in the sinks' folder, compared
            os.chdir(sinks)
            with Engine(wh, spark=spark) as eng:
                fuzzer = Fuzzer(eng, args.seed * 1000 + part, sinks,
                                Limits(step_every=args.step_every),
                                log=lambda m: print(m, flush=True))
                fuzzer.setup()
                counts = fuzzer.run(n, progress_every=250)
            merge(total, counts)
            done += n
            part += 1
            os.chdir(root)
            shutil.rmtree(wh, ignore_errors=True)
            shutil.rmtree(sinks, ignore_errors=True)
    finally:
        os.chdir(cwd)
        spark.stop()
    seconds = time.time() - started
    print()
    print(total.problems())
    print(f"torture: seed {args.seed}, {datetime.datetime.now():%Y-%m-%d %H:%M}, "
          f"{platform.node()} ({os.cpu_count()} cores), {seconds:.0f} s, {part} warehouses")
    print(f"torture: statements tried {total.tried} ({total.statements} statements, "
          f"{total.api_calls} API calls)")
    print(f"torture: accepted {total.accepted}")
    print(f"torture: refused with SparkfillError {total.refused} "
          f"({', '.join(f'{k} {v}' for k, v in total.by_error.most_common())})")
    print(f"torture: internal errors {len(total.internal)} (must be 0)")
    print(f"torture: changed warehouses on refusal {len(total.changed)} (must be 0)")
    print(f"torture: epochs {total.steps}; VERIFYs collected {total.verified}, "
          f"inexact {len(total.inexact)} (must be 0)")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if total.internal or total.changed or total.inexact else 0


if __name__ == "__main__":
    sys.exit(main())
