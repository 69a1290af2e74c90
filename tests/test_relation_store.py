"""Unit tests of the relation store, key ranges and changelog consolidation:
the storage invariants the engine's correctness rests on."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from sparkfill.dataflow.changelog import consolidate
from sparkfill.storage.keyrange import END, Position, _covered_sql, covered, gt, le
from sparkfill.storage.meta_store import EpochCommit, MetaStore
from sparkfill.storage.relation_store import RelationStore, StoredRelation
from sparkfill.storage.schema import OP, VNODE, Column, vnode_expr, vnodes_of
from sparkfill.storage.warehouse import Warehouse

COLUMNS = (Column("id", "bigint", False), Column("v", "string", True))
KEY = ("id",)


@pytest.fixture(params=["driver", "executors", "s3-executors"])
def store(request, tmp_path: Path, spark, monkeypatch):
    """A store whose appends are written by the driver (small Δs, as the epoch loop
    writes them) or by Spark's executors (large Δs), in a local folder, and by the
    executors through pyarrow into a bucket of the loopback S3 server: every test
    runs each way."""
    import sparkfill.storage.relation_store as relation_store

    if request.param.endswith("executors"):
        monkeypatch.setattr(relation_store, "LOCAL_WRITE_ROWS", -1)
    location = tmp_path
    if request.param.startswith("s3"):
        location = f"s3://{request.getfixturevalue('s3_server').new_bucket()}/wh"
    meta = MetaStore(tmp_path / "meta.sqlite")
    st_ = RelationStore(spark, Warehouse(location), meta, target_file_rows=40,
                        max_log_files=1000, min_compact_rows=10**9)
    rel = StoredRelation(1, "r", "000001-r", COLUMNS, KEY)
    st_.create(rel.dir, COLUMNS)
    with meta.transaction() as conn:
        meta.set_version(conn, rel.id, 0, 0)
    yield st_, meta, rel
    meta.close()


def _changelog(spark, rows: list[tuple[int, str | None, str]]):
    df = spark.createDataFrame(rows, "id bigint, v string, _op string")
    return df.withColumn(VNODE, vnode_expr(["id"])).select("id", "v", VNODE, OP)


def _commit(store, meta, rel, epoch, rows, spark):
    written = store.append(rel, epoch, _changelog(spark, rows), len(rows))
    meta.commit_epoch(EpochCommit(epoch, 0.0, 0.0, {rel.id: written.version}, {}, [], [], 0))
    return written.version


def _random_changes(rng, model: dict[int, str], epoch: int, keys: range, n: int):
    """``n`` random keys of ``keys`` changed in ``epoch`` as changelog rows, ``model``
    (key -> value) brought up to date: a live key deleted (30%) or updated, a new
    key inserted."""
    rows = []
    for k in rng.sample(keys, n):
        if k in model and rng.random() < 0.3:
            rows.append((k, model.pop(k), "-"))
        elif k in model:
            rows += [(k, model[k], "U-"), (k, f"{k}-{epoch}", "U+")]
            model[k] = f"{k}-{epoch}"
        else:
            model[k] = f"{k}-{epoch}"
            rows.append((k, model[k], "+"))
    return rows


def _snap(store, rel, epoch):
    return sorted((r.id, r.v) for r in store.snapshot(rel, epoch).collect())


def test_snapshot_merges_log_latest_change_wins_and_time_travels(store, spark):
    st_, meta, rel = store
    _commit(st_, meta, rel, 1, [(1, "a", "+"), (2, "b", "+"), (3, "c", "+")], spark)
    _commit(st_, meta, rel, 2, [(1, "a", "U-"), (1, "a2", "U+"), (2, "b", "-")], spark)
    _commit(st_, meta, rel, 3, [(2, "b3", "+"), (3, "c", "-")], spark)
    assert _snap(st_, rel, 1) == [(1, "a"), (2, "b"), (3, "c")]
    assert _snap(st_, rel, 2) == [(1, "a2"), (3, "c")]
    assert _snap(st_, rel, 3) == [(1, "a2"), (2, "b3")]
    log = st_.changelog(rel, 1, 3).select("id", OP, "_epoch").collect()
    assert sorted((r.id, r[OP], r._epoch) for r in log) == [
        (1, "U+", 2), (1, "U-", 2), (2, "+", 3), (2, "-", 2), (3, "-", 3)]


def test_delta_checkpoints_keep_every_version_readable(store, spark, monkeypatch):
    import sparkfill.storage.relation_store as relation_store

    monkeypatch.setattr(relation_store, "CHECKPOINT_EVERY", 2)
    st_, meta, rel = store
    _commit(st_, meta, rel, 1, [(1, "a", "+"), (2, "b", "+")], spark)
    _commit(st_, meta, rel, 2, [(1, "a", "U-"), (1, "a2", "U+")], spark)
    _commit(st_, meta, rel, 3, [(2, "b", "-"), (3, "c", "+")], spark)
    log = st_.warehouse.list(f"{st_.path(rel)}/_delta_log")
    assert any(name.endswith(".checkpoint.parquet") for name in log), log
    fresh = RelationStore(spark, st_.warehouse, meta)  # no cached file lists
    assert _snap(fresh, rel, 1) == [(1, "a"), (2, "b")]
    assert _snap(fresh, rel, 2) == [(1, "a2"), (2, "b")]
    assert _snap(fresh, rel, 3) == [(1, "a2"), (3, "c")]


def test_append_is_idempotent_per_epoch(store, spark):
    st_, meta, rel = store
    v1 = _commit(st_, meta, rel, 1, [(1, "a", "+")], spark)
    again = st_.append(rel, 1, _changelog(spark, [(1, "a", "+")]), 1)
    assert again.version == v1 and again.counts == {"+": 1}  # found, not written again
    assert [(r.id, r.v, r[OP]) for r in again.delta.collect()] == [(1, "a", "+")]
    assert len(st_.files(rel, st_.latest_version(rel))) == 1
    assert _snap(st_, rel, 1) == [(1, "a")]


def test_append_observes_its_rows_and_vnodes_and_reads_back(store, spark):
    st_, meta, rel = store
    rows = [(1, "a", "+"), (2, "b", "U-"), (2, "b2", "U+"), (3, None, "-")]
    jobs = st_.spark_jobs
    written = st_.append(rel, 1, _changelog(spark, rows), len(rows))
    assert st_.spark_jobs == jobs + 1, "one Spark job writes, counts and collects vnodes"
    assert written.counts == {"+": 1, "U-": 1, "U+": 1, "-": 1}
    want_vnodes = sorted({r[0] for r in _changelog(spark, rows).select(VNODE).collect()})
    assert list(written.vnodes) == want_vnodes
    assert sorted((r.id, r.v, r[OP]) for r in written.delta.collect()) == sorted(rows)
    # an empty changelog commits nothing
    version = st_.latest_version(rel)
    assert st_.append(rel, 2, _changelog(spark, [(9, "x", "+")]).limit(0), 0) is None
    assert st_.latest_version(rel) == version


def test_compaction_keeps_snapshots_and_old_epochs(store, spark):
    st_, meta, rel = store
    rng = random.Random(3)
    model: dict[int, str] = {}
    history = {}
    for epoch in range(1, 7):
        _commit(st_, meta, rel, epoch, _random_changes(rng, model, epoch, range(200), 60),
                spark)
        history[epoch] = sorted(model.items())
    before = st_.latest_version(rel)
    st_.compact(rel, 6, len(model))
    files = st_.files_at(rel, 6)
    assert {f.kind for f in files} == {"base"}
    # split by vnode range: into files (object storage), or into the row groups of
    # one file (a local warehouse: a Spark task per file costs as much as its rows)
    groups = [(md.row_group(g).num_rows, _vnode_range(md, g))
              for f in files for md in [st_.warehouse.parquet_metadata(f.uri)]
              for g in range(md.num_row_groups)]
    assert len(groups) > 1 and all(n <= st_.target_file_rows for n, _ in groups), groups
    # (the driver writes a file per range; Spark, locally, the ranges as one file)
    assert len(files) in (1, len(groups)), (files, groups)
    assert st_.latest_version(rel) == before + 1
    for epoch, expected in history.items():
        assert _snap(st_, rel, epoch) == expected
    # a read of one vnode reads (and counts) only the row groups that can hold it,
    # and returns exactly its rows
    vnode = groups[0][1][0]
    st_.rows_read.clear()
    got = sorted((r.id, r.v) for r in st_.snapshot(rel, 6, vnodes=[vnode]).collect())
    assert got == [(k, v) for k, v in history[6] if vnodes_of([k], "bigint")[0] == vnode]
    holding = sum(n for n, (lo, hi) in groups if lo <= vnode <= hi)
    assert 0 < st_.rows_read["r"] <= holding < len(model), (st_.rows_read, groups)


def test_a_small_relation_is_folded_by_the_driver(tmp_path, spark):
    """A relation of a few rows, keyed by two columns, folded whenever
    ``compaction_due`` says so (its log of more than 20 rows, and more rows than its
    base): each fold reads and merges its files on the driver (no Spark job), and the
    snapshot as of every epoch, before and after each fold, equals the model; a
    key deleted and inserted again, updated twice, and one whose last change is a
    delete, are each folded as their last change says."""
    columns = (Column("id", "bigint", False), Column("s", "string", False),
               Column("v", "string", True))
    meta = MetaStore(tmp_path / "meta.sqlite")
    st_ = RelationStore(spark, Warehouse(tmp_path), meta, target_file_rows=40,
                        min_compact_rows=20)
    rel = StoredRelation(1, "r", "000001-r", columns, ("id", "s"))
    st_.create(rel.dir, columns)
    with meta.transaction() as conn:
        meta.set_version(conn, rel.id, 0, 0)
    rng = random.Random(9)
    model: dict[tuple[int, str], str] = {}
    history = {}
    folds = 0
    for epoch in range(1, 13):
        flat: dict[int, str] = {k[0] * 2 + "ab".index(k[1]): v for k, v in model.items()}
        rows = _random_changes(rng, flat, epoch, range(60), 15)
        model = {(k // 2, "ab"[k % 2]): v for k, v in flat.items()}
        df = spark.createDataFrame([(k // 2, "ab"[k % 2], v, op) for k, v, op in rows],
                                   "id bigint, s string, v string, _op string")
        written = st_.append(rel, epoch, df.withColumn(VNODE, vnode_expr(["id", "s"]))
                             .select("id", "s", "v", VNODE, OP), len(rows))
        meta.commit_epoch(EpochCommit(epoch, 0.0, 0.0, {rel.id: written.version}, {}, [], [],
                                      0))
        history[epoch] = sorted((k[0], k[1], v) for k, v in model.items())
        if st_.compaction_due(rel, epoch) == "fold":
            jobs = st_.spark_jobs
            st_.compact(rel, epoch, len(model))
            assert st_.spark_jobs == jobs, f"epoch {epoch}: the fold ran a Spark job"
            assert {f.kind for f in st_.files_at(rel, epoch)} <= {"base"}
            folds += 1
        for e, expected in history.items():
            got = sorted((r.id, r.s, r.v) for r in st_.snapshot(rel, e).collect())
            assert got == expected, f"as of epoch {e}, after epoch {epoch}"
    assert folds >= 3, folds
    meta.close()


def _vnode_range(md, g: int) -> tuple[int, int]:
    names = [md.schema.column(i).name for i in range(md.num_columns)]
    st = md.row_group(g).column(names.index(VNODE)).statistics
    return int(st.min), int(st.max)


def test_a_relation_in_one_vnode_reads_its_log_after_a_fold(store, spark):
    """All rows in one vnode (a global aggregate's state, a join on a constant key)
    folded into more files than the vnode ranges its rows fill: the fold leaves no
    empty file, and the log appended after it is read. An empty base file, without
    statistics, once moved the start of the log past every epoch, so a snapshot was
    the base alone (issue 38: Nexmark q102's scalar froze at its compaction)."""
    st_, meta, rel = store
    rng = random.Random(5)
    model: dict[int, str] = {}

    def commit(epoch: int) -> None:
        rows = _random_changes(rng, model, epoch, range(300), 100)
        df = spark.createDataFrame(rows, "id bigint, v string, _op string")
        written = st_.append(rel, epoch, df.withColumn(VNODE, F.lit(192))
                             .select("id", "v", VNODE, OP), len(rows))
        meta.commit_epoch(EpochCommit(epoch, 0.0, 0.0, {rel.id: written.version}, {}, [], [],
                                      0))

    for epoch in range(1, 4):
        commit(epoch)
    st_.compact(rel, 3, len(model))
    assert _snap(st_, rel, 3) == sorted(model.items())
    for epoch in range(4, 7):
        commit(epoch)
        assert _snap(st_, rel, epoch) == sorted(model.items()), f"epoch {epoch}"
    files = st_.files_at(rel, 3)
    assert files and all(f.kind == "base" and f.rows > 0 for f in files)


def test_a_merged_log_keeps_every_epoch_and_the_log_store(store, spark):
    """Many small log files over a large base are merged into one log file, not
    folded into base: the base is not rewritten, every row stays with its epoch, so
    a snapshot as of every epoch and the log store's reads between any two epochs
    are what they were; a log too large to merge, or large against the base, is
    folded."""
    import sparkfill.storage.relation_store as relation_store

    st_, meta, rel = store
    st_.max_log_files, st_.min_compact_rows, st_.log_fraction = 4, 10, 1.0
    rng = random.Random(5)
    model = {k: f"{k}-0" for k in range(300)}
    _commit(st_, meta, rel, 1, [(k, v, "+") for k, v in model.items()], spark)
    st_.compact(rel, 1, len(model))
    base = {f.path for f in st_.files_at(rel, 1)}
    history = {1: sorted(model.items())}
    for epoch in range(2, 7):
        _commit(st_, meta, rel, epoch, _random_changes(rng, model, epoch, range(320), 12),
                spark)
        history[epoch] = sorted(model.items())

    def log_rows(after, upto):
        return sorted(tuple(r) for r in st_.changelog(rel, after, upto)
                      .select("id", "v", OP, "_epoch").collect())

    spans = [(a, b) for a in range(1, 6) for b in range(a + 1, 7)]
    logs = {span: log_rows(*span) for span in spans}
    assert st_.compaction_due(rel, 6) == "merge", "5 log files over a base of 300 rows"
    jobs = st_.spark_jobs
    st_.merge_log(rel, 6)
    assert st_.spark_jobs == jobs, "merged on the driver"
    files = st_.files_at(rel, 6)
    assert {f.path for f in files if f.kind == "base"} == base, "the base is not rewritten"
    merged = [f for f in files if f.kind == "log"]
    rows = sum(f.rows for f in merged)
    assert all(f.path.startswith("log/m") for f in merged)
    assert len(merged) == math.ceil(rows / st_.target_file_rows) < 5
    assert (min(f.epoch_min for f in merged), max(f.epoch_max for f in merged)) == (2, 6)
    assert st_.compaction_due(rel, 6) is None
    for epoch, expected in history.items():
        assert _snap(st_, rel, epoch) == expected, epoch
    for span in spans:
        assert log_rows(*span) == logs[span], span
    monkey = pytest.MonkeyPatch()
    try:  # too many rows to merge on the driver: folded
        for epoch in range(7, 10):
            _commit(st_, meta, rel, epoch, [(epoch * 1000, "n", "+")], spark)
        assert st_.compaction_due(rel, 9) == "merge"
        monkey.setattr(relation_store, "MERGE_LOG_ROWS", 10)
        assert st_.compaction_due(rel, 9) == "fold"
    finally:
        monkey.undo()
    st_.log_fraction = 0.05  # a log large against its base is folded, however few files
    assert st_.compaction_due(rel, 9) == "fold"


@pytest.mark.parametrize("writer", ["driver", "executors"])
def test_a_merged_log_keeps_every_column_type(writer, tmp_path: Path, spark, monkeypatch):
    """The merge reads the log files on the driver (pyarrow) and writes them again:
    every column type, as the driver or Spark's executors wrote it, reads back the
    same at every epoch."""
    import datetime as dt
    from decimal import Decimal

    import sparkfill.storage.relation_store as relation_store

    if writer == "executors":
        monkeypatch.setattr(relation_store, "LOCAL_WRITE_ROWS", -1)
    types = ["tinyint", "smallint", "int", "float", "double", "boolean", "date", "timestamp",
             "timestamp_ntz", "decimal(12,3)", "decimal(30,5)", "string"]
    columns = (Column("id", "bigint", False),
               *[Column(f"c{i}", t) for i, t in enumerate(types)])
    meta = MetaStore(tmp_path / "meta.sqlite")
    st_ = RelationStore(spark, Warehouse(tmp_path), meta, max_log_files=3,
                        min_compact_rows=10**9)
    rel = StoredRelation(1, "r", "000001-r", columns, KEY)
    st_.create(rel.dir, columns)
    with meta.transaction() as conn:
        meta.set_version(conn, rel.id, 0, 0)
    schema = ", ".join([f"{c.name} {c.type}" for c in columns] + ["_op string"])
    for epoch in range(1, 5):
        rows = [(k * 10 + epoch, k, 300 + k, -k, 1.5 * k, k / 3, k % 2 == 0,
                 dt.date(2020, 1, k + 1), dt.datetime(2021, 2, 3, 4, 5, k, tzinfo=dt.UTC),
                 dt.datetime(2022, 1, 1, 0, 0, k), Decimal(f"{k}.125"),
                 Decimal(f"123456789012345.{k}"), None if k == 3 else f"s{k}", "+")
                for k in range(5)]
        delta = spark.createDataFrame(rows, schema).withColumn(VNODE, vnode_expr(["id"])) \
            .select(*[c.name for c in columns], VNODE, OP)
        written = st_.append(rel, epoch, delta, len(rows))
        meta.commit_epoch(EpochCommit(epoch, 0.0, 0.0, {rel.id: written.version}, {}, [], [],
                                      0))

    def snap(epoch):
        return sorted(tuple(r) for r in st_.snapshot(rel, epoch).collect())

    before = {epoch: snap(epoch) for epoch in range(1, 5)}
    assert st_.compaction_due(rel, 4) == "merge"
    st_.merge_log(rel, 4)
    assert all(f.path.startswith("log/m") for f in st_.files_at(rel, 4))
    assert {epoch: snap(epoch) for epoch in range(1, 5)} == before
    # then folded (by the driver, when its appends are: a small relation) with every
    # value as it was
    st_.compact(rel, 4, len(before[4]))
    assert {f.kind for f in st_.files_at(rel, 4)} == {"base"}
    assert {epoch: snap(epoch) for epoch in range(1, 5)} == before
    meta.close()


def test_a_log_that_is_already_a_base_is_adopted_without_a_rewrite(store, spark):
    """Compaction of a relation first filled by one epoch (only inserts: its log is
    its live rows) links the log files under base/ instead of rewriting them (no
    Spark job, same files' rows); every epoch stays readable, also once the log
    paths are gone (vacuumed). A log with a retraction is rewritten."""
    st_, meta, rel = store
    _commit(st_, meta, rel, 1, [(i, str(i), "+") for i in range(300)], spark)
    log_files = st_.files_at(rel, 1)
    jobs = st_.spark_jobs
    st_.compact(rel, 1, 300)
    assert st_.spark_jobs == jobs, "adopted: no Spark job"
    base = st_.files_at(rel, 1)
    assert {f.kind for f in base} == {"base"} and len(base) == len(log_files) >= 1
    assert sorted((f.rows, f.vnode_min, f.vnode_max, f.key_min, f.key_max) for f in base) == \
        sorted((f.rows, f.vnode_min, f.vnode_max, f.key_min, f.key_max) for f in log_files)
    for f in log_files:  # as vacuum leaves it: the base keeps its rows
        st_.warehouse.rmtree(f.uri)
    assert _snap(st_, rel, 1) == [(i, str(i)) for i in range(300)]
    _commit(st_, meta, rel, 2, [(1, "1", "U-"), (1, "x", "U+"), (2, "2", "-"), (500, "n", "+")],
            spark)
    want = sorted([(1, "x"), (500, "n")] + [(i, str(i)) for i in range(3, 300)] + [(0, "0")])
    assert _snap(st_, rel, 2) == want
    adopted = {f.path for f in base}
    st_.compact(rel, 2, 299)
    folded = st_.files_at(rel, 2)
    assert {f.kind for f in folded} == {"base"}
    assert adopted.isdisjoint(f.path for f in folded), "a log with retractions is rewritten"
    assert _snap(st_, rel, 2) == want
    assert _snap(st_, rel, 1) == [(i, str(i)) for i in range(300)]


def test_a_first_fill_in_more_files_than_a_fold_would_write_is_adopted(store, spark):
    """A first fill sized by its upstream's rows (a blocking CREATE's MV, a filter of
    half the upstream's rows) is written in more files than a fold would write; files
    of at least a quarter of the target are not small, so the fold adopts them as
    they are (no Spark job) instead of rewriting them."""
    st_, meta, rel = store
    rows = [(i, str(i), "+") for i in range(300)]
    written = st_.append(rel, 1, _changelog(spark, rows), 3 * len(rows))  # hint: 3x
    meta.commit_epoch(EpochCommit(1, 0.0, 0.0, {rel.id: written.version}, {}, [], [], 0))
    log_files = st_.files_at(rel, 1)
    # (the driver writes a small Δ in files of the target; the executors by the hint)
    assert 4 * len(rows) >= len(log_files) * st_.target_file_rows, "not small on average"
    jobs = st_.spark_jobs
    st_.compact(rel, 1, len(rows))
    assert st_.spark_jobs == jobs, "adopted: no Spark job"
    assert len(st_.files_at(rel, 1)) == len(log_files)
    assert _snap(st_, rel, 1) == sorted((i, str(i)) for i in range(300))


def test_a_log_of_upserts_is_not_adopted(store, spark):
    """The first epoch of a relation may hold U-/U+ pairs (a snapshot job's tagged
    append) or a retraction: then its rows are not its live rows and it is rewritten."""
    st_, meta, rel = store
    _commit(st_, meta, rel, 1, [(1, "a", "+"), (2, "b", "U-"), (2, "b2", "U+")], spark)
    st_.compact(rel, 1, 2)
    assert {f.kind for f in st_.files_at(rel, 1)} == {"base"}
    assert _snap(st_, rel, 1) == [(1, "a"), (2, "b2")]


def test_range_reads_prune_files(store, spark):
    st_, meta, rel = store
    _commit(st_, meta, rel, 1, [(i, str(i), "+") for i in range(400)], spark)
    st_.compact(rel, 1, 400)
    st_.rows_read.clear()
    whole = st_.snapshot(rel, 1).count()
    full_read = st_.rows_read["r"]
    st_.rows_read.clear()
    part = st_.snapshot(rel, 1, after=Position(100, None), vnode_hi=140).collect()
    assert whole == 400 and full_read == 400
    assert all(100 < r[VNODE] <= 140 for r in part)
    assert 0 < st_.rows_read["r"] < full_read / 2


@settings(max_examples=25, deadline=None)
@given(vnode=st.integers(0, 255), key=st.one_of(st.none(), st.integers(-5, 5)))
def test_le_and_gt_partition_rows(spark, vnode, key):
    df = spark.createDataFrame([(v, k) for v in (vnode - 1, vnode, vnode + 1)
                                for k in range(-6, 7)], f"{VNODE} int, id bigint")
    pos = Position(vnode, None if key is None else (key,))
    pos = Position.from_json(pos.to_json())
    below = {(r[0], r[1]) for r in df.where(le(pos, COLUMNS[:1])).collect()}
    above = {(r[0], r[1]) for r in df.where(gt(pos, COLUMNS[:1])).collect()}
    everything = {(r[0], r[1]) for r in df.collect()}
    assert below | above == everything and not below & above
    for v, k in below:
        assert v < vnode or (v == vnode and (key is None or k <= key))
    assert END.is_end and not pos.is_end or vnode == 255


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_covered_as_sql_text_selects_what_its_definition_says(spark, seed):
    """The arrangement backfill's ``covered`` (done vnodes, or keys at or below their
    vnode's position) built as one SQL text over a composite key of a number, a string
    (quotes and non-ASCII included) and a timestamp (compared as microseconds), checked
    row by row against the definition."""
    import datetime

    rng = random.Random(seed)
    cols = (Column("a", "bigint", False), Column("s", "string", False),
            Column("ts", "timestamp", False))
    texts = ["", "a", "b", "it's", "é", "z\\q"]
    epoch0 = datetime.datetime(2026, 1, 1)
    rows = [(rng.randrange(6), rng.randrange(-3, 4), rng.choice(texts),
             epoch0 + datetime.timedelta(seconds=rng.randrange(4))) for _ in range(120)]
    df = spark.createDataFrame(rows, f"{VNODE} int, a bigint, s string, ts timestamp")

    def micros(t):
        return int((t - datetime.datetime(1970, 1, 1)).total_seconds() * 1_000_000)

    vnodes = list(range(6))
    rng.shuffle(vnodes)
    done = sorted(vnodes[:rng.randrange(3)])
    positions = {v: (rng.randrange(-3, 4), rng.choice(texts),
                     micros(epoch0) + rng.randrange(4) * 1_000_000)
                 for v in vnodes[len(done):len(done) + rng.randrange(4)]}
    assert _covered_sql(done, positions, cols) is not None
    got = sorted(tuple(r) for r in df.where(covered(done, positions, cols)).collect())
    want = sorted(r for r in rows
                  if r[0] in done or (r[0] in positions
                                      and (r[1], r[2], micros(r[3])) <= positions[r[0]]))
    assert [tuple(r[:3]) for r in got] == [r[:3] for r in want]
    assert len(got) == len(want)


@settings(max_examples=5, deadline=None)
@given(ints=st.lists(st.integers(-2**31, 2**31 - 1), min_size=1, max_size=40),
       longs=st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=40),
       texts=st.lists(st.text(max_size=12), min_size=1, max_size=40))
def test_vnodes_hashed_on_the_driver_are_spark_s(spark, ints, longs, texts):
    """The driver hashes staged keys to vnodes without a Spark job: it must agree
    with ``vnode_expr`` for every key type it accepts, or lookups miss old rows."""
    cases = [("tinyint", [v % 256 - 128 for v in ints]), ("smallint", [v % 65536 - 32768
             for v in ints]), ("int", ints + [0, -1, 2**31 - 1, -2**31]),
             ("bigint", longs + [0, -1, 2**63 - 1, -2**63]), ("string", texts + ["", "é✓"])]
    for type_name, values in cases:
        df = spark.createDataFrame([(v,) for v in values], f"k {type_name}")
        found = sorted({r[0] for r in df.select(vnode_expr(["k"])).collect()})
        assert vnodes_of(values, type_name) == found, type_name
    assert vnodes_of([1.5], "double") is None


def test_consolidate_emits_one_net_change_per_key(spark):
    before = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id bigint, v string")
    after = spark.createDataFrame([(1, "a"), (2, "b2"), (4, "d")], "id bigint, v string")
    out = consolidate(before, after, ["id", "v"], ["id"]).collect()
    got = sorted((r.id, r.v, r[OP]) for r in out)
    assert got == [(2, "b", "U-"), (2, "b2", "U+"), (3, "c", "-"), (4, "d", "+")]
    assert all(r[VNODE] == spark.range(1).select(
        F.pmod(F.xxhash64(F.lit(r.id).cast("bigint")), F.lit(256))).first()[0] for r in out)


def _plan_text(df) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        df.explain()
    return buf.getvalue()


_IMAGE = st.dictionaries(st.tuples(st.integers(0, 3), st.sampled_from(["x", None])),
                         st.tuples(st.sampled_from(["a", "b", None]),
                                   st.lists(st.integers(0, 2), max_size=2)), max_size=8)


#: rows whose keys no before/after image holds (``Change.fresh``: a chunk's rows)
_FRESH = st.dictionaries(st.tuples(st.integers(10, 12), st.sampled_from(["x", None])),
                         st.tuples(st.sampled_from(["a", None]),
                                   st.lists(st.integers(0, 2), max_size=2)), max_size=4)


@settings(max_examples=12, deadline=None)
@given(before=_IMAGE, after=_IMAGE, fresh=st.none() | _FRESH, one_partition=st.booleans())
def test_consolidate_turns_before_into_after_with_one_change_per_key(
        spark, before, after, fresh, one_partition):
    """Property: over any before/after images (a two-column key whose second part
    may be NULL, nullable and nested values), and fresh rows of keys neither holds,
    the changelog holds one net change per key — none for an unchanged row, a ``+``
    for each fresh row — and applied to ``before`` gives ``after`` and the fresh
    rows; so whether the inputs are one partition or several."""
    schema = "k bigint, j string, v string, arr array<int>"

    def frame(rows):
        df = spark.createDataFrame([(k, j, v, arr) for (k, j), (v, arr) in rows.items()],
                                   schema)
        return df.coalesce(1) if one_partition else df.repartition(3)

    out = consolidate(frame(before), frame(after), ["k", "j", "v", "arr"], ["k", "j"],
                      fresh=None if fresh is None else frame(fresh)).collect()
    after = {**after, **(fresh or {})}
    changes: dict = {}
    for r in out:
        changes.setdefault((r.k, r.j), []).append((r[OP], (r.v, tuple(r.arr))))
    state = {key: (v, tuple(arr)) for key, (v, arr) in before.items()}
    for key, ops in changes.items():
        kinds = sorted(op for op, _ in ops)
        assert kinds in (["+"], ["-"], ["U+", "U-"]), (key, ops)
        for op, row in ops:
            if op in ("-", "U-"):
                assert state.pop(key) == row
        for op, row in ops:
            if op in ("+", "U+"):
                assert key not in state
                state[key] = row
    assert state == {key: (v, tuple(arr)) for key, (v, arr) in after.items()}
    unchanged = {key for key in before if key in after and before[key] == after[key]}
    assert not unchanged & set(changes)


def test_small_reads_are_one_partition_and_their_changelog_needs_no_exchange(
        store, spark, monkeypatch):
    """A read of at most ONE_TASK_ROWS rows is one partition, so consolidating two of
    them, and grouping the changelog, runs without an exchange (one stage); a read
    of no file folds away (no scan of it is left in the plan); a larger read keeps
    its partitions (the changelog then shuffles), and its changelog holds the same
    rows."""
    import sparkfill.storage.spark_files as spark_files

    st_, meta, rel = store
    _commit(st_, meta, rel, 1, [(i, f"v{i}", "+") for i in range(100)], spark)
    _commit(st_, meta, rel, 2, [(i, f"w{i}", "U+") for i in range(0, 100, 3)], spark)
    cols = ["id", "v"]

    def changelog(old: int, new: int):
        return consolidate(st_.snapshot(rel, old).select(*cols),
                           st_.snapshot(rel, new).select(*cols), cols, ["id"])

    small = changelog(1, 2)
    assert "Exchange" not in _plan_text(small)
    # the changelog keeps its input's partitioning: a group after it shuffles nothing
    assert "Exchange" not in _plan_text(small.groupBy("id").count())
    expected = sorted((r.id, r.v, r[OP]) for r in small.collect())
    assert len(expected) == 2 * 34 and {op for *_, op in expected} == {"U-", "U+"}
    nothing = changelog(0, 1)
    plan = _plan_text(nothing)
    assert "ExistingRDD" not in plan and "LocalTableScan" not in plan, plan
    assert sorted(r[OP] for r in nothing.collect()) == ["+"] * 100
    monkeypatch.setattr(spark_files, "ONE_TASK_ROWS", 0)
    split = changelog(1, 2)
    assert "Exchange" in _plan_text(split)
    assert sorted((r.id, r.v, r[OP]) for r in split.collect()) == expected


def test_many_local_files_are_read_through_globs_naming_exactly_them(spark, tmp_path: Path):
    """A read of more than three local files passes them as two Hadoop globs (a Py4J
    round trip per list element otherwise): it reads exactly the named files, spread
    over several folders, and not their neighbours; names a glob would misread are
    passed as they are."""
    from pyspark.sql import types as T

    from sparkfill.storage.spark_files import local_paths, read_parquet

    files = []
    for i in range(9):
        folder = tmp_path / f"d{i % 3}" / f"e{i}"
        spark.range(i * 10, i * 10 + 10).coalesce(1).write.parquet(str(folder))
        files += sorted(str(p) for p in folder.glob("*.parquet"))
    wanted = files[1:8]  # 7 of the 9: the first and last are neighbours not to read
    paths = local_paths(wanted)
    assert len(paths) == 2 and all("{" in p for p in paths)
    schema = T.StructType([T.StructField("id", T.LongType())])
    got = sorted(r.id for r in read_parquet(spark, Warehouse(tmp_path), schema, wanted).collect())
    assert got == list(range(10, 80))
    odd = [*wanted[:3], "/w/a,b{c}/part-0.parquet"]  # passed as they are
    assert local_paths(odd) == odd


def test_a_read_of_immutable_files_is_built_once_and_reused(spark, tmp_path: Path,
                                                             monkeypatch):
    """A relation's files never change under their names, so a read of the same files
    in the same schema is the same frame (no second listing nor plan), whatever the
    row hint (one partition or not); another file list or schema is a new read, and a
    read not marked immutable is always new."""
    from pyspark.sql import types as T

    from sparkfill.storage import spark_files
    from sparkfill.storage.spark_files import read_parquet

    files = []
    for i in range(2):
        folder = tmp_path / f"e{i}"
        spark.range(i * 10, i * 10 + 10).coalesce(1).write.parquet(str(folder))
        files += sorted(str(p) for p in folder.glob("*.parquet"))
    wh = Warehouse(tmp_path)
    schema = T.StructType([T.StructField("id", T.LongType())])
    first = read_parquet(spark, wh, schema, files, immutable=True)
    assert read_parquet(spark, wh, schema, files, immutable=True) is first
    small = read_parquet(spark, wh, schema, files, rows=20, immutable=True)
    assert small is not first  # one partition: a coalesced view of the same read
    assert sorted(r.id for r in small.collect()) == list(range(20))
    assert read_parquet(spark, wh, schema, files[:1], immutable=True) is not first
    other = T.StructType([T.StructField("id", T.LongType()), T.StructField("x", T.IntegerType())])
    assert read_parquet(spark, wh, other, files, immutable=True) is not first
    assert read_parquet(spark, wh, schema, files) is not first
    # bounded: the least recently used read is dropped first
    spark_files._reads.clear()
    monkeypatch.setattr(spark_files._reads, "limit", 3)
    kept = read_parquet(spark, wh, schema, files, immutable=True)
    one = read_parquet(spark, wh, schema, files[:1], immutable=True)
    read_parquet(spark, wh, schema, files[1:], immutable=True)
    assert read_parquet(spark, wh, schema, files, immutable=True) is kept  # used again
    read_parquet(spark, wh, other, files, immutable=True)  # a fourth: drops `one`
    assert len(spark_files._reads) == 3
    assert read_parquet(spark, wh, schema, files, immutable=True) is kept
    assert read_parquet(spark, wh, schema, files[:1], immutable=True) is not one


def test_lru_cache_keeps_the_most_recently_used():
    """The footer and file-list caches' bound: a read makes an entry recent, a put
    beyond the limit forgets the least recently used, a built value is held."""
    from sparkfill.storage.lru import LruCache

    cache: LruCache[str, list[int]] = LruCache(2)
    cache.put("a", [1])
    cache.put("b", [])
    assert cache.get("a") == [1]  # "a" is now the most recent
    cache.put("c", [3])
    assert cache.get("b") is None and cache.get("a") == [1] and len(cache) == 2
    built: list[str] = []
    assert cache.get_or_build("d", lambda: built.append("d") or [4]) == [4]
    assert cache.get_or_build("d", lambda: built.append("again") or [5]) == [4]
    assert built == ["d"] and cache.get("c") is None


def test_a_weighed_lru_cache_keeps_the_most_recent_entries_within_its_weight():
    """The keyed copies' footer cache: entries weigh their row groups' column chunks;
    the most recently used are kept while their weights sum to at most the limit, a
    value heavier than the limit alone is not kept, and a put again reweighs."""
    from sparkfill.storage.lru import LruCache

    cache: LruCache[str, list[int]] = LruCache(10, len)
    cache.put("a", [0] * 4)
    cache.put("b", [0] * 5)
    assert cache.get("a") is not None and cache.weight == 9  # "a" is now the most recent
    cache.put("c", [0] * 3)  # 12 > 10: forgets "b", the least recently used
    assert cache.get("b") is None and len(cache) == 2 and cache.weight == 7
    assert cache.put("huge", [0] * 11) == [0] * 11  # returned, not kept
    assert cache.get("huge") is None and cache.weight == 7
    cache.put("a", [0] * 8)  # reweighed: 8 + 3 > 10 forgets "c"
    assert cache.get("c") is None and cache.weight == 8 and len(cache) == 1
    cache.discard("a")
    cache.discard("never held")
    assert cache.weight == 0 and cache.get("a") is None and len(cache) == 0
    cache.put("b", [0] * 2)
    cache.clear()
    assert cache.weight == 0 and cache.get("b") is None
