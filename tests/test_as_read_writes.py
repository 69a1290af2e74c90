"""A filter/project MV keeps its leaf's key, so each of its rows lies in the vnode of
the leaf row it comes from: a bulk backfill chunk's rows are written in the
partitions the leaf's files were read in, with no exchange into ranges of vnodes,
and the MV equals Spark's batch query at every epoch, whatever the strategy."""

from __future__ import annotations

import random

import pytest
from helpers import assert_same_rows
from scale import at_scale

from sparkfill import Engine
from sparkfill.storage import relation_store

SQL = {
    "p": "SELECT id, g, v * 2 AS w FROM {t} WHERE v % 3 <> 0",
    # the key is hidden (not selected): still the leaf's, unchanged
    "q": "SELECT g, s, v FROM {t} WHERE g <> 2",
}


def _row(rng: random.Random, id_: int) -> dict:
    return {"id": id_, "g": rng.randrange(5), "v": rng.randrange(100),
            "s": rng.choice(["a", "b", None])}


@pytest.mark.parametrize("strategy", ["blocking", "arrangement", "no_shuffle"])
def test_a_projection_chunk_is_written_as_read_and_stays_exact(spark, tmp_path, monkeypatch,
                                                               strategy):
    at_scale(monkeypatch)  # every chunk of more than 20 rows is a bulk write
    writes: list[tuple[str, bool]] = []
    real = relation_store.RelationStore._write_files

    def spy(self, rel, df, subdir, rows, *args, **kwargs):
        writes.append((rel.name, bool(kwargs.get("as_read"))))
        return real(self, rel, df, subdir, rows, *args, **kwargs)

    monkeypatch.setattr(relation_store.RelationStore, "_write_files", spy)
    rng = random.Random(11)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, s STRING, PRIMARY KEY (id))")
        eng.insert("t", [_row(rng, i) for i in range(600)])
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
