"""What every source connector shares: its options, the context of one batch and
the batch it returns.

Invariant: a connector is a pure reader — ``read`` turns (options, offset,
batch number) into a batch of keyed changes and the offset after it, and
changes nothing itself; the ``SourceManager`` stages the batch and advances the
offset in one meta-store transaction. So a batch that is read again after a
crash (its staging did not commit) is read from the same offset.

A connector that needs files of its own for a batch writes them under the batch's
scratch directory (``BatchContext.scratch``, a URI under the warehouse, reached
through ``BatchContext.warehouse``), never elsewhere in the warehouse.

A batch's rows have the table's columns plus ``_sf_idx`` (order within the
batch: the last change of a key wins) and ``_sf_kind`` (``U`` upsert of the
whole row, ``D`` delete of the key): the shape of staged DML.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pyspark.sql import DataFrame, SparkSession

from ..errors import InvalidOption
from ..storage.schema import Column
from ..storage.warehouse import Warehouse

__all__ = ["Connector", "BatchContext", "SourceBatch", "TableShape", "resolve_path",
           "storage_options_for", "opt_int", "opt_float", "opt_str", "check_known"]


@dataclass(frozen=True)
class TableShape:
    """The table a source feeds."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @property
    def by_lower(self) -> dict[str, Column]:
        return {c.name.lower(): c for c in self.columns}


@dataclass(frozen=True)
class BatchContext:
    """The input of one batch: which epoch it feeds and where the last one ended."""

    epoch: int
    #: number of this batch (1 for a source's first batch)
    batch: int
    #: the offset after the previous batch (None before the first)
    position: Any
    #: files consumed by earlier batches (file sources)
    consumed: frozenset[str] = frozenset()
    #: the URI of a scratch directory the connector may write to (removed after
    #: staging), under ``warehouse``
    scratch: str = ""
    #: the warehouse holding ``scratch`` (None: ``scratch`` is a local folder, or
    #: the current directory when it is empty too)
    warehouse: Warehouse | None = None

    def scratch_space(self) -> tuple[Warehouse, str]:
        """The warehouse to write scratch files through and the scratch URI in it."""
        if self.warehouse is not None:
            return self.warehouse, self.scratch or self.warehouse.join("staging", "sources")
        local = Warehouse(self.scratch or ".")
        return local, local.uri


@dataclass
class SourceBatch:
    """One batch of a source: its rows in the staged shape, its malformed records
    (dead-letter rows: file, line, reason, raw), the offset after it and the files
    it consumed."""

    rows: DataFrame | None
    position: Any
    dead_letters: DataFrame | None = None
    files: list[str] = field(default_factory=list)
    #: DataFrames the connector persisted for this batch (released after staging)
    cached: list[DataFrame] = field(default_factory=list)


class Connector(ABC):
    """A kind of source (``connector = '...'``)."""

    name: ClassVar[str]
    #: option names this connector accepts (besides ``connector``)
    options: ClassVar[tuple[str, ...]]
    #: whether malformed input goes to a ``<table>__dead_letter`` table
    has_dead_letters: ClassVar[bool] = False

    def __init__(self, spark: SparkSession, table: TableShape, options: dict[str, Any]) -> None:
        self.spark = spark
        self.table = table
        self.opts = options

    @classmethod
    @abstractmethod
    def validate(cls, table: TableShape, options: dict[str, Any],
                 warehouse: Warehouse) -> dict[str, Any]:
        """The normalized options of a new source (JSON values), or raise
        ``InvalidOption`` / ``SourceError`` naming the table and the option. A path
        option is resolved with ``resolve_path`` against ``warehouse``."""

    @abstractmethod
    def read(self, ctx: BatchContext) -> SourceBatch:
        """The next batch after ``ctx.position``."""

    @classmethod
    def describe(cls, position: Any) -> str:
        """The offset in words (for status displays)."""
        return "" if position is None else str(position)


def check_known(table: str, connector: str, options: dict[str, Any],
                known: tuple[str, ...]) -> None:
    for name in options:
        if name != "connector" and name not in known:
            raise InvalidOption(f"table {table!r}: unknown option {name!r} for connector "
                                f"{connector!r}; known: {', '.join(known)}")


def opt_int(table: str, options: dict[str, Any], name: str, default: int | None,
            minimum: int = 0) -> int | None:
    value = options.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise InvalidOption(f"table {table!r}: option {name} must be an integer, got {value!r}")
    try:
        number = int(str(value)) if not isinstance(value, float) else int(value)
    except ValueError as exc:
        raise InvalidOption(f"table {table!r}: option {name} must be an integer, "
                            f"got {value!r}") from exc
    if number < minimum:
        raise InvalidOption(f"table {table!r}: option {name} must be >= {minimum}, got {number}")
    return number


def opt_float(table: str, options: dict[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    try:
        number = float(str(value))
    except ValueError as exc:
        raise InvalidOption(f"table {table!r}: option {name} must be a number, "
                            f"got {value!r}") from exc
    if not number >= 0 or number == float("inf"):
        raise InvalidOption(f"table {table!r}: option {name} must be a number >= 0, "
                            f"got {value!r}")
    return number


def opt_str(table: str, options: dict[str, Any], name: str, default: str | None,
            choices: tuple[str, ...] | None = None) -> str | None:
    value = options.get(name, default)
    if value is None:
        return None
    text = str(value)
    if choices is not None and text.lower() not in choices:
        raise InvalidOption(f"table {table!r}: option {name} must be one of "
                            f"{', '.join(map(repr, choices))}, got {value!r}")
    return text.lower() if choices is not None else text


def storage_options_for(path: str, warehouse: Warehouse | None) -> dict[str, str] | None:
    """The storage options to open ``path`` with: the warehouse's for a path on the same
    kind of object store (``Warehouse.options_for``), else none (the environment's)."""
    return None if warehouse is None else warehouse.options_for(path)


def resolve_path(value: str, warehouse: Warehouse | Path | str | None, owner: str = "") -> str:
    """A ``path`` option as an absolute path or URI: ``{warehouse}`` stands for the
    warehouse (its folder, or its URI on an object store); a relative path is
    relative to the current directory. When the warehouse is not a local folder
    (an object store; None: not known as a folder) a relative path is refused
    (``InvalidOption``), as is ``{warehouse}`` with no warehouse: it would name no
    place under the warehouse. ``owner`` (e.g. ``"table 't'"``) prefixes errors."""
    prefix = f"{owner}: " if owner else ""
    if isinstance(warehouse, Warehouse):
        root: str | None = warehouse.uri
        local = warehouse.is_local
    elif warehouse is None:
        root, local = None, False
    else:
        root = str(warehouse)
        local = "://" not in root or root.startswith("file://")
    if "{warehouse}" in value:
        if root is None:
            raise InvalidOption(f"{prefix}path {value!r}: {{warehouse}} names no folder here "
                                "(the warehouse is not a local folder)")
        value = value.replace("{warehouse}", root.rstrip("/"))
    if "://" in value:
        if value.startswith("file://"):
            return str(Path(value[len("file://"):]).resolve())
        return value
    expanded = Path(value).expanduser()
    if not expanded.is_absolute() and not local:
        raise InvalidOption(
            f"{prefix}path {value!r} is relative, but the warehouse"
            f"{'' if root is None else ' ' + repr(root)} is not a local folder: give an "
            "absolute path, a URI, or '{warehouse}/...' for a place under the warehouse")
    return str(expanded.resolve())
