"""sparkfill: incremental materialized views with online backfill on Apache Spark.

The public API is this module's ``__all__``: the ``Engine``, its progress
records, and the one error hierarchy under ``SparkfillError``.
"""

from .engine import Engine
from .errors import (
    CatalogError,
    DataError,
    DependentObjects,
    EngineClosed,
    EpochNotRetained,
    InvalidOption,
    MaterializedViewNotReady,
    RelationExists,
    SinkError,
    SourceError,
    SparkfillError,
    SqlError,
    UnknownColumn,
    UnknownRelation,
    UnsupportedQuery,
    WarehouseLocked,
)
from .progress import EpochReport, JobProgress

__all__ = [
    "Engine",
    "EpochReport",
    "JobProgress",
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
    "EngineClosed",
    "SourceError",
    "SinkError",
]

__version__ = "0.1.0"
