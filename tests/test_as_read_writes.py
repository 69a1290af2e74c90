"""A filter/project MV keeps its leaf's key, so each of its rows lies in the vnode of
the leaf row it comes from: a bulk backfill chunk's rows are written in the
partitions the leaf's files were read in, with no exchange into ranges of vnodes,
and the MV equals Spark's batch query at every epoch, whatever the strategy. So
does an inner join's whose other side is small and meets each row at most once
(its whole key equated with the row's values: the MV's key is the row's)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from helpers import assert_same_rows
from scale import at_scale

from sparkfill import Engine
from sparkfill.storage import relation_store
from sparkfill.storage.schema import vnode_sql

SQL = {
    "p": "SELECT id, g, v * 2 AS w FROM {t} WHERE v % 3 <> 0",
    # the key is hidden (not selected): still the leaf's, unchanged
    "q": "SELECT g, s, v FROM {t} WHERE g <> 2",
}


def _spy_on_store(monkeypatch, method: str,
                  note: Callable[[str, dict[str, Any], Any], None]) -> None:
    """Call ``note(relation, keyword arguments, result)`` after each call of the
    store's ``method`` from now on."""
    real = getattr(relation_store.RelationStore, method)

    def spy(self, rel, *args, **kwargs):
        out = real(self, rel, *args, **kwargs)
        note(rel.name, kwargs, out)
        return out

    monkeypatch.setattr(relation_store.RelationStore, method, spy)


def _spy_on_writes(monkeypatch) -> list[tuple[str, bool]]:
    """Each file write of the store from now on, as (relation, written as read)."""
    writes: list[tuple[str, bool]] = []
    _spy_on_store(monkeypatch, "_write_files",
                  lambda rel, kwargs, _: writes.append((rel, bool(kwargs.get("as_read")))))
    return writes


def _row(rng: random.Random, id_: int) -> dict:
    return {"id": id_, "g": rng.randrange(5), "v": rng.randrange(100),
            "s": rng.choice(["a", "b", None])}


def _stage_t(eng: Engine, rng: random.Random) -> None:
    """Create ``t`` and stage its first 600 rows (the next step commits them)."""
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, s STRING, PRIMARY KEY (id))")
    eng.insert("t", [_row(rng, i) for i in range(600)])


# no_shuffle's chunks are arrangement's read whole: an extended variant
@pytest.mark.parametrize("strategy", ["blocking", "arrangement",
                                      pytest.param("no_shuffle", marks=pytest.mark.extended)])
def test_a_projection_chunk_is_written_as_read_and_stays_exact(spark, tmp_path, monkeypatch,
                                                               strategy):
    at_scale(monkeypatch)  # every chunk of more than 20 rows is a bulk write
    writes = _spy_on_writes(monkeypatch)
    rng = random.Random(11)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        _stage_t(eng, rng)
        eng.step()
        for name, sql in SQL.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = '{strategy}', "
                    f"backfill_chunk_rows = 120) AS " + sql.format(t="t"))
        eng.step()  # a first chunk alone, no change of the upstream beside it
        ids, checked = 600, 0
        for _ in range(40):
            eng.insert("t", [_row(rng, rng.randrange(ids + 30)) for _ in range(30)])
            ids += 30
            eng.delete("t", [{"id": rng.randrange(ids)} for _ in range(6)])
            eng.sql(f"UPDATE t SET v = v + 1 WHERE g = {rng.randrange(5)}")
            report = eng.step()
            created = [n for n in SQL if eng.progress(n).state == "created"]
            for name in created:
                assert_same_rows(eng.read(name, as_of=report.epoch),
                                 spark.sql(SQL[name], t=eng.read("t", as_of=report.epoch)),
                                 label=f"MV {name} at epoch {report.epoch}")
            if len(created) == len(SQL):
                checked += 1
                if checked >= 3:
                    break
        assert checked >= 3, "the MVs were not created in 40 epochs"
        for name in SQL:
            assert eng.verify(name).count() == 0
            # its chunks went through the as-read write; its table's own Δs did not
            mine = [as_read for rel, as_read in writes if rel == name]
            assert mine[0], (name, writes)  # the first chunk, alone
            assert any(mine[1:]) or strategy == "blocking", (name, writes)
        assert not any(as_read for rel, as_read in writes if rel == "t")
    finally:
        eng.close()


JOIN_SQL = "SELECT x.id, x.v, y.name FROM {t} x JOIN {d} y ON x.g = y.g WHERE x.v % 3 <> 0"


def test_join_keys_drop_a_side_each_row_meets_at_most_once(engine):
    """An inner join's side whose whole key the ON clause equates with the other
    side's values, by a cast that keeps distinct values distinct, adds nothing to the
    MV's key; any other join keeps both sides' keys."""
    engine.sql("CREATE TABLE t (id BIGINT, g INT, gs STRING, v BIGINT, PRIMARY KEY (id))")
    engine.sql("CREATE TABLE d (g INT, name STRING, PRIMARY KEY (g))")
    engine.sql("CREATE TABLE d2 (g INT, h INT, name STRING, PRIMARY KEY (g, h))")
    engine.sql("CREATE TABLE wide (g BIGINT, name STRING, PRIMARY KEY (g))")
    engine.sql("CREATE TABLE ds (gs STRING, name STRING, PRIMARY KEY (gs))")
    cases = {
        "SELECT x.id, y.name FROM t x JOIN d y ON x.g = y.g": ["id"],
        "SELECT x.id, y.name FROM d y JOIN t x ON y.g = x.g": ["id"],
        # an int key equated with a bigint: widened, still distinct
        "SELECT x.id, y.name FROM t x JOIN d y ON CAST(x.g AS BIGINT) = y.g": ["id"],
        "SELECT x.id, y.name FROM t x JOIN ds y ON x.gs = y.gs": ["id"],
        # a part of the key only; a string key equated with a number ('1' and '01' may
        # be one); an outer join
        "SELECT x.id, y.name FROM t x JOIN d2 y ON x.g = y.g": ["id", "_sf_k_y_g", "_sf_k_y_h"],
        "SELECT x.id, y.name FROM t x JOIN ds y ON x.g = y.gs": ["id", "_sf_k_y_gs"],
        "SELECT x.id, y.name FROM t x LEFT JOIN d y ON x.g = y.g": ["id", "_sf_k_y"],
    }
    for i, (sql, key) in enumerate(cases.items()):
        engine.sql(f"CREATE MATERIALIZED VIEW k{i} AS {sql}")
        assert list(engine.relation(f"k{i}").key) == key, (sql, engine.relation(f"k{i}").key)
    # an int equated with a bigint key is widened (Spark never narrows): one row each;
    # a decimal key equated with a double is cast to a double: two keys may meet one
    engine.sql("CREATE MATERIALIZED VIEW kw AS SELECT x.id, y.name FROM t x JOIN wide y "
               "ON x.g = y.g")
    assert list(engine.relation("kw").key) == ["id"]
    engine.sql("CREATE TABLE dd (p DECIMAL(20, 2), name STRING, PRIMARY KEY (p))")
    engine.sql("CREATE MATERIALIZED VIEW kd AS SELECT x.id, y.name FROM t x JOIN dd y "
               "ON CAST(x.v AS DOUBLE) = y.p")
    assert list(engine.relation("kd").key) == ["id", "_sf_k_y_p"]


@pytest.mark.parametrize("strategy", ["blocking", "arrangement"])
def test_a_join_chunk_is_written_as_read_and_stays_exact(spark, tmp_path, monkeypatch,
                                                         strategy):
    """An inner join over a small dimension whose key it equates: a chunk of the large
    side alone is written as read; beside DML of both tables (a dimension row's change
    updates its rows in place, by the large side's key) the MV equals Spark's batch
    query at every epoch."""
    at_scale(monkeypatch)
    writes = _spy_on_writes(monkeypatch)
    rng = random.Random(12)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        _stage_t(eng, rng)
        eng.sql("CREATE TABLE d (g INT, name STRING, PRIMARY KEY (g))")
        eng.insert("d", [{"g": g, "name": f"n{g}"} for g in range(4)])
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW j WITH (backfill = '{strategy}', "
                f"backfill_chunk_rows = 120) AS " + JOIN_SQL.format(t="t", d="d"))
        assert list(eng.relation("j").key) == ["id"]
        # blocking: both leaves in one epoch; arrangement: the smaller leaf, d, first (no
        # row of t yet, so none of the MV), then a first chunk of t alone
        for _ in range(12):
            eng.step()
            if any(rel == "j" for rel, _ in writes):
                break
        assert [as_read for rel, as_read in writes if rel == "j"] == [True], writes
        ids, checked = 600, 0
        for _ in range(40):
            eng.insert("t", [_row(rng, rng.randrange(ids + 30)) for _ in range(30)])
            ids += 30
            eng.delete("t", [{"id": rng.randrange(ids)} for _ in range(6)])
            g = rng.randrange(6)
            if rng.random() < 0.3:
                eng.delete("d", [{"g": g}])
            else:
                eng.insert("d", [{"g": g, "name": rng.choice(["a", "b", None])}])
            report = eng.step()
            if eng.progress("j").state == "created":
                assert_same_rows(eng.read("j", as_of=report.epoch),
                                 spark.sql(JOIN_SQL, t=eng.read("t", as_of=report.epoch),
                                           d=eng.read("d", as_of=report.epoch)),
                                 label=f"MV j at epoch {report.epoch}")
                checked += 1
                if checked >= 4:
                    break
        assert checked >= 4, "the MV was not created in 40 epochs"
        assert eng.verify("j").count() == 0
    finally:
        eng.close()


def test_a_bulk_write_of_insertions_takes_its_counts_from_its_files(spark, tmp_path,
                                                                    monkeypatch):
    """A blocking CREATE's rows, written as read, are insertions only: the append
    takes their count and vnodes from the files' statistics (no observation), and
    they are what an observation would have found: every row counted as ``+``, every
    vnode that holds a row named."""
    at_scale(monkeypatch)  # a Δ of more than 20 rows is a bulk write
    appended: list[tuple[str, bool, bool, Any]] = []
    _spy_on_store(monkeypatch, "append", lambda rel, kwargs, out: appended.append(
        (rel, bool(kwargs.get("inserts")), bool(kwargs.get("as_read")), out)))
    rng = random.Random(5)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        _stage_t(eng, rng)
        eng.step()
        eng.sql("CREATE MATERIALIZED VIEW p WITH (backfill = 'blocking') AS "
                + SQL["p"].format(t="t"))
        report = eng.step()
        mine = [(inserts, as_read, out) for name, inserts, as_read, out in appended
                if name == "p"]
        assert len(mine) == 1 and mine[0][0] and mine[0][1], appended
        out = mine[0][2]
        rows = eng.read("p", as_of=report.epoch)
        assert out is not None and out.counts == {"+": rows.count()}
        held = {r[0] for r in rows.selectExpr(vnode_sql(["id"])).distinct().collect()}
        assert held and held <= set(out.vnodes), (sorted(held), out.vnodes)
        assert_same_rows(rows, spark.sql(SQL["p"], t=eng.read("t", as_of=report.epoch)),
                         label="p")
    finally:
        eng.close()
