"""DataFrames an epoch computes once and reads many times.

Invariant: a materialized DataFrame is computed at most once per epoch (on its
first action), and its plan is a single leaf over the stored rows, so a plan
built on it does not grow with the plans that produced it. Without the cut, an
MV's Δ would carry the whole plan of its upstream's Δ, and so on down a chain
of MVs: Spark re-analyses that tree at every DataFrame call, which costs
seconds per epoch three MVs deep and exhausts the driver's heap on wider plans.
Every materialized DataFrame is released after the epoch's commit.
"""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame

__all__ = ["materialize", "release"]


def materialize(df: DataFrame, held: list[DataFrame]) -> DataFrame:
    """``df`` computed on its first use, kept in memory (spilling to disk), with its
    plan cut to one leaf; recorded in ``held`` for ``release``."""
    cut = df.localCheckpoint(eager=False, storageLevel=StorageLevel.MEMORY_AND_DISK)
    held.append(cut)
    return cut


def release(df: DataFrame) -> None:
    """Drop the stored rows of a materialized (or persisted) DataFrame."""
    plan = df._jdf.logicalPlan()  # type: ignore[operator]
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)
    else:
        df.unpersist()
