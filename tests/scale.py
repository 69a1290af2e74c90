"""The engine's size thresholds lowered, so that a small test takes the paths a large
warehouse takes.

The engine chooses between a whole read and a keyed lookup, a driver write and an
executor write, one task and many, a merge of the log and a fold into base, by
comparing row counts with module constants (``SCAN_ROWS``, ``ONE_TASK_ROWS``,
``LOCAL_WRITE_ROWS``, ``KEY_VALUES``, ``MERGE_LOG_ROWS``, ``DRIVER_STAGE_ROWS``) and by
the relation store's compaction settings. At the sizes a test can afford, every
choice falls on the small side; ``at_scale`` sets every threshold to a few rows
(each name where it is defined and where it is imported), so a test of a few
hundred rows crosses them all: a long history in a short test.
"""

from __future__ import annotations

from typing import Any

import pytest

import sparkfill.dataflow.aggregate as aggregate_mod
import sparkfill.dataflow.join as join_mod
import sparkfill.dataflow.keys as keys_mod
import sparkfill.dataflow.mv as mv_mod
import sparkfill.engine as engine_mod
import sparkfill.pipelines.coordinator as coordinator_mod
import sparkfill.storage.dml as dml_mod
import sparkfill.storage.relation_store as relation_store_mod
import sparkfill.storage.spark_files as spark_files_mod

#: each threshold's name -> the modules that bind it (where it is defined and imported)
THRESHOLDS: dict[str, list[Any]] = {
    "SCAN_ROWS": [keys_mod, aggregate_mod, join_mod, mv_mod],
    "ONE_TASK_ROWS": [spark_files_mod, join_mod],
    "LOCAL_WRITE_ROWS": [relation_store_mod, coordinator_mod, mv_mod],
    "KEY_VALUES": [relation_store_mod, dml_mod],
    "MERGE_LOG_ROWS": [relation_store_mod],
    "DRIVER_STAGE_ROWS": [dml_mod, engine_mod],
    "DRIVER_CHANGE_ROWS": [dml_mod],
}


def at_scale(monkeypatch: pytest.MonkeyPatch, rows: int = 40) -> None:
    """Every size threshold at about ``rows`` rows (compaction settings: see
    ``compact_often``)."""
    values = {"SCAN_ROWS": rows, "ONE_TASK_ROWS": rows, "LOCAL_WRITE_ROWS": rows // 2,
              "KEY_VALUES": max(2, rows // 8), "MERGE_LOG_ROWS": 4 * rows,
              "DRIVER_STAGE_ROWS": rows // 2, "DRIVER_CHANGE_ROWS": rows}
    for name, modules in THRESHOLDS.items():
        for module in modules:
            assert hasattr(module, name), f"{module.__name__} no longer binds {name}"
            monkeypatch.setattr(module, name, values[name])


def compact_often(eng: Any, rows: int = 40) -> None:
    """The engine's store merges a log of four files and folds one of ``2 * rows``,
    in ranges of vnodes of ``rows // 2`` rows: a fold writes several ranges (as row
    groups of one file where Spark writes them locally, so reads of a few vnodes
    skip row groups; as files on object storage), and a relation whose rows sit in
    few vnodes (a global aggregate's state, a join on a constant key) leaves some of
    those ranges empty. A base of ``rows`` rows or more gets keyed copies, in row
    groups of ``rows // 8`` rows, once a lookup wants them."""
    eng.store.max_log_files = 4
    eng.store.min_compact_rows = 2 * rows
    eng.store.target_file_rows = max(1, rows // 2)
    # a base of ``rows`` rows gets keyed copies of a few rows per row group
    eng.store.keyed_copy_min_rows = rows
    eng.store.keyed_group_rows = max(2, rows // 8)
