"""The ``sparkfill`` command line: ``run``, ``sql``, ``status`` (``--json``), ``ui`` and
``demo``.

Invariant: ``status`` and ``ui`` only read (the meta store, opened read-only, without
the writer lock; never Spark), so they are safe beside a running engine; ``run`` and ``sql`` open
the warehouse as its writer. ``run`` checks the whole file (parsed, then every
statement planned against the catalog it would build) before the first statement
runs, and a re-run of the same file resumes after the last statement that ran.
Exit codes: 0 done, 1 a statement, its check or the engine
failed (the ``SparkfillError`` message is printed), 2 bad arguments (argparse's
own, a missing file or warehouse), 130 aborted by a second Ctrl-C.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import SparkfillError
from .storage.warehouse import Warehouse
from .ui.facts import status_facts

__all__ = ["main", "status_facts"]


def _meta_of(args: argparse.Namespace) -> str | None:
    """The meta store a command opens: ``--meta``, else the PostgreSQL URL the
    warehouse records (libpq then finds a password in ``PGPASSWORD`` or
    ``~/.pgpass``), else None (its SQLite ``meta.sqlite``)."""
    from .storage.meta_store import recorded_meta

    return args.meta if args.meta is not None else recorded_meta(args.warehouse)


def _warehouse(text: str) -> Warehouse:
    """A command's warehouse argument: a folder or an object-store URI."""
    try:
        return Warehouse(text)
    except SparkfillError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    """A TCP port number (0: any free port)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return port


def _open_meta(warehouse: Warehouse, meta_url: str | None) -> Any:
    """The warehouse's meta store, opened read-only (no writer lock)."""
    from .ui.facts import open_meta

    return open_meta(warehouse, meta_url)


def _status(args: argparse.Namespace, console: Console) -> int:
    try:
        meta = _open_meta(args.warehouse, _meta_of(args))
    except SparkfillError as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}))
        else:
            console.print(f"[red]error:[/red] {exc}")
        return 2
    try:
        facts = status_facts(meta, args.warehouse)
    finally:
        meta.close()
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        _print_status(facts, console)
    return 0


def _ui(args: argparse.Namespace, console: Console) -> int:
    from .ui.server import UiServer

    try:
        server = UiServer(args.warehouse, _meta_of(args), host=args.host, port=args.port)
    except SparkfillError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    console.print(f"sparkfill ui: [bold]{server.url}[/bold] — warehouse {args.warehouse} "
                  "(read-only; Ctrl-C stops)", highlight=False, soft_wrap=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]note:[/yellow] listening on {args.host}: anyone who can reach "
                      "it sees the warehouse's names, counts and warnings", highlight=False)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0


def _print_status(facts: dict[str, Any], console: Console) -> None:
    console.print(f"warehouse {facts['warehouse']}: committed epoch "
                  f"{facts['committed_epoch']}")
    table = Table("name", "kind", "strategy", "state", "rows", "backfilled rows", "vnodes done")
    for rel in facts["relations"]:
        is_mv = rel["kind"] == "mv"
        table.add_row(rel["name"], rel["kind"], rel["strategy"] or "", rel["state"],
                      f"{rel['rows']:,}", f"{rel['backfilled_rows']:,}" if is_mv else "",
                      str(rel["vnodes_done"]) if is_mv else "")
    console.print(table)
    if facts.get("jobs"):
        out = Table("creating", "strategy", "phase", "done", "rows/s", "ETA", "rate limit")
        for job in facts["jobs"]:
            eta = job["eta_seconds"]
            state = " (stalled)" if job["stalled"] else " (paused)" if job["paused"] else ""
            out.add_row(job["name"], job["strategy"], job["phase"] + state,
                        f"{job['percent']:.1f}% of {job['rows_total_estimate']:,}",
                        f"{job['rows_per_second']:,.0f}", "" if eta is None else f"{eta:,.0f}s",
                        "" if job["rate_limit"] is None else f"{job['rate_limit']:,}")
        console.print(out)
    if facts["sources"]:
        out = Table("source", "connector", "last epoch", "batches", "offset", "rows",
                    "dead letters")
        for src in facts["sources"]:
            position = src["position"]
            shown = "" if position is None else (
                position if isinstance(position, str) else json.dumps(position))
            dead = src["dead_letters"]
            out.add_row(src["name"], src["connector"], str(src["last_epoch"]),
                        str(src["batches"]), shown, f"{src['rows']:,}",
                        "" if dead is None else f"{dead:,}")
        console.print(out)
    if facts["sinks"]:
        out = Table("sink", "from", "connector", "path", "epoch written")
        for sink in facts["sinks"]:
            written = sink["epoch_written"]
            out.add_row(sink["name"], sink["from"], sink["connector"], sink["path"],
                        "" if written is None else str(written))
        console.print(out)
    if facts.get("verified"):
        out = Table("sampled VERIFY of", "epoch", "sample", "differing rows")
        for v in facts["verified"]:
            found = v["differences"]
            out.add_row(v["name"], str(v["epoch"]), f"{v['sample']:.2%}",
                        f"[red]{found:,}[/red]" if found else "0")
        console.print(out)


def _frame_table(df: Any, limit: int) -> tuple[Table, bool]:
    """A rich table of at most ``limit`` rows of a DataFrame; whether rows were cut."""
    rows = df.limit(limit + 1).collect()
    table = Table(*df.columns)
    for r in rows[:limit]:
        table.add_row(*["NULL" if v is None else str(v) for v in r])
    return table, len(rows) > limit


def _print_frame(console: Console, df: Any, limit: int) -> None:
    table, cut = _frame_table(df, limit)
    console.print(table)
    if cut:
        console.print(f"[dim](first {limit} rows)[/dim]")


def _print_result(console: Console, statement: str, result: Any, limit: int) -> None:
    """A statement's result; VERIFY's says in words whether the MV is exact."""
    if re.match(r"\s*VERIFY\b", statement, re.IGNORECASE):
        differing = result.count()
        if differing == 0:
            console.print("exact (0 differing rows)")
            return
        console.print(f"[red]NOT exact: {differing:,} differing rows[/red] (side 'missing': "
                      "in the batch result, not in the MV; 'extra': the other way round)")
    _print_frame(console, result, limit)


def _show_without_spark(args: argparse.Namespace, console: Console) -> bool:
    """Answer a SHOW or an EXPLAIN MATERIALIZED VIEW from the meta store (read-only,
    beside any writer) without starting Spark; False for any other statement."""
    from .sql.frontend import ExplainExisting, Show, parse_statement
    from .storage.catalog import Catalog
    from .storage.meta_store import META_FILE
    from .storage.metadata import SHOW_COLUMNS, explain_existing, show_rows

    cmd = parse_statement(args.statement)
    wh = args.warehouse
    exists = any(wh.is_file(wh.join(name)) for name in ("meta.sqlite", META_FILE))
    if not isinstance(cmd, Show | ExplainExisting) or not exists:
        return False
    meta = _open_meta(args.warehouse, _meta_of(args))
    try:
        if isinstance(cmd, ExplainExisting):
            console.print(explain_existing(Catalog(meta), cmd.name), highlight=False,
                          soft_wrap=True)
            return True
        rows = show_rows(cmd.what, meta, Catalog(meta))
    finally:
        meta.close()
    table = Table(*[name for name, _ in SHOW_COLUMNS[cmd.what]])
    for r in rows[:args.limit]:
        table.add_row(*["NULL" if v is None else str(v) for v in r])
    console.print(table)
    if len(rows) > args.limit:
        console.print(f"[dim](first {args.limit} rows)[/dim]")
    return True


def _sql(args: argparse.Namespace, console: Console, spark: Any) -> int:
    from .engine import Engine

    wh = args.warehouse
    if wh.local_path is not None and not wh.local_path.is_dir():
        console.print(f"[red]error:[/red] warehouse {wh} is not a directory")
        return 2
    try:
        if _show_without_spark(args, console):
            return 0
        with Engine(args.warehouse.uri, spark=spark, meta=_meta_of(args)) as eng:
            result = eng.sql(args.statement)
            if result is not None:
                _print_result(console, args.statement, result, args.limit)
            else:
                console.print("ok")
    except SparkfillError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 1
    return 0


def _creating_upstreams(eng: Any, command: Any) -> list[str]:
    """Creating MVs a statement reads (it must wait for them): the upstreams of a
    CREATE MATERIALIZED VIEW, the MV a VERIFY checks, the relations a query reads."""
    from sqlglot import exp

    from .sql.frontend import CreateMaterializedView, Query, Verify

    if isinstance(command, CreateMaterializedView):
        names = [t.name for t in command.query.find_all(exp.Table)]
    elif isinstance(command, Verify):
        names = [command.name]
    elif isinstance(command, Query):
        names = [t.name for t in command.tree.find_all(exp.Table)]
    else:
        return []
    waiting = []
    for name in names:
        rel = eng.catalog.find(name)
        if rel is not None and rel.kind == "mv" and rel.state != "created" \
                and rel.name not in waiting:
            waiting.append(rel.name)
    return waiting


def _created(eng: Any, command: Any) -> bool:
    return not _creating_upstreams(eng, command)


def _ran(eng: Any, resume_key: str, index: int) -> None:
    """Record that the pipeline's first ``index`` statements ran."""
    with eng.meta.transaction() as conn:
        eng.meta.put(conn, resume_key, str(index))


def _run(args: argparse.Namespace, console: Console, spark: Any) -> int:
    from .pipelines.pipeline import parse_pipeline

    path: Path = args.pipeline
    if not path.is_file():
        console.print(f"[red]error:[/red] pipeline file {path} does not exist")
        return 2
    try:
        statements = parse_pipeline(path.read_text(), str(path))
    except SparkfillError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 1
    from .engine import Engine
    from .pipelines.live import EpochLoop, stop_on_signals
    from .pipelines.pipeline_check import check_pipeline

    stop = threading.Event()
    text = path.read_text()
    fresh = not args.warehouse.exists(args.warehouse.uri)
    resume_key = f"pipeline:{hashlib.sha256(text.encode()).hexdigest()}"
    try:
        with Engine(args.warehouse.uri, spark=spark, meta=_meta_of(args)) as eng, \
                stop_on_signals(stop, console):
            # a re-run of the same file resumes after the last statement it ran
            done = int(eng.meta.get(resume_key) or 0)
            todo = statements[done:]
            try:
                check_pipeline(eng, todo, str(path))
            except SparkfillError:
                if fresh:  # a warehouse created only to check a failing pipeline
                    eng.close()
                    args.warehouse.rmtree(args.warehouse.uri)
                raise
            if args.check:
                console.print(f"ok: {len(todo)} statements of {path} checked"
                              + (f" (the first {done} already ran)" if done else ""))
                return 0
            if done:
                console.print(f"[dim]{path.name}: resuming after statement {done} (line "
                              f"{statements[done - 1].line})[/dim]")
            loop = EpochLoop(eng, console, args.interval, stop)
            for index, st in enumerate(todo, start=done + 1):
                if stop.is_set():
                    break
                if st.step is not None:
                    console.print(f"[dim]{path.name}:{st.line}[/dim] STEP {st.step}")
                    loop.run(epochs=st.step)
                    if stop.is_set():
                        break
                    _ran(eng, resume_key, index)
                    continue
                waiting = _creating_upstreams(eng, st.command)
                if waiting:
                    console.print(f"[dim]{path.name}:{st.line}[/dim] waiting for "
                                  f"{', '.join(waiting)} to be created", soft_wrap=True)
                    loop.run(until=functools.partial(_created, eng, st.command))
                    if stop.is_set():
                        break
                console.print(f"[dim]{path.name}:{st.line}[/dim] {st.summary}",
                              highlight=False, soft_wrap=True)
                try:
                    result = eng.sql(st.text)
                except SparkfillError as exc:
                    console.print(f"[red]error:[/red] {path}:{st.line}: {exc}", highlight=False)
                    return 1
                _ran(eng, resume_key, index)
                if result is not None:
                    _print_result(console, st.text, result, 50)
            if not stop.is_set():
                loop.run(epochs=args.epochs, until_idle=args.until_idle)
            stopped = " (stopped)" if stop.is_set() else ""
            console.print(f"done{stopped}: {loop.totals.epochs} epochs this run, committed "
                          f"epoch {eng.committed_epoch}")
            for name, n in loop.totals.source_rows.items():
                dead = loop.totals.dead_letters.get(name)
                console.print(f"  {name}: {n:,} rows" + (f", {dead:,} dead letters"
                                                         if dead else ""))
    except SparkfillError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 1
    except KeyboardInterrupt:
        console.print("[red]aborted[/red]")
        return 130
    return 0


def _parser() -> argparse.ArgumentParser:
    from . import __version__
    from .session import LOGS_ENV

    parser = argparse.ArgumentParser(prog="sparkfill",
                                     description="incremental materialized views on Spark")
    parser.add_argument("--version", action="version", version=f"sparkfill {__version__}")
    parser.add_argument("--spark-logs", action="store_true",
                        help=f"keep Spark's own log output (the same as {LOGS_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run", help="run a pipeline file, then keep stepping epochs with a live display",
        description="Run the statements of PIPELINE (SQL separated by ';', plus STEP [n] to "
                    "run n epochs), then keep stepping epochs with a live display until "
                    "--epochs ran, the pipeline is idle (--until-idle), or Ctrl-C (which "
                    "stops after the current epoch).")
    run.add_argument("pipeline", type=Path, metavar="PIPELINE.sql")
    run.add_argument("--warehouse", type=_warehouse, required=True, metavar="DIR",
                     help="the warehouse folder (created when missing) or object-store URI")
    until = run.add_mutually_exclusive_group()
    until.add_argument("--epochs", type=int, metavar="N",
                       help="epochs to run after the file's statements")
    until.add_argument("--until-idle", action="store_true",
                       help="stop when no MV is being created and no source other than "
                            "datagen produced anything in the last epoch")
    run.add_argument("--interval", type=float, default=0.0, metavar="SECONDS",
                     help="start epochs at least this far apart (default 0)")
    run.add_argument("--check", action="store_true",
                     help="only check the file: plan every statement against the catalog "
                          "it would build (nothing runs, nothing is written)")
    sql = sub.add_parser("sql", help="run one statement against a warehouse",
                         description="Run one statement; a query or SHOW prints a table.")
    sql.add_argument("warehouse", type=_warehouse, metavar="DIR")
    sql.add_argument("statement", metavar="STATEMENT")
    sql.add_argument("--limit", type=int, default=100, metavar="N",
                     help="rows to print at most (default 100)")
    status = sub.add_parser("status", help="print a warehouse's relations, jobs, sources and "
                                           "sinks (read-only)",
                            description="Read-only: safe beside a running pipeline.")
    status.add_argument("warehouse", type=_warehouse, metavar="DIR")
    status.add_argument("--json", action="store_true",
                        help="print the same facts as one JSON object (for scripts and "
                             "monitoring)")
    ui = sub.add_parser("ui", help="serve a live web page of a warehouse (read-only)",
                        description="Serve a live web page of the warehouse: its dataflow "
                                    "graph, each creating job's progress, the epoch timeline, "
                                    "warnings and errors; plus /api/status (the facts of "
                                    "'status --json'), /api/watch and /metrics (Prometheus). "
                                    "Read-only: safe beside a running pipeline; never starts "
                                    "Spark.")
    ui.add_argument("warehouse", type=_warehouse, metavar="DIR")
    ui.add_argument("--port", type=_port, default=8765, metavar="P",
                    help="the port to listen on (default 8765; 0: any free port)")
    ui.add_argument("--host", default="127.0.0.1", metavar="HOST",
                    help="the address to listen on (default 127.0.0.1: this machine only)")
    for command in (run, sql, status, ui):
        command.add_argument("--meta", metavar="URL", default=None,
                             help="the warehouse's PostgreSQL meta store (default: the URL "
                                  "the warehouse records, else its meta.sqlite)")
    demo = sub.add_parser("demo", help="run the demo (online MV creation with live progress)",
                          description="Run the demo; arguments after 'demo' go to it (see "
                                      "'sparkfill demo -- --help').", add_help=False)
    demo.add_argument("-h", "--help", action="help", help="show this help message and exit")
    demo.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the demo")
    return parser


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """Run one command; ``spark``: a SparkSession to use instead of building one
    (for embedding and tests)."""
    args = _parser().parse_args(argv)
    if args.spark_logs:
        from .session import LOGS_ENV

        os.environ[LOGS_ENV] = "1"
    # not a terminal (a pipe, a log): wide lines rather than cut names
    console = Console() if sys.stdout.isatty() else Console(width=160)
    if args.command == "demo":
        from .demo import main as demo_main

        extra = [a for a in args.args if a != "--"]
        return demo_main(extra)
    if args.command == "status":
        return _status(args, console)
    if args.command == "ui":
        return _ui(args, console)
    if args.command == "sql":
        return _sql(args, console, spark)
    if args.epochs is not None and args.epochs < 0:
        console.print("[red]error:[/red] --epochs must be >= 0")
        return 2
    if args.interval < 0:
        console.print("[red]error:[/red] --interval must be >= 0")
        return 2
    return _run(args, console, spark)


if __name__ == "__main__":
    sys.exit(main())
