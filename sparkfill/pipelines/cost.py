"""Costs measured in this process: an epoch's work on one relation as a fixed
cost plus a cost per row, fitted to its last epochs.

Invariant: a fit is returned only from enough samples whose sizes differ enough
to tell the two parts apart; otherwise the caller decides without one.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["linear_cost", "sizes_differ"]


def linear_cost(samples: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """``(fixed seconds, seconds per row)`` fitted (least squares) to ``(rows,
    seconds)`` samples; None while they are too few (3) or their sizes too alike
    (max < 1.3 min) to tell the two apart."""
    if len(samples) < 3:
        return None
    rows = [float(r) for r, _ in samples]
    secs = [t for _, t in samples]
    if min(rows) <= 0 or not sizes_differ(samples):
        return None
    mean_r, mean_t = statistics.fmean(rows), statistics.fmean(secs)
    var = sum((r - mean_r) ** 2 for r in rows)
    per_row = sum((r - mean_r) * (t - mean_t) for r, t in zip(rows, secs, strict=True)) / var
    return max(0.0, mean_t - per_row * mean_r), per_row


def sizes_differ(samples: Sequence[tuple[int, float]]) -> bool:
    """Whether the samples' sizes (those above zero) differ enough (max >= 1.3 min)
    to tell a fixed cost from a per-row one."""
    rows = [r for r, _ in samples if r > 0]
    return len(rows) >= 2 and max(rows) >= 1.3 * min(rows)
