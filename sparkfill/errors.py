"""The one exception hierarchy of sparkfill.

Invariant: every error that crosses the public API is a ``SparkfillError``;
errors of Spark, delta-rs, SQLite, PostgreSQL or sqlglot are translated at the boundary
(``sparkfill.engine``) into one of these, with what was wrong and where.
A statement or DML call that raises one of these has changed nothing.
"""

from __future__ import annotations

import re

__all__ = [
    "SparkfillError",
    "SqlError",
    "UnsupportedQuery",
    "CatalogError",
    "UnknownRelation",
    "UnknownColumn",
    "RelationExists",
    "DependentObjects",
    "InvalidOption",
    "DataError",
    "MaterializedViewNotReady",
    "EpochNotRetained",
    "WarehouseLocked",
    "WarehouseReadOnly",
    "MetaStoreError",
    "EngineClosed",
    "SourceError",
    "SinkError",
    "DamagedFile",
    "ROW_ERRORS",
    "is_row_error",
    "without_internal_names",
]


_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class SparkfillError(Exception):
    """Base class of every error raised by sparkfill. Its message is plain text:
    terminal escape codes (sqlglot underlines a syntax error's token) are removed,
    so logs and files show it as it reads."""

    def __init__(self, *args: object) -> None:
        super().__init__(*[_TERMINAL_CODES.sub("", a) if isinstance(a, str) else a
                           for a in args])


class SqlError(SparkfillError):
    """A statement could not be parsed or analysed."""


class UnsupportedQuery(SqlError):
    """A query uses a construct sparkfill does not maintain incrementally."""


class CatalogError(SparkfillError):
    """A statement conflicts with the catalog."""


class UnknownRelation(CatalogError):
    """No table or materialized view has this name."""


class UnknownColumn(CatalogError):
    """A relation has no column of this name."""


class RelationExists(CatalogError):
    """A table or materialized view of this name already exists."""


class DependentObjects(CatalogError):
    """A relation cannot be dropped while other relations read it."""


class InvalidOption(SparkfillError):
    """An option name or value (WITH, SET) is not valid."""


class DataError(SparkfillError):
    """Rows given to a DML call do not fit the table (null key, wrong type, ...)."""


class MaterializedViewNotReady(SparkfillError):
    """The materialized view is still being created (backfilling)."""


class EpochNotRetained(SparkfillError):
    """The requested epoch is not committed, or no longer retained."""


class WarehouseLocked(SparkfillError):
    """Another process holds the warehouse's writer lock."""


class WarehouseReadOnly(SparkfillError):
    """A write through an engine opened with ``read_only=True`` (or a read-only
    open of a folder that is not a warehouse)."""


class MetaStoreError(SparkfillError):
    """The meta store named by ``Engine(..., meta=...)`` cannot serve this warehouse:
    its server cannot be reached, its driver is missing, or the warehouse was
    created with another meta store (recorded in the warehouse's ``meta.json``)."""


class EngineClosed(SparkfillError):
    """The engine was closed."""


class SourceError(SparkfillError):
    """A source cannot read its input (directory, external table, change feed)."""


class SinkError(SparkfillError):
    """A sink cannot write its output (path, Delta table, column names)."""


class DamagedFile(SparkfillError):
    """A data file a committed epoch of a relation references is missing, or is not
    the file that was written (truncated or overwritten by hand): the message names
    the relation and the file."""


#: Spark's error conditions of evaluating an expression over a value (ANSI mode):
#: they depend on the rows, and Spark's own query over the same rows raises them
ROW_ERRORS = (
    "CAST_INVALID_INPUT", "CAST_OVERFLOW", "ARITHMETIC_OVERFLOW", "DIVIDE_BY_ZERO",
    "NUMERIC_VALUE_OUT_OF_RANGE", "INVALID_ARRAY_INDEX", "INVALID_INDEX_OF_ZERO",
    "DATETIME_FIELD_OUT_OF_BOUNDS", "DATETIME_OVERFLOW", "INVALID_FRACTION_OF_SECOND",
    "INVALID_PARAMETER_VALUE", "USER_RAISED_EXCEPTION", "SCALAR_SUBQUERY_TOO_MANY_ROWS",
    "CANNOT_PARSE_TIMESTAMP", "INVALID_URL", "INVALID_UTF8_STRING", "BINARY_ARITHMETIC_OVERFLOW",
    "INTERVAL_ARITHMETIC_OVERFLOW", "INTERVAL_DIVIDED_BY_ZERO", "NULL_MAP_KEY",
    "DUPLICATED_MAP_KEY", "EXCEED_LIMIT_LENGTH", "CONVERSION_INVALID_INPUT",
)


def is_row_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark's error of evaluating the query over certain values."""
    condition = ""
    get = getattr(exc, "getCondition", None)
    if callable(get):
        try:
            condition = get() or ""
        except Exception:  # noqa: BLE001 - the text below decides then
            condition = ""
    text = f"{condition} {exc}"
    return any(c in text for c in ROW_ERRORS)


def without_internal_names(text: str) -> str:
    """``text`` (an error of Spark) with the names of internal relations and planning
    views taken out: a qualifier dropped, a name shown as ``<internal>``."""
    return re.sub(r"`?__sf_\w+`?", "<internal>", re.sub(r"`?__sf_\w+`?\.", "", text))
