"""A dry run of a pipeline: every statement checked before the first runs.

Invariant: checking reads the catalog and plans queries (Spark analyses them over
empty relations) but never writes: no relation, DML, epoch or file comes from a
check. It follows the catalog the pipeline would build — a table or MV created
by an earlier statement is known to the later ones, a dropped one is not — so a
pipeline that fails its check changes nothing, and the first error names the
file, the line and what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlglot import exp

from ..errors import (
    CatalogError,
    RelationExists,
    SparkfillError,
    SqlError,
    UnknownRelation,
)
from ..options import resolve_options
from ..sql.frontend import (
    CreateMaterializedView,
    CreateSink,
    CreateTable,
    Delete,
    Drop,
    DropSink,
    Explain,
    ExplainExisting,
    InsertValues,
    Query,
    Update,
    Verify,
)
from ..sql.links import plan_chain
from ..sql.planner import LeafInfo
from ..storage.catalog import check_not_reserved
from .pipeline import Statement

__all__ = ["check_pipeline"]


class _Catalog:
    """The relations (name → kind, columns) as the pipeline would leave them."""

    def __init__(self, engine: Any) -> None:
        self.kinds: dict[str, str] = {}
        self.infos: dict[str, LeafInfo] = {}
        self.names: dict[str, str] = {}
        for rel in engine.catalog.all():
            if rel.kind == "state":
                continue
            self._add(rel.name, rel.kind, LeafInfo(rel.name, rel.columns, rel.key))
        self.sinks = {s.name.lower() for s in engine.meta.sinks()}

    def _add(self, name: str, kind: str, info: LeafInfo) -> None:
        self.kinds[name.lower()] = kind
        self.infos[name.lower()] = info
        self.names[name.lower()] = name

    def has(self, name: str) -> bool:
        return name.lower() in self.kinds

    def leaf(self, name: str) -> LeafInfo:
        info = self.infos.get(name.lower())
        if info is None:
            raise UnknownRelation(f"no table or materialized view named {name!r}")
        return info

    def columns_of(self, name: str) -> list[str] | None:
        info = self.infos.get(name.lower())
        return None if info is None else [c.name for c in info.columns if not c.hidden]

    def create(self, name: str, kind: str, info: LeafInfo, if_not_exists: bool) -> None:
        check_not_reserved(name)
        if self.has(name):
            if if_not_exists:
                return
            raise RelationExists(f"a relation named {name!r} already exists")
        self._add(name, kind, info)

    def table(self, name: str, what: str) -> None:
        kind = self.kinds.get(name.lower())
        if kind is None:
            raise UnknownRelation(f"{what}: no table named {name!r}")
        if kind != "table":
            raise CatalogError(f"{what}: {name!r} is a materialized view; only tables take "
                               "INSERT, UPDATE and DELETE")


def check_pipeline(engine: Any, statements: Sequence[Statement], where: str) -> None:
    """Raise the first statement's error as ``where:line: message`` (its own
    ``SparkfillError`` class); return when every statement would be accepted."""
    catalog = _Catalog(engine)
    for st in statements:
        if st.command is None:
            continue
        try:
            _check(engine, catalog, st.command)
        except SparkfillError as exc:
            raise type(exc)(f"{where}:{st.line}: {exc}") from exc


def _check(engine: Any, catalog: _Catalog, cmd: Any) -> None:
    if isinstance(cmd, CreateTable):
        catalog.create(cmd.name, "table", LeafInfo(cmd.name, tuple(cmd.columns),
                                                   tuple(cmd.key)), cmd.if_not_exists)
    elif isinstance(cmd, CreateMaterializedView | Explain):
        create = cmd.statement if isinstance(cmd, Explain) else cmd
        if isinstance(cmd, CreateMaterializedView) and catalog.has(create.name) \
                and create.if_not_exists:
            return
        resolve_options(engine.session_options(), create.options)
        _, planned = plan_chain(engine.spark, create.name, create.query, catalog.columns_of,
                                catalog.leaf)
        if isinstance(cmd, CreateMaterializedView):
            info = LeafInfo(create.name, tuple(planned.columns), tuple(planned.key))
            if create.or_replace and catalog.kinds.get(create.name.lower()) == "mv":
                catalog._add(create.name, "mv", info)  # the new definition from then on
            else:
                catalog.create(create.name, "mv", info, False)
    elif isinstance(cmd, Drop):
        kind = catalog.kinds.get(cmd.name.lower())
        if kind is None:
            if not cmd.if_exists:
                raise UnknownRelation(f"no relation named {cmd.name!r} to drop")
            return
        if (cmd.kind == "table") != (kind == "table"):
            raise SqlError(f"{cmd.name!r} is {'a table' if kind == 'table' else 'an MV'}; use "
                           f"DROP {'TABLE' if kind == 'table' else 'MATERIALIZED VIEW'}")
        del catalog.kinds[cmd.name.lower()], catalog.infos[cmd.name.lower()]
    elif isinstance(cmd, InsertValues | Update | Delete):
        what = type(cmd).__name__.upper().replace("INSERTVALUES", "INSERT")
        catalog.table(cmd.table, what)
        if isinstance(cmd, InsertValues) and cmd.columns:
            known = {c.name.lower() for c in catalog.leaf(cmd.table).columns}
            unknown = [c for c in cmd.columns if c.lower() not in known]
            if unknown:
                raise SqlError(f"INSERT INTO {cmd.table}: unknown column {unknown[0]!r}")
    elif isinstance(cmd, Query):
        for t in cmd.tree.find_all(exp.Table):
            if t.name and not catalog.has(t.name) and not _is_cte(cmd.tree, t.name):
                raise UnknownRelation(f"no table or materialized view named {t.name!r}")
    elif isinstance(cmd, Verify | ExplainExisting):
        if catalog.kinds.get(cmd.name.lower()) != "mv":
            what = "VERIFY" if isinstance(cmd, Verify) else "EXPLAIN"
            raise UnknownRelation(f"{what}: no materialized view named {cmd.name!r}")
    elif isinstance(cmd, CreateSink):
        catalog.leaf(cmd.source)
        if cmd.name.lower() in catalog.sinks and not cmd.if_not_exists:
            raise RelationExists(f"a sink named {cmd.name!r} already exists")
        catalog.sinks.add(cmd.name.lower())
    elif isinstance(cmd, DropSink):
        if cmd.name.lower() not in catalog.sinks and not cmd.if_exists:
            raise CatalogError(f"no sink named {cmd.name!r}")
        catalog.sinks.discard(cmd.name.lower())


def _is_cte(tree: exp.Expr, name: str) -> bool:
    return any(cte.alias_or_name.lower() == name.lower() for cte in tree.find_all(exp.CTE))
