"""The epoch coordinator: runs epochs one after another.

Invariant: epoch ``e`` is planned (its inputs pinned: the staged DML up to a
sequence number, each creating job's chunk limit, and the epoch's processing
time, which fills the processing-time columns of the rows it writes) and the
plan persisted before any work, so a crash at any point is recovered by re-running the same
plan: the appends that already landed are skipped (Delta application
transactions) and the rest recomputed from the same inputs. An epoch whose run
raised (a failed write or job, a damaged file) is run again by the next ``step``
with the same inputs (``retry_plan``: DML bound, processing time, chunk limits),
what was asked since (a RECOMPUTE) joining them. Nothing of ``e`` is visible
before ``commit_epoch``.

Epoch ``e``:
1. inputs: the staged DML pinned by the plan;
2. Δ per relation in topological order, each appended as soon as it is computed
   (one Spark job, which also counts its rows and vnodes) and read back from its
   files by the relations downstream: tables from DML; an MV from its leaves'
   changes (their Δs once created, their backfill scans while creating) through
   its operators, which append the Δs of its state tables the same way, or — as
   ``refresh.py`` chooses — by a recompute whose differences are those Δs; a
   relation whose inputs did not change runs nothing. The small Δs nothing reads
   back this epoch — of created MVs no MV reads, and of state tables whose operator
   reads the Δ's plan itself — are appended together at the end of the phase, their
   rows brought to the driver by one Spark job. A relation whose changelog no later
   epoch reads takes a Δ of about its size (and a recomputed MV nothing reads, its
   rows) as a new base in place of an append (``EpochAppends.rewrite``,
   ``rewrite_unread``);
3. commit ``e`` in the meta store: versions, row counts, progress, applied DML,
   and its row of ``epochs`` (its time, the creating jobs' share of it, its changes
   and Spark jobs, each job's rows; the previous epoch's work after its commit);
4. release the backfill chunks read for ``e``; compact and vacuum. ``e`` is
   committed: a failure here is logged (and reported) and retried later, so
   ``step()`` raises only for an epoch that did not commit.
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from ..backfill.arrangement import ArrangementScan, VnodeProgress
from ..backfill.scan import BackfillScan
from ..backfill.snapshot_jobs import SnapshotJobs
from ..backfill.state import (
    Done,
    Held,
    InProgress,
    NotStarted,
    ScanResult,
    held_rows,
    held_rows_in,
    state_from_rows,
    state_to_row,
)
from ..dataflow.aggregate import Guess
from ..dataflow.cached import epoch_cache, persisted
from ..dataflow.change import Deferred, Emit, HeldRows, StateDelta, change_of
from ..dataflow.changelog import after_images, consolidate
from ..dataflow.mv import DataflowResult, MvDataflow
from ..dataflow.recompute import recompute
from ..dataflow.topn import rebuilt_top_n
from ..progress import EpochReport, JobProgress, RefreshChoice
from ..session import default_parallelism_of
from ..storage.catalog import Catalog, Relation
from ..storage.dml import DmlStager, table_delta
from ..storage.keyrange import END
from ..storage.meta_store import AfterCommit, EpochCommit, MetaStore, ProgressRow, StagedBatch
from ..storage.relation_store import LOCAL_WRITE_ROWS, Appended, RelationStore, retracts
from ..storage.schema import VNODE, names_sql
from .codegen import INTERPRETED_ROWS, Interpreted
from .cost import linear_cost, sizes_differ
from .failures import (
    FAILED_KEY,
    Failure,
    RelationFailed,
    error_line,
    failed_upstream,
    failure_message,
    failures_json,
    is_row_error,
    load_failures,
)
from .guessing import GuessPolicy
from .refresh import FULL, RefreshPolicy
from .replace import Switch, swapped, switch_delta, switched

__all__ = ["EpochCoordinator", "STALL_EPOCHS", "uses_snapshot_job", "queued_jobs",
           "retry_plan"]

LOG = logging.getLogger("sparkfill")

#: a created MV's state Δ of at least this many rows per row of its table (one that
#: holds more than ``LOCAL_WRITE_ROWS``) is written as the table's new rows
#: (``EpochAppends.rewrite``)
REWRITE_FRACTION = 0.5
#: the meta store's key of the MVs an ``ALTER ... RECOMPUTE`` asked to rebuild (JSON ids)
RECOMPUTE_KEY = "recompute_requested"
#: a job that made no progress for this many epochs while not paused is stalled
STALL_EPOCHS = 5
#: the adaptive chunk never falls below what finishes a job in about this many epochs
MAX_BACKFILL_EPOCHS = 100
#: nor grows above this many times ``backfill_chunk_rows`` (1,000,000 rows by default:
#: a Spark job's fixed cost is paid once per epoch, so a job over millions of rows
#: needs chunks of this order to finish in tens of epochs, not hundreds)
MAX_CHUNK_FACTOR = 100


@dataclass(frozen=True)
class _Choice:
    """How a created MV took this epoch's change, and the sizes it was chosen by."""

    choice: RefreshChoice
    changed_rows: int
    leaf_rows: int


@dataclass
class _RateSample:
    at: float
    rows: int


@dataclass
class EpochAppends:
    """The appends of one epoch, made as each relation's Δ is computed: the Δs read
    back for the relations downstream, the Delta versions to commit with the epoch
    and the rows each Δ holds per ``_op``."""

    store: RelationStore
    epoch: int
    deltas: dict[int, DataFrame] = field(default_factory=dict)
    counts: dict[int, dict[str, int]] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)
    #: appends made as an earlier epoch (a snapshot job catching up): (relation, epoch, version)
    tagged: list[tuple[int, int, int]] = field(default_factory=list)
    #: small Δs of MVs nothing reads this epoch, appended together by ``flush``, each
    #: with its guess (``DataflowResult.guess``), checked in that job
    deferred: list[tuple[Relation, DataFrame, Guess | None]] = field(default_factory=list)
    #: Δs cached for the epoch (a rewritten state's), released after the commit
    cached: list[DataFrame] = field(default_factory=list)
    #: write every Δ alone, none deferred (the run that finds whose deferred Δ failed)
    no_defer: bool = False
    #: the names of the relations whose changelog an MV reads (their Δs this epoch, or
    #: their logs while it is created): every other MV's changelog is only written
    read_now: frozenset[str] = frozenset()
    #: the names of the relations whose log an MV not yet created may read in a later
    #: epoch (its backfill's catch-up): every other relation's changelog is read, if
    #: at all, in the epoch that writes it, from its Δ
    log_read: frozenset[str] = frozenset()

    def append(self, rel: Relation, delta: DataFrame | None, rows_hint: int,
               tag: int | None = None, placed: bool = False,
               prepared: Sequence[str] = (), as_read: bool = False,
               inserts: bool = False, rows: pa.Table | None = None) -> Appended | None:
        tag = self.epoch if tag is None else tag
        # a state table's touched keys drive its operator's lookups: on the driver
        written = self.store.append(rel.stored, tag, delta, rows_hint,
                                    collect_keys=rel.kind == "state", placed=placed,
                                    prepared=prepared, as_read=as_read, inserts=inserts,
                                    rows=rows)
        if written is None:
            return None
        if written.rewritten:
            written = self._recovered_rewrite(rel, written)
        self.deltas[rel.id] = written.delta
        self.counts[rel.id] = written.counts
        if tag == self.epoch:
            self.versions[rel.id] = written.version
        else:
            self.tagged.append((rel.id, tag, written.version))
        return written

    def _recovered_rewrite(self, rel: Relation, written: Appended) -> Appended:
        """A retried epoch whose first attempt wrote ``rel``'s rows as its new base
        (``rewrite``, ``rewrite_rows``) where this attempt appends a Δ: the rows are
        there; the Δ, for whatever reads it this epoch, is the difference of the
        relation's rows at ``e-1`` and at ``e`` (each row keeps its stored vnode)."""
        names = [c.name for c in rel.columns]
        key, vnode = list(rel.key), "_sf_stored_vnode"

        def rows_at(epoch: int, files: Sequence[Any]) -> DataFrame:
            return (self.store.snapshot(rel.stored, epoch, files=files, bulk=True)
                    .selectExpr(*names_sql(names), f"{VNODE} AS {vnode}"))
        old = rows_at(self.epoch - 1, self.store.files_at(rel.stored, self.epoch - 1))
        new = rows_at(self.epoch, self.store.files(rel.stored, written.version))
        delta = (consolidate(old, new, [*names, vnode], key).drop(VNODE)
                 .withColumnRenamed(vnode, VNODE))
        counts = {"+": written.counts.get("+", 0), "-": rel.row_count}
        return Appended(written.version, written.observed._replace(counts=counts),
                        lambda: delta)

    def defer(self, rel: Relation, delta: DataFrame, guess: Guess | None = None) -> None:
        """Append ``rel``'s small Δ with the others deferred, in ``flush``: for an MV
        nothing reads this epoch (its Δ is needed only once committed), or a state
        table whose operator reads the Δ's plan. ``guess``: ``delta`` is a guess
        (``DataflowResult.guess``), checked in the flush's job."""
        self.deferred.append((rel, delta, guess))

    def flush(self) -> None:
        """Append the deferred Δs: their rows come to the driver in one Spark job, with
        the rows that check each guessed one (a wrong guess's Δ is built anew, its
        collect a job of its own). Nothing reads them back this epoch (they waited
        because nothing does), so ``deltas`` does not take them."""
        items, self.deferred = self.deferred, []
        wrong: set[int] = set()  # the guesses whose check found a lost group

        def instead(i: int, rel: Relation, guess: Guess) -> DataFrame:
            wrong.add(i)
            return self._instead(rel, guess)

        checks = {i: (g.check, functools.partial(instead, i, rel, g))
                  for i, (rel, _, g) in enumerate(items) if g is not None}
        written = self.store.append_many([(rel.stored, delta) for rel, delta, _ in items],
                                         self.epoch, checks)
        for i, (_, _, guess) in enumerate(items):
            if guess is not None and i not in wrong:
                guess.held()
        for (rel, _, _), out in zip(items, written, strict=True):
            if out is not None:
                if out.rewritten:  # (its Δ is not read: only its counts are wanted)
                    out = self._recovered_rewrite(rel, out)
                self.counts[rel.id] = out.counts
                self.versions[rel.id] = out.version

    def _instead(self, rel: Relation, guess: Guess) -> DataFrame:
        """``rel``'s Δ where its guess was wrong: built anew, its reads counted as its."""
        with self.store.reading_for(rel.name):
            return guess.instead(self.cached)

    def emitter(self, tag: int | None = None, may_wait: bool = False,
                may_retract: bool = True) -> Emit:
        """An operator's ``Emit`` for its state tables' Δs. ``may_wait``: a created
        MV's epoch, whose small state Δs the operator says it can read as plans
        (``deferrable``) are deferred to ``flush`` (one Spark job for them all), not
        appended each by its own job first, and whose Δ that touches most of a state
        table (``rewritable``) becomes the table's new rows (``rewrite``);
        ``may_retract``: whether its leaves' changes hold before-images (and so may
        its state's Δs)."""
        def emit(rel: Relation, delta: DataFrame, rows_hint: int, *,
                 deferrable: bool = False, rewritable: bool = False) -> StateDelta | None:
            if (deferrable and may_wait and tag is None and rows_hint <= LOCAL_WRITE_ROWS
                    and not self.no_defer):
                self.defer(rel, delta)
                return Deferred(delta, may_retract)
            # (a state that holds few rows gains nothing: its Δ is about its new rows,
            # and an append keeps the Δ's keys for the lookups they drive)
            if (rewritable and may_wait and tag is None and rel.kind == "state"
                    and rel.row_count > LOCAL_WRITE_ROWS and rows_hint > LOCAL_WRITE_ROWS
                    and rows_hint >= REWRITE_FRACTION * rel.row_count):
                return Deferred(self.rewrite(rel, delta), may_retract)
            return self.append(rel, delta, rows_hint, tag)
        return emit

    def rewrite(self, rel: Relation, delta: DataFrame,
                rows: DataFrame | None = None) -> DataFrame:
        """Write a state table's (or an unread MV's) rows at this epoch — its rows at
        ``e-1`` with ``delta`` applied — as its new base, in place of appending
        ``delta``: a Δ of about as many rows as the table (a bulk UPDATE's before- and
        after-images are twice as many) costs more to append, and its log would be
        folded into a base right after. Only the table's own operator reads a state's
        changelog, and only in the epoch that writes it (from ``delta`` itself); an
        MV's only the MVs over it (``unread``): the rows at every epoch are all that
        must be kept, and they are. Returns ``delta``
        cached (the rewrite and the operator both read it; released after the
        commit), so it is computed once, as an append computes it once. ``rows``: the
        rows at this epoch, where they cost less than ``delta`` applied (a table's,
        from its staged rows): then ``delta`` is computed only if something reads it."""
        delta = persisted(delta, StorageLevel.MEMORY_AND_DISK_DESER)
        self.cached.append(delta)
        if rows is None:
            key = list(rel.key)
            cols = names_sql([*[c.name for c in rel.columns], VNODE])
            old = self.store.snapshot(rel.stored, self.epoch - 1, bulk=True)
            rows = (old.join(delta.selectExpr(*names_sql(key)), key, "left_anti")
                    .selectExpr(*cols).unionByName(after_images(delta).selectExpr(*cols)))
        self.rewrite_rows(rel, rows)
        self.deltas[rel.id] = delta  # for the MVs that read it this epoch
        return delta

    def unread(self, rel: Relation) -> bool:
        """Whether nothing reads ``rel``'s changelog: a state table's is read only by
        its operator, in the epoch that writes it; an MV's by the MVs over it."""
        return rel.kind == "state" or (rel.kind == "mv" and rel.name.lower() not in self.read_now)

    def log_unread(self, rel: Relation) -> bool:
        """Whether ``rel``'s changelog of this epoch is read, if at all, only this
        epoch, as its Δ (``deltas``): no MV over it is being created (a sink behind
        it rewrites its table when its log no longer holds what it missed)."""
        return rel.kind == "state" or rel.name.lower() not in self.log_read

    def rewrite_unread(self, rel: Relation, rows: DataFrame, as_read: bool = False) -> bool:
        """``rewrite_rows`` for a recompute's rows of a relation that holds more than
        ``LOCAL_WRITE_ROWS`` rows and whose changelog nothing reads; False (nothing
        written) for any other."""
        if rel.row_count <= LOCAL_WRITE_ROWS or not self.unread(rel):
            return False
        self.rewrite_rows(rel, rows, as_read)
        return True

    def rewrite_rows(self, rel: Relation, rows: DataFrame, as_read: bool = False) -> None:
        """Write ``rows`` (columns + ``_vnode``), ``rel``'s rows at this epoch, as its
        new base in place of every file (``rewrite``, ``rewrite_unread``, ``replace``):
        no comparison with its rows at ``e-1``, and no changelog kept for the epoch
        (its snapshots at every epoch are all that is kept, and they are; a sink
        behind it rewrites its table from the new base). Its counts: ``+`` the rows
        written, ``-`` the rows they replace. ``as_read``: each partition of ``rows``
        holds the rows of a few contiguous vnodes (``RelationStore.rewrite``)."""
        version, counts = self.store.rewrite(rel.stored, self.epoch, rows, rel.row_count,
                                             as_read)
        self.versions[rel.id] = version
        self.counts[rel.id] = counts

    def replace(self, rel: Relation, rows: DataFrame, delta: DataFrame) -> None:
        """A repair of a relation whose data files at ``e-1`` are damaged (``ALTER ...
        RECOMPUTE``): its ``rows`` at this epoch (columns + ``_vnode``) written as its
        new base in place of every file (none is read), and ``delta`` — its difference
        from its rows at ``e-1`` as recomputed from its leaves — its Δ for the
        relations that read it this epoch (cached: computed once; released after the
        commit). Its changelog of this epoch is not kept: a sink behind it rewrites
        its table from the new base."""
        delta = persisted(delta, StorageLevel.MEMORY_AND_DISK_DESER)
        self.cached.append(delta)
        self.rewrite_rows(rel, rows)
        self.deltas[rel.id] = delta

    def rows(self, rel_id: int) -> int:
        return sum(self.counts.get(rel_id, {}).values())


def queued_jobs(meta: MetaStore, catalog: Catalog,
                progress: dict[int, list[ProgressRow]] | None = None) -> set[int]:
    """Creating jobs waiting for a slot (``max_concurrent_creating_jobs``), the later
    ones in creation order; ``progress``: every MV's rows (``MetaStore.all_progress``),
    else read per MV. A job is an MV with its join chain's links, which wait or run
    together: an MV reads a link created with it from birth, every change of it as it
    comes, so it cannot wait while the link runs (it would miss the link's first
    rows)."""
    limit = meta.get("max_concurrent_creating_jobs")
    if limit is None:
        return set()
    waiting: list[list[int]] = []
    slots = int(limit)
    for r in catalog.all():
        if r.kind != "mv" or r.state != "creating" or r.owner is not None:
            continue
        job = [r, *catalog.internals_of(r)]
        rows = [p for m in job for p in (meta.progress(m.id) if progress is None
                                         else progress.get(m.id, []))]
        if any(p.state != "not_started" for p in rows):
            slots -= 1  # a started job keeps its slot: its MV already holds rows
        else:
            waiting.append([m.id for m in job])
    return {i for job in waiting[max(0, slots):] for i in job}


def uses_snapshot_job(rel: Relation) -> bool:
    """A creating MV whose backfill is a snapshot job (a top-N has none: it reads its
    whole input in one epoch)."""
    return (rel.kind == "mv" and rel.state == "creating" and rel.options is not None
            and rel.options.strategy == "snapshot" and rel.plan is not None
            and rel.plan.topn is None)


class EpochCoordinator:
    def __init__(self, spark: SparkSession, meta: MetaStore, store: RelationStore,
                 catalog: Catalog, stager: DmlStager, retain_epochs: int) -> None:
        self.spark = spark
        self.meta = meta
        self.store = store
        self.catalog = catalog
        self.stager = stager
        self.retain_epochs = retain_epochs
        #: vacuum every this many epochs (tests lower it to reach vacuum often)
        self.vacuum_every = 10
        self.scan = BackfillScan(spark, store)
        self.dataflow = MvDataflow(spark, store)
        self.snapshots = SnapshotJobs(spark, meta, store, catalog, self.dataflow)
        self._tokens: dict[int, float] = {}
        self._token_time: dict[int, float] = {}
        self.arrangement = ArrangementScan(spark, store)
        #: adaptive chunk size of each creating job (rows per epoch)
        self._budget: dict[int, float] = {}
        #: rows each relation's last Δ inserted (``+``): the inflow a backfill must outpace
        self._inserted: dict[int, int] = {}
        self._samples: dict[int, deque[_RateSample]] = defaultdict(lambda: deque(maxlen=12))
        #: rows each relation read from storage in the last epoch
        self.last_rows_read: dict[str, int] = {}
        #: seconds of the last epochs without backfill work
        self._base_samples: deque[float] = deque(maxlen=5)
        #: (snapshot rows read, own seconds) of each backfilling MV's last epochs
        self._own_samples: dict[int, deque[tuple[int, float]]] = defaultdict(
            lambda: deque(maxlen=6))
        #: each backfilling MV's last fitted (fixed seconds, seconds per chunk row)
        self._cost_fits: dict[int, tuple[float, float]] = {}
        #: how each created MV takes a change: incremental rules or a recompute
        self.refresh = RefreshPolicy()
        #: whether each created MV's running min/max is guessed unlost (``Guess``)
        self.guessing = GuessPolicy()
        #: the last epoch's work after its commit, recorded with the next epoch's row,
        #: and when that work began (the end of its Δs)
        self._after: AfterCommit | None = None
        self._after_began = 0.0

    # --- planning -------------------------------------------------------------------------

    def queued(self) -> set[int]:
        """Creating jobs waiting for a slot (``max_concurrent_creating_jobs``), the
        later ones in creation order."""
        return queued_jobs(self.meta, self.catalog)

    def _budget_of(self, mv: Relation) -> int:
        assert mv.options is not None
        return int(self._budget.get(mv.id, mv.options.chunk_rows))

    @property
    def base_seconds(self) -> float | None:
        """The time of an epoch without backfill work (the median of the last five):
        the part of an epoch that is not a backfill's own doing."""
        return statistics.median(self._base_samples) if self._base_samples else None

    def _adapt_budget(self, mv: Relation, epoch_seconds: float,
                      own_seconds: float | None = None, rows: int | None = None) -> None:
        """The RFC's "final way", budgeted from the backfill's own share of the epoch:
        grow or shrink the chunk so that what the backfill adds to an epoch — the
        time the epoch spent on this MV's Δ (``own_seconds``), and at most the epoch's
        time above ``base_seconds`` when that is known — stays near what the target
        leaves it (the target less the rest of the epoch, at least half the target).
        Epochs that are slow for other reasons (other MVs, other jobs) do not shrink
        it; it at most doubles per epoch, up to ``MAX_CHUNK_FACTOR`` times
        ``backfill_chunk_rows``, and it never falls below the chunk that finishes the job in
        ``MAX_BACKFILL_EPOCHS`` (nor below a quarter of ``backfill_chunk_rows``), so a
        job never slows to a crawl.

        The MV's own time also holds a fixed part (its steady work on its upstream's
        changes, the chunk's bookkeeping jobs), which no chunk size changes. With
        ``rows`` (the snapshot rows the epoch read), the last epochs' (rows, own time)
        fit that fixed cost plus a cost per row, and the chunk is sized from the fit:
        the rows get what the target leaves after the fixed cost, and never less time
        than the fixed cost itself (when the fixed cost alone overruns the target,
        shrinking would only stretch the job over more epochs that each pay it: at
        least half of the backfill's time goes to rows). Until the chunks' sizes differ
        enough to fit, a chunk over the target is first probed at twice its size (so
        the fit can tell a fixed cost from a per-row one) rather than shrunk to the
        floor, where every chunk is alike and no fit ever comes."""
        assert mv.options is not None
        target = mv.options.target_epoch_ms / 1000.0
        if target <= 0 or mv.options.strategy != "arrangement":
            return
        # the backfill's own time: the time spent on this MV, and at most the epoch's
        # time above the base cost of an epoch without backfill (when known)
        own = epoch_seconds if own_seconds is None else own_seconds
        if self.base_seconds is not None:
            own = min(own, epoch_seconds - self.base_seconds)
        own = max(0.05, own)
        rest = max(0.0, epoch_seconds - own)
        allowed = max(target - rest, target / 2)
        samples = self._own_samples[mv.id]
        if rows is not None and own_seconds is not None:
            samples.append((rows, own))
        fit = linear_cost(samples) or self._cost_fits.get(mv.id)  # alike chunks: the last fit
        if fit is not None:
            self._cost_fits[mv.id] = fit
        growth = 2.0
        if fit is None:
            measured = rows is not None and own_seconds is not None
            if own <= allowed or not measured:
                factor = allowed / own
            elif not sizes_differ(samples):
                factor = 2.0  # probe: a larger chunk tells the fixed cost from the rows'
            else:
                factor = 1.0  # probed: hold for the fit's third sample
        elif fit[1] <= 0:
            factor = 2.0  # the chunk's rows cost nothing measurable: grow
        else:
            fixed, per_row = fit
            rows_time = max(allowed - fixed, fixed)  # rows never get less than the fixed cost
            factor = rows_time / per_row / max(1.0, self._budget_of(mv))
            growth = 4.0  # a fit says where the chunk belongs: reach it in fewer epochs
        factor = min(growth, max(0.5, factor))
        base = mv.options.chunk_rows
        total = sum(leaf.row_count for leaf in self.catalog.leaves_of(mv))
        floor = max(1.0, base / 4, total / MAX_BACKFILL_EPOCHS)
        self._budget[mv.id] = min(max(base * float(MAX_CHUNK_FACTOR), floor),
                                  max(floor, self._budget_of(mv) * factor))

    def _liveness_rows(self, mv: Relation) -> int:
        """Extra snapshot rows so a job outpaces the upstream's inserts into the range
        it has not covered yet (twice the last epoch's inflow into that range): the
        remaining rows then shrink every epoch, however fast the upstream writes."""
        inserted = max((self._inserted.get(leaf.id, 0) for leaf in self.catalog.leaves_of(mv)),
                       default=0)
        if not inserted:
            return 0
        rows = self.meta.progress(mv.id)
        if all(r.state == "not_started" for r in rows):
            return 0  # the last epoch's inflow predates the job: its snapshot holds it
        if mv.options is not None and mv.options.strategy == "arrangement":
            pending = 1.0 - VnodeProgress.from_rows(rows).vnodes_done / 256
        else:
            pending = 1.0
        return int(2 * inserted * pending)

    def _chunk_limit(self, mv: Relation, now: float) -> int | None:
        """Snapshot rows the job may read this epoch: its (adaptive) chunk, capped
        by the rate limit's tokens; None: unbounded (blocking)."""
        assert mv.options is not None
        opts = mv.options
        if opts.strategy == "blocking":
            return None
        budget = self._budget_of(mv)
        if opts.rate_limit is None:
            self._token_time.pop(mv.id, None)
            return budget + self._liveness_rows(mv)
        if opts.rate_limit == 0:
            self._token_time.pop(mv.id, None)
            return 0
        last = self._token_time.get(mv.id)
        tokens = self._tokens.get(mv.id, 0.0)
        # at most about one second of the rate per chunk: smooth, never a burst
        tokens = min(float(min(budget, opts.rate_limit)),
                     tokens + (opts.rate_limit if last is None else opts.rate_limit * (now - last)))
        self._token_time[mv.id] = now
        limit = int(tokens)
        self._tokens[mv.id] = tokens - limit
        return limit

    def proctime_us(self, now: float) -> int:
        """The processing time of the next epoch, microseconds since the Unix epoch:
        the wall clock, but always after the last committed epoch's (a clock set back
        does not make processing time go back, and two epochs never share one)."""
        last = int(self.meta.get("proctime_us", "0") or 0)
        return max(int(now * 1_000_000), last + 1)

    def plan(self) -> dict[str, Any]:
        """Pin the inputs of the next epoch: DML bound, chunk limits, parallelism, and
        its processing time (the value of the processing-time columns of the rows it
        writes: persisted with the plan, so a re-run after a crash writes the same)."""
        epoch = self.meta.committed_epoch + 1
        staged = self.meta.staged()
        now = time.time()
        queued = self.queued()
        creating = [r for r in self.catalog.all()
                    if r.kind == "mv" and r.state == "creating" and r.id not in queued]
        default_parallelism = default_parallelism_of(self.spark)
        return {"epoch": epoch, "dml_upto": max((b.seq for b in staged), default=0),
                "proctime_us": self.proctime_us(now),
                "limits": {str(r.id): self._chunk_limit(r, now) for r in creating},
                "parallelism": {str(r.id): (r.options.parallelism if r.options
                                            and r.options.parallelism else default_parallelism)
                                for r in creating},
                "queued": sorted(queued),
                # MVs rebuilt from their upstreams this epoch (ALTER ... RECOMPUTE)
                "recompute": self.recompute_requested(),
                # MVs that switch to their created replacement (CREATE OR REPLACE)
                "switch": {str(r.replaces): r.id for r in self.catalog.all()
                           if r.replaces is not None and r.state == "created"}}

    def recompute_requested(self) -> list[int]:
        """The created MVs an ``ALTER MATERIALIZED VIEW ... RECOMPUTE`` asked to rebuild."""
        ids = json.loads(self.meta.get(RECOMPUTE_KEY) or "[]")
        return sorted(i for i in ids if (r := self.catalog.find_by_id(i)) is not None
                      and r.kind == "mv" and r.state == "created")

    def request_recompute(self, conn: Any, ids: Sequence[int]) -> None:
        """Persist a request to rebuild ``ids`` in the next epoch (in ``conn``'s
        transaction)."""
        wanted = set(json.loads(self.meta.get(RECOMPUTE_KEY) or "[]")) | set(ids)
        self.meta.put(conn, RECOMPUTE_KEY, json.dumps(sorted(wanted)))

    def _forget_recompute(self, ids: Sequence[int]) -> None:
        """The requests a committed epoch honoured (a crash before this only repeats a
        rebuild, which finds no difference)."""
        left = set(json.loads(self.meta.get(RECOMPUTE_KEY) or "[]")) - set(ids)
        with self.meta.transaction() as conn:
            self.meta.put(conn, RECOMPUTE_KEY, json.dumps(sorted(left)))

    def step(self) -> EpochReport:
        # a relation that fails on its rows is marked failed and the epoch runs again
        # without it, as a step after a failed one does (``failures``): at most once
        # per relation, once more with every read merged first (``_isolate``), and
        # once more to find whose deferred Δ failed
        for _ in range(len(self.catalog.all()) + 3):
            plan = self.plan()
            pending = self.meta.pending_epoch()
            if pending is not None and pending[0] == plan["epoch"]:
                plan = retry_plan(pending[1], plan)
            self.meta.begin_epoch(plan["epoch"], plan)
            try:
                return self.execute(plan)
            except RelationFailed as failed:
                self._isolate(failed, plan)
        raise AssertionError("unreachable: every relation failed")  # pragma: no cover

    def _isolate(self, failed: RelationFailed, plan: dict[str, Any]) -> None:
        """Persist the plan's retry with every read merged in its own job
        (``RelationStore.merging_reads``: the error may have come from a row no longer
        live, which a filter pushed below an anti-join read), the first time an MV's
        Δ raises an error of its rows in this epoch; then mark ``failed.rel`` failed
        at this epoch, or, when a deferred Δ raised, persist the plan's retry with
        every Δ written alone; re-raise the cause when that was already so."""
        epoch = int(plan["epoch"])
        self.catalog.reload()
        if not plan.get("merged_reads") and not failed.guarded:
            LOG.info("epoch %d runs again with every read merged by key: %s", epoch,
                     error_line(failed.cause))
            self.meta.begin_epoch(epoch, {**plan, "merged_reads": True})
            return
        if failed.rel is None:
            if plan.get("no_defer"):
                raise failed.cause
            self.meta.begin_epoch(epoch, {**plan, "no_defer": True})
            return
        failures = load_failures(self.meta)
        if failures.get(failed.rel.id, Failure(-1, "")).epoch == epoch:
            raise failed.cause  # failed again in the epoch that skips it: not its rows
        failures[failed.rel.id] = Failure(epoch, error_line(failed.cause))
        with self.meta.transaction() as conn:
            self.meta.put(conn, FAILED_KEY, failures_json(failures))
        LOG.warning(failure_message(self.catalog, self.catalog.user_mv(failed.rel),
                                    failed.rel, failures[failed.rel.id]))

    def swap(self, a: Relation, b: Relation) -> EpochReport:
        """Run the epoch of ``ALTER MATERIALIZED VIEW a SWAP WITH b``: no DML, no
        backfill chunk, no switch or recompute (those wait for the next epoch); only
        the two MVs' differences, and what follows from them downstream."""
        self.recover()  # an epoch that failed before its commit first (``step``)
        plan = {**self.plan(), "dml_upto": 0, "recompute": [], "switch": {},
                "swap": [a.id, b.id]}
        plan["limits"] = dict.fromkeys(plan["limits"], 0)
        self.meta.begin_epoch(plan["epoch"], plan)
        return self.execute(plan)

    def recover(self) -> EpochReport | None:
        pending = self.meta.pending_epoch()
        if pending is None:
            return None
        _, plan = pending
        try:
            return self.execute(plan)
        except RelationFailed as failed:  # marked, and the epoch runs as a step
            self._isolate(failed, plan)
            return self.step()

    # --- execution ------------------------------------------------------------------------

    def execute(self, plan: dict[str, Any]) -> EpochReport:
        # the session's settings back, and the store's reads as they were, always; a
        # failed run's cached frames released (a committed one releases them itself)
        with Interpreted(self.spark) as codegen, \
                self.store.merging_reads(bool(plan.get("merged_reads"))), epoch_cache():
            return self._execute_epoch(plan, codegen)

    def _small_epoch(self, plan: dict[str, Any], batches: Sequence[StagedBatch]) -> bool:
        """Whether the epoch's work is small: fewer than ``INTERPRETED_ROWS`` staged rows,
        and no bulk work — no MV creating (a backfill chunk, a snapshot job's thread),
        no recompute, switch or swap, no MV refreshed by recompute every epoch."""
        return (sum(b.rows for b in batches) < INTERPRETED_ROWS
                and not (plan.get("recompute") or plan.get("switch") or plan.get("swap"))
                and not self.snapshots.threads
                and all(r.state == "created" and (r.options is None
                                                  or r.options.refresh != FULL)
                        for r in self.catalog.all() if r.kind == "mv"))

    def _execute_epoch(self, plan: dict[str, Any], codegen: Interpreted) -> EpochReport:
        started = time.time()
        epoch = int(plan["epoch"])
        if plan.get("switch") or plan.get("swap"):
            self.catalog.reload()  # drop what a failed run of a switch held in memory
        if plan.get("proctime_us") is None:  # a plan persisted before processing time
            plan = {**plan, "proctime_us": self.proctime_us(started)}
        self.store.rows_read.clear()
        jobs_before = self.store.spark_jobs

        # phase 1: inputs — the staged DML the plan pinned; a small epoch's queries are
        # interpreted, not compiled (``codegen.py``), up to its commit
        batches = self.meta.staged(int(plan["dml_upto"]))
        if self._small_epoch(plan, batches):
            codegen.interpret()
        by_table: dict[int, list[Any]] = defaultdict(list)
        for b in batches:
            by_table[b.rel_id].append(b)

        # phase 2: Δ per relation, in topological order, each appended once computed
        appends = EpochAppends(self.store, epoch, no_defer=bool(plan.get("no_defer")))
        cached: list[DataFrame] = []
        progress: list[ProgressRow] = []
        created: list[int] = []
        chunk_rows: dict[int, int] = {}
        extra_rows: dict[int, int] = {}
        #: the seconds each backfilling MV spent on its own Δ (its share of the epoch)
        own_seconds: dict[int, float] = {}
        #: the creating jobs' share of the epoch (snapshot jobs' catching up too)
        backfill_seconds = 0.0
        #: how each created MV whose leaves changed took the change
        choices: dict[int, _Choice] = {}
        #: relations whose Δ an MV (created, creating or waiting) reads
        read_now = {u.lower() for r in self.catalog.all() for u in r.upstreams}
        #: MVs that switch to their replacement (which is read whole, after its Δ)
        switching = {int(m): int(r) for m, r in (plan.get("switch") or {}).items()
                     if self.catalog.find_by_id(int(m)) is not None
                     and self.catalog.find_by_id(int(r)) is not None}
        replacements = {self.catalog.get_by_id(r).name.lower() for r in switching.values()}
        appends.read_now = frozenset(read_now | replacements)
        appends.log_read = frozenset(
            {u.lower() for r in self.catalog.all() if r.kind == "mv" and r.state != "created"
             for u in r.upstreams} | replacements)
        switches: list[Switch] = []
        #: SWAP WITH: each MV as it is once it took the other's definition, from the
        #: catalog before either changes
        swapping: dict[int, tuple[Relation, Switch, Relation]] = {}
        if plan.get("swap"):
            one, two = (self.catalog.get_by_id(int(i)) for i in plan["swap"])
            for mv, other in ((one, two), (two, one)):
                swapping[mv.id] = (*swapped(self.catalog, mv, other, epoch), other)
        #: relations that failed on their rows (``failures``): each takes no Δ, unless
        #: a RECOMPUTE asked to rebuild it and it did not fail in this very epoch
        failures = load_failures(self.meta)
        rebuilt = {i for i in plan.get("recompute") or [] if i in failures
                   and failures[i].epoch < epoch}
        for rel in self.catalog.all():
            if rel.kind == "state":
                continue  # computed with its MV
            if self.catalog.is_waiting(rel):
                continue  # its backfill starts once its upstream MVs are created
            if rel.id in failures and rel.id not in rebuilt and rel.id not in switching:
                continue  # failed on its rows: frozen until rebuilt or replaced
            began = time.time()
            try:  # an error of the rows fails this relation only (``failures``)
                if uses_snapshot_job(rel):
                    rel = self.prepare_snapshot_job(rel)
                    try:
                        with self.store.reading_for(rel.name):
                            step = self.snapshots.step(rel, appends.deltas, epoch,
                                                       appends.emitter)
                    except Exception as exc:
                        # the job beside the epochs raised on its rows, which it reads
                        # guarded (``RelationStore.snapshot``): no retry passes that
                        if is_row_error(exc):
                            raise RelationFailed(rel, exc, guarded=True) from exc
                        raise
                    progress.extend(step.progress)
                    appends.tagged.extend(step.versions)
                    extra_rows.update(step.row_counts)
                    if step.created:
                        created.append(rel.id)
                    out, hint = step.result, step.rows_hint
                    scans: list[ScanResult] = []
                elif rel.id in swapping:
                    new, switch, other = swapping[rel.id]
                    self.store.add_columns(new.stored)
                    rows = self.store.snapshot(other.stored, epoch - 1, bulk=True)
                    with self.store.reading_for(rel.name):
                        delta = switch_delta(self.store, rel, new, rows, epoch)
                    rel, hint, scans = new, rel.row_count + other.row_count, []
                    out = DataflowResult(delta, recomputed=True)
                    switches.append(switch)
                    self.catalog.substitute(rel)  # its dependents read it swapped
                    choices[rel.id] = _Choice(RefreshChoice(
                        FULL, "SWAP WITH: took the other's query (the change is the "
                        "difference of the two contents)"), hint, hint)
                elif rel.id in switching:
                    rel, switch, out, hint = self._switch(rel, switching[rel.id], appends, epoch)
                    switches.append(switch)
                    self.catalog.substitute(rel)  # its dependents read it switched
                    scans = []
                    choices[rel.id] = _Choice(RefreshChoice(
                        FULL, "CREATE OR REPLACE: switched to the new query (the change is "
                        "the difference of the two contents)"), hint, hint)
                else:
                    with self.store.reading_for(rel.name):
                        out, scans, hint = self._delta_of(rel, by_table, appends, plan, epoch,
                                                          created, choices)
                if out is not None and out.rows_hint is not None:
                    hint = min(hint, out.rows_hint)
                deferred = (out is not None and out.delta is not None and not scans
                            and out.tag is None and rel.kind == "mv" and not out.recomputed
                            and hint <= LOCAL_WRITE_ROWS and appends.unread(rel)
                            and not appends.no_defer)
                if out is not None and out.guess is not None and not deferred:
                    # a guessed Δ that is read, or written alone: the lost groups first
                    out.delta, out.guess = out.guess.instead(out.cached), None
                if out is not None:
                    cached.extend(out.cached)
                if scans:
                    chunk_rows[rel.id] = sum(s.chunk_rows for s in scans)
                    for leaf, scan in enumerate(scans):
                        cached.extend(scan.cached)
                        progress.extend(scan.progress_rows if scan.progress_rows is not None else
                                        [state_to_row(rel.id, scan.state, scan.pinned_epoch, leaf)])
                    if all(isinstance(scan.state, Done) for scan in scans):
                        created.append(rel.id)
                if out is not None and out.rows is not None:
                    # a table's change computed on the driver: written from there
                    with self.store.reading_for(rel.name):
                        appends.append(rel, None, hint, rows=out.rows)
                elif out is not None and out.delta is not None:
                    if deferred:
                        appends.defer(rel, out.delta, out.guess)
                    elif (not scans and out.tag is None
                          and not (out.placed or out.prepared or out.as_read)
                          and rel.row_count > LOCAL_WRITE_ROWS and appends.log_unread(rel)
                          and hint >= REWRITE_FRACTION * rel.row_count):
                        # a Δ of about as many rows as the table or MV, whose log no
                        # backfill reads: its rows at e written as its new base (as a
                        # state table's), not a log about its size that a fold would
                        # rewrite right after and every read would merge until then;
                        # the MVs over it read the Δ, cached
                        with self.store.reading_for(rel.name):
                            appends.rewrite(rel, out.delta,
                                            None if out.rows_at is None else out.rows_at())
                    else:
                        with self.store.reading_for(rel.name):
                            appends.append(rel, out.delta, hint, out.tag, out.placed,
                                           out.prepared, out.as_read, out.inserts)
            except Exception as exc:
                if (rel.kind == "mv" and is_row_error(exc)
                        and not isinstance(exc, RelationFailed)):  # a table's Δ never
                    raise RelationFailed(rel, exc) from exc
                raise
            if scans:
                own_seconds[rel.id] = time.time() - began
            if scans or uses_snapshot_job(rel):
                backfill_seconds += time.time() - began
            if rel.id in choices and rel.id not in switching and rel.id not in swapping:
                took = choices[rel.id]
                self.refresh.record(rel.id, took.choice.mode, took.changed_rows, took.leaf_rows,
                                    time.time() - began)
        # the small Δs of created MVs nothing reads this epoch: one Spark job for all
        try:
            appends.flush()
        except Exception as exc:
            if is_row_error(exc):  # whose? the epoch runs again writing each Δ alone
                raise RelationFailed(None, exc) from exc
            raise
        counts = appends.counts
        self._inserted = {rid: c.get("+", 0) for rid, c in counts.items()}

        # phase 3: commit the epoch (and forget the failures it rebuilt or replaced)
        finished = time.time()
        cleared = rebuilt | set(switching) | {r.id for sw in switches for r in sw.dropped}
        spark_jobs = self.store.spark_jobs - jobs_before
        after = self._after if self._after is not None and self._after.epoch == epoch - 1 \
            else None
        self.meta.commit_epoch(EpochCommit(
            epoch=epoch, seconds=finished - started, finished_at=finished,
            versions=appends.versions,
            row_count_deltas={**extra_rows, **{rid: c.get("+", 0) - c.get("-", 0)
                                               for rid, c in counts.items()}},
            progress=progress, created=created, applied_dml_upto=int(plan["dml_upto"]),
            tagged_versions=appends.tagged, proctime_us=int(plan["proctime_us"]),
            definitions={k: v for sw in switches for k, v in sw.definitions.items()},
            dropped=[r.id for sw in switches for r in sw.dropped],
            dropped_folders={r.id: self.store.path(r.stored) for sw in switches
                             for r in sw.dropped},
            backfill_seconds=backfill_seconds,
            changes=sum(c.get("+", 0) + c.get("-", 0) + c.get("U+", 0)
                        for c in counts.values()),
            spark_jobs=spark_jobs, after_previous=after,
            settings=({FAILED_KEY: failures_json(
                {i: f for i, f in failures.items() if i not in cleared
                 and self.catalog.find_by_id(i) is not None})} if failures else {}),
        ))

        # phase 4: release the epoch's backfill chunks; housekeeping (under the
        # session's own settings: a fold is bulk work). The epoch is committed: from
        # here a failure is logged and left for a later epoch (the applied DML files,
        # compaction, vacuum), never raised
        codegen.restore()
        warnings: list[str] = []
        self.catalog.reload()
        self.last_rows_read = dict(self.store.rows_read)
        for rel_id, failure in failures.items():
            failed = self.catalog.find_by_id(rel_id)
            if failure.epoch == epoch and failed is not None:
                warnings.append(failure_message(self.catalog, self.catalog.user_mv(failed),
                                                failed, failure))
        for rel_id in sorted(rebuilt):
            if (fixed := self.catalog.find_by_id(rel_id)) is not None and not fixed.internal:
                warnings.append(f"materialized view {fixed.name!r}, failed at epoch "
                                f"{failures[rel_id].epoch}, is rebuilt and readable again")

        def after_commit(what: str, work: Any) -> None:
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - the epoch stands; retried later
                warnings.append(f"epoch {epoch} committed, but {what} failed (retried "
                                f"later): {type(exc).__name__}: {exc}")
                LOG.warning(warnings[-1])

        for df in cached + appends.cached:
            after_commit("releasing a backfill chunk or a cached Δ", df.unpersist)
        for sw in switches:
            after_commit("removing the files of a switched MV's old state and of its "
                         "replacement", lambda sw=sw: self._forget_switched(sw))
        if plan.get("recompute"):
            after_commit("forgetting the honoured RECOMPUTE requests",
                         lambda: self._forget_recompute(plan["recompute"]))
        after_commit("removing applied DML files",
                     lambda: self.stager.remove_applied([b.path for b in batches]))
        if not any(chunk_rows.values()):  # no backfill work: the epoch's base cost
            self._base_samples.append(finished - started)
        for mv_id in chunk_rows:
            mv = self.catalog.get_by_id(mv_id)
            self._samples[mv_id].append(_RateSample(finished, self._rows_done(mv)))
            self._adapt_budget(mv, finished - started, own_seconds.get(mv_id),
                               chunk_rows[mv_id])
        after_commit("compaction and vacuum", lambda: self._housekeep(epoch, appends.versions))
        # by name: the relations that still exist (a switch drops its replacement's)
        names = {r.id: r.name for r in self.catalog.all()}
        changes = {names[rid]: c.get("+", 0) + c.get("-", 0) + c.get("U+", 0)
                   for rid, c in counts.items() if rid in names}
        self._after_began = finished
        self.after_commit(epoch, warnings)
        return EpochReport(epoch=epoch, seconds=finished - started, changes=changes,
                           jobs=self.jobs(), rows_read=self.last_rows_read,
                           backfill_rows={names[k]: v for k, v in chunk_rows.items()
                                          if k in names},
                           spark_jobs=spark_jobs, warnings=warnings,
                           refresh={names[k]: c.choice for k, c in choices.items()
                                    if k in names})

    def after_commit(self, epoch: int, warnings: Sequence[str]) -> None:
        """The work after ``epoch``'s commit is done (``Engine.step``'s sinks and
        sampled VERIFY included), with these warnings: recorded in its row of
        ``epochs`` with the next epoch's commit."""
        self._after = AfterCommit(epoch, time.time() - self._after_began, tuple(warnings))

    def prepare_snapshot_job(self, mv: Relation) -> Relation:
        """A snapshot job that waited for its upstream MVs takes its snapshot as of the
        last committed epoch (where they are complete), not as of its creation; a job
        that has started keeps its snapshot. Call before starting its phase 1."""
        committed = self.meta.committed_epoch
        if mv.created_epoch >= committed or self.snapshots.has_started(mv) or not any(
                leaf.kind == "mv" and (leaf.ready_epoch or 0) > mv.created_epoch
                for leaf in self.catalog.leaves_of(mv)):
            return mv
        with self.meta.transaction() as conn:
            self.meta.set_created_epoch(conn, mv.id, committed)
        self.catalog.reload()
        return self.catalog.get_by_id(mv.id)

    def _delta_of(self, rel: Relation, by_table: dict[int, list[Any]],
                  appends: EpochAppends, plan: dict[str, Any], epoch: int,
                  created_now: Sequence[int], choices: dict[int, _Choice],
                  ) -> tuple[DataflowResult | None, list[ScanResult], int]:
        """Δ of one relation for ``epoch`` (its operators append their state tables'
        Δs), for a creating MV the result of each leaf's backfill scan, and about
        how many rows the Δ holds. ``created_now``: the MVs this epoch completes (so
        far, upstream first); ``choices`` takes how a created MV took its change."""
        if rel.kind == "table":
            batches = by_table.get(rel.id)
            if not batches:
                return None, [], 0
            table = table_delta(self.spark, self.store, rel, batches, epoch - 1,
                                int(plan["proctime_us"]))
            return (DataflowResult(table.delta, placed=table.placed, prepared=table.prepared,
                                   rows_at=table.rows_at, rows=table.rows),
                    [], sum(b.rows for b in batches))
        assert rel.plan is not None and rel.options is not None
        leaves = self.catalog.leaves_of(rel)
        states = self.catalog.states_of(rel)
        deltas = appends.deltas
        hint = sum(appends.rows(leaf.id) for leaf in leaves)
        repair = rel.id in plan.get("recompute", ())
        if rel.plan.topn is not None:
            # a top-N recomputes from its whole input: created in its first epoch
            leaf = leaves[0]
            if rel.state == "created" and leaf.id not in deltas and not repair:
                return None, [], 0
            if repair and self.store.damaged(rel.stored, epoch - 1):
                appends.replace(rel, *rebuilt_top_n(self.store, rel, leaf,
                                                    deltas.get(leaf.id), epoch))
                return None, [], 0
            out = DataflowResult(self.dataflow.top_n(rel, leaf, deltas.get(leaf.id), epoch))
            scans = [] if rel.state == "created" else [ScanResult(
                None, Done(leaf.row_count), epoch - 1, leaf.row_count, [])]
            return out, scans, hint + rel.plan.topn.limit
        if rel.state == "created":
            ops = [appends.counts.get(leaf.id, {}) for leaf in leaves]
            # a leaf's Δ of insertions only (as its append observed it) is taken as such
            changes = [change_of(deltas.get(leaf.id), [c.name for c in leaf.columns],
                                 retracting=retracts(c))
                       for leaf, c in zip(leaves, ops, strict=True)]
            if all(c is None for c in changes) and not repair:
                return None, [], 0
            # the rows a recompute reads: each leaf's, before or after the change
            leaf_rows = sum(max(leaf.row_count, leaf.row_count + c.get("+", 0) - c.get("-", 0))
                            for leaf, c in zip(leaves, ops, strict=True))
            choice = (RefreshChoice(FULL, "ALTER MATERIALIZED VIEW ... RECOMPUTE") if repair
                      else self.refresh.choose(rel, hint, leaf_rows))
            choices[rel.id] = _Choice(choice, hint, leaf_rows)
            if choice.mode == FULL:
                # a repair compares every relation whole (none is trusted): its
                # differences are bounded by the MV's rows, not by the change
                hint = max(hint, rel.row_count) if repair else hint
                diff = recompute(self.store, rel, leaves, states,
                                 [self._rows_at(leaf, appends, epoch) for leaf in leaves],
                                 changes,
                                 [leaf.row_count + c.get("+", 0)
                                  for leaf, c in zip(leaves, ops, strict=True)],
                                 epoch, appends.emitter(), hint, whole=repair,
                                 rows_before=lambda: [self._rows_at(leaf, None, epoch - 1)
                                                      for leaf in leaves],
                                 replace=appends.replace, rewrite=appends.rewrite_unread)
                return DataflowResult(diff, recomputed=True), [], hint
            emit = appends.emitter(may_wait=True, may_retract=any(retracts(c) for c in ops))
            return (self.dataflow.run(rel, leaves, states, changes, epoch, False, emit, hint,
                                      [appends.rows(leaf.id) for leaf in leaves],
                                      held=[self._held(leaf, Held(epoch - 1))
                                            for leaf in leaves],
                                      may_guess=self.guessing.may_guess(rel.id),
                                      saw=functools.partial(self.guessing.saw, rel.id)),
                    [], hint)
        if rel.id in plan.get("queued", []):
            return None, [], 0
        rows = self.meta.progress(rel.id)
        initial = all(r.state == "not_started" for r in rows)
        active = self._active_leaf(rel, leaves, rows)
        limit = plan["limits"].get(str(rel.id), rel.options.chunk_rows)
        scans = [self._follow(leaf, deltas.get(leaf.id), created_now)
                 if self.catalog.follows_from_birth(rel, leaf) else
                 self._scan_leaf(rel, i, leaf, [r for r in rows if r.leaf == i],
                                 limit if i == active else 0, deltas.get(leaf.id), plan, epoch)
                 for i, leaf in enumerate(leaves)]
        hint += sum(s.chunk_rows for s in scans)
        result = self.dataflow.run(rel, leaves, states, [s.change for s in scans], epoch,
                                   initial, appends.emitter(), hint,
                                   [appends.rows(leaf.id) + s.chunk_rows
                                    for leaf, s in zip(leaves, scans, strict=True)],
                                   held=[self._held(leaf, s.held or Held(epoch - 1))
                                         for leaf, s in zip(leaves, scans, strict=True)])
        return result, scans, hint

    def _switch(self, mv: Relation, rep_id: int, appends: EpochAppends, epoch: int,
                ) -> tuple[Relation, Switch, DataflowResult, int]:
        """The epoch where ``mv`` switches to its created replacement (processed
        before it this epoch): ``mv`` as switched, what the commit writes, and as
        its Δ the difference between its old rows and the replacement's (the Δ's
        rows: at most both contents)."""
        rep = self.catalog.get_by_id(rep_id)
        new, switch = switched(self.catalog, mv, rep, epoch)
        self.store.add_columns(new.stored)
        rows = self._rows_at(rep, appends, epoch)
        with self.store.reading_for(mv.name):
            delta = switch_delta(self.store, mv, new, rows, epoch)
        hint = mv.row_count + rep.row_count + appends.rows(rep.id)
        return new, switch, DataflowResult(delta, recomputed=True), hint

    def _forget_switched(self, switch: Switch) -> None:
        """After a switch commits: the dropped relations' files and in-memory state."""
        for rel in switch.dropped:
            self.store.delete(rel.dir)
            self.scan.forget(rel.id)
            self.refresh.forget(rel.id)
            self.guessing.forget(rel.id)
        self.meta.remove_pending_dirs([self.store.path(r.stored) for r in switch.dropped])
        for rel_id in switch.definitions:
            self.refresh.forget(rel_id)  # a new query: its measured costs start over
            self.guessing.forget(rel_id)

    def _rows_at(self, leaf: Relation, appends: EpochAppends | None, epoch: int) -> DataFrame:
        """The live rows of ``leaf`` at ``epoch``, this epoch's append included (not
        committed yet: read from the Delta version the append made); without
        ``appends``, at committed ``epoch``."""
        if appends is None:
            files = self.store.files_at(leaf.stored, epoch)
        elif (version := appends.versions.get(leaf.id)) is not None:
            files = self.store.files(leaf.stored, version)
        else:  # unchanged this epoch
            files = self.store.files_at(leaf.stored, epoch - 1)
        rows = self.store.snapshot(leaf.stored, epoch, files=files, bulk=True)
        return rows.selectExpr(*names_sql([c.name for c in leaf.columns]))

    def _held(self, leaf: Relation, held: Held) -> HeldRows:
        """The rows of ``leaf`` an MV held before the epoch, read when asked for."""
        return HeldRows(lambda narrow: held_rows(self.store, leaf, held, narrow), held.empty,
                        lambda column, values: held_rows_in(self.store, leaf, held, column,
                                                            values))

    @staticmethod
    def _follow(leaf: Relation, delta: DataFrame | None,
                created_now: Sequence[int]) -> ScanResult:
        """A leaf the MV follows from birth: its changes pass through as they are;
        done once the leaf is created (it then holds every row it will hold)."""
        done = leaf.state == "created" or leaf.id in created_now
        return ScanResult(change_of(delta, [c.name for c in leaf.columns]),
                          Done(leaf.row_count) if done else NotStarted(), None, 0, [])

    def _active_leaf(self, mv: Relation, leaves: list[Relation],
                     rows: list[ProgressRow]) -> int | None:
        """The one leaf whose snapshot the job reads now: a started one, else the
        next in ``backfill_order`` (by default the leaf with fewer rows first)."""
        def leaf_state(i: int) -> str:
            mine = [r for r in rows if r.leaf == i]
            assert mv.options is not None
            if mv.options.strategy == "arrangement":
                if VnodeProgress.from_rows(mine).is_done:
                    return "done"
            elif isinstance(state_from_rows(mine)[0], Done):
                return "done"
            return "started" if any(r.state != "not_started" for r in mine) else "not_started"
        pending = [i for i in range(len(leaves)) if leaf_state(i) != "done"
                   and not self.catalog.follows_from_birth(mv, leaves[i])]
        started = [i for i in pending if leaf_state(i) == "started"]
        if started:
            return started[0]
        if not pending:
            return None
        assert mv.options is not None and mv.plan is not None
        order = list(mv.options.backfill_order or ())
        aliases = [lf.alias.lower() for lf in mv.plan.leaves]
        names = [lf.relation.lower() for lf in mv.plan.leaves]

        def rank(i: int) -> tuple[int, int, int]:
            for n, wanted in enumerate(order):
                if wanted.lower() in (aliases[i], names[i]):
                    return (n, 0, i)
            return (len(order), leaves[i].row_count, i)
        return min(pending, key=rank)

    def _scan_leaf(self, rel: Relation, leaf: int, upstream: Relation,
                   rows: list[ProgressRow], limit: int | None, delta_u: DataFrame | None,
                   plan: dict[str, Any], epoch: int) -> ScanResult:
        """One epoch of the backfill scan of one leaf of a creating MV."""
        assert rel.options is not None
        if rel.options.strategy == "arrangement":
            progress = VnodeProgress.from_rows(rows)
            parallelism = int(plan.get("parallelism", {}).get(str(rel.id), 1))
            result = self.arrangement.run(upstream, progress, int(limit or 0), parallelism,
                                          delta_u, epoch)
            done = result.progress.is_done
            return ScanResult(
                result.change, Done(result.progress.rows_done) if done else InProgress(
                    END, result.progress.rows_done), None, result.chunk_rows, result.cached,
                result.progress.to_rows(rel.id, since=progress, leaf=leaf), held=result.held)
        state, pinned = state_from_rows(rows)
        return self.scan.run(rel, leaf, upstream, state, pinned, limit, delta_u, epoch)

    def _housekeep(self, epoch: int, appended: dict[int, int]) -> None:
        held = self.snapshots.held_relations()
        for rel in self.catalog.all():
            if rel.id in held:
                continue  # a snapshot job reads its log or writes it as of earlier epochs
            if rel.id in appended:
                due = self.store.compaction_due(rel.stored, epoch)
                if due == "fold":
                    self.store.compact(rel.stored, epoch, rel.row_count)
                elif due == "merge":
                    self.store.merge_log(rel.stored, epoch)
            if rel.stored.dir in self.store.copies_wanted:
                # a lookup read this base whole: its keyed copies (of the base as it is
                # after a fold above), for the next ones
                self.store.write_keyed_copies(rel.stored, epoch)
        if epoch % self.vacuum_every == 0:
            self.vacuum(epoch)

    def retention_horizon(self, epoch: int | None = None) -> int:
        """The oldest epoch still readable."""
        epoch = self.meta.committed_epoch if epoch is None else epoch
        horizon = max(0, epoch - self.retain_epochs)
        for rel in self.catalog.all():
            if rel.kind == "mv" and rel.state == "creating":
                for row in self.meta.progress(rel.id):
                    if row.pinned_epoch is not None:
                        horizon = min(horizon, row.pinned_epoch)
        return horizon

    def vacuum(self, epoch: int) -> None:
        horizon = self.retention_horizon(epoch)
        by_id = {r.id: r for r in self.catalog.all()}
        for rel_id, path in self.meta.removed_files_before(horizon):
            rel = by_id.get(rel_id)
            if rel is not None:
                self.store.remove_file(rel.stored, path)
        with self.meta.transaction() as conn:
            self.meta.forget_removed_files(conn, horizon)
            self.meta.prune_versions(conn, horizon)
            self.meta.put(conn, "retention_horizon", str(horizon))
        # directories emptied by the removals above; a running snapshot job writes
        # its relations' files from its own thread, so those are left to the job
        held = self.snapshots.held_relations()
        for rel in by_id.values():
            if rel.id in held:
                continue
            wh = self.store.warehouse
            if not wh.is_local:
                continue  # an object store has no directories: nothing is left behind
            for sub in ("log", "base"):
                for d in wh.list(f"{self.store.path(rel.stored)}/{sub}"):
                    if wh.is_file(d):
                        continue
                    if not any(e.endswith(".parquet") or not wh.is_file(e) for e in wh.list(d)):
                        wh.rmtree(d)

    # --- progress -------------------------------------------------------------------------

    def _rows_done(self, mv: Relation) -> int:
        return sum(r.rows for r in self.meta.progress(mv.id))

    def job_progress(self, mv: Relation) -> JobProgress:
        """An MV's job; one with a join chain counts its links' rows too and shows
        the state, rate and ETA of the part that runs now (links first)."""
        own = self._job_progress(mv)
        links = self.catalog.internals_of(mv)
        if not links or mv.state == "created":
            return own
        parts = [*[self._job_progress(link) for link in links], own]
        active = next(p for p in parts if p.state != "created")
        done = sum(p.rows_done for p in parts)
        return replace(active, name=mv.name, rows_done=done,
                       rows_total_estimate=max(done, sum(p.rows_total_estimate for p in parts)),
                       eta_seconds=None if active is not own else own.eta_seconds,
                       vnodes_done=own.vnodes_done)

    def _job_progress(self, mv: Relation) -> JobProgress:
        assert mv.options is not None
        if uses_snapshot_job(mv):
            return self.snapshots.progress(mv)
        rows = self.meta.progress(mv.id)
        done = sum(r.rows for r in rows)
        leaves = max(1, len(mv.upstreams))
        if mv.options.strategy == "arrangement":
            vnodes = sum(VnodeProgress.from_rows([r for r in rows if r.leaf == i]).vnodes_done
                         for i in range(leaves)) // leaves
        else:
            vnodes = 256 * sum(r.state == "done" for r in rows) // leaves
        if mv.state == "created":
            return JobProgress(mv.name, mv.options.strategy, "created", done, done, 0.0, 0.0,
                               vnodes_done=256)
        total = max(done, sum(leaf.row_count for leaf in self.catalog.leaves_of(mv)))
        samples = list(self._samples.get(mv.id, ()))
        rate = 0.0
        if len(samples) >= 2 and samples[-1].at > samples[0].at:
            rate = max(0.0, (samples[-1].rows - samples[0].rows)
                       / (samples[-1].at - samples[0].at))
        paused = mv.options.rate_limit == 0
        recent = samples[-STALL_EPOCHS:]
        stalled = (not paused and len(recent) == STALL_EPOCHS
                   and recent[-1].rows == recent[0].rows)
        eta = (total - done) / rate if rate > 0 else None
        state = ("queued" if mv.id in self.queued() else "paused" if paused
                 else "backfilling")
        return JobProgress(mv.name, mv.options.strategy, state, done, total, rate, eta,
                           vnodes_done=vnodes, paused=paused, stalled=stalled)

    def user_job(self, mv: Relation, failures: dict[int, Failure] | None = None
                 ) -> JobProgress:
        """The job of the user's MV ``mv``: its creation, or a replacement being
        built for it (``CREATE OR REPLACE``; until the switch), under its name;
        ``failures``: the failed relations, when the caller read them."""
        rep = self.catalog.replacement_of(mv)
        job = self.job_progress(mv) if rep is None else \
            replace(self.job_progress(rep), name=mv.name)
        failed = failed_upstream(self.catalog, mv, load_failures(self.meta)
                                 if failures is None else failures)
        if failed is not None:
            job = replace(job, failed=failure_message(self.catalog, mv, *failed))
        return job

    def jobs(self) -> list[JobProgress]:
        failures = load_failures(self.meta)  # one read for every MV's job
        return [self.user_job(r, failures) for r in self.catalog.all()
                if r.kind == "mv" and not r.internal]


def retry_plan(failed: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """The plan of an epoch whose earlier run (``failed``, its persisted plan) raised
    before its commit, some of its appends perhaps landed (each holding that run's
    inputs, found again by its application transaction): ``fresh`` (what the
    catalog asks now: a RECOMPUTE, a switch, a new MV's chunk) with the failed run's
    inputs pinned: its DML bound (DML staged since waits for the next epoch: a
    landed table append does not hold it), processing time, chunk limits and
    parallelism; an MV that began creating since waits for the next epoch. A failed
    SWAP is run again as it was."""
    if failed.get("swap"):
        return failed
    plan = {**fresh, "dml_upto": failed["dml_upto"]}
    if failed.get("proctime_us") is not None:
        plan["proctime_us"] = failed["proctime_us"]
    if failed.get("no_defer"):  # a deferred Δ failed on its rows: each is written alone
        plan["no_defer"] = True
    if failed.get("merged_reads"):  # a Δ failed on its rows: every read merged by key
        plan["merged_reads"] = True
    for key in ("limits", "parallelism"):
        plan[key] = {**fresh.get(key, {}), **failed.get(key, {})}
    # an MV whose creation began after the failed run was planned waits for the next
    # epoch: that run may have written a relation it reads as a new base, keeping no
    # changelog of the epoch for a backfill to read (``EpochAppends.log_unread``)
    began = [int(i) for i in fresh.get("limits", {}) if i not in failed.get("limits", {})]
    plan["queued"] = sorted({*fresh.get("queued", []), *began})
    return plan
