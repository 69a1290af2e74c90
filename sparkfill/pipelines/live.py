"""Running epochs one after another with a live display (``sparkfill run``).

Invariant: the loop only ever stops between epochs — a stop request (Ctrl-C,
SIGTERM) is honoured once the running epoch has committed, so a stopped
pipeline leaves a warehouse with nothing in flight. A second Ctrl-C aborts at
once (the next open of the warehouse re-runs the interrupted epoch).

"Idle" (``--until-idle``): no materialized view is being created and, in the
last epoch, no source other than ``datagen`` produced a row or a dead letter.
A datagen source never runs dry, so with datagen ``--until-idle`` means "until
every creating job is done".
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
)
from rich.table import Table
from rich.text import Text

from ..progress import EpochReport, JobProgress

__all__ = ["EpochLoop", "stop_on_signals"]


@contextmanager
def stop_on_signals(stop: threading.Event, console: Console) -> Iterator[None]:
    """While inside: the first SIGINT/SIGTERM sets ``stop``; a second SIGINT raises
    ``KeyboardInterrupt``."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not stop.is_set():
            console.print("[yellow]stopping after the current epoch "
                          "(Ctrl-C again to abort)[/yellow]")
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclass
class _Totals:
    epochs: int = 0
    source_rows: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)


class EpochLoop:
    """Steps an engine's epochs and shows what they did."""

    def __init__(self, engine: Any, console: Console, interval: float,
                 stop: threading.Event) -> None:
        self.eng = engine
        self.console = console
        self.interval = interval
        self.stop = stop
        self.totals = _Totals()
        self._last_end: float | None = None
        self._progress = Progress(
            TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>10,.0f} rows/s"), TextColumn("ETA {task.fields[eta]}"),
            TextColumn("{task.fields[state]}"), auto_refresh=False)
        self._tasks: dict[str, TaskID] = {}

    # --- rules ----------------------------------------------------------------------------

    def creating(self) -> list[JobProgress]:
        return [j for j in self.eng.progress() if j.state != "created"]

    def idle(self, report: EpochReport) -> bool:
        if self.creating():
            return False
        kinds = {self.eng.catalog.get_by_id(s.rel_id).name: s.connector
                 for s in self.eng.sources.sources()}
        produced = sum(n for name, n in report.source_rows.items() if kinds.get(name) != "datagen")
        dead = sum(n for name, n in report.dead_letters.items() if kinds.get(name) != "datagen")
        return produced + dead == 0

    # --- running --------------------------------------------------------------------------

    def run(self, epochs: int | None = None, until_idle: bool = False,
            until: Callable[[], bool] | None = None) -> int:
        """Run epochs until ``epochs`` ran, the pipeline is idle (``until_idle``),
        ``until()`` holds, or a stop was requested; returns the epochs run."""
        ran = 0
        live = Live(self._render(None), console=self.console, auto_refresh=False,
                    transient=False) if self.console.is_terminal else None
        if live is not None:
            live.start()
        try:
            while not self.stop.is_set():
                if epochs is not None and ran >= epochs:
                    break
                if until is not None and until():
                    break
                started = time.time()
                report = self.eng.step()
                ran += 1
                self._account(report)
                if live is not None:
                    live.update(self._render(report), refresh=True)
                else:
                    self.console.print(self._line(report), highlight=False, soft_wrap=True)
                self._last_end = time.time()
                if until_idle and self.idle(report):
                    break
                wait = self.interval - (time.time() - started)
                if wait > 0:
                    self.stop.wait(wait)
        finally:
            if live is not None:
                live.stop()
        return ran

    def _account(self, report: EpochReport) -> None:
        t = self.totals
        t.epochs += 1
        for name, n in report.source_rows.items():
            t.source_rows[name] = t.source_rows.get(name, 0) + n
        for name, n in report.dead_letters.items():
            t.dead_letters[name] = t.dead_letters.get(name, 0) + n

    def _elapsed(self, report: EpochReport) -> float:
        if self._last_end is None:
            return max(report.seconds, 1e-3)
        return max(time.time() - self._last_end, report.seconds, 1e-3)

    # --- display --------------------------------------------------------------------------

    def _line(self, report: EpochReport) -> str:
        """One line per epoch, for a console that is not a terminal."""
        elapsed = self._elapsed(report)
        parts = [f"epoch {report.epoch} {report.seconds:.2f}s"]
        if report.source_rows:
            parts.append("sources: " + ", ".join(
                f"{name} {n:,} rows ({n / elapsed:,.0f}/s)"
                + (f", {report.dead_letters[name]} dead letters"
                   if report.dead_letters.get(name) else "")
                for name, n in report.source_rows.items()))
        jobs = self.creating()
        if jobs:
            parts.append("jobs: " + ", ".join(j.describe() for j in jobs))
        done = [j.name for j in report.jobs if j.state == "created"]
        if done:
            parts.append(f"created: {', '.join(done)}")
        return " | ".join(parts)

    def _render(self, report: EpochReport | None) -> Group:
        if report is None:
            return Group(Text("starting ..."))
        elapsed = self._elapsed(report)
        head = Text.assemble(
            ("epoch ", "bold"), (f"{report.epoch}", "bold cyan"),
            f"  ·  {report.seconds:.2f}s  ·  {time.strftime('%H:%M:%S')}  ·  "
            f"{sum(report.changes.values()):,} changes  ·  "
            f"{self.totals.epochs} epochs this run")
        parts: list[Any] = [head]
        sources = self.eng.sources.sources()
        if sources:
            table = Table("source", "connector", "rows this epoch", "rows/s", "dead letters",
                          "offset", box=None, padding=(0, 2))
            for s in sources:
                name = self.eng.catalog.get_by_id(s.rel_id).name
                n = report.source_rows.get(name, 0)
                table.add_row(name, s.connector, f"{n:,}", f"{n / elapsed:,.0f}",
                              f"{s.total_dead_letters:,}" if s.dead_letter_id else "",
                              self.eng.sources.describe(s))
            parts.append(table)
        for j in self.eng.progress():
            if j.name not in self._tasks and j.state != "created":
                self._tasks[j.name] = self._progress.add_task(j.name, total=None, rate=0.0,
                                                              state=j.state, eta="-")
            if j.name in self._tasks:
                eta = ("0s" if j.state == "created" else "-" if j.eta_seconds is None
                       else f"{j.eta_seconds:,.0f}s")
                self._progress.update(self._tasks[j.name],
                                      total=max(1, j.rows_total_estimate, j.rows_done),
                                      completed=j.rows_done, rate=j.rows_per_second,
                                      state=j.state, eta=eta)
        if self._tasks:
            parts.append(Text("each bar counts the rows of the upstream snapshot its job has "
                              "scanned (the MV keeps those its query passes)", style="dim"))
            parts.append(self._progress)
        return Group(*parts)
