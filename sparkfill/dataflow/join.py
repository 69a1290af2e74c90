"""Join: two leaves' rows joined, each side's rows in its state table — kept there
from the first time they must be looked up by key.

Invariant: a join side's state table is kept or not kept. Kept, after epoch ``e``
it holds ``V_i(e)``, keyed ``(join key JSON, leaf key)`` and distributed by join
key. Not kept (an inner join's side whose state has no files at ``e-1``), it holds
nothing, and ``V_i(e-1)`` is the leaf's rows the MV held (``HeldRows``) mapped by
``side_rows``: its Δs are not appended. A side is kept from the epoch in which the
other side's change first needs its rows and its leaf is large: that epoch appends
all of ``V_i(e)`` as its state's Δ. So a CREATE writes no join state, and a side
only ever looked up by a small other side's changes (a dimension table's) is never
written — the state exists by need.

The join recomputes only the join keys the epoch's changes touch: each side's
state at ``e-1`` looked up by those keys (pruned to their vnodes) is the old
input, that state with the side's Δ applied the new one, and the row stage over
each is the change. An inner join follows the bilinear rule instead
(``Δ(A⋈B) = ΔA⋈B(e-1) + A(e)⋈ΔB``): each side's Δ looks up only the other
side's rows of the keys it touched (a side not kept: its held rows, read whole);
no side's unchanged rows of a touched key are read. A side not kept takes its
leaf's change as signed rows, read once and not paired by key (the terms are
netted anyway), and the MV's changelog nets and pairs the terms in one exchange
(``net_changelog``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..sql.planner import JOIN_KEY, MvPlan
from ..storage.catalog import Relation
from ..storage.relation_store import KEY_VALUES, Appended, DataFile, RelationStore
from ..storage.schema import names_sql, quoted
from ..storage.spark_files import ONE_TASK_ROWS
from .change import (
    WEIGHT,
    Change,
    Emit,
    HeldRows,
    StateDelta,
    Unkept,
    apply_delta,
    may_retract,
    net_change,
    signed,
    signed_changelog,
)
from .changelog import after_images, consolidate, union_all
from .keys import SCAN_ROWS, json_key_sql, keyed_unkept, read_touched, touched_partitions
from .project import project

__all__ = ["side_rows", "kept_sides", "born_unkept", "join_change", "inner_join_change"]


def side_rows(plan: MvPlan, side: int, rows: DataFrame, state: Relation,
              keep: Sequence[str] = ()) -> DataFrame:
    """A join side's leaf rows as rows of its state table (with their join key, and
    the columns ``keep``): the rows the WHERE's conjuncts over this side alone pass
    (``JoinSpec.side_filters``)."""
    assert plan.join is not None
    kept = plan.join.side_filters[side]
    if kept:
        rows = rows.where(kept)
    key = json_key_sql(plan.join.key_exprs[side])
    return rows.selectExpr(*[f"{key} AS {quoted(c.name)}" if c.name == JOIN_KEY
                             else quoted(c.name) for c in state.columns], *names_sql(keep))


def _files_before(store: RelationStore, states: Sequence[Relation],
                  epoch: int) -> list[list[DataFile]]:
    """Each side's state files at ``epoch - 1``."""
    return [store.files_at(state.stored, epoch - 1) for state in states[:2]]


def kept_sides(store: RelationStore, plan: MvPlan, states: Sequence[Relation],
               epoch: int) -> list[bool]:
    """Whether each side's state table is kept in ``epoch``: an outer join's always,
    an inner join's once it has files at ``epoch - 1``."""
    assert plan.join is not None
    if plan.join.how != "inner":
        return [True, True]
    return [bool(files) for files in _files_before(store, states, epoch)]


def born_unkept(plan: MvPlan | None, states: Sequence[Relation]) -> set[int]:
    """The state tables an MV's first rows leave unwritten (a snapshot job's phase 1):
    an inner join's sides, kept only once needed."""
    if plan is None or plan.join is None or plan.join.how != "inner":
        return set()
    return {state.id for state in states[:2]}


def join_change(store: RelationStore, plan: MvPlan, leaves: Sequence[Relation],
                states: Sequence[Relation], changes: Sequence[Change | None], epoch: int,
                emit: Emit, rows_hint: int, leaf_rows: Sequence[int] | None = None,
                held: Sequence[HeldRows] | None = None) -> Change | None:
    """The join's rows before and after this epoch, for the join keys it touched;
    each kept side's state table takes that side's change. ``rows_hint``: about how
    many rows the changes hold, ``leaf_rows`` (when known) each side's share, which
    sizes that side's state write; ``held[i]``: the rows of leaf ``i`` the MV held
    before the epoch (without them every side is kept)."""
    assert plan.join is not None
    inner = plan.join.how == "inner"
    files = _files_before(store, states, epoch) if inner else [[], []]
    kept = [not inner or held is None or bool(f) for f in files]
    written: list[StateDelta | None] = []
    for side, change in enumerate(changes):
        state = states[side]
        cols = [col.name for col in state.columns]
        if change is None:
            written.append(None)
            continue
        signed_rows = change.signed_rows()
        if not kept[side] and signed_rows is not None:
            # never appended: the bilinear terms sign and net its rows anyway, so the
            # leaf's change is read once and its images are not paired first
            delta = signed_changelog(side_rows(plan, side, signed_rows, state, [WEIGHT]),
                                     cols)
        else:
            delta = consolidate(
                None if change.before is None else side_rows(plan, side, change.before,
                                                             state),
                side_rows(plan, side, change.arrivals(), state), cols, state.key,
                (JOIN_KEY,))
        if not kept[side]:
            # a small Δ that looks up a large kept side by its keys: its keys and vnodes
            # on the driver, so the lookup is keyed and pruned, not a semi-join over the
            # whole state
            looks_up = kept[1 - side] and states[1 - side].row_count > SCAN_ROWS and \
                (rows_hint if leaf_rows is None else leaf_rows[side]) <= KEY_VALUES
            written.append(keyed_unkept(store, delta, JOIN_KEY, change.leaves)
                           if looks_up else Unkept(delta, change.leaves))
            continue
        # an inner join looks up the other side's state by this side's keys: a small
        # one (or a side not kept, read whole) is read whole, so this side's append may
        # wait for the epoch's flush
        other = states[1 - side]
        written.append(emit(
            state, delta, rows_hint if leaf_rows is None else leaf_rows[side],
            deferrable=inner and other.row_count <= SCAN_ROWS, rewritable=inner))
    moved = [w for w in written if w is not None]
    if not moved:
        return None
    if inner:
        return inner_join_change(store, plan, leaves, states, written, epoch, rows_hint,
                                 files, kept, held, emit, leaf_rows)
    appended = [w for w in moved if isinstance(w, Appended)]
    assert len(appended) == len(moved)  # only an inner join's appends wait
    keys = touched_partitions(appended, JOIN_KEY)
    # each side's state is distributed by join key: the Δs' vnodes are the keys'
    vnodes = sorted({v for w in appended for v in w.vnodes})
    olds, news = [], []
    for side, state in enumerate(states):
        leaf_cols = [c.name for c in leaves[side].columns]
        old = (store.lookup(state.stored, epoch - 1, keys, vnodes=vnodes)
               .selectExpr(*names_sql(c.name for c in state.columns)))
        mine = written[side]
        new = old if mine is None else apply_delta(old, mine.delta, state)
        olds.append(old.selectExpr(*names_sql(leaf_cols)))
        news.append(new.selectExpr(*names_sql(leaf_cols)))
    return Change(project(plan, olds), project(plan, news))


def _held_side(plan: MvPlan, side: int, state: Relation, held: HeldRows) -> DataFrame:
    """``V_side(e-1)`` of a side not kept: the leaf's held rows as state rows."""
    return side_rows(plan, side, held(), state).selectExpr(
        *names_sql(c.name for c in state.columns))


def inner_join_change(store: RelationStore, plan: MvPlan, leaves: Sequence[Relation],
                      states: Sequence[Relation], written: Sequence[StateDelta | None],
                      epoch: int, rows_hint: int, before: Sequence[Sequence[DataFile]],
                      kept: Sequence[bool] = (True, True),
                      held: Sequence[HeldRows] | None = None,
                      emit: Emit | None = None,
                      leaf_rows: Sequence[int] | None = None) -> Change | None:
    """The bilinear rule of an inner join, ``Δ(A⋈B) = ΔA⋈B(e-1) + A(e)⋈ΔB``:
    each side's Δ looks up only the other side's rows of the join keys it
    touched (``B`` before this epoch's change, ``A`` after it), and the signed
    terms net per row. No side's unchanged rows of a touched key are read.
    ``rows_hint``: about how many rows the sides' Δs hold.

    A side's state empty at ``e-1`` (a first fill) is not read: its term is empty,
    or, for ``A(e)``, ``ΔA``'s rows. A side not kept (``kept``) is its held rows
    (``held``), read whole; when its leaf is large, its state is kept from now on:
    ``emit`` appends all of its rows at ``e`` as the state's Δ (``before``: each
    side's state files at ``e-1``). A small side's rows
    (``leaf_rows``: about how many each side's Δ holds) meet a large side's by a
    broadcast, so the large side's rows keep their partitions (``mv._as_read``).
    When no Δ retracts,
    no output row leaves and the terms are disjoint (a ``+`` is a key new to its
    side, so a pair arises in one term only): the change is their rows as
    insertions, not netted by an exchange. None: no term has rows (each side's Δ
    meets an empty other side)."""
    terms = []
    retracting = any(w is not None and may_retract(w) for w in written)
    for side in (0, 1):
        mine = written[side]
        if mine is None:
            continue
        other = 1 - side
        state = states[other]
        state_cols = [c.name for c in state.columns]
        theirs = written[other]
        size = state.row_count  # about how many rows ``rows`` holds
        theirs_rows = rows_hint if leaf_rows is None else leaf_rows[other]
        if not kept[other]:
            assert held is not None and emit is not None
            if held[other].empty:
                rows = None  # the MV holds none of its rows yet
            else:
                rows = _held_side(plan, other, state, held[other])
                size = leaves[other].row_count
                if size > SCAN_ROWS:  # large: kept from now on, as it is at e
                    now = rows if theirs is None else apply_delta(rows, theirs.delta, state)
                    emit(state, consolidate(None, now, state_cols, state.key, (JOIN_KEY,)),
                         size)
        elif before[other]:
            rows = read_touched(store, state, epoch - 1, [mine], JOIN_KEY,
                                files=before[other]).selectExpr(*names_sql(state_cols))
        else:
            rows = None
        if rows is not None:
            if other == 0 and theirs is not None:  # A(e): A(e-1) with ΔA applied
                rows = apply_delta(rows, theirs.delta, state)
                size += theirs_rows
        elif other == 0 and theirs is not None:  # A(e-1) is empty: A(e) is ΔA's rows
            rows = after_images(theirs.delta).selectExpr(*names_sql(state_cols))
            size = theirs_rows
        else:
            continue  # B(e-1) is empty: so is ΔA⋈B(e-1)
        inputs = [signed(mine.delta, [c.name for c in leaves[side].columns]), rows]
        # small Δ, small state: each read is one partition, joined without exchange
        small = rows_hint <= ONE_TASK_ROWS and size <= ONE_TASK_ROWS
        mine_rows = rows_hint if leaf_rows is None else leaf_rows[side]
        if not small and size <= SCAN_ROWS < mine_rows:
            inputs[1] = F.broadcast(rows)  # a large Δ meets a small side
        elif not small and mine_rows <= SCAN_ROWS < size:
            inputs[0] = F.broadcast(inputs[0])  # a small Δ meets a large side
        if side == 1:
            inputs.reverse()
        terms.append(project(plan, inputs, keep=[WEIGHT], merge=small))
    if not terms:
        return None
    if not retracting:
        return Change(None, union_all(terms).drop(WEIGHT))
    return net_change(union_all(terms), [name for name, _ in plan.rows])
