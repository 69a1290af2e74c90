"""An MV's dataflow: from the changes of its leaves in one epoch to the MV's
changelog and the changelogs of its state tables, through its operators in order.

Invariant: with ``V_i(e)`` the rows of leaf ``i`` the MV has taken in so far
(all of it once created, the backfilled part while creating), after epoch ``e``
``MV(e) = Q(V_1(e), V_2(e))``, and each stateful operator's state table holds
what its module says (``join.py``, ``aggregate.py``, ``window.py``).

A stateful operator recomputes only the partitions — join keys, groups, window
partitions — that
the epoch's changes touch: the old rows from its state at ``e-1``, the new rows
from that state with the changes applied; the difference of the two is the
output. Reads of a state table are pruned to the touched partitions' vnodes and
filtered by the touched keys — values the state table's write observed, so the
filter is part of the read's own Spark job (a broadcast job only for a Δ with
more than ``KEY_VALUES`` keys) — so an epoch's work follows its changes, not the
size of the state (global aggregates, one partition, excepted).

A state table's Δ is appended (``emit``) as soon as it is computed, in one Spark
job that also observes the vnodes it touched; the operator reads it back from
the written files, so no Δ is computed twice and no plan grows down a chain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from ..sql.planner import GROUP_OF_ROW, MvPlan
from ..storage.catalog import Relation
from ..storage.relation_store import LOCAL_WRITE_ROWS, Appended, RelationStore
from ..storage.schema import names_sql
from ..storage.spark_files import ONE_TASK_ROWS
from . import aggregate, join, project, topn, union, window
from .cached import persisted
from .change import WEIGHT, Change, Emit, HeldRows, StateDelta, Unkept, signed_changelog
from .changelog import consolidate, net_changelog
from .keys import SCAN_ROWS, keyed_unkept

__all__ = ["DataflowResult", "MvDataflow", "stage_input_rows"]


@dataclass
class DataflowResult:
    #: the MV's own changelog for the epoch (not written yet), None: no change
    delta: DataFrame | None
    #: the epoch the Δs are appended as (a snapshot job catching up: an earlier one)
    tag: int | None = None
    #: at most about how many rows ``delta`` holds, when the operators know better than
    #: the count of their input rows (an aggregate: two per touched group); it sizes
    #: the Δ's write (a few thousand groups are written by the driver, not as files of
    #: vnode ranges sized by the million input rows they came from)
    rows_hint: int | None = None
    #: ``delta`` is already in the partitions its append writes, for the hint it is
    #: appended with (a first load: ``RelationStore.place_by_vnode_range``)
    placed: bool = False
    #: ``delta`` is a backfill chunk of a filter/project whose rows keep their leaf
    #: row's vnode (``project.keeps_leaf_vnodes``), in the partitions the leaf's files
    #: were read in, each of a few contiguous vnodes: written as they are, with no
    #: exchange into ranges of vnodes (``RelationStore.append``'s ``as_read``)
    as_read: bool = False
    #: ``delta`` holds insertions only (a chunk's or a first fill's rows, no upstream
    #: change beside them): an as-read write takes its counts from its files' footers
    inserts: bool = False
    #: ``delta`` is the rows of these directories' files, written already as the
    #: relation's log files of the epoch (a table's placed first load): linked, not
    #: written again
    prepared: tuple[str, ...] = ()
    #: ``delta`` is the difference of a recompute (``recompute.py``): computing it reads
    #: the MV's leaves and relations whole, so its append never waits for the flush
    recomputed: bool = False
    #: frames this epoch's operators cached (read by two of its jobs): released after
    #: the commit
    cached: list[DataFrame] = field(default_factory=list)
    #: the relation's rows at the epoch (columns + ``_vnode``), built when asked for,
    #: where they cost less than ``delta`` applied to its rows at ``e-1`` (a table's:
    #: ``TableDelta.rows_at``): what a rewrite in place of the append writes
    rows_at: Callable[[], DataFrame] | None = None
    #: the changelog as rows on the driver, ``delta`` then None (a table's change of new
    #: keys: ``TableDelta.rows``): written from there
    rows: pa.Table | None = None
    #: ``delta`` is a running aggregate's changelog on the guess that no group lost its
    #: min/max (``aggregate.Guess``): written only once ``guess.check`` is found empty,
    #: else ``guess.instead``'s changelog is
    guess: aggregate.Guess | None = None


class MvDataflow:
    """Runs one MV's operators for one epoch."""

    def __init__(self, spark: SparkSession, store: RelationStore) -> None:
        self.spark = spark
        self.store = store

    def run(self, mv: Relation, leaves: Sequence[Relation], states: Sequence[Relation],
            changes: Sequence[Change | None], epoch: int, initial: bool, emit: Emit,
            rows_hint: int, leaf_rows: Sequence[int] | None = None,
            held: Sequence[HeldRows] | None = None, may_guess: bool = False,
            saw: Callable[[bool], None] | None = None) -> DataflowResult:
        """``changes[i]``: leaf ``i``'s change this epoch (None: none); ``initial``:
        the job's first epoch (a global aggregate emits its row for empty input);
        ``emit`` appends a state table's Δ; ``rows_hint``: about how many rows the
        changes hold, ``leaf_rows`` (when known) each leaf's share; ``held[i]``: the
        rows of leaf ``i`` the MV held before the epoch, read only when an aggregate
        finds a lost min/max again there (``AggSpec.extremes``); ``may_guess``: a
        running aggregate's Δ may be a guess (``DataflowResult.guess``), which the
        caller checks before it writes the Δ or gives it to any reader; ``saw``: told,
        each epoch whose Δ could lose a running min/max, whether a group did."""
        plan = mv.plan
        assert plan is not None
        result = DataflowResult(None)
        names = [c.name for c in mv.columns]

        # stage 1: rows — filter/project over one leaf, over each branch of a UNION
        # ALL, or over a recomputed join (each side's state table takes its change)
        if plan.branches:
            result.delta = union.union_delta(mv, plan, changes)
            return result
        if plan.join is None:
            rows = project.row_change(plan, changes[0])
        else:
            rows = join.join_change(self.store, plan, leaves, states[:2], changes, epoch,
                                    emit, rows_hint, leaf_rows, held)

        # stage 2: the aggregate, the window functions, or the rows themselves, become
        # the MV's changelog (the aggregate's and the window's input rows go to their
        # state table first)
        written: StateDelta | None = None
        few_groups = False  # a bulk Δ of the aggregate's input, of few groups
        if plan.window is not None:
            if rows is not None:
                written = self._emit_stage_input(plan, states[-1], rows, emit, rows_hint)
            assert written is None or isinstance(written, Appended)  # never deferred
            result.delta = window.window_change(self.store, mv, plan, states[-1], written,
                                                epoch)
            return result
        if plan.agg is None:
            if rows is not None:
                if rows.leaves and (signed_rows := rows.signed_rows()) is not None:
                    # the change as signed rows (a leaf's changelog read once, or a join's
                    # terms), netted per row and paired per key in one exchange (none
                    # for a small change, read as one partition; the statement reads
                    # the MV's columns and the weight by name)
                    result.delta = net_changelog(signed_rows, names, mv.key, WEIGHT,
                                                 spread=rows_hint > ONE_TASK_ROWS)
                else:
                    picked = rows.mapped(lambda part: part.selectExpr(*names_sql(names)))
                    result.delta = consolidate(picked.before, picked.after, names, mv.key,
                                               fresh=picked.fresh)
                result.as_read = _as_read(mv, leaves, changes, rows, initial)
                result.inserts = not rows.leaves
            return result
        if rows is not None and aggregate.keeps_input(plan.agg):
            # a running or a global aggregate reads its state whole when the Δ's keys
            # are not known: its Δ may wait for the flush, or become the state's rows
            written = self._emit_stage_input(
                plan, states[-1], rows, emit, rows_hint,
                deferrable=aggregate.state_may_wait(mv, plan),
                rewritable=plan.agg.running is not None or not plan.agg.group)
        elif (rows is not None and initial and plan.agg.group and plan.join is None
              and rows_hint > LOCAL_WRITE_ROWS):
            # a bulk first epoch (a blocking CREATE, a first chunk): the MV is empty and
            # its leaf's rows are the change's after-images (none were held, so no
            # before-image counts), so its Δ is the aggregate over them, as a batch
            # query computes it, with partial aggregation; its groups are counted
            # first, so its write is sized by them
            after = stage_input_rows(plan, states[-1], rows.arrivals())
            out, groups = aggregate.evaluate_counted(mv, plan, after, result.cached)
            self.store.spark_jobs += 1
            result.rows_hint = groups
            result.delta = consolidate(None, out.selectExpr(*names_sql(names)), names, mv.key)
            return result
        elif rows is not None:
            written = self._unkept_stage_input(mv, plan, states[-1], rows, rows_hint)
            if rows_hint > LOCAL_WRITE_ROWS:
                # a bulk Δ: its groups size the MV's write. Cached: the estimate's job
                # and the aggregate's both read it, and computing it pairs the row
                # stage's images through an exchange (a backfill chunk of TPC-H q1:
                # 184,000 rows shuffled twice an epoch, 0.6-0.9 s each)
                written = replace(written, delta=persisted(written.delta))
                result.cached.append(written.delta)
                groups = aggregate.estimate_groups(written.delta)
                few_groups = groups <= aggregate.FEW_GROUPS
                result.rows_hint = aggregate.changed_rows_bound(groups)
                self.store.spark_jobs += 1
        guesses: list[aggregate.Guess] | None = [] if may_guess else None
        result.delta = aggregate.aggregate_change(self.store, mv, plan, states[-1], written,
                                                  epoch, initial, held[0] if held else None,
                                                  few_groups, result.cached, guesses, saw)
        result.guess = guesses[0] if guesses else None
        if isinstance(written, Appended) and written.key_count is not None:
            result.rows_hint = aggregate.changed_rows_bound(written.key_count)
        return result

    # --- top-N (an MV of its own over one leaf) -------------------------------------------

    def top_n(self, mv: Relation, leaf: Relation, leaf_delta: DataFrame | None,
              epoch: int) -> DataFrame:
        """A top-N MV's changelog for ``epoch`` (``topn.top_n``)."""
        return topn.top_n(self.store, mv, leaf, leaf_delta, epoch)

    # --- the aggregate's or the window functions' input ------------------------------------

    def _emit_stage_input(self, plan: MvPlan, state: Relation, rows: Change, emit: Emit,
                          rows_hint: int, deferrable: bool = False,
                          rewritable: bool = False) -> StateDelta | None:
        """Append the row stage's change to the aggregate's or the window's state table
        (distributed by its first key column, the group or partition); ``deferrable``:
        the append may wait for the epoch's flush."""
        return emit(state, self._stage_delta(plan, state, rows), rows_hint,
                    deferrable=deferrable, rewritable=rewritable)

    def _stage_delta(self, plan: MvPlan, state: Relation, rows: Change) -> DataFrame:
        """The row stage's change as a changelog of the aggregate's or the window's
        state table (distributed by its first key column)."""
        staged = rows.mapped(lambda part: stage_input_rows(plan, state, part))
        return consolidate(staged.before, staged.after, [c.name for c in state.columns],
                           state.key, state.key[:1], staged.fresh)

    def _unkept_stage_input(self, mv: Relation, plan: MvPlan, state: Relation, rows: Change,
                            rows_hint: int) -> Unkept:
        """The row stage's change as the aggregate's state Δ, not appended (the
        aggregate keeps no input rows); a small Δ's groups come to the driver (one
        Spark job), so the MV's lookup of their old values stays a keyed one, unless
        the MV is small enough to be read whole. Never appended, it need not be
        consolidated: from signed rows (read once), its rows are only mapped — the
        running values sum them signed, and a lost min/max applies them
        (``aggregate_running``), which a pair of equal rows leaves as it was."""
        if (signed := rows.signed_rows()) is not None:
            delta = signed_changelog(
                aggregate.agg_input_rows(plan, state, signed, keep=[WEIGHT]),
                [c.name for c in state.columns])
        else:
            delta = self._stage_delta(plan, state, rows)
        if rows_hint <= LOCAL_WRITE_ROWS and mv.row_count > SCAN_ROWS:
            return keyed_unkept(self.store, delta, GROUP_OF_ROW, rows.leaves)
        return Unkept(delta, rows.leaves)


def _as_read(mv: Relation, leaves: Sequence[Relation], changes: Sequence[Change | None],
             rows: Change, initial: bool) -> bool:
    """Whether the MV's Δ is in the layout of one leaf's change, so it is written as
    read (``DataflowResult.as_read``): a backfill chunk (alone: no image leaves; or
    beside the upstream's own few changes) of rows that keep the vnodes of that
    leaf's rows (``project.keeps_leaf_vnodes``) — of a filter/project, or of an inner
    join whose other side is small (broadcast to the chunk's partitions), the one
    leaf that changed or, in a first fill, the large one (the other side's chunk
    meets the large one's rows as read)."""
    if rows.leaves and rows.fresh is None:
        return False
    if any(c is not None and c.has_signed for c in changes):
        # a leaf's changelog read back from its log: its partitions are the read's
        # packing of the log's files, not a few contiguous vnodes each
        return False
    changed = [i for i, c in enumerate(changes) if c is not None]
    sides = changed if len(changed) == 1 or not initial else [
        i for i, leaf in enumerate(leaves) if leaf.row_count > SCAN_ROWS]
    if len(sides) != 1:
        return False
    side = sides[0]
    if any(leaf.row_count > SCAN_ROWS for i, leaf in enumerate(leaves) if i != side):
        return False
    return project.keeps_leaf_vnodes(mv, leaves, side)


def stage_input_rows(plan: MvPlan, state: Relation, rows: DataFrame) -> DataFrame:
    """Row-stage rows as rows of the state table of the aggregate or of the window
    functions (its first key column: the row's group or partition)."""
    return (aggregate.agg_input_rows(plan, state, rows) if plan.agg is not None
            else window.window_input_rows(plan, state, rows))
