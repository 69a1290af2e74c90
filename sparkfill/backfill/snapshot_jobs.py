"""Snapshot-backfill jobs as the epoch loop sees them: starting and stopping
phase 1's thread, committing its initial rows, and catching up through the
upstream's log store (phases 2 and 3).

Invariant: a snapshot job's progress is one row per leaf (vnode -1). While phase
1 runs, each row is ``in_progress`` with the snapshot rows read so far; once the
initial rows ``Q(U(s))`` are committed (as of ``s``, the epoch committed when the
MV was created) every row is ``done``. Every row's ``pinned_epoch`` is the job's
position ``p``: ``s`` in phase 1, then the last upstream epoch consumed, so the
MV read as of ``p`` is ``Q(U(p))``, and the retention horizon keeps what the job
still needs. All meta-store and Delta-log writes happen here, in the epoch loop.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from pyspark.sql import DataFrame, SparkSession

from ..dataflow.change import Change, Emit, HeldRows
from ..dataflow.changelog import span_change
from ..dataflow.mv import DataflowResult, MvDataflow
from ..errors import is_row_error
from ..progress import JobProgress
from ..session import default_parallelism_of
from ..storage.catalog import Catalog, Relation
from ..storage.meta_store import MetaStore, ProgressRow
from ..storage.relation_store import RelationStore
from .snapshot import JobControl, SnapshotJob, chunk_plan, job_status, leaf_span
from .state import Held, held_rows

__all__ = ["SnapshotJobs", "SnapshotStep", "CATCH_UP_EPOCHS"]

#: upstream epochs one epoch consumes at most from the log store while catching up
CATCH_UP_EPOCHS = 16
#: lag samples kept to tell a lag that keeps growing
LAG_WINDOW = 5
#: how long a cancelled job's directory is watched for its Spark tasks' late writes
LATE_WRITE_SECONDS = 2.0
WHOLE = -1


@dataclass
class SnapshotStep:
    result: DataflowResult | None
    progress: list[ProgressRow]
    versions: list[tuple[int, int, int]] = field(default_factory=list)
    row_counts: dict[int, int] = field(default_factory=dict)
    created: bool = False
    #: about how many rows the result's Δ holds
    rows_hint: int = 0


class SnapshotJobs:
    def __init__(self, spark: SparkSession, meta: MetaStore, store: RelationStore,
                 catalog: Catalog, dataflow: MvDataflow) -> None:
        self.spark = spark
        self.meta = meta
        self.store = store
        self.catalog = catalog
        self.dataflow = dataflow
        self.threads: dict[int, SnapshotJob] = {}
        self.controls: dict[int, JobControl] = {}
        self._lags: dict[int, deque[int]] = defaultdict(lambda: deque(maxlen=LAG_WINDOW))
        self._rates: dict[int, deque[tuple[float, int]]] = defaultdict(
            lambda: deque(maxlen=12))

    # --- phase 1's thread -----------------------------------------------------------------

    def job_dir(self, mv: Relation) -> str:
        """The URI of ``mv``'s job directory (phase 1's checkpoints and files)."""
        return f"{self.store.root}/_jobs/{mv.id:06d}"

    def _in_phase_1(self, mv: Relation) -> bool:
        rows = self.meta.progress(mv.id)
        return not rows or any(r.state != "done" for r in rows)

    def has_started(self, mv: Relation) -> bool:
        """Whether phase 1 was ever started (its plan, and so its snapshot, fixed)."""
        return mv.id in self.threads or \
            self.store.warehouse.exists(f"{self.job_dir(mv)}/plan.json")

    def start(self, mv: Relation) -> None:
        """Start (or resume, from its checkpoints) phase 1 of ``mv``'s job."""
        assert mv.options is not None
        running = self.threads.get(mv.id)
        if running is not None and running.is_alive():
            return
        if not self._in_phase_1(mv):
            return
        s = mv.created_epoch
        leaves = self.catalog.leaves_of(mv)
        warehouse = self.store.warehouse
        job_dir = self.job_dir(mv)
        warehouse.makedirs(job_dir)
        plan_path = f"{job_dir}/plan.json"
        if not warehouse.exists(plan_path):
            estimates = [self.store.estimate_rows_by_vnode(leaf.stored, s, leaf.row_count)
                         for leaf in leaves]
            # with a rate limit, chunks of about one second of it: paced, not bursts
            rows = mv.options.chunk_rows
            if mv.options.rate_limit:
                rows = max(1, min(rows, mv.options.rate_limit))
            # atomic: a plan is whole or absent, and once there it is never rewritten
            warehouse.write_text(plan_path, json.dumps(chunk_plan(estimates, rows)))
        control = JobControl(rate_limit=mv.options.rate_limit)
        parallelism = mv.options.parallelism or default_parallelism_of(self.spark)
        job = SnapshotJob(self.spark, self.store, job_dir, mv, leaves,
                          self.catalog.states_of(mv),
                          [self.store.files_at(leaf.stored, s) for leaf in leaves], s,
                          control, parallelism)
        self.threads[mv.id] = job
        self.controls[mv.id] = control
        job.start()

    def stop(self, mv_id: int, remove_dir: str | None = None) -> None:
        """Stop a job's thread (cancelling its Spark jobs); remove its files if asked.

        A cancelled job's thread returns as soon as its Spark operation is
        interrupted, but the operation's tasks may still be writing (on a Spark
        Connect server, tasks die after the client has its error): a directory
        removed while they write comes back, so a job that was running is removed
        until it stays gone, for a bounded time. What is still left then is an
        orphan that the next open removes (``remove_orphans``)."""
        job = self.threads.pop(mv_id, None)
        self.controls.pop(mv_id, None)
        was_running = job is not None and job.is_alive()
        if job is not None:
            job.cancel()
            job.join(timeout=120)
        if remove_dir is not None:
            self._remove(remove_dir, settle=LATE_WRITE_SECONDS if was_running else 0.0)

    def _remove(self, job_dir: str, settle: float) -> None:
        warehouse = self.store.warehouse
        deadline = time.monotonic() + settle
        while True:
            try:
                warehouse.rmtree(job_dir)
            except OSError:  # a late writer is still creating files below it
                pass
            if time.monotonic() >= deadline:
                return
            time.sleep(0.25)

    def remove_orphans(self, live_ids: set[int]) -> None:
        """Remove job directories of MVs that no longer exist (a drop or cancel
        interrupted after its commit, or a late writer of a cancelled job)."""
        for uri in self.store.warehouse.list(f"{self.store.root}/_jobs"):
            name = uri.rsplit("/", 1)[-1]
            if name.isdigit() and int(name) not in live_ids:
                try:
                    self.store.warehouse.rmtree(uri)
                except OSError:  # left for the next open
                    pass

    def stop_all(self) -> None:
        for mv_id in list(self.threads):
            self.stop(mv_id)

    def set_rate_limit(self, mv_id: int, value: int | None) -> None:
        control = self.controls.get(mv_id)
        if control is not None:
            control.rate_limit = value

    def held_relations(self) -> set[int]:
        """Relations a creating snapshot job reads the log of or writes as of earlier
        epochs: they are not compacted while it exists."""
        held: set[int] = set()
        for mv in self.catalog.all():
            if mv.kind == "mv" and mv.state == "creating" and mv.options is not None \
                    and mv.options.strategy == "snapshot":
                held.add(mv.id)
                held.update(r.id for r in self.catalog.states_of(mv))
                held.update(r.id for r in self.catalog.leaves_of(mv))
        return held

    # --- the epoch loop's part ------------------------------------------------------------

    def step(self, mv: Relation, deltas: dict[int, DataFrame], epoch: int,
             emit_as: Callable[[int], Emit]) -> SnapshotStep:
        """The epoch loop's part of the job for ``epoch``: phase 1's commit once its
        files are written, then catching up on the log store (state tables' Δs
        appended through ``emit_as(epoch they belong to)``), then joining."""
        assert mv.options is not None
        leaves = self.catalog.leaves_of(mv)
        if self._in_phase_1(mv):
            return self._phase_1(mv, leaves)
        rows = self.meta.progress(mv.id)
        position = min(int(r.pinned_epoch or 0) for r in rows)
        done = {r.leaf: r.rows for r in rows}
        if mv.id in self.threads or self.store.warehouse.exists(self.job_dir(mv)):
            self.stop(mv.id, self.job_dir(mv))  # phase 1's files are committed
        if mv.options.rate_limit == 0:  # paused
            return SnapshotStep(None, [])
        # phase 2: consume the log store; phase 3: join, with this epoch's own change
        lag = (epoch - 1) - position
        self._lags[mv.id].append(lag)
        join = lag <= mv.options.max_lag_epochs
        upto = epoch if join else min(position + CATCH_UP_EPOCHS, epoch - 1)
        changes: list[Change | None] = []
        for leaf in leaves:
            span = leaf_span(self.store, leaf, position, min(upto, epoch - 1),
                             deltas.get(leaf.id) if join else None, epoch)
            if span is None:
                changes.append(None)
                continue
            before, after = span_change(span, [c.name for c in leaf.columns], leaf.key)
            changes.append(Change(before, after))
        result = None
        hint = sum(f.rows for leaf in leaves
                   for f in self.store.files_at(leaf.stored, min(upto, epoch - 1))
                   if f.kind == "log" and f.epoch_max > position)
        if any(c is not None for c in changes):
            # the MV holds each leaf as it was at ``position``
            result = self.dataflow.run(
                mv, leaves, self.catalog.states_of(mv), changes, upto, False, emit_as(upto),
                hint, held=[HeldRows(partial(held_rows, self.store, leaf, Held(position)))
                            for leaf in leaves])
            result.tag = upto
        progress = [ProgressRow(mv.id, i, WHOLE, "done", None, done.get(i, 0), upto)
                    for i in range(len(leaves))]
        return SnapshotStep(result, progress, created=join, rows_hint=hint)

    def _phase_1(self, mv: Relation, leaves: list[Relation]) -> SnapshotStep:
        s = mv.created_epoch
        job = self.threads.get(mv.id)
        control = self.controls.get(mv.id)
        if (job is not None and not job.is_alive() and control is not None
                and control.failure is not None and is_row_error(control.failure)):
            # the query raised on the snapshot's rows: no retry passes that; raised in
            # the epoch, it fails this MV alone (``pipelines.failures``)
            failure, control.failure = control.failure, None
            raise failure
        if job is None or not job.is_alive():
            status = job_status(self.store.warehouse, self.job_dir(mv))
            if status["manifest"] is None:
                self.start(mv)  # resume after a restart, or retry after an error
        status = job_status(self.store.warehouse, self.job_dir(mv))
        rows = status["rows"]
        self._rates[mv.id].append((time.time(), sum(rows.values())))
        manifest = status["manifest"]
        if manifest is None:
            return SnapshotStep(None, [
                ProgressRow(mv.id, i, WHOLE, "in_progress", None, rows.get(i, 0), s)
                for i in range(len(leaves))])
        versions, counts = [], {}
        for rel_id, entry in manifest.items():
            rel = self.catalog.get_by_id(int(rel_id))
            version = self.store.commit_files(rel.stored, s, entry["files"])
            versions.append((rel.id, s, version))
            counts[rel.id] = int(entry["rows"])
        return SnapshotStep(None, [
            ProgressRow(mv.id, i, WHOLE, "done", None, rows.get(i, 0), s)
            for i in range(len(leaves))], versions, counts)

    # --- progress -------------------------------------------------------------------------

    def progress(self, mv: Relation) -> JobProgress:
        assert mv.options is not None
        total = sum(leaf.row_count for leaf in self.catalog.leaves_of(mv))
        paused = mv.options.rate_limit == 0
        if self._in_phase_1(mv):
            status = job_status(self.store.warehouse, self.job_dir(mv))
            done = sum(status["rows"].values())
            samples = list(self._rates.get(mv.id, ()))
            rate = 0.0
            if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
                rate = max(0.0, (samples[-1][1] - samples[0][1])
                           / (samples[-1][0] - samples[0][0]))
            eta = (max(0, total - done) / rate) if rate > 0 else None
            control = self.controls.get(mv.id)
            stalled = control is not None and control.error is not None
            vnodes = 256 * status["chunks_done"] // max(1, status["chunks"])
            return JobProgress(mv.name, "snapshot", "paused" if paused else "backfilling",
                               done, max(done, total), rate, eta, vnodes_done=vnodes,
                               paused=paused, stalled=stalled)
        rows = self.meta.progress(mv.id)
        done = sum(r.rows for r in rows)
        position = min(int(r.pinned_epoch or 0) for r in rows)
        lag = max(0, self.meta.committed_epoch - position)
        lags = list(self._lags.get(mv.id, ()))
        growing = len(lags) == LAG_WINDOW and all(b > a for a, b in zip(lags, lags[1:],
                                                                         strict=False))
        return JobProgress(mv.name, "snapshot", "paused" if paused else "catching_up", done,
                           max(done, total), 0.0, None, vnodes_done=256, paused=paused,
                           stalled=growing, lag_epochs=lag)
