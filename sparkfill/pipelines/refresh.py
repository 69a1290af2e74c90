"""How a created MV takes an epoch's change: by its operators' incremental rules,
or by a recompute from its leaves whose difference is its Δ
(``dataflow/recompute.py``).

Invariant: the choice changes what an epoch costs, never what it writes — both
ways give the same consolidated changelog as the MV's Δ (or, for an MV whose
changelog nothing reads, the same rows as its new base:
``EpochAppends.rewrite_unread``), so downstream MVs, sinks and time travel cannot
tell them apart. It is made per MV per epoch, from the epoch's change and the
costs measured in this process, and reported with its reason in
``EpochReport.refresh``; the option ``refresh`` (``'incremental'`` or ``'full'``)
forces it, ``'auto'`` (the default) lets it be chosen:

* an MV whose rows are its leaves' rows one by one (filter/project, UNION ALL)
  is taken incrementally: its change, mapped row by row, is all a recompute
  would find — unless the change is at least ``MIN_FULL_ROWS`` rows and
  ``FULL_FRACTION`` of its leaves' rows, when its rows written whole from its
  leaves (``recompute``) cost less than a change about their size applied;
* a change of fewer than ``MIN_FULL_ROWS`` rows is taken incrementally (its
  epoch costs about its fixed cost, which a recompute pays too, plus a scan);
* once both ways have been measured on this MV, the cheaper estimate wins: an
  incremental epoch as a fixed cost plus a cost per changed row, a recompute
  as a cost per row of its leaves;
* before that, a change of at least ``FULL_FRACTION`` of the leaves' rows is
  recomputed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque

from ..progress import RefreshChoice
from ..storage.catalog import Relation
from .cost import linear_cost

__all__ = ["RefreshPolicy", "MIN_FULL_ROWS", "FULL_FRACTION", "INCREMENTAL", "FULL"]

INCREMENTAL, FULL = "incremental", "full"
#: a change of fewer rows is taken incrementally under ``refresh = 'auto'``
MIN_FULL_ROWS = 10_000
#: until both ways are measured, a change of at least this share of the rows its
#: leaves hold is recomputed: a recompute reads and compares whole relations, and
#: measured at 1,000,000 rows (bench/RESULTS.md "Stop 44") an aggregate's or a
#: join's incremental epoch stayed cheaper up to a change of 14% of its leaves
FULL_FRACTION = 0.5


class RefreshPolicy:
    """Chooses each created MV's refresh per epoch and learns from what it costs."""

    def __init__(self) -> None:
        #: (changed rows, seconds) of each MV's last incremental epochs
        self._incremental: dict[int, deque[tuple[int, float]]] = defaultdict(
            lambda: deque(maxlen=8))
        #: (rows of its leaves, seconds) of each MV's last recomputes
        self._full: dict[int, deque[tuple[int, float]]] = defaultdict(lambda: deque(maxlen=4))

    def choose(self, mv: Relation, changed_rows: int, leaf_rows: int) -> RefreshChoice:
        """How ``mv`` takes a change of ``changed_rows`` rows of leaves that hold
        ``leaf_rows`` rows after it."""
        assert mv.options is not None
        mode = mv.options.refresh
        if mode in (INCREMENTAL, FULL):
            return RefreshChoice(mode, f"refresh = '{mode}'")
        plan = mv.plan
        share = changed_rows / max(1, leaf_rows)
        if plan is not None and plan.agg is None and plan.join is None and plan.window is None:
            if changed_rows >= MIN_FULL_ROWS and share >= FULL_FRACTION:
                return RefreshChoice(FULL, (
                    f"its rows are its leaves' rows one by one, and {changed_rows:,} changed "
                    f"rows are {share:.1%} of the {leaf_rows:,} its leaves hold: its rows "
                    "written whole cost less than its change mapped and applied"))
            return RefreshChoice(INCREMENTAL, "its rows are its leaves' rows one by one: "
                                              "their change is all a recompute would find")
        if changed_rows < MIN_FULL_ROWS:
            return RefreshChoice(INCREMENTAL, f"{changed_rows:,} changed rows, fewer than "
                                              f"{MIN_FULL_ROWS:,}")
        incremental = self.incremental_seconds(mv.id, changed_rows)
        full = self.full_seconds(mv.id, leaf_rows)
        if incremental is not None and full is not None:
            return RefreshChoice(
                FULL if incremental > full else INCREMENTAL,
                f"measured: incremental about {incremental:.2f}s, recompute about {full:.2f}s "
                f"({changed_rows:,} changed rows of {leaf_rows:,})")
        return RefreshChoice(
            FULL if share >= FULL_FRACTION else INCREMENTAL,
            f"{changed_rows:,} changed rows are {share:.1%} of the {leaf_rows:,} its leaves "
            f"hold ({'at least' if share >= FULL_FRACTION else 'below'} "
            f"{FULL_FRACTION:.0%}; both costs not measured yet)")

    def record(self, mv_id: int, mode: str, changed_rows: int, leaf_rows: int,
               seconds: float) -> None:
        """What one epoch of ``mv_id`` taken as ``mode`` cost."""
        if mode == FULL:
            self._full[mv_id].append((max(1, leaf_rows), seconds))
        elif changed_rows > 0:
            self._incremental[mv_id].append((changed_rows, seconds))

    def incremental_seconds(self, mv_id: int, changed_rows: int) -> float | None:
        """An incremental epoch's estimate, from a fit of fixed plus per-row cost to
        epochs of different sizes (None until there are such)."""
        fit = linear_cost(self._incremental.get(mv_id, ()))
        return None if fit is None else fit[0] + fit[1] * changed_rows

    def full_seconds(self, mv_id: int, leaf_rows: int) -> float | None:
        """A recompute's estimate: its measured cost per row of its leaves (None until
        one was measured)."""
        samples = self._full.get(mv_id)
        if not samples:
            return None
        return statistics.median(s / rows for rows, s in samples) * leaf_rows

    def forget(self, mv_id: int) -> None:
        self._incremental.pop(mv_id, None)
        self._full.pop(mv_id, None)
