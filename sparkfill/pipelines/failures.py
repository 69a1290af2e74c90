"""Relations whose query failed on the rows of an epoch, kept apart so that the
epoch commits everything else.

An MV's query can fail on certain rows only (``WHERE s > 1.5`` over a string
column that comes to hold ``'k7'``: Spark's own query over that snapshot raises
too). Such an error is not the engine's and no retry of the epoch can pass it; it
must not hold back the tables and the other MVs either. So the relation whose Δ
raised it *fails*: from that epoch on it takes no Δ (its rows and state stay
those of the epoch before), and every relation downstream of it goes on taking
its other inputs' changes (it stays consistent with the failed one's frozen rows,
and takes the failed one's difference once that is rebuilt). A read of a failed
MV, or of an MV that reads one (its links included), at or after the epoch of
the failure is refused naming the error; ``ALTER MATERIALIZED VIEW ...
RECOMPUTE`` rebuilds the MV from its upstreams once the rows are fixed, and DROP
removes it.

Invariants: the failed set lives in the meta store (``FAILED_KEY``) and changes
only in a meta transaction: a relation is marked before its epoch runs again
without it, and a mark is cleared by the commit of the epoch whose recompute
rebuilt the relation (or by its DROP). An error counts as a failure of the rows
only when Spark names it an error of evaluating an expression over values
(``errors.ROW_ERRORS``); any other error fails the epoch as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import ROW_ERRORS, is_row_error, without_internal_names
from ..storage.catalog import Catalog, Relation

__all__ = ["FAILED_KEY", "Failure", "RelationFailed", "is_row_error", "load_failures",
           "failures_json", "failed_upstream", "failed_as_of", "failure_message",
           "error_line"]

#: the meta store key of the failed relations: JSON ``{id: {"epoch", "error"}}``
FAILED_KEY = "failed_relations"


@dataclass(frozen=True)
class Failure:
    """A relation's failure: the epoch whose Δ raised, and Spark's error (one line)."""

    epoch: int
    error: str


class RelationFailed(Exception):
    """Raised inside an epoch's run: ``rel``'s Δ raised an error of its rows (``rel``
    None: one of the Δs written together at the epoch's end did, unattributed).
    ``guarded``: the rows were read so that no filter ran on a row no longer live
    (a snapshot job's chunks): running the epoch again with every read merged by key
    cannot pass it."""

    def __init__(self, rel: Relation | None, cause: BaseException,
                 guarded: bool = False) -> None:
        super().__init__(f"{rel.name if rel else 'a deferred Δ'}: {cause}")
        self.rel = rel
        self.cause = cause
        self.guarded = guarded


def error_line(exc: BaseException) -> str:
    """Spark's error as one line a user reads (no JVM stack, no internal names)."""
    text = str(exc).strip()
    for line in text.splitlines():
        if any(c in line for c in ROW_ERRORS):
            text = line
            break
    else:
        text = text.splitlines()[0] if text else type(exc).__name__
    return without_internal_names(" ".join(text.split()))[:500]


def load_failures(meta: Any) -> dict[int, Failure]:
    """The failed relations, by id."""
    raw = json.loads(meta.get(FAILED_KEY) or "{}")
    return {int(k): Failure(int(v["epoch"]), str(v["error"])) for k, v in raw.items()}


def failures_json(failures: dict[int, Failure]) -> str:
    return json.dumps({str(k): {"epoch": f.epoch, "error": f.error}
                       for k, f in sorted(failures.items())})


def failed_upstream(catalog: Catalog, rel: Relation, failures: dict[int, Failure]
                    ) -> tuple[Relation, Failure] | None:
    """``rel`` itself if it failed, else the first relation upstream of it (its links
    and upstream MVs, transitively) that did, with its failure; None if none did."""
    if not failures:
        return None
    seen: set[int] = set()
    todo: list[Relation] = [rel]
    while todo:
        r = todo.pop()
        if r.id in seen:
            continue
        seen.add(r.id)
        if r.id in failures:
            return r, failures[r.id]
        todo.extend(catalog.leaves_of(r))
    return None


def failed_as_of(catalog: Catalog, rel: Relation, failures: dict[int, Failure], epoch: int
                 ) -> tuple[Relation, Failure] | None:
    """``failed_upstream`` when that failure happened at or before ``epoch`` (the
    epochs of ``rel`` a read refuses); None otherwise."""
    failed = failed_upstream(catalog, rel, failures)
    return failed if failed is not None and epoch >= failed[1].epoch else None


def failure_message(catalog: Catalog, rel: Relation, failed: Relation, failure: Failure
                    ) -> str:
    """Why ``rel`` cannot be read from ``failure.epoch`` on, and what repairs it."""
    owner = catalog.user_mv(failed)
    who = owner.name
    lead = (f"materialized view {rel.name!r} failed" if who == rel.name else
            f"materialized view {rel.name!r} reads {who!r}, which failed")
    if owner.state != "created":  # its backfill raised: nothing to rebuild from
        return (f"{lead} while being created, at epoch {failure.epoch}: its query raised "
                f"on the rows it read (Spark's own query over them raises too): "
                f"{failure.error}. DROP MATERIALIZED VIEW {who} and create it again once "
                f"the rows (or the query) are fixed")
    return (f"{lead} at epoch {failure.epoch}: its query raised on the rows of that epoch "
            f"(Spark's own query over them raises too): {failure.error}. Its rows stay "
            f"those of epoch {failure.epoch - 1}; fix the rows (or the query) and run "
            f"ALTER MATERIALIZED VIEW {who} RECOMPUTE, or DROP it")
