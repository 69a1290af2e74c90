"""Which TPC-DS queries sparkfill accepts: EXPLAIN CREATE MATERIALIZED VIEW of each
of the 103 statements over empty tables, and a tally of the refusal reasons.

    PYTHONPATH=. python bench/tpcds_survey.py [--out survey.json]

Invariant: it only plans (nothing is created), so it runs in seconds per query.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tpcds  # noqa: E402

from sparkfill import Engine  # noqa: E402
from sparkfill.errors import SparkfillError  # noqa: E402
from sparkfill.session import build_spark_session  # noqa: E402


def survey(eng: Engine, names: list[str]) -> dict[str, str | None]:
    """name -> None when accepted, else the refusal (``Error: message``)."""
    qs = tpcds.queries()
    out: dict[str, str | None] = {}
    for name in names:
        try:
            eng.explain(f"CREATE MATERIALIZED VIEW {name} AS {qs[name]}")
            out[name] = None
        except SparkfillError as e:
            out[name] = f"{type(e).__name__}: {e}"
        except Exception as e:  # an internal error is a finding too
            out[name] = f"INTERNAL {type(e).__name__}: {str(e)[:300]}"
    return out


def reason_class(msg: str) -> str:
    return re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "…", msg.split("\n")[0])[:150]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = tpcds.generate(0.01, Path(tmp) / "data")
        spark = build_spark_session(master="local[2]", shuffle_partitions=2)
        eng = Engine(Path(tmp) / "wh", spark=spark)
        import contextlib
        import io

        tpcds.create(eng, data)
        t0 = time.time()
        with contextlib.redirect_stdout(io.StringIO()):
            result = survey(eng, args.only or tpcds.NAMES)
        eng.close()
    tally = collections.Counter(reason_class(m) for m in result.values() if m)
    for name, msg in result.items():
        print(f"{name:5s} {'ok' if msg is None else msg[:200]}")
    print(f"\naccepted {sum(m is None for m in result.values())} of {len(result)} "
          f"({time.time() - t0:.0f} s)")
    for reason, n in tally.most_common():
        print(f"{n:3d}  {reason}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
