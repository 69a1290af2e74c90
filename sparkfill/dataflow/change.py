"""Changes: one epoch's change of a set of rows, as an operator takes it in and
hands it on.

Invariant: a ``Change`` holds whole images — ``before`` rows leave, ``after`` rows
arrive — at most one per key on each side. A signed change (each row with its
weight, ``+1`` arrives, ``-1`` leaves) summed per distinct row is that same
change (``net_change``); ``apply_delta`` turns a state's rows at ``e-1`` into its
rows at ``e``: every key a Δ touches is replaced by its after-image, if any.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import DataFrame

from ..storage.catalog import Relation
from ..storage.relation_store import IS_BEFORE, IS_LIVE, Appended, retracts
from ..storage.schema import OP, names_sql
from .changelog import after_images, netted_sql
from .statement import sql_over

__all__ = ["Change", "change_of", "Emit", "Deferred", "Unkept", "StateDelta", "may_retract",
           "WEIGHT", "signed", "net_change", "signed_changelog", "apply_delta", "HeldRows"]


#: a part of a change: its rows, or how to build their plan when first asked for
#: (a consumer often reads only some parts: a signed change's images, say, and a
#: plan not built costs the driver nothing)
Part = DataFrame | Callable[[], DataFrame]


class Change:
    """One epoch's change of a set of rows: ``before`` rows leave, ``after`` rows
    arrive (whole images, at most one per key on each side). ``before`` None: no row
    leaves (a backfill's chunk of rows new to the MV), so the change's changelog is its
    ``after`` rows as insertions, without pairing images by key. ``fresh``: more
    arriving rows whose keys neither ``before`` nor ``after`` holds (a backfill's chunk
    of rows new to the MV beside the upstream's own changes): insertions that never
    need pairing, so the chunk's rows skip the exchange that pairs the others.
    ``signed``: the same change as signed rows (its columns and ``WEIGHT``), when it
    came as such — a relation's changelog read once, or a join's terms — so a consumer
    that nets rows anyway (a join's bilinear terms, an MV's changelog) reads them once
    and pairs nothing first (``net_changelog``); summed per distinct row it is
    ``before`` against ``after``.

    ``before``, ``after`` and ``signed`` may be given as functions that build their
    plans; each is built when first read, once, so the parts no consumer reads cost
    nothing. Whether a part exists (``leaves``, ``has_signed``) is known without
    building it."""

    def __init__(self, before: Part | None, after: Part, fresh: DataFrame | None = None,
                 signed: Part | None = None) -> None:
        self._parts: dict[str, Part | None] = {
            "before": before, "after": after, "signed": signed}
        self.fresh = fresh

    def _part(self, name: str) -> DataFrame | None:
        part = self._parts[name]
        if part is None or isinstance(part, DataFrame):
            return part
        built = self._parts[name] = part()
        return built

    @property
    def before(self) -> DataFrame | None:
        return self._part("before")

    @property
    def after(self) -> DataFrame:
        after = self._part("after")
        assert after is not None
        return after

    @property
    def signed(self) -> DataFrame | None:
        return self._part("signed")

    @signed.setter
    def signed(self, rows: Part | None) -> None:
        self._parts["signed"] = rows

    @property
    def leaves(self) -> bool:
        """Whether rows may leave (``before`` is not None), without building it."""
        return self._parts["before"] is not None

    @property
    def has_signed(self) -> bool:
        """Whether ``signed`` is not None, without building it."""
        return self._parts["signed"] is not None

    def arrivals(self) -> DataFrame:
        """Every arriving row: ``after`` and ``fresh``."""
        return self.after if self.fresh is None else self.after.unionByName(self.fresh)

    def mapped(self, f: Callable[[DataFrame], DataFrame]) -> Change:
        """This change with ``f`` (a row-wise map that keeps keys apart: a filter and
        projection that keeps the key) applied to each part (each built when read)."""
        return Change((lambda: f(_built(self.before))) if self.leaves else None,
                      lambda: f(self.after),
                      None if self.fresh is None else f(self.fresh))

    def signed_rows(self) -> DataFrame | None:
        """``signed``, when nothing is beside it (no ``fresh`` rows)."""
        return self.signed if self.fresh is None else None

    def has_signed_rows(self) -> bool:
        """Whether ``signed_rows()`` is not None, without building it."""
        return self.has_signed and self.fresh is None


def _built(rows: DataFrame | None) -> DataFrame:
    assert rows is not None
    return rows


@dataclass(frozen=True)
class HeldRows:
    """The rows of a leaf an MV held before the epoch (the leaf's columns), read only
    when asked for: by an aggregate finding a lost min/max again, by a join side
    whose state is not kept (``join.py``). ``empty``: the MV is known to hold none
    of them (its backfill has not reached the leaf yet), so nothing need be read."""

    #: the rows, given a condition over the leaf's columns that every row the caller
    #: keeps passes (None: it keeps any), which the read may filter by early
    read: Callable[[str | None], DataFrame]
    empty: bool = False
    #: the rows whose given column holds one of the given values (none NULL), read on
    #: the driver where that costs less than Spark's scan (None: not there, ask ``read``)
    rows_in: Callable[[str, Sequence[object]], DataFrame | None] | None = None

    def __call__(self, narrow: str | None = None) -> DataFrame:
        return self.read(narrow)


def change_of(delta: DataFrame | None, columns: Sequence[str],
              retracting: bool = True) -> Change | None:
    """A relation's consolidated changelog as a ``Change`` over ``columns``.
    ``retracting`` False: the changelog is known to hold no before-image (its rows
    per ``_op``, as its append observed them, are insertions only), so no row leaves
    (``before`` None) and every arriving row's key is new to the relation: an
    operator's rule takes them as insertions, pairs no images and looks for no
    retracted value (a lost min/max)."""
    if delta is None:
        return None
    picked = names_sql(columns)
    return Change((lambda: delta.where(IS_BEFORE).selectExpr(*picked)) if retracting else None,
                  lambda: delta.where(IS_LIVE).selectExpr(*picked),
                  signed=lambda: signed(delta, columns))


@dataclass(frozen=True)
class Deferred:
    """A state table's Δ whose append waits for the epoch's one write of small Δs:
    its operator reads the Δ's plan as it is. Its keys and vnodes are not known on
    the driver, so the lookups they would drive read the relation they look into
    whole: an operator lets its state's append wait only when that relation is
    small. ``may_retract``: whether the Δ can hold before-images (its leaves'
    changes do)."""

    delta: DataFrame
    may_retract: bool


@dataclass(frozen=True)
class Unkept:
    """A state table's Δ that is never appended: its operator needs the Δ itself but
    never the rows it would keep (a running count or sum per group reads its old
    values from the MV). ``keys`` and ``vnodes``: the Δ's distinct values of its
    first key column and their vnodes, when brought to the driver (None: not
    known); ``may_retract`` as ``Deferred``'s."""

    delta: DataFrame
    may_retract: bool
    keys: tuple[object, ...] | None = None
    vnodes: tuple[int, ...] | None = None


#: a state table's Δ as its operator reads it: appended (read back from its files,
#: with its keys and vnodes observed), deferred to the epoch's flush, or not kept
StateDelta = Appended | Deferred | Unkept


def may_retract(written: StateDelta) -> bool:
    """Whether a state table's Δ can hold before-images (``-``, ``U-``)."""
    if isinstance(written, Deferred | Unkept):
        return written.may_retract
    return retracts(written.counts)


class Emit(Protocol):
    """Appends a state table's Δ for the epoch (``rows_hint``: about how many rows);
    returns what was written, or None when the Δ was empty. ``deferrable``: the
    operator's lookups can do without the Δ's keys (they read small relations),
    so the append may wait for the epoch's flush (a ``Deferred`` is returned).
    ``rewritable``: the same, for a Δ that touches most of the state table: it may
    be written as the table's new rows instead (``EpochAppends.rewrite``)."""

    def __call__(self, rel: Relation, delta: DataFrame, rows_hint: int, *,
                 deferrable: bool = False, rewritable: bool = False) -> StateDelta | None: ...


#: a row's weight in a signed change (+1 arrives, -1 leaves): the join's bilinear rule
WEIGHT = "_sf_w"


def signed(delta: DataFrame, columns: Sequence[str]) -> DataFrame:
    """A changelog's rows with their weight: +1 for an after-image, -1 for a
    before-image."""
    return delta.selectExpr(*names_sql(columns),
                            f"CASE WHEN {IS_LIVE} THEN 1 ELSE -1 END AS {WEIGHT}")


def net_change(rows: DataFrame, columns: Sequence[str]) -> Change:
    """A signed change summed per distinct row: what remains with weight -1 leaves,
    with +1 arrives (a set-keyed relation's change nets to -1, 0 or +1 per row)."""
    picked = names_sql(columns)
    net = sql_over(netted_sql(columns, WEIGHT, "{_sf_signed}"), {"_sf_signed": rows})
    return Change(lambda: net.where(f"{WEIGHT} < 0").selectExpr(*picked),
                  lambda: net.where(f"{WEIGHT} > 0").selectExpr(*picked), signed=rows)


def signed_changelog(rows: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Signed rows (``columns`` and ``WEIGHT``) as a changelog a state's rules read
    (``signed``, ``after_images``, ``apply_delta``): ``+`` arrives, ``-`` leaves. Not
    consolidated: a key may hold a ``-`` and a ``+`` of the same row; applied, or
    signed and netted, it is the same change."""
    return rows.selectExpr(*names_sql(columns),
                           f"CASE WHEN {WEIGHT} > 0 THEN '+' ELSE '-' END AS {OP}")


def apply_delta(rows: DataFrame, delta: DataFrame, state: Relation) -> DataFrame:
    """A state's ``rows`` with its ``delta`` applied: the old rows of the keys the Δ
    touches leave, their after-images arrive."""
    cols = [c.name for c in state.columns]
    return rows.join(delta.selectExpr(*names_sql(state.key)), list(state.key), "left_anti") \
        .unionByName(after_images(delta).selectExpr(*names_sql(cols)))
