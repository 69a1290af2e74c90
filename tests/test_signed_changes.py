"""Signed changes (``Change.signed``): a leaf's changelog read once as signed rows, not
paired by key, where its consumer nets rows anyway — a join side whose state is not
kept (the bilinear terms), an aggregate that keeps no input rows (running values),
an MV's own changelog (``net_changelog``: netted per row and paired per key in one
exchange). The changes that stress it: an update no MV sees (a pair of equal rows
once projected), one that crosses a filter, moves a row to another group or join
key, deletes at a group's max (found again in the leaf's rows of those groups, read
narrowed to them: ``RelationStore.snapshot(narrow=)``), and the dimension side changing
too. Every epoch, every MV equals its batch query over the tables as of that epoch."""

from __future__ import annotations

import random

import pytest
from helpers import assert_same_rows

from sparkfill.dataflow import changelog, join, mv
from sparkfill.storage import relation_store

MVS = {
    "j": "SELECT t.id, t.v, d.name FROM {t} AS t JOIN {d} AS d ON t.k = d.k "
         "WHERE t.v % 2 = 0",
    "ja": "SELECT d.name, count(*) AS n, sum(t.v) AS sv, max(t.v) AS mx "
          "FROM {t} AS t JOIN {d} AS d ON t.k = d.k GROUP BY d.name",
    "a": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx, min(v) AS mn FROM {t} "
         "GROUP BY g",
    "p": "SELECT id, g, v * 2 AS w FROM {t} WHERE v % 3 <> 0",
}


@pytest.fixture
def narrowed(monkeypatch):
    return _spied_narrowed(monkeypatch)


def _spied_narrowed(monkeypatch) -> list[bool]:
    """The reads narrowed to some groups' rows (an aggregate finding a lost max again
    in its leaf): how many merged a log with the base's rows that pass. Spark's read:
    none is read on the driver (``DRIVER_HELD_ROWS``)."""
    from sparkfill.backfill import state

    monkeypatch.setattr(state, "DRIVER_HELD_ROWS", 0)
    calls = []
    real = relation_store.RelationStore.snapshot

    def spy(store, rel, epoch, *args, **kwargs):
        if kwargs.get("narrow") is not None:
            files = store.files_at(rel, epoch)
            calls.append(any(f.kind == "log" for f in files)
                         and any(f.kind == "base" for f in files))
        return real(store, rel, epoch, *args, **kwargs)
    monkeypatch.setattr(relation_store.RelationStore, "snapshot", spy)
    return calls


@pytest.fixture
def netted(monkeypatch):
    """How many MV changelogs were built by ``net_changelog`` (from signed rows)."""
    calls = []
    real = changelog.net_changelog

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(mv, "net_changelog", spy)
    return calls


# CI runs ``t``'s join side "large": not kept (its change signed) until the dimension
# first changes (epoch 3: both terms, and ``t``'s rows at that epoch — its held rows
# with its signed change applied — become its state), kept (consolidated) after; the
# extended run keeps it unkept, its change signed, throughout
@pytest.mark.parametrize("large_t", [True, pytest.param(False, marks=pytest.mark.extended)])
def test_signed_changes_keep_joins_aggregates_and_projections_exact(
        engine, spark, netted, narrowed, monkeypatch, large_t):
    # bulk Δs (over this many rows) take the aggregate's estimate-and-cache path
    monkeypatch.setattr(mv, "LOCAL_WRITE_ROWS", 12)
    if large_t:
        monkeypatch.setattr(join, "SCAN_ROWS", 10)  # t is "large": kept once d changes
    # the table folds its log into base often: reads merge a base with a log
    engine.store.min_compact_rows, engine.store.log_fraction = 40, 1.0
    rng = random.Random(11)
    engine.sql("CREATE TABLE t (id BIGINT, g INT, k INT, v BIGINT, s STRING, "
               "PRIMARY KEY (id))")
    engine.sql("CREATE TABLE d (k INT, name STRING, PRIMARY KEY (k))")
    rows = {i: {"id": i, "g": rng.randrange(4), "k": rng.randrange(6),
                "v": rng.randrange(40), "s": "x"} for i in range(60)}
    engine.insert("t", list(rows.values()))
    engine.insert("d", [{"k": k, "name": f"n{k % 4}"} for k in range(6)])
    engine.step()
    for name, sql in MVS.items():
        engine.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS "
                   + sql.replace("{t}", "t").replace("{d}", "d"))
    engine.step()
    next_id = 60
    for epoch_no in range(7):
        ids = list(rows)
        changed: dict[int, dict] = {}
        for i in rng.sample(ids, 3):  # seen by no MV: a pair of equal rows once projected
            changed[i] = {**rows[i], "s": f"s{epoch_no}"}
        for i in rng.sample(ids, 4):  # crosses the filters, moves group and join key
            changed[i] = {**rows[i], "v": rows[i]["v"] + rng.choice([1, 3, 7]),
                          "g": rng.randrange(4), "k": rng.randrange(7)}
        for _ in range(3):
            changed[next_id] = {"id": next_id, "g": rng.randrange(4), "k": rng.randrange(7),
                                "v": rng.randrange(40), "s": "n"}
            next_id += 1
        # deletes, the current max of a group among them
        top = max((r for r in rows.values() if r["id"] not in changed),
                  key=lambda r: r["v"])
        gone = {top["id"], *rng.sample([i for i in ids if i not in changed], 2)}
        if epoch_no == 3:  # a bulk epoch: a third of the rows change at once
            for i in rng.sample([i for i in ids if i not in changed and i not in gone], 20):
                changed[i] = {**rows[i], "v": rows[i]["v"] + 1}
        engine.insert("t", list(changed.values()))
        engine.delete("t", [{"id": i} for i in gone])
        rows.update(changed)
        for i in gone:
            del rows[i]
        if epoch_no in (3, 5):  # the dimension changes too: both bilinear terms
            k = rng.randrange(7)
            engine.insert("d", [{"k": k, "name": f"m{epoch_no}"}])
        report = engine.step()
        t_at = engine.read("t", as_of=report.epoch)
        d_at = engine.read("d", as_of=report.epoch)
        for name, sql in MVS.items():
            want = spark.sql(sql, t=t_at, d=d_at)
            assert_same_rows(engine.read(name, as_of=report.epoch), want,
                             label=f"MV {name!r} at epoch {report.epoch}")
    assert netted, "no MV changelog was built from signed rows"
    assert narrowed, "no lost max was found again by a narrowed read"
    assert any(narrowed), "no lost max was found again by a narrowed merge of base and log"
    # t's side of the join: kept (its rows at the last epoch, the filter's) once d
    # changed when t counts as large, else never written
    t_side = engine.catalog.states_of(engine.catalog.get("j"))[0]
    held = engine.store.snapshot(t_side.stored, report.epoch).count()
    assert held == (t_at.where("v % 2 = 0").count() if large_t else 0)


@pytest.mark.parametrize("reader", ["spark", "driver"])
def test_a_lost_max_found_again_merges_the_groups_base_rows_with_the_whole_log(
        engine, spark, monkeypatch, reader):
    """A group's max lost while a row of its base has moved to another group in the
    log: the narrowed read keeps only the group's base rows but merges them with every
    log row, so the moved row's latest version (another group) wins, not its base one
    — by Spark, and on the driver (``rows_in_on_driver``) where the leaf is small."""
    if reader == "spark":
        narrowed = _spied_narrowed(monkeypatch)
    else:
        narrowed = []
        real = relation_store.RelationStore.rows_in_on_driver

        def spy(store, rel, epoch, column, values, max_rows):
            found = real(store, rel, epoch, column, values, max_rows)
            files = store.files_at(rel, epoch)
            narrowed.append(found is not None and any(f.kind == "log" for f in files)
                            and any(f.kind == "base" for f in files))
            return found
        monkeypatch.setattr(relation_store.RelationStore, "rows_in_on_driver", spy)
    engine.store.min_compact_rows, engine.store.log_fraction = 3, 1.0
    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.insert("t", [{"id": 1, "g": 1, "v": 50}, {"id": 2, "g": 1, "v": 100},
                        {"id": 3, "g": 2, "v": 10}, {"id": 4, "g": 1, "v": 20}])
    engine.step()  # folded into base: 4 log rows, more than 3
    sql = "SELECT g, count(*) AS c, max(v) AS mx FROM {t} GROUP BY g"
    engine.sql("CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS "
               + sql.replace("{t}", "t"))
    engine.step()
    engine.insert("t", [{"id": 1, "g": 2, "v": 50}])  # to group 2, in the log
    engine.step()
    engine.delete("t", [{"id": 2}])  # group 1 loses its max: found again, 20
    report = engine.step()
    assert narrowed and narrowed[-1], "the lost max was not read narrowed over base and log"
    got = engine.read("m", as_of=report.epoch)
    assert_same_rows(got, spark.sql(sql, t=engine.read("t", as_of=report.epoch)),
                     label=f"m at epoch {report.epoch}")
    assert sorted(tuple(r) for r in got.collect()) == [(1, 1, 20), (2, 2, 50)]
