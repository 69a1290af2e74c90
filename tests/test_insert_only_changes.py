"""A leaf's change of insertions only (new keys, as its append observed them) is
taken as such: no row leaves, so an operator pairs no images and looks for no lost
min/max (``change_of(retracting=False)``). Checked against Spark's batch queries at
every epoch, over MVs of every operator shape, with insert-only epochs between
epochs that update, delete and upsert existing keys; and that exactly the
insert-only epochs took their leaves' changes as insertions, the table's change computed
on the driver in every epoch (``dml._change_on_driver``)."""

from __future__ import annotations

import random

from helpers import assert_rows_equal, assert_same_rows

from sparkfill.pipelines import coordinator
from sparkfill.storage import dml

#: each MV's query over its leaves ``{t}``, ``{d}``, ``{proj}`` (an MV over an MV)
MVS = {
    "agg": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx, min(v) AS mn "
           "FROM {t} GROUP BY g",
    "dist": "SELECT g, count(DISTINCT v) AS dv FROM {t} GROUP BY g",
    "proj": "SELECT id, g, v * 2 AS v2 FROM {t} WHERE v % 3 <> 0",
    "j": "SELECT t.id, t.v, d.name FROM {t} AS t JOIN {d} AS d ON t.k = d.k "
         "WHERE t.v % 2 = 0",
    "jagg": "SELECT d.name, count(*) AS n, max(t.v) AS mx FROM {t} AS t JOIN {d} AS d "
            "ON t.k = d.k GROUP BY d.name",
    "onmv": "SELECT g, count(*) AS n, max(v2) AS mx FROM {proj} GROUP BY g",
}
LEAVES = ("t", "d", "proj")


def _row(rng: random.Random, id_: int) -> dict:
    return {"id": id_, "g": rng.randrange(5), "k": rng.randrange(12),
            "v": rng.randrange(60)}


def test_insert_only_epochs_take_their_changes_as_insertions(engine, spark, monkeypatch):
    rng = random.Random(11)
    engine.sql("CREATE TABLE t (id BIGINT, g INT, k INT, v BIGINT, PRIMARY KEY (id))")
    engine.sql("CREATE TABLE d (k INT, name STRING, PRIMARY KEY (k))")
    model: dict[str, dict[object, dict]] = {"t": {}, "d": {}}  # each table's rows by key
    keys = {"t": "id", "d": "k"}

    def upsert(table: str, rows: list[dict]) -> None:
        engine.insert(table, rows)
        model[table].update({r[keys[table]]: r for r in rows})

    def delete(table: str, gone: list[object]) -> None:
        engine.delete(table, [{keys[table]: k} for k in gone])
        for k in gone:
            model[table].pop(k, None)

    upsert("t", [_row(rng, i) for i in range(400)])
    upsert("d", [{"k": k, "name": f"n{k % 4}"} for k in range(10)])
    engine.step()
    for name, sql in MVS.items():  # (proj created before the MV over it)
        if "{proj}" in sql:
            engine.step()
        engine.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS "
                   + sql.format(**{n: n for n in LEAVES}))
    engine.step()
    assert all(engine.progress(name).state == "created" for name in MVS)

    taken: list[bool] = []  # per leaf change of a created MV: taken as insertions
    change_of = coordinator.change_of

    def spy(delta, columns, retracting=True):
        change = change_of(delta, columns, retracting)
        if change is not None:
            taken.append(change.before is None)
        return change

    monkeypatch.setattr(coordinator, "change_of", spy)
    on_driver: list[str] = []  # the tables whose change the driver computed
    on_the_driver = dml._change_on_driver

    def spy_driver(store, rel, batches, before, prev_epoch):
        rows = on_the_driver(store, rel, batches, before, prev_epoch)
        if rows is not None:
            on_driver.append(rel.name)
        return rows

    monkeypatch.setattr(dml, "_change_on_driver", spy_driver)
    next_id, next_k = 400, 12
    for i in range(6):  # insert-only epochs 0, 2, 4 (d gains keys in 0 and 4)
        taken.clear()
        on_driver.clear()
        insert_only = i % 2 == 0
        if insert_only:
            upsert("t", [_row(rng, next_id + n) for n in range(30)])
            # in the same epoch: a new key upserted again (its last row counts), one
            # inserted and deleted (no change), one never held deleted (no change)
            upsert("t", [_row(rng, next_id), _row(rng, next_id + 30)])
            delete("t", [next_id + 30, 10**9])
            next_id += 31
            if i % 4 == 0:  # d gains keys the new rows of t may meet
                upsert("d", [{"k": next_k, "name": "new"}])
                next_k += 1
        else:
            # the largest values leave (most groups' max), others move, and an
            # existing key is upserted beside a new one
            highest = sorted(model["t"], key=lambda k: -model["t"][k]["v"])[:6]
            delete("t", highest)
            moved = rng.sample(sorted(model["t"]), 10)
            upsert("t", [_row(rng, k) for k in moved] + [_row(rng, next_id)])
            next_id += 1
            upsert("d", [{"k": rng.randrange(next_k), "name": f"m{i}"}])
        report = engine.step()
        for table, cols in (("t", ("id", "g", "k", "v")), ("d", ("k", "name"))):
            assert_rows_equal(engine.read(table, as_of=report.epoch).select(*cols),
                              [tuple(r[c] for c in cols) for r in model[table].values()],
                              label=f"table {table} at epoch {report.epoch}")
        for name, sql in MVS.items():
            leaves = {n: engine.read(n, as_of=report.epoch) for n in LEAVES
                      if "{" + n + "}" in sql}
            assert_same_rows(engine.read(name, as_of=report.epoch), spark.sql(sql, **leaves),
                             label=f"MV {name} at epoch {report.epoch}")
        assert taken, f"epoch {report.epoch}: no created MV took a leaf's change"
        if insert_only:
            assert all(taken), f"epoch {report.epoch}: an insertion-only change was paired"
        # a few keys of a small table, staged by the driver: their change is found there
        assert "t" in on_driver, f"epoch {report.epoch}: t's change went to Spark"
        if not insert_only:
            assert not all(taken), f"epoch {report.epoch}: a retracting change was taken " \
                "as insertions"
    for name in MVS:
        assert engine.verify(name).count() == 0, name
