"""sparkfill: incremental materialized views with online backfill on Apache Spark.

The public API is this module's ``__all__``: the ``Engine``, its progress
records, and the one error hierarchy under ``SparkfillError``.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from .engine import Engine
from .errors import (
    CatalogError,
    DamagedFile,
    DataError,
    DependentObjects,
    EngineClosed,
    EpochNotRetained,
    InvalidOption,
    MaterializedViewNotReady,
    MetaStoreError,
    RelationExists,
    SinkError,
    SourceError,
    SparkfillError,
    SqlError,
    UnknownColumn,
    UnknownRelation,
    UnsupportedQuery,
    WarehouseLocked,
    WarehouseReadOnly,
)
from .progress import EpochReport, JobProgress, RefreshChoice

__all__ = [
    "Engine",
    "EpochReport",
    "JobProgress",
    "RefreshChoice",
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
]

try:  # the installed distribution's version (pyproject.toml is its one source)
    __version__ = _version("sparkfill")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
