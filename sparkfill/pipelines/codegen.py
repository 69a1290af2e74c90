"""Code generation by the epoch's size: a small epoch's queries are interpreted.

Spark compiles each query's plan to Java (whole-stage code generation, and a class
per projection and predicate) before it runs it. That pays for itself over millions
of rows, and costs more than it saves over the few thousand rows a steady epoch's
queries touch: an epoch builds new plans every time, and generating and compiling
their code is about a fifth of its time (bench/RESULTS.md, stop 54).

Invariant: while ``Interpreted.interpret`` is in effect, the session runs with
``INTERPRETED_CONF``; ``restore`` (and leaving the ``with`` block, on success or
error) puts back each setting's value as it was, so the session's own settings,
and any other epoch, are never changed. Results are the same either way: Spark
keeps its interpreted and its generated paths equal.
"""

from __future__ import annotations

import logging
from types import TracebackType

from pyspark.sql import SparkSession

from .refresh import MIN_FULL_ROWS

__all__ = ["INTERPRETED_CONF", "INTERPRETED_ROWS", "Interpreted"]

LOG = logging.getLogger(__name__)

#: the settings under which Spark interprets a plan instead of compiling it; and
#: derives no constraints of its operators (``isnotnull`` filters inferred from a
#: join's keys, filters pruned as implied): over a few thousand rows they save
#: nothing, and deriving them over an epoch's plans is its optimizer's largest cost
#: (``PruneFilters``, bench/RESULTS.md, stop 66); and reads Parquet row by row: the
#: vectorized reader's column batches (4,096 rows each, allocated per file) cost
#: more than they save over an epoch's files of a few rows (stops 80-81)
INTERPRETED_CONF: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.constraintPropagation.enabled": "false",
    "spark.sql.parquet.enableVectorizedReader": "false",
}
#: an epoch whose staged input holds fewer rows than this (and that runs no bulk
#: work: no backfill, recompute or switch) is interpreted; below it, ``refresh =
#: 'auto'`` never chooses a recompute either
INTERPRETED_ROWS = MIN_FULL_ROWS


class Interpreted:
    """The settings of one epoch: ``interpret()`` sets ``INTERPRETED_CONF`` on the
    session, ``restore()`` (idempotent) puts back what was there."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._saved: dict[str, str | None] | None = None

    def interpret(self) -> None:
        if self._saved is not None:
            return
        self._saved = {}  # filled as each setting changes: restore undoes what did
        for key, value in INTERPRETED_CONF.items():
            self._saved[key] = self.spark.conf.get(key, None)
            self.spark.conf.set(key, value)

    def restore(self) -> None:
        saved, self._saved = self._saved, None
        for key, value in (saved or {}).items():
            if value is None:
                self.spark.conf.unset(key)
            else:
                self.spark.conf.set(key, value)

    def __enter__(self) -> Interpreted:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.restore()
            return
        try:  # the epoch's own error is the one to report (a session gone fails here too)
            self.restore()
        except Exception as also:  # noqa: BLE001
            LOG.warning("could not put the session's code-generation settings back after "
                        "a failed epoch: %s", also)
