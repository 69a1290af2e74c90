"""SHOW and EXPLAIN MATERIALIZED VIEW answers from the meta store alone: no Spark,
so the ``sparkfill`` command answers them at once, beside a running writer.

Invariant: every answer is read from committed meta-store state (and, for a
sink, its Delta table's log); nothing here writes. ``Engine`` turns the same
rows into DataFrames (its ``SHOW JOBS`` adds the live rates only a running
engine measures).
"""

from __future__ import annotations

from typing import Any

from ..errors import SqlError
from ..sinks import synced_epoch
from ..sql.planner import explain_plan
from .catalog import Catalog
from .meta_store import MetaStore

__all__ = ["SHOW_COLUMNS", "show_rows", "show_schema", "explain_existing"]

#: the columns of each SHOW, with their Spark types
SHOW_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "tables": [("name", "string"), ("columns", "string"), ("primary_key", "string"),
               ("rows", "bigint")],
    "materialized views": [("name", "string"), ("state", "string"), ("strategy", "string"),
                           ("rows", "bigint"), ("definition", "string")],
    "sinks": [("name", "string"), ("from", "string"), ("connector", "string"),
              ("path", "string"), ("epoch", "bigint"), ("state", "string")],
    "jobs": [("name", "string"), ("strategy", "string"), ("state", "string"),
             ("rows_done", "bigint"), ("rows_total_estimate", "bigint"),
             ("rows_per_second", "double"), ("eta_seconds", "double")],
}


def show_schema(what: str) -> str:
    """``SHOW <what>``'s columns as a Spark DDL schema string."""
    return ", ".join(f"`{name}` {type_}" for name, type_ in SHOW_COLUMNS[what])


def show_rows(what: str, meta: MetaStore, catalog: Catalog) -> list[tuple[Any, ...]]:
    """The rows of ``SHOW <what>`` (columns: ``SHOW_COLUMNS[what]``). ``jobs``: each
    MV's progress as committed (rows done of the upstreams' rows; the rate and ETA,
    which a running engine measures, are left empty)."""
    rels = catalog.all()
    if what == "tables":
        return [(r.name, ", ".join(f"{c.name} {c.type.upper()}"
                                   f"{' AS PROCTIME()' if c.name == r.proctime else ''}"
                                   for c in r.columns),
                 ", ".join(r.key), r.row_count) for r in rels if r.kind == "table"]
    if what == "materialized views":
        return [(r.name, r.state, r.options.strategy if r.options else None, r.row_count,
                 r.sql) for r in rels if r.kind == "mv" and not r.internal]
    if what == "sinks":
        rows = []
        for s in meta.sinks():
            rel = catalog.get_by_id(s.rel_id)
            state = "waiting" if rel.kind == "mv" and rel.state != "created" else "running"
            rows.append((s.name, rel.name, s.connector, s.path, synced_epoch(s.path, s.id),
                         state))
        return rows
    jobs: list[tuple[Any, ...]] = []
    for r in rels:
        if r.kind != "mv" or r.internal:
            continue
        # an MV's job includes its links' progress (created with it)
        done = sum(p.rows for mv in (*catalog.internals_of(r), r) for p in meta.progress(mv.id))
        if r.state == "created":
            jobs.append((r.name, r.options.strategy if r.options else None, "created", done,
                         done, 0.0, 0.0))
            continue
        total = max(done, sum(leaf.row_count for mv in (*catalog.internals_of(r), r)
                              for leaf in catalog.leaves_of(mv)))
        paused = r.options is not None and r.options.rate_limit == 0
        jobs.append((r.name, r.options.strategy if r.options else None,
                     "paused" if paused else "backfilling", done, total, None, None))
    return jobs


def explain_existing(catalog: Catalog, name: str) -> str:
    """The operator plan of an existing MV, from its stored plan, with its state
    tables' keys (``EXPLAIN MATERIALIZED VIEW name``)."""
    rel = catalog.get(name)
    if rel.kind != "mv" or rel.plan is None or rel.internal:
        raise SqlError(f"{rel.name!r} is not a materialized view")
    chain = [*catalog.internals_of(rel), rel]
    lines = []
    for i, mv in enumerate(chain):
        assert mv.plan is not None
        if len(chain) > 1:
            role = f"link {i + 1} (an internal MV)" if i < len(chain) - 1 else "the MV"
            lines.append(f"-- {role}: {mv.name}")
        lines.append(explain_plan(mv.name, mv.plan, mv.key))
        for state in catalog.states_of(mv):
            lines.append(f"state {state.name}: key=({', '.join(state.key)})")
    if rel.options is not None:  # how it takes a change (EpochReport.refresh: each epoch's)
        lines.append(f"refresh: {rel.options.refresh}")
    return "\n".join(lines)
