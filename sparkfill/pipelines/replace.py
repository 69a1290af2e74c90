"""``CREATE OR REPLACE MATERIALIZED VIEW``: an MV switches to a new definition at one
epoch boundary, its dependents untouched.

The new definition is built online as a *replacement*: an internal creating MV
(``__sf_r<id>_<name>``, with ``replaces`` = the MV's id), backfilled by any strategy
while the MV keeps serving and feeding its dependents from the old definition. In
the first epoch ``s`` after the replacement is created, the coordinator processes
the replacement before the MV (``Catalog.all``) and, instead of the MV's old
dataflow, writes as the MV's change the keyed difference between its rows at
``s - 1`` and the replacement's rows at ``s``. Dependents and sinks apply that change
like any other: none is rebuilt.

Invariants:

- The switch is one meta-store transaction, the epoch's own commit: the MV takes the
  replacement's definition (query, plan, columns, options), its state tables and
  join-chain links, and keeps its name, id and storage; its old states and links
  and the replacement's own rows are dropped. A crash before that commit re-runs
  the epoch (the old definition still serves); after it, the new one serves.
- The MV's storage is one changelog across the switch: ``read(mv, as_of=e)`` before
  the switch returns the old contents in the old columns (``Relation.history``).
- Refused at once, changing nothing: a new key; a column kept under another type;
  a dependent MV that would not plan against the new columns, or whose columns
  would change (a ``SELECT *``); a sink on the MV when its visible columns change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame

from ..dataflow.changelog import consolidate
from ..errors import DependentObjects, UnsupportedQuery
from ..sql.planner import LeafInfo, PlannedMv
from ..storage.catalog import Catalog, Relation
from ..storage.relation_store import RelationStore
from ..storage.schema import Column, quoted

__all__ = ["Switch", "check_replacement", "check_swap", "swapped", "switch_delta", "switched"]

#: plans a dependent MV again, given the replaced MV's new LeafInfo (raises where
#: it fails); returns the dependent's columns
PlanDependent = Callable[[Relation, LeafInfo], Sequence[Column]]


def check_replacement(mv: Relation, planned: PlannedMv, catalog: Catalog,
                      sinks: Sequence[Any], plan_dependent: PlanDependent) -> None:
    """Refuse a new definition of ``mv`` its storage, dependents or sinks cannot
    take (see the module's invariants)."""
    # the stored key's columns (an aggregate's is its hidden group key, whatever it
    # groups by: a change of its GROUP BY keeps that key)
    if [k.lower() for k in planned.key] != [k.lower() for k in mv.key]:
        raise UnsupportedQuery(
            f"the new query of {mv.name!r} is keyed by ({', '.join(planned.key)}), the "
            f"materialized view by ({', '.join(mv.key)}): a new key needs a new "
            "materialized view (CREATE one, then DROP the old)")
    old_types = {c.name.lower(): c for c in mv.columns}
    for col in planned.columns:
        was = old_types.get(col.name.lower())
        if was is not None and was.type != col.type:
            raise UnsupportedQuery(
                f"the new query of {mv.name!r} changes column {col.name!r} from {was.type} "
                f"to {col.type}; keep its type (CAST it) or name it differently")
    old_visible = [(c.name.lower(), c.type) for c in mv.visible_columns]
    new_visible = [(c.name.lower(), c.type) for c in planned.columns if not c.hidden]
    if old_visible != new_visible:
        for sink in sinks:
            raise DependentObjects(
                f"cannot replace {mv.name!r} with other columns: sink {sink.name!r} writes "
                "its columns; DROP SINK it first, or keep the columns")
    info = LeafInfo(mv.name, tuple(planned.columns), tuple(planned.key))
    dropped = sorted({n for n, _ in old_visible} - {n for n, _ in new_visible})
    for dep in catalog.dependents(mv.name):
        if dep.replaces == mv.id:
            continue
        try:
            columns = plan_dependent(dep, info)
        except Exception as exc:  # noqa: BLE001 - the planner's or Spark's analysis error
            gone = f" (it drops {', '.join(map(repr, dropped))})" if dropped else ""
            why = str(exc).split("SQLSTATE")[0].strip().rstrip(".;")
            raise DependentObjects(
                f"cannot replace {mv.name!r}: materialized view {dep.name!r} reads it and "
                f"would not plan against the new columns{gone}: {why}") from exc
        if [(c.name, c.type) for c in columns] != [(c.name, c.type) for c in dep.columns]:
            raise DependentObjects(
                f"cannot replace {mv.name!r}: the columns of materialized view "
                f"{dep.name!r}, which reads it, would change (it reads them all, as with "
                "SELECT *); name the columns it reads, or replace it too")


def switch_delta(store: RelationStore, mv: Relation, new: Relation, new_rows: DataFrame,
                 epoch: int) -> DataFrame:
    """The changelog that turns ``mv``'s rows at ``epoch - 1`` (its old definition)
    into ``new_rows``, the replacement's rows at ``epoch``, in the new columns (a
    column the old definition lacked is NULL in its rows), computed by Spark."""
    old_names = {c.name.lower() for c in mv.columns}
    names = [c.name for c in new.columns]
    old = store.snapshot(mv.stored, epoch - 1, bulk=True).selectExpr(*[
        quoted(c.name) if c.name.lower() in old_names
        else f"CAST(NULL AS {c.type}) AS {quoted(c.name)}" for c in new.columns])
    return consolidate(old, new_rows.selectExpr(*[quoted(n) for n in names]), names,
                       list(new.key))


@dataclass(frozen=True)
class Switch:
    """What the epoch's commit writes for one switch: every changed definition (the
    MV's, and those of the replacement's states and links, now the MV's) and the
    relations dropped (the MV's old states and links, the replacement itself)."""

    definitions: dict[int, dict[str, Any]]
    dropped: list[Relation]


def switched(catalog: Catalog, mv: Relation, rep: Relation, epoch: int) -> tuple[Relation,
                                                                                   Switch]:
    """``mv`` as it is once switched to the replacement ``rep`` at ``epoch`` (its
    storage and identity, ``rep``'s definition, the old one kept in its history),
    and what the commit writes for it."""
    new, definitions = _taking(catalog, mv, rep, epoch)
    old_links = catalog.internals_of(mv)
    dropped = [*[st for m in (mv, *old_links) for st in catalog.states_of(m)], *old_links,
               rep]
    return new, Switch(definitions, dropped)


def check_swap(a: Relation, b: Relation, catalog: Catalog) -> None:
    """Refuse ``ALTER MATERIALIZED VIEW a SWAP WITH b`` unless both are the user's
    created MVs with the same visible columns, neither reads the other, and neither
    has a replacement being built."""
    for mv in (a, b):
        if mv.kind != "mv" or mv.internal:
            raise UnsupportedQuery(f"{mv.name!r} is not a materialized view: SWAP WITH "
                                   "exchanges two materialized views")
        if mv.state != "created":
            raise UnsupportedQuery(f"materialized view {mv.name!r} is still being created; "
                                   "SWAP WITH exchanges two created materialized views")
        if catalog.replacement_of(mv) is not None:
            raise UnsupportedQuery(f"materialized view {mv.name!r} has a replacement being "
                                   f"built (CREATE OR REPLACE); CANCEL JOBS {mv.name} first")
    if a.id == b.id:
        raise UnsupportedQuery(f"SWAP WITH needs two materialized views; {a.name!r} is named "
                               "twice")
    for x, y in ((a, b), (b, a)):
        if any(d.id == y.id for d in catalog.downstream_of(x)):
            raise UnsupportedQuery(f"materialized view {y.name!r} reads {x.name!r}: after a "
                                   "swap it would read itself")
    cols_a = [(c.name.lower(), c.type) for c in a.visible_columns]
    cols_b = [(c.name.lower(), c.type) for c in b.visible_columns]
    if cols_a != cols_b:
        raise UnsupportedQuery(
            f"SWAP WITH needs the same columns: {a.name!r} has "
            f"({', '.join(f'{n} {t}' for n, t in cols_a)}), {b.name!r} has "
            f"({', '.join(f'{n} {t}' for n, t in cols_b)})")
    if [k.lower() for k in a.key] != [k.lower() for k in b.key]:
        raise UnsupportedQuery(f"SWAP WITH needs the same key: {a.name!r} is keyed by "
                               f"({', '.join(a.key)}), {b.name!r} by ({', '.join(b.key)})")
    hidden = {c.name.lower(): c.type for c in a.columns}
    for c in b.columns:
        if hidden.get(c.name.lower(), c.type) != c.type:
            raise UnsupportedQuery(
                f"{a.name!r} and {b.name!r} keep internal column {c.name!r} in different "
                "types; they cannot exchange their storage")


def swapped(catalog: Catalog, mv: Relation, other: Relation, epoch: int,
            ) -> tuple[Relation, Switch]:
    """``mv`` as it is once it took ``other``'s definition at ``epoch`` (``SWAP
    WITH``: its storage and identity kept, the old definition in its history), and
    what the commit writes for it: ``other``'s state tables and links become its."""
    new, definitions = _taking(catalog, mv, other, epoch)
    return new, Switch(definitions, [])


def _taking(catalog: Catalog, mv: Relation, source: Relation, epoch: int,
            ) -> tuple[Relation, dict[int, dict[str, Any]]]:
    """``mv`` with ``source``'s definition from ``epoch`` (its storage and identity
    kept, the old definition in its history), and the definitions the commit writes:
    ``mv``'s, and ``source``'s state tables and links owned by ``mv``."""
    new = replace(source, id=mv.id, name=mv.name, dir=mv.dir, state="created",
                  created_epoch=mv.created_epoch, row_count=mv.row_count,
                  ready_epoch=mv.ready_epoch, replaces=None,
                  history=(*mv.history, (epoch - 1, mv.columns, mv.sql)))
    definitions = {mv.id: new.definition()}
    for r in [*catalog.states_of(source), *catalog.internals_of(source)]:
        definitions[r.id] = replace(r, owner=mv.id).definition()
    return new, definitions
