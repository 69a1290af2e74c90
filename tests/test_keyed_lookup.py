"""Keyed copies (``RelationStore._read_keyed``): a fold of a large relation keyed by one
integer or string column writes beside each base file its rows sorted by key in small
row groups, and a lookup of a few keys reads only the row groups that hold one. The
threshold is lowered here so small tables get copies; every epoch is checked against a
model of the table and, for the MVs over it, their batch queries."""

from __future__ import annotations

import random

import pytest
from helpers import TableModel, assert_rows_equal, check_mv, mv_sql

from sparkfill import Engine
from sparkfill.storage import dml, relation_store
from sparkfill.storage.relation_store import KEYED_PREFIX, keyed_copy_uri

AGG = "SELECT g, count(*) AS n, sum(v) AS s, max(v) AS m FROM {src} GROUP BY g"
PROJ = "SELECT id, g, v * 2 AS v2 FROM {src} WHERE v % 3 <> 0"


@pytest.fixture
def keyed_reads(monkeypatch):
    """The base files each lookup read through keyed copies (``_read_keyed`` that did
    not fall back), and the rows it counted. A table's old rows are looked up by Spark
    here, as a large table's are (a small one's are read on the driver)."""
    monkeypatch.setattr(dml, "DRIVER_CHANGE_ROWS", 0)
    calls: list[tuple[int, int]] = []
    real = relation_store.RelationStore._read_keyed

    def spy(store, rel, files, keys, *more):
        before = sum(store.rows_read.values())
        out = real(store, rel, files, keys, *more)
        if out is not None:
            calls.append((len(files), sum(store.rows_read.values()) - before))
        return out
    monkeypatch.setattr(relation_store.RelationStore, "_read_keyed", spy)
    return calls


def _epoch(engine, spark, model, mvs, ups, dels=()):
    """One epoch of ``ups`` and ``dels`` to ``t``, in the engine and its model: then
    ``t`` equals the model and each MV of ``mvs`` (name -> query) its batch query."""
    engine.insert("t", ups)
    if dels:
        engine.delete("t", list(dels))
    model.insert(ups)
    model.delete(dels)
    model.step()
    report = engine.step()
    assert_rows_equal(engine.read("t"), model.rows(), label=f"t at epoch {report.epoch}")
    for name, sql in mvs.items():
        check_mv(engine, spark, name, sql, "t", report.epoch)
    return report


def _small_folds(engine):
    store = engine.store
    store.keyed_copy_min_rows, store.keyed_group_rows = 0, 20
    store.target_file_rows = 300  # several base files, each a range of vnodes
    store.min_compact_rows, store.log_fraction, store.max_log_files = 100, 0.25, 4


# CI runs the composite key (the general path: the keys' vnodes found by Spark); the
# lifecycle test below reads a one-column key through copies under its oracle too
@pytest.mark.parametrize("key_type", [pytest.param("BIGINT", marks=pytest.mark.extended),
                                      pytest.param("STRING", marks=pytest.mark.extended),
                                      "BIGINT, INT"])
def test_lookups_through_keyed_copies_keep_the_table_and_its_mvs_exact(
        engine, spark, keyed_reads, key_type):
    """Random upserts and deletes of a few keys an epoch, over a table folded often
    (so its base files change), keyed by an integer, a string, or two columns (an
    order's lines: the first column's values pruned, the pairs' vnodes found by
    Spark): the table equals its model and each MV its batch query at every epoch,
    lookups read through the copies, and read fewer rows than the table holds."""
    _small_folds(engine)
    rng = random.Random(7)
    composite = "," in key_type
    if composite:
        engine.sql("CREATE TABLE t (id BIGINT, line INT, g INT, v BIGINT, "
                   "PRIMARY KEY (id, line))")
        model = TableModel(["id", "line", "g", "v"], key=("id", "line"))
    else:
        engine.sql(f"CREATE TABLE t (id {key_type}, g INT, v BIGINT, PRIMARY KEY (id))")
        model = TableModel(["id", "g", "v"], key="id")
    engine.sql(f"CREATE MATERIALIZED VIEW agg AS {mv_sql(AGG, 't')}")
    engine.sql(f"CREATE MATERIALIZED VIEW proj AS {mv_sql(PROJ, 't')}")

    def key(k: int) -> dict:
        if composite:
            return {"id": k // 3, "line": k % 3}
        return {"id": k if key_type == "BIGINT" else f"k{k:05d}"}

    def row(k: int) -> dict:
        return {**key(k), "g": rng.randrange(5), "v": rng.randrange(1_000)}

    mvs = {"agg": AGG, "proj": PROJ}
    _epoch(engine, spark, model, {}, [row(k) for k in range(3_000)])
    for _ in range(8):
        _epoch(engine, spark, model, mvs, [row(rng.randrange(3_500)) for _ in range(40)],
               [key(rng.randrange(3_500)) for _ in range(10)])
    assert keyed_reads, "no lookup read through keyed copies"
    assert any(files > 1 for files, _ in keyed_reads), keyed_reads
    assert all(rows < 3_000 for _, rows in keyed_reads), keyed_reads


@pytest.mark.connect
def test_copies_are_written_when_a_lookup_wants_them_and_rewritten_when_lost(
        engine, spark, keyed_reads):
    """A base gets keyed copies after the first epoch whose lookup read it whole; a
    copy deleted by hand makes the lookup read the base files instead (derived data,
    not a damaged relation), exactly, and is written again after; vacuum removes the
    copies of the files it removes."""
    _small_folds(engine)
    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.sql(f"CREATE MATERIALIZED VIEW agg AS {mv_sql(AGG, 't')}")
    model = TableModel(["id", "g", "v"], key="id")
    wh = engine.store.warehouse
    rel = engine.catalog.get("t").stored

    def epoch(ups, dels=()):
        _epoch(engine, spark, model, {"agg": AGG}, ups, dels)

    def copies():
        return [keyed_copy_uri(f.uri) for f in engine.store.files_at(
            rel, engine.committed_epoch) if f.kind == "base"]

    epoch([{"id": k, "g": k % 4, "v": k} for k in range(2_000)])  # a load, folded
    assert copies() and not any(wh.exists(c) for c in copies())
    epoch([{"id": 1, "g": 1, "v": 1}], [{"id": 5}])  # reads the base whole, wants copies
    assert not keyed_reads, "a lookup read through copies not yet written"
    first = copies()
    assert first and all(wh.exists(c) for c in first), first
    epoch([{"id": 2, "g": 2, "v": 2}])
    assert len(keyed_reads) == 1, keyed_reads
    wh.rmtree(first[0])
    engine.store._keyed_groups.clear()
    epoch([{"id": k, "g": 9, "v": -k} for k in range(0, 2_000, 97)], [{"id": 7}])
    assert len(keyed_reads) == 1, "a lookup read through a missing copy"
    assert wh.exists(first[0]), "the lost copy was not written again"
    epoch([{"id": 3, "g": 3, "v": 3}])
    assert len(keyed_reads) == 2, keyed_reads
    # fold again: the old base files and their copies are removed by vacuum
    for n in range(6):
        epoch([{"id": 10_000 + 100 * n + k, "g": 1, "v": k} for k in range(100)])
    assert set(copies()).isdisjoint(first), "no fold"
    epoch([{"id": 4, "g": 4, "v": 4}])
    engine.coordinator.retain_epochs = 0
    engine.coordinator.vacuum(engine.committed_epoch)
    assert not any(wh.exists(c) for c in first), "vacuum left keyed copies behind"
    live = copies()
    assert live and all(wh.exists(c) and KEYED_PREFIX in c for c in live), live
    assert_rows_equal(engine.read("t"), model.rows(), label="t after vacuum")


@pytest.mark.extended
def test_keyed_copies_on_an_object_store(spark, s3_warehouse, pg_url, keyed_reads):
    """The copies are written and read through pyarrow's S3 filesystem on the
    executors: lookups read through them and the MV stays exact."""
    with Engine(s3_warehouse, spark=spark, meta=pg_url) as engine:
        _small_folds(engine)
        engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        engine.sql(f"CREATE MATERIALIZED VIEW agg AS {mv_sql(AGG, 't')}")
        model = TableModel(["id", "g", "v"], key="id")
        _epoch(engine, spark, model, {}, [{"id": k, "g": k % 4, "v": k} for k in range(1_500)])
        for n in range(3):
            _epoch(engine, spark, model, {"agg": AGG},
                   [{"id": k, "g": n, "v": -k} for k in range(n, 1_600, 53)],
                   [{"id": k} for k in range(n + 7, 1_500, 211)])
    assert keyed_reads, "no lookup read through keyed copies"


# the one-column key is an extended variant: the two-column key's ranges hold it
@pytest.mark.parametrize("composite", [pytest.param(False, marks=pytest.mark.extended), True],
                         ids=["one-column key", "two-column key"])
def test_a_change_of_many_keys_finds_its_old_rows_by_their_ranges(
        engine, spark, monkeypatch, composite):
    """An epoch that changes more keys than ``KEY_VALUES`` finds its old rows by a
    semi-join with its keys below the merge of base and log, reading only the files
    its keys' range in each vnode meets: the table equals its model and each MV its
    batch query at every epoch (random upserts of old and new keys, deletes, a key
    changed twice in one epoch; half the table's keys at once, which meet the merged
    snapshot instead), and a batch of new keys above the table's range reads none of
    the table's rows."""
    monkeypatch.setattr(relation_store, "KEY_VALUES", 4)
    monkeypatch.setattr(dml, "KEY_VALUES", 4)
    _small_folds(engine)
    engine.store.keyed_copy_min_rows = 10**9  # no copies: the semi-join's path alone
    lookups: list[int] = []
    real = dml.key_ranges

    def spy(keys, key):
        out = real(keys, key)
        lookups.append(len(out))
        return out
    monkeypatch.setattr(dml, "key_ranges", spy)
    rng = random.Random(11)
    if composite:
        engine.sql("CREATE TABLE t (id BIGINT, line INT, g INT, v BIGINT, "
                   "PRIMARY KEY (id, line))")
        model = TableModel(["id", "line", "g", "v"], key=("id", "line"))
    else:
        engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        model = TableModel(["id", "g", "v"], key="id")
    engine.sql(f"CREATE MATERIALIZED VIEW agg AS {mv_sql(AGG, 't')}")
    engine.sql(f"CREATE MATERIALIZED VIEW proj AS {mv_sql(PROJ, 't')}")
    mvs = {"agg": AGG, "proj": PROJ}

    def key(k: int) -> dict:
        return {"id": k // 3, "line": k % 3} if composite else {"id": k}

    def row(k: int) -> dict:
        return {**key(k), "g": rng.randrange(5), "v": rng.randrange(1_000)}

    _epoch(engine, spark, model, mvs, [row(k) for k in range(1_500)])
    for _ in range(5):
        ups = [row(rng.randrange(1_800)) for _ in range(60)]
        _epoch(engine, spark, model, mvs, ups + ups[:5],
               [key(rng.randrange(1_800)) for _ in range(20)])
    assert lookups and all(n > 0 for n in lookups), lookups
    # half the table's keys (over SEMI_FRACTION): they meet the merged snapshot
    semis: list[bool] = []
    real_snapshot = engine.store.snapshot

    def snapshot(*args, **kwargs):
        semis.append(kwargs.get("semi") is not None)
        return real_snapshot(*args, **kwargs)
    monkeypatch.setattr(engine.store, "snapshot", snapshot)
    _epoch(engine, spark, model, mvs, [row(k) for k in range(0, 1_500, 2)])
    assert semis and not semis[0], semis
    monkeypatch.setattr(engine.store, "snapshot", real_snapshot)
    # new keys above every key the table holds: no file's key range meets them
    calls = len(lookups)
    report = _epoch(engine, spark, model, mvs, [row(k) for k in range(6_000, 6_060)])
    assert len(lookups) == calls + 1, "the new keys' lookup did not go by ranges"
    assert report.rows_read.get("t", 0) == 0, report.rows_read
