"""Progress records handed to users: one ``JobProgress`` per creating or created
MV, one ``EpochReport`` per committed epoch.

Invariant: these are plain immutable values derived from state that was
committed with an epoch; holding one never pins engine resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["JobProgress", "EpochReport", "RefreshChoice", "JOB_STATES"]

#: The states of a job, in the order a job goes through them ("paused": rate limit 0).
JOB_STATES = ("queued", "backfilling", "paused", "catching_up", "created")


@dataclass(frozen=True)
class JobProgress:
    """Progress of the job that creates a materialized view."""

    name: str
    strategy: str
    state: str
    rows_done: int
    rows_total_estimate: int
    rows_per_second: float
    eta_seconds: float | None
    vnodes_done: int = 0
    paused: bool = False
    #: no progress for several epochs while not paused (snapshot: the lag grew)
    stalled: bool = False
    #: snapshot strategy, catching up: committed epochs not yet consumed from the log
    lag_epochs: int | None = None
    #: why the MV (or an MV it reads) stopped: its query raised on the rows of an
    #: epoch; reads are refused until ``ALTER ... RECOMPUTE`` rebuilds it (or DROP)
    failed: str | None = None

    @property
    def fraction_done(self) -> float:
        if self.state == "created":
            return 1.0
        if self.rows_total_estimate <= 0:
            return 0.0
        return min(1.0, self.rows_done / self.rows_total_estimate)

    def describe(self) -> str:
        """One plain line for logs: rows of the upstream snapshot scanned (the MV
        keeps those its query passes), percent, rate and ETA once a rate is known."""
        line = (f"{self.name} {self.state}: {self.rows_done:,}/{self.rows_total_estimate:,} "
                f"upstream rows scanned ({100 * self.fraction_done:.0f}%)")
        if self.failed is not None:
            return f"{line}; FAILED: {self.failed}"
        if self.state == "created":
            return line
        line += f", {self.rows_per_second:,.0f} rows/s"
        if self.eta_seconds is not None:
            line += f", ETA {self.eta_seconds:,.0f}s"
        if self.lag_epochs is not None:
            line += f", {self.lag_epochs} epochs behind"
        return line + (" (stalled)" if self.stalled else "")


@dataclass(frozen=True)
class RefreshChoice:
    """How a created MV took one epoch's change: ``"incremental"`` (its operators'
    incremental rules) or ``"full"`` (recomputed from its leaves, the difference
    written as its changelog), and why."""

    mode: str
    reason: str


@dataclass(frozen=True)
class EpochReport:
    """What one committed epoch did."""

    epoch: int
    seconds: float
    changes: dict[str, int] = field(default_factory=dict)
    jobs: list[JobProgress] = field(default_factory=list)
    #: rows in the data files each relation's reads selected this epoch
    rows_read: dict[str, int] = field(default_factory=dict)
    #: snapshot rows each creating job backfilled this epoch
    backfill_rows: dict[str, int] = field(default_factory=dict)
    #: rows each source table took in this epoch (inserts, updates and deletes)
    source_rows: dict[str, int] = field(default_factory=dict)
    #: malformed records each source sent to its dead-letter table this epoch
    dead_letters: dict[str, int] = field(default_factory=dict)
    #: Spark jobs the epoch ran: its writes, collects and broadcasts (a snapshot
    #: job's phase 1, which runs beside the epochs, not included)
    spark_jobs: int = 0
    #: work after the commit that failed and will be retried (the epoch stands):
    #: clean-up, compaction, a sink's write
    warnings: list[str] = field(default_factory=list)
    #: how each created MV whose leaves changed took the change, and why (the option
    #: ``refresh``: forced, or chosen from the change's size and measured costs)
    refresh: dict[str, RefreshChoice] = field(default_factory=dict)
