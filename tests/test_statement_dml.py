"""A DML statement's rows (an UPDATE's, a DELETE's) are staged from the driver when they
are few (one Parquet file, its footer noting the batch's keys) and by Spark when they
are many (a directory of files): either way the table equals a model of the DML at
every epoch, an MV over it its batch query, and a statement rejected for a bad value
names the row and stages nothing. Over a large table, a statement is tried on the driver
only when its WHERE pins the key to few values."""

from __future__ import annotations

import pytest
from helpers import assert_rows_equal, assert_same_rows

import sparkfill.engine as engine_mod
import sparkfill.storage.dml as dml_mod
from sparkfill import DataError, Engine
from sparkfill.sql.frontend import keys_pinned

AGG = "SELECT g, count(*) AS c, sum(v) AS s FROM t GROUP BY g"


def _staged_paths(eng: Engine) -> list[str]:
    return [b.path for b in eng.meta.staged()]


@pytest.mark.parametrize("driver_rows", [20_000, 3])
def test_statements_staged_by_the_driver_or_by_spark_apply_exactly(
        spark, tmp_path, monkeypatch, driver_rows):
    for module in (dml_mod, engine_mod):
        monkeypatch.setattr(module, "DRIVER_STAGE_ROWS", driver_rows)
    eng = Engine(str(tmp_path / "wh"), spark=spark)
    try:
        eng.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, g INT NOT NULL, v INT)")
        model = {i: (i % 4, i) for i in range(40)}
        eng.insert("t", [{"id": i, "g": g, "v": v} for i, (g, v) in model.items()])
        eng.step()
        eng.sql(f"CREATE MATERIALIZED VIEW m WITH (backfill = 'blocking') AS {AGG}")
        eng.step()

        # each statement, the rows its batch holds, and the model after it
        statements = [
            # the key pinned: tried on the driver whatever the table's size
            ("UPDATE t SET v = 1 WHERE id IN (1, 2)", 2,
             lambda m: {i: (g, 1 if i in (1, 2) else v) for i, (g, v) in m.items()}),
            ("UPDATE t SET v = v + 100 WHERE id < 8", 8,
             lambda m: {i: (g, v + 100 if i < 8 else v) for i, (g, v) in m.items()}),
            ("DELETE FROM t WHERE id % 9 = 4", 4,
             lambda m: {i: gv for i, gv in m.items() if i % 9 != 4}),
            # a key set: each old key deleted, each new one upserted
            ("UPDATE t SET id = id + 1000, v = 7 WHERE id BETWEEN 10 AND 15", 12,
             lambda m: {(i + 1000 if 10 <= i <= 15 else i): ((g, 7) if 10 <= i <= 15 else (g, v))
                        for i, (g, v) in m.items()}),
            # every row: staged `.whole`, its epoch keeps no old row
            ("UPDATE t SET v = v * 2", 36,
             lambda m: {i: (g, v * 2) for i, (g, v) in m.items()}),
        ]
        for sql, rows, apply in statements:
            before = set(_staged_paths(eng))
            eng.sql(sql)
            (path,) = set(_staged_paths(eng)) - before
            on_driver = eng.warehouse.is_file(path)
            assert on_driver == (rows <= driver_rows), (sql, path)
            assert path.endswith(".whole") == (sql == "UPDATE t SET v = v * 2"), path
            model = apply(model)
            report = eng.step()
            assert_rows_equal(eng.read("t", as_of=report.epoch).select("id", "g", "v"),
                              [(i, g, v) for i, (g, v) in model.items()],
                              label=f"t after {sql!r}")
            assert_same_rows(eng.read("m", as_of=report.epoch),
                             spark.sql(AGG.replace("FROM t", "FROM {t}"),
                                       t=eng.read("t", as_of=report.epoch)),
                             label=f"m after {sql!r}")

        # a bad value names its row and stages nothing, the warehouse as it was
        files = sorted(eng.warehouse.list(eng.stager.dir))
        with pytest.raises(DataError, match=r"column g: NOT NULL column is null"):
            eng.sql("UPDATE t SET g = NULL WHERE id < 5")
        assert _staged_paths(eng) == [] and sorted(eng.warehouse.list(eng.stager.dir)) == files
        report = eng.step()
        assert_rows_equal(eng.read("t", as_of=report.epoch).select("id", "g", "v"),
                          [(i, g, v) for i, (g, v) in model.items()], label="t after the reject")
    finally:
        eng.close()


def test_a_where_pins_the_key_only_with_literals_under_and():
    """How many keys a WHERE can match, when it says (what decides whether a statement
    over a large table is tried on the driver)."""
    cases = {"id = 5": (1, None), "id IN (1, 2, 3) AND v > 2": (3, None),
             "t.id = 7": (1, None), "id = 1 AND id IN (1, 2)": (1, None),
             "a = 1 AND b IN (1, 2)": (None, 2), "(id = 1 OR id = 2)": (None, None),
             "id < 8": (None, None), "v = 1": (None, None),
             "id IN (SELECT 1)": (None, None), "a = 1": (None, None),
             "(a = 1 AND v > 0) AND (b = 2)": (None, 1), "3 = id": (1, None),
             "((id IN (4, 5)))": (2, None), "(a = 1 OR b = 2) AND a = 1": (None, None)}
    for where, (one, two) in cases.items():
        assert keys_pinned(where, ["id"]) == one, where
        assert keys_pinned(where, ["a", "b"]) == two, where
