"""Whether a running aggregate's Δ is guessed this epoch (``aggregate.Guess``), from
how often its recent Δs found a group that lost its min/max.

Invariant: the choice changes what an epoch costs, never what it writes — a
guessed Δ is checked in the job that writes it and built again when wrong, an
unguessed one finds its lost groups first. A guess that holds saves that
collect (a Spark job); one that fails costs the flush's part for nothing, the
collect and a job for the Δ built again. Measured (bench/RESULTS.md, stop 78):
at 1,000,000 rows a failed guess cost about what collecting first did, and 2 of
10 epochs lost a max; at a test's 2,000 rows nearly every epoch lost one, and
collecting first made the epoch 0.72-0.96x. So an MV guesses while at most
``MAX_LOST_SHARE`` of its last ``WINDOW`` epochs that could lose an extreme did
(and, with nothing seen yet, it guesses): one whose groups are so small that a
delete mostly takes a group's only row at its max finds its lost groups first.
"""

from __future__ import annotations

from collections import defaultdict, deque

__all__ = ["GuessPolicy", "WINDOW", "MAX_LOST_SHARE"]

#: the last epochs (each one whose Δ could lose a min/max) a choice looks back on
WINDOW = 8
#: an MV guesses while at most this share of those epochs lost one
MAX_LOST_SHARE = 0.5


class GuessPolicy:
    """Per MV, whether its recent epochs lost a min/max, and so whether to guess."""

    def __init__(self) -> None:
        self._seen: dict[int, deque[bool]] = defaultdict(lambda: deque(maxlen=WINDOW))

    def may_guess(self, mv_id: int) -> bool:
        seen = self._seen.get(mv_id)
        return not seen or sum(seen) <= MAX_LOST_SHARE * len(seen)

    def saw(self, mv_id: int, lost: bool) -> None:
        """An epoch of ``mv_id`` whose Δ could lose a min/max found (``lost``) a group
        that did, or none."""
        self._seen[mv_id].append(lost)

    def forget(self, mv_id: int) -> None:
        self._seen.pop(mv_id, None)
