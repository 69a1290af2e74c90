"""The ``sparkfill`` command line: ``demo``, ``sql`` and ``status``.

Invariant: ``status`` only reads (the meta store, opened read-only, without the
writer lock), so it is safe beside a running engine; the other commands open
the warehouse as its writer.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .errors import SparkfillError

__all__ = ["main"]


def _status(warehouse: Path, console: Console) -> int:
    meta = warehouse / "meta.sqlite"
    if not meta.exists():
        console.print(f"[red]error:[/red] {warehouse} is not a sparkfill warehouse")
        return 2
    conn = sqlite3.connect(f"file:{meta}?mode=ro", uri=True)
    committed = conn.execute("SELECT value FROM kv WHERE key = 'committed_epoch'").fetchone()
    console.print(f"warehouse {warehouse}: committed epoch {committed[0] if committed else 0}")
    table = Table("name", "kind", "strategy", "state", "rows", "backfilled rows", "vnodes done")
    for rel_id, name, kind, state, rows, definition in conn.execute(
            "SELECT id, name, kind, state, row_count, definition FROM relations ORDER BY id"):
        options = json.loads(definition).get("options") or {}
        done, vnodes = conn.execute(
            "SELECT COALESCE(SUM(rows), 0), COALESCE(SUM(state = 'done' AND vnode >= 0), 0) "
            "FROM backfill_progress WHERE mv_id = ?", (rel_id,)).fetchone()
        if kind == "mv" and state == "creating":
            state = "paused" if options.get("rate_limit") == 0 else "backfilling"
            if options.get("strategy") != "arrangement":
                vnodes = 256 if state == "created" else 0
        elif kind == "mv":
            vnodes = 256
        table.add_row(name, kind, options.get("strategy", ""), state, f"{rows:,}",
                      f"{done:,}" if kind == "mv" else "", str(vnodes) if kind == "mv" else "")
    console.print(table)
    conn.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkfill",
                                     description="incremental materialized views on Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo (online MV creation with live progress)")
    demo.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the demo")
    sql = sub.add_parser("sql", help="run one statement against a warehouse")
    sql.add_argument("warehouse", type=Path)
    sql.add_argument("statement")
    status = sub.add_parser("status", help="print a warehouse's relations and jobs (read-only)")
    status.add_argument("warehouse", type=Path)
    args = parser.parse_args(argv)
    console = Console()
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(args.args)
    if args.command == "status":
        return _status(args.warehouse, console)
    from .engine import Engine

    try:
        with Engine(args.warehouse) as eng:
            result = eng.sql(args.statement)
            if result is not None:
                result.show(truncate=False)
    except SparkfillError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
