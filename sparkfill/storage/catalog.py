"""The catalog: tables and materialized views, loaded from the meta store.

Invariant: relation ids grow in creation order and an MV is only created over
relations that already exist, so id order is a topological order of the
dataflow; the in-memory catalog always mirrors the meta store's committed rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import SqlError, UnknownRelation
from ..options import BackfillOptions
from ..sql.planner import MvPlan
from .meta_store import MetaStore, RelationRow
from .relation_store import StoredRelation
from .schema import Column

__all__ = ["Relation", "Catalog", "check_not_reserved"]


#: the longest relation name, in UTF-8 bytes: a relation's folder is named after it
#: (with its id, and a state table's role), within a file name's 255 bytes
MAX_NAME_BYTES = 100


def check_not_reserved(name: str) -> None:
    """Refuse a user's relation name in the namespace of internal relations, or one
    that cannot name the relation's folder: only letters, digits and underscores
    (Spark reads a folder with ``[`` or ``{`` in its name as a glob and one with ``:``
    as a URI, delta-rs decodes ``%20``, and ``/`` or ``..`` would leave the
    warehouse's ``relations`` folder)."""
    if not re.fullmatch(r"\w+", name):
        raise SqlError(f"relation name {name!r}: a relation is named by letters, digits and "
                       "underscores (its data lives in a folder named after it)")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise SqlError(f"relation name {name[:40]!r}...: longer than {MAX_NAME_BYTES} bytes")
    if name.lower().startswith("__sf_"):
        raise SqlError(f"names starting with __sf_ are reserved for state tables: {name!r}")


@dataclass(frozen=True)
class Relation:
    id: int
    name: str
    kind: str  # "table" | "mv" | "state" (an operator's state table, owned by an MV)
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    state: str  # "created" | "creating"
    created_epoch: int
    dir: str
    row_count: int = 0
    ready_epoch: int | None = None
    sql: str | None = None
    plan: MvPlan | None = None
    options: BackfillOptions | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: a state table, or an internal MV (a link of a join chain): the MV that owns it
    owner: int | None = None
    #: a table's processing-time column (``col TIMESTAMP AS PROCTIME()``): every row
    #: version an epoch writes holds that epoch's processing time there
    proctime: str | None = None
    #: a replacement (``CREATE OR REPLACE``): the MV it is built for, which switches
    #: to its definition once it is created
    replaces: int | None = None
    #: an MV's earlier definitions, oldest first: (the last epoch it held, its
    #: columns, its SQL); ``at(epoch)`` is the relation as it was at an epoch
    history: tuple[tuple[int, tuple[Column, ...], str | None], ...] = ()

    def at(self, epoch: int) -> Relation:
        """The relation as it was at ``epoch``: its columns and SQL then (an MV that
        ``CREATE OR REPLACE`` switched later had its earlier definition's)."""
        for until, columns, sql in self.history:
            if epoch <= until:
                return replace(self, columns=columns, sql=sql)
        return self
    #: what messages call it (``table 't'``, ``materialized view 'm'``, an internal
    #: relation as a part of the MV that owns it) and how a damaged data file of it
    #: is repaired; set by the catalog, not persisted
    label: str = ""
    repair: str = ""

    @property
    def internal(self) -> bool:
        """A relation sparkfill made for an MV (a state table, a join-chain link, a
        replacement): not the user's to name, read or drop."""
        return self.kind == "state" or self.owner is not None or self.replaces is not None

    @property
    def stored(self) -> StoredRelation:
        return StoredRelation(self.id, self.name, self.dir, self.columns, self.key,
                              self.label, self.repair)

    @property
    def visible_columns(self) -> list[Column]:
        return [c for c in self.columns if not c.hidden]

    @property
    def writable_columns(self) -> list[Column]:
        """The columns DML may give: all but the processing-time column."""
        return [c for c in self.columns if c.name != self.proctime]

    @property
    def upstreams(self) -> tuple[str, ...]:
        """The relations an MV reads (its leaves), FROM first."""
        return () if self.plan is None else self.plan.upstreams

    def definition(self) -> dict[str, Any]:
        d = {
            "columns": [c.to_json() for c in self.columns],
            "key": list(self.key),
            "sql": self.sql,
            "plan": None if self.plan is None else self.plan.to_json(),
            "options": None if self.options is None else self.options.to_json(),
            "owner": self.owner,
        }
        if self.proctime is not None:
            d["proctime"] = self.proctime
        if self.replaces is not None:
            d["replaces"] = self.replaces
        if self.history:
            d["history"] = [{"until": until, "columns": [c.to_json() for c in columns],
                             "sql": sql} for until, columns, sql in self.history]
        return d

    @staticmethod
    def from_row(row: RelationRow) -> Relation:
        d = row.definition
        return Relation(
            id=row.id, name=row.name, kind=row.kind,
            columns=tuple(Column.from_json(c) for c in d["columns"]),
            key=tuple(d["key"]), state=row.state, created_epoch=row.created_epoch,
            dir=row.dir, row_count=row.row_count, ready_epoch=row.ready_epoch, sql=d.get("sql"),
            plan=None if d.get("plan") is None else MvPlan.from_json(d["plan"]),
            options=None if d.get("options") is None else BackfillOptions.from_json(d["options"]),
            owner=d.get("owner"), proctime=d.get("proctime"), replaces=d.get("replaces"),
            history=tuple((int(h["until"]), tuple(Column.from_json(c) for c in h["columns"]),
                           h.get("sql")) for h in d.get("history", ())),
        )

    def to_row(self) -> RelationRow:
        return RelationRow(self.id, self.name, self.kind, self.definition(), self.state,
                           self.created_epoch, self.row_count, self.dir, self.ready_epoch)


def _label(rel: Relation, by_id: dict[int, Relation]) -> tuple[str, str]:
    """What messages call ``rel`` (an internal relation is a part of its user's MV:
    messages never name internal relations), and how a damaged data file of it is
    repaired."""
    if rel.kind == "table":
        return (f"table {rel.name!r}", "restore the file from a backup, or drop the table and "
                "load it again: a table's rows are kept nowhere else")
    user = rel
    for _ in range(len(by_id)):  # a state's owner may be a link, owned by the MV
        if user.owner is None or user.owner not in by_id:
            break
        user = by_id[user.owner]
    repair = (f"ALTER MATERIALIZED VIEW {user.name} RECOMPUTE rebuilds it from its upstreams "
              "in the next epoch (or drop the materialized view and create it again)")
    if user is rel:
        return f"materialized view {rel.name!r}", repair
    part = "a state table" if rel.kind == "state" else "an internal link"
    return f"materialized view {user.name!r} ({part} of it)", repair


def _lookup_key(name: object) -> str:
    """A relation name as the catalog keys it; a name that is not a string (an API
    call's wrong argument) is no relation's."""
    if not isinstance(name, str):
        text = repr(name)
        raise UnknownRelation(f"a relation is named by a string, not by {type(name).__name__} "
                              f"{text if len(text) <= 80 else text[:80] + '...'}")
    return name.lower()


class Catalog:
    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self._by_name: dict[str, Relation] = {}
        self.reload()

    def reload(self) -> None:
        rels = {row.id: Relation.from_row(row) for row in self.meta.relations()}
        self._by_name = {r.name.lower(): replace(r, label=label, repair=repair)
                         for r in rels.values() for label, repair in [_label(r, rels)]}

    def substitute(self, rel: Relation) -> None:
        """Hold ``rel`` in place of the relation of its name until the next
        ``reload``: an epoch's later relations see an MV it switched (``CREATE OR
        REPLACE``) as switched, before the commit writes it."""
        self._by_name[rel.name.lower()] = rel

    def get(self, name: str) -> Relation:
        rel = self._by_name.get(_lookup_key(name))
        if rel is None:
            known = ", ".join(sorted(r.name for r in self._by_name.values()
                                     if not r.internal)) or "none"
            raise UnknownRelation(f"no table or materialized view named {name!r} (known: {known})")
        return rel

    def get_by_id(self, rel_id: int) -> Relation:
        for r in self._by_name.values():
            if r.id == rel_id:
                return r
        raise UnknownRelation(f"no relation with id {rel_id}")

    def find_by_id(self, rel_id: int) -> Relation | None:
        return next((r for r in self._by_name.values() if r.id == rel_id), None)

    def find(self, name: str) -> Relation | None:
        return self._by_name.get(_lookup_key(name))

    def all(self) -> list[Relation]:
        """Every relation in topological order: each after the relations it reads, an
        MV after its replacement (which it switches to); otherwise by id."""
        by_id = sorted(self._by_name.values(), key=lambda r: r.id)
        before: dict[int, set[int]] = {r.id: set() for r in by_id}
        for r in by_id:
            for u in r.upstreams:
                if (up := self._by_name.get(u.lower())) is not None:
                    before[r.id].add(up.id)
            if r.replaces is not None and r.replaces in before:
                before[r.replaces].add(r.id)
        if all(not deps or max(deps) < rid for rid, deps in before.items()):
            return by_id  # ids already follow the edges (no replacement reorders them)
        done: set[int] = set()
        order: list[Relation] = []
        left = list(by_id)
        while left:
            ready = next((r for r in left if before[r.id] <= done), left[0])
            order.append(ready)
            done.add(ready.id)
            left.remove(ready)
        return order

    def replacement_of(self, mv: Relation) -> Relation | None:
        """The replacement being built for ``mv`` (``CREATE OR REPLACE``), if any."""
        return next((r for r in self._by_name.values() if r.replaces == mv.id), None)

    def dependents(self, name: str) -> list[Relation]:
        """The MVs that read ``name`` (a join-chain link, or a replacement, as the
        user's MV it is for)."""
        found: dict[int, Relation] = {}
        for r in self.all():
            if any(u.lower() == name.lower() for u in r.upstreams):
                user = self.user_mv(r)
                found.setdefault(user.id, user)
        return list(found.values())

    def downstream_of(self, rel: Relation) -> list[Relation]:
        """Every user MV that reads ``rel``, directly or through other MVs."""
        found: dict[int, Relation] = {}
        todo = [rel.name]
        while todo:
            for dep in self.dependents(todo.pop()):
                if dep.id not in found and dep.id != rel.id:
                    found[dep.id] = dep
                    todo.append(dep.name)
        return list(found.values())

    def user_mv(self, rel: Relation) -> Relation:
        """The user's MV that ``rel`` belongs to: itself, the owner of a join-chain
        link, or the MV a replacement is for (a replacement's link: that MV too)."""
        while rel.owner is not None or rel.replaces is not None:
            rel = self.get_by_id(rel.owner if rel.owner is not None else rel.replaces)  # type: ignore[arg-type]
        return rel

    def internals_of(self, mv: Relation) -> list[Relation]:
        """The links of an MV's join chain (internal MVs it owns), upstream first."""
        return [r for r in self.all() if r.kind == "mv" and r.owner == mv.id]

    def is_waiting(self, mv: Relation) -> bool:
        """A creating MV whose backfill waits for an upstream MV that is still being
        created and that it does not follow from birth (``follows_from_birth``)."""
        return mv.kind == "mv" and mv.state == "creating" and any(
            leaf.kind == "mv" and leaf.state != "created"
            and not self.follows_from_birth(mv, leaf) for leaf in self.leaves_of(mv))

    @staticmethod
    def follows_from_birth(mv: Relation, leaf: Relation) -> bool:
        """Whether creating ``mv`` reads upstream MV ``leaf`` as changes from its first
        row instead of backfilling it: both were created at the same epoch (a query's
        links are created with it), when ``leaf`` was empty, and every row ``leaf``
        gains from then on arrives as a change of an epoch ``mv`` processes. Not when
        either runs a snapshot job (its first rows are committed as of an earlier
        epoch, and the job reads a fixed snapshot) or ``mv`` is a top-N (it reads its
        input whole)."""
        def snapshot_job(rel: Relation) -> bool:
            return rel.options is not None and rel.options.strategy == "snapshot"
        return (mv.kind == "mv" and leaf.kind == "mv" and mv.state == "creating"
                and leaf.created_epoch == mv.created_epoch and not snapshot_job(mv)
                and not snapshot_job(leaf) and mv.plan is not None and mv.plan.topn is None)

    def states_of(self, mv: Relation) -> list[Relation]:
        """An MV's state tables, in the order its plan names them."""
        if mv.plan is None:
            return []
        return [self.get(n) for n in mv.plan.states]

    def leaves_of(self, mv: Relation) -> list[Relation]:
        return [self.get(n) for n in mv.upstreams]
