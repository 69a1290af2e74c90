"""Bad input raises a clear SparkfillError subclass naming the offending thing and
leaves the warehouse unchanged: same committed epoch, and after the next step
the tables hold exactly what they would hold without the bad call (no part of a
failed call is staged)."""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest
from helpers import TableModel, assert_rows_equal, assert_same_rows, subprocess_env

from sparkfill import (
    DataError,
    DependentObjects,
    EpochNotRetained,
    InvalidOption,
    MaterializedViewNotReady,
    RelationExists,
    SparkfillError,
    SqlError,
    UnknownColumn,
    UnknownRelation,
    UnsupportedQuery,
)

COLS = ["order_id", "cust", "amount", "label"]
DDL = "order_id BIGINT, cust INT, amount BIGINT, label STRING"
MV_TEMPLATE = "SELECT order_id, amount * 10 AS amount10, label FROM {src} WHERE cust <> 3"


class Fixture:
    """A warehouse with table ``orders`` (20 rows committed) and MV ``orders_mv``."""

    def __init__(self, eng, spark):
        self.eng, self.spark = eng, spark
        eng.sql(
            "CREATE TABLE orders (order_id BIGINT, cust INT, amount BIGINT, "
            "label STRING NOT NULL, PRIMARY KEY (order_id))"
        )
        self.model = TableModel(COLS, key="order_id")
        rows = [self.row(k) for k in range(20)]
        eng.insert("orders", rows)
        self.model.insert(rows)
        self.step()
        eng.sql(
            "CREATE MATERIALIZED VIEW orders_mv WITH (backfill = 'no_shuffle', "
            "backfill_chunk_rows = 1000) AS " + MV_TEMPLATE.replace("{src}", "orders")
        )
        for _ in range(10):
            self.step()
            if eng.progress("orders_mv").state == "created":
                break
        assert eng.progress("orders_mv").state == "created"

    @staticmethod
    def row(k: int, amount: int | None = None) -> dict:
        return {
            "order_id": k,
            "cust": k % 5,
            "amount": 100 + k if amount is None else amount,
            "label": f"L{k}",
        }

    def step(self) -> None:
        self.eng.step()
        self.model.step()

    def expect_unchanged(self, epoch_before: int, tables_before: set[str] | None = None) -> None:
        """Nothing committed by the failed call; a step then applies only good DML."""
        eng = self.eng
        assert eng.committed_epoch == epoch_before, "a failed call committed an epoch"
        # a good call after the bad one still works, exactly once
        good = [self.row(500 + epoch_before, amount=7)]
        eng.insert("orders", good)
        self.model.insert(good)
        self.step()
        assert_rows_equal(eng.read("orders"), self.model.rows(), label="orders after bad call")
        assert_same_rows(
            eng.read("orders_mv"),
            self.spark.sql(MV_TEMPLATE, src=eng.read("orders")),
            label="orders_mv after bad call",
        )
        if tables_before is not None:
            assert relation_names(eng) == tables_before


def relation_names(eng) -> set[str]:
    """Every name listed by SHOW TABLES and SHOW MATERIALIZED VIEWS (any string column)."""
    names: set[str] = set()
    for stmt in ("SHOW TABLES", "SHOW MATERIALIZED VIEWS"):
        for row in eng.sql(stmt).collect():
            names.update(v for v in row if isinstance(v, str))
    return names


@pytest.fixture
def fx(engine, spark):
    return Fixture(engine, spark)


def raises(fx: Fixture, exc_types, fn, *names: str, full_check: bool = True):
    """Call ``fn``; assert it raises ``exc_types`` (a SparkfillError) whose message names
    every one of ``names`` (case-insensitive), and that the warehouse is unchanged:
    same committed epoch and relations; with ``full_check`` also that a following
    step applies nothing of the failed call (callers that pass ``full_check=False``
    do that check once at the end of a series of bad calls)."""
    epoch = fx.eng.committed_epoch
    before = relation_names(fx.eng)
    with pytest.raises(exc_types) as info:
        fn()
    assert isinstance(info.value, SparkfillError)
    msg = str(info.value).lower()
    for name in names:
        assert name.lower() in msg, f"message {str(info.value)!r} does not name {name!r}"
    assert fx.eng.committed_epoch == epoch, "a failed call committed an epoch"
    assert relation_names(fx.eng) == before, "a failed call changed the catalog"
    if full_check:
        fx.expect_unchanged(epoch, before)
    return info.value


class Cases:
    """Run many bad calls against one fixture, report every failing case at the end."""

    def __init__(self, fx: Fixture):
        self.fx = fx
        self.epoch = fx.eng.committed_epoch
        self.failures: list[str] = []

    def check(self, case: str, fn) -> None:
        try:
            fn()
        except AssertionError as exc:  # pytest.fail inside raises() too
            self.failures.append(f"[{case}] {str(exc).splitlines()[0]}")
        except pytest.fail.Exception as exc:
            self.failures.append(f"[{case}] {exc}")
        except Exception as exc:  # the wrong exception type
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.failures.append(f"[{case}] raised {type(exc).__name__}: {first[:300]}")

    def finish(self) -> None:
        # one step after all the bad calls: none of them staged anything
        self.fx.expect_unchanged(self.epoch)
        assert not self.failures, "\n".join(self.failures)


def names_one_of(exc: Exception, *alternatives: str) -> None:
    msg = str(exc).lower()
    assert any(a.lower() in msg for a in alternatives), (
        f"message {str(exc)!r} names none of {alternatives}"
    )


# --------------------------------------------------------------------------- #
# DML: null key, NOT NULL, wrong types, unknown table / column
# --------------------------------------------------------------------------- #


def _mixed(fx, bad: dict) -> list[dict]:
    """A batch mixing a new key, an overwrite of a committed key, and one bad row."""
    return [fx.row(100, amount=1), fx.row(3, amount=999), bad]


@pytest.mark.parametrize("fmt", ["dicts", "pandas"])
def test_null_key_insert(fx, fmt):
    rows = _mixed(fx, {"order_id": None, "cust": 1, "amount": 5, "label": "x"})
    data = rows if fmt == "dicts" else pd.DataFrame(rows)
    raises(fx, DataError, lambda: fx.eng.insert("orders", data), "order_id")


def test_null_key_spark_dataframe(fx, spark):
    rows = [(100, 1, 1, "a"), (None, 1, 5, "x")]
    raises(
        fx, DataError, lambda: fx.eng.insert("orders", spark.createDataFrame(rows, DDL)), "order_id"
    )


def test_null_key_delete(fx):
    raises(
        fx,
        DataError,
        lambda: fx.eng.delete("orders", [{"order_id": 4}, {"order_id": None}]),
        "order_id",
    )


def test_missing_key_column(fx):
    # insert without the key column at all; delete without the key column
    raises(
        fx,
        DataError,
        lambda: fx.eng.insert("orders", [{"cust": 1, "amount": 2, "label": "z"}]),
        "order_id",
    )
    raises(fx, DataError, lambda: fx.eng.delete("orders", [{"cust": 1}]), "order_id")


def test_null_in_not_null_column(fx):
    rows = _mixed(fx, {"order_id": 101, "cust": 1, "amount": 5, "label": None})
    raises(fx, DataError, lambda: fx.eng.insert("orders", rows), "label")


def test_null_in_not_null_column_sql(fx):
    raises(
        fx,
        DataError,
        lambda: fx.eng.sql(
            "INSERT INTO orders (order_id, cust, amount, label) VALUES (101, 1, 5, NULL)"
        ),
        "label",
    )


@pytest.mark.parametrize("fmt", ["dicts", "pandas"])
def test_wrong_type_insert(fx, fmt):
    rows = _mixed(fx, {"order_id": 102, "cust": 1, "amount": "not-a-number", "label": "x"})
    data = rows if fmt == "dicts" else pd.DataFrame(rows)
    raises(fx, DataError, lambda: fx.eng.insert("orders", data), "amount")


def test_wrong_type_key_insert(fx):
    rows = _mixed(fx, {"order_id": "abc", "cust": 1, "amount": 5, "label": "x"})
    raises(fx, DataError, lambda: fx.eng.insert("orders", rows), "order_id")


@pytest.mark.connect
def test_wrong_type_spark_dataframe(fx, spark):
    df = spark.createDataFrame(
        [(103, 1, "not-a-number", "x")], "order_id BIGINT, cust INT, amount STRING, label STRING"
    )
    raises(fx, DataError, lambda: fx.eng.insert("orders", df), "amount")


@pytest.mark.parametrize(
    "values",
    [
        "(104, 1, 5, 'ok'), (105, 1, 'not-a-number', 'bad')",  # mixed with a good row
        "(105, 1, 'not-a-number', 'bad')",  # alone
    ],
    ids=["mixed", "single"],
)
def test_wrong_type_sql_insert(fx, values):
    sql = f"INSERT INTO orders (order_id, cust, amount, label) VALUES {values}"
    raises(fx, (DataError, SqlError), lambda: fx.eng.sql(sql), "amount")


def test_unknown_table(fx):
    eng = fx.eng
    cases = Cases(fx)
    calls = [
        ("insert", lambda: eng.insert("no_such_tbl", [fx.row(1)]), "no_such_tbl"),
        ("delete", lambda: eng.delete("no_such_tbl", [{"order_id": 1}]), "no_such_tbl"),
        ("read", lambda: eng.read("no_such_tbl"), "no_such_tbl"),
        ("progress", lambda: eng.progress("no_such_mv"), "no_such_mv"),
        (
            "sql insert",
            lambda: eng.sql("INSERT INTO no_such_tbl (order_id) VALUES (1)"),
            "no_such_tbl",
        ),
        ("update", lambda: eng.sql("UPDATE no_such_tbl SET a = 1"), "no_such_tbl"),
        ("sql delete", lambda: eng.sql("DELETE FROM no_such_tbl WHERE a = 1"), "no_such_tbl"),
        ("select", lambda: eng.sql("SELECT * FROM no_such_tbl"), "no_such_tbl"),
        ("drop table", lambda: eng.sql("DROP TABLE no_such_tbl"), "no_such_tbl"),
        ("drop mv", lambda: eng.sql("DROP MATERIALIZED VIEW no_such_mv"), "no_such_mv"),
        (
            "create mv",
            lambda: eng.sql("CREATE MATERIALIZED VIEW m_x AS SELECT a FROM no_such_tbl"),
            "no_such_tbl",
        ),
    ]
    for case, fn, name in calls:
        cases.check(
            case,
            lambda fn=fn, name=name: raises(fx, UnknownRelation, fn, name, full_check=False),
        )
    # IF EXISTS is not an error and changes nothing
    eng.sql("DROP TABLE IF EXISTS no_such_tbl")
    eng.sql("DROP MATERIALIZED VIEW IF EXISTS no_such_mv")
    cases.finish()


def test_unknown_column_insert(fx):
    bad = {"order_id": 106, "cust": 1, "amount": 5, "label": "x", "colour": "red"}
    raises(fx, UnknownColumn, lambda: fx.eng.insert("orders", _mixed(fx, bad)), "colour")


def test_unknown_column_pandas(fx):
    df = pd.DataFrame([{"order_id": 107, "cust": 1, "amount": 5, "label": "x", "colour": "red"}])
    raises(fx, UnknownColumn, lambda: fx.eng.insert("orders", df), "colour")


def test_unknown_column_sql_insert(fx):
    raises(
        fx,
        UnknownColumn,
        lambda: fx.eng.sql("INSERT INTO orders (order_id, colour) VALUES (108, 'red')"),
        "colour",
    )


def test_unknown_column_update(fx):
    raises(fx, UnknownColumn, lambda: fx.eng.sql("UPDATE orders SET colour = 'red'"), "colour")
    raises(
        fx,
        UnknownColumn,
        lambda: fx.eng.sql("UPDATE orders SET amount = 1 WHERE colour = 'red'"),
        "colour",
    )
    raises(
        fx, UnknownColumn, lambda: fx.eng.sql("DELETE FROM orders WHERE colour = 'red'"), "colour"
    )


@pytest.mark.connect
def test_unknown_column_mv(fx):
    raises(
        fx,
        UnknownColumn,
        lambda: fx.eng.sql("CREATE MATERIALIZED VIEW m_bad AS SELECT order_id, colour FROM orders"),
        "colour",
    )
    raises(
        fx,
        UnknownColumn,
        lambda: fx.eng.sql(
            "CREATE MATERIALIZED VIEW m_bad AS SELECT order_id FROM orders WHERE colour = 'red'"
        ),
        "colour",
    )
    # the failed CREATE left nothing behind: the name is free
    fx.eng.sql("CREATE MATERIALIZED VIEW m_bad AS SELECT order_id, cust FROM orders")
    for _ in range(10):
        fx.step()
        if fx.eng.progress("m_bad").state == "created":
            break
    assert_same_rows(
        fx.eng.read("m_bad"), fx.eng.read("orders").select("order_id", "cust"), label="m_bad"
    )


# --------------------------------------------------------------------------- #
# SQL: unsupported shapes, garbage
# --------------------------------------------------------------------------- #

UNSUPPORTED = [
    ("intersect_all", "SELECT order_id FROM orders INTERSECT ALL SELECT order_id FROM orders",
     ("intersect all",)),
    ("except_star", "SELECT * FROM orders EXCEPT SELECT * FROM orders",
     ("name the columns",)),
    ("non_equi_join", "SELECT a.order_id FROM orders a JOIN orders b ON a.amount < b.amount",
     ("non-equi",)),
    ("chain_non_equi", "SELECT a.order_id FROM orders a JOIN orders b ON a.order_id = "
     "b.order_id JOIN orders c ON a.amount < c.amount", ("non-equi",)),
    ("order_by_limit", "SELECT DISTINCT cust FROM orders ORDER BY amount LIMIT 3",
     ("limit",)),
    ("limit", "SELECT order_id FROM orders LIMIT 5", ("limit",)),
    ("distinct_agg", "SELECT DISTINCT cust, count(*) AS c FROM orders GROUP BY cust",
     ("distinct",)),
    ("union", "SELECT order_id FROM orders UNION ALL SELECT order_id FROM orders UNION "
     "SELECT order_id FROM orders", ("union all",)),
    ("union_branch", "SELECT order_id FROM orders UNION ALL SELECT a.order_id FROM orders a "
     "JOIN orders b ON a.amount < b.amount", ("non-equi",)),
    (
        "window_partitions",
        "SELECT order_id, row_number() OVER (PARTITION BY cust ORDER BY amount) AS rn, "
        "rank() OVER (PARTITION BY amount ORDER BY cust) AS rk FROM orders",
        ("partition by",),
    ),
    ("session", "SELECT cust, session_window(ts, '5 seconds') AS w FROM orders",
     ("session_window", "GROUP BY")),
    ("session_join", "SELECT o.cust, count(*) AS n FROM orders o JOIN orders p ON o.id = p.id "
     "GROUP BY o.cust, session_window(o.ts, '5 seconds')", ("session", "derived table")),
    (
        "subquery",
        "SELECT order_id FROM orders WHERE amount > (SELECT amount FROM orders o "
        "WHERE o.order_id = orders.cust)",
        ("subquer", "sub-quer"),
    ),
    ("rand", "SELECT order_id, rand() AS r FROM orders", ("rand", "nondetermin", "non-determin")),
    ("now", "SELECT order_id, now() AS t FROM orders", ("now", "nondetermin", "non-determin")),
]


@pytest.mark.connect
def test_unsupported_mv_queries(fx):
    cases = Cases(fx)
    for name, query, words in UNSUPPORTED:

        def case(name=name, query=query, words=words):
            exc = raises(
                fx,
                UnsupportedQuery,
                lambda: fx.eng.sql(f"CREATE MATERIALIZED VIEW m_{name} AS {query}"),
                full_check=False,
            )
            names_one_of(exc, *words)
            assert f"m_{name}" not in {p.name for p in fx.eng.progress()}
            with pytest.raises(UnknownRelation):
                fx.eng.read(f"m_{name}")

        cases.check(name, case)
    cases.finish()


GARBAGE = [
    "SELEC * FRM orders",
    "CREATE TABLE broken (id BIGINT",
    "CREATE MATERIALIZED VIEW AS SELECT",
    "INSERT INTO orders VALUES (",
    "UPDATE orders SET WHERE",
    "CREATE TABLE odd (id FANCYTYPE, PRIMARY KEY (id))",
]


def test_garbage_sql(fx):
    cases = Cases(fx)
    for sql in GARBAGE:
        cases.check(
            sql, lambda sql=sql: raises(fx, SqlError, lambda: fx.eng.sql(sql), full_check=False)
        )
    cases.finish()


def test_create_table_key_not_a_column(fx):
    raises(
        fx,
        (SqlError, UnknownColumn),
        lambda: fx.eng.sql("CREATE TABLE t2 (id BIGINT, PRIMARY KEY (nope_col))"),
        "nope_col",
    )


# --------------------------------------------------------------------------- #
# Catalog conflicts
# --------------------------------------------------------------------------- #


def test_drop_table_with_dependent_mv(fx):
    exc = raises(fx, DependentObjects, lambda: fx.eng.sql("DROP TABLE orders"), "orders_mv")
    assert "orders" in str(exc)


def test_drop_mv_with_dependent_mv(fx):
    eng = fx.eng
    eng.sql("CREATE MATERIALIZED VIEW mv2 AS SELECT order_id, amount10 FROM orders_mv")
    for _ in range(10):
        fx.step()
        if eng.progress("mv2").state == "created":
            break
    raises(fx, DependentObjects, lambda: eng.sql("DROP MATERIALIZED VIEW orders_mv"), "mv2")
    raises(fx, DependentObjects, lambda: eng.sql("DROP TABLE orders"), "orders_mv")
    # in dependency order it works
    eng.sql("DROP MATERIALIZED VIEW mv2")
    eng.sql("DROP MATERIALIZED VIEW orders_mv")
    eng.sql("DROP TABLE orders")
    fx.eng.step()
    names = relation_names(eng)
    assert not {"mv2", "orders_mv", "orders"} & names
    with pytest.raises(UnknownRelation):
        eng.read("orders")


def test_duplicate_create(fx):
    raises(
        fx,
        RelationExists,
        lambda: fx.eng.sql("CREATE TABLE orders (order_id BIGINT, PRIMARY KEY (order_id))"),
        "orders",
    )
    raises(
        fx,
        RelationExists,
        lambda: fx.eng.sql("CREATE MATERIALIZED VIEW orders_mv AS SELECT order_id FROM orders"),
        "orders_mv",
    )
    # a table and an MV share one name space
    raises(
        fx,
        RelationExists,
        lambda: fx.eng.sql("CREATE MATERIALIZED VIEW orders AS SELECT order_id FROM orders"),
        "orders",
    )


BAD_OPTIONS = [
    ("backfill = 'nope'", ("nope", "backfill")),
    ("backfill_chunk_rows = -1", ("backfill_chunk_rows",)),
    ("backfill_chunk_rows = 0", ("backfill_chunk_rows",)),
    ("backfill_chunk_rows = 'many'", ("backfill_chunk_rows",)),
    ("backfill_rate_limit = -5", ("backfill_rate_limit",)),
    ("colour = 3", ("colour",)),
]

BAD_SETS = [
    ("SET backfill_chunk_rows = -1", "backfill_chunk_rows"),
    ("SET backfill_chunk_rows = 'x'", "backfill_chunk_rows"),
    ("SET backfill = 'nope'", "nope"),
    ("SET no_such_option = 1", "no_such_option"),
]


def test_bad_options(fx):
    cases = Cases(fx)
    for with_clause, words in BAD_OPTIONS:

        def case(with_clause=with_clause, words=words):
            exc = raises(
                fx,
                InvalidOption,
                lambda: fx.eng.sql(
                    f"CREATE MATERIALIZED VIEW m_opt WITH ({with_clause}) "
                    "AS SELECT order_id FROM orders"
                ),
                full_check=False,
            )
            names_one_of(exc, *words)
            with pytest.raises(UnknownRelation):
                fx.eng.progress("m_opt")

        cases.check(with_clause, case)
    for stmt, word in BAD_SETS:
        cases.check(
            stmt,
            lambda stmt=stmt, word=word: raises(
                fx, InvalidOption, lambda: fx.eng.sql(stmt), word, full_check=False
            ),
        )
    cases.finish()
    # the failed SETs changed no session default: a new MV backfills with the
    # explicit chunk and is correct
    fx.eng.sql("CREATE MATERIALIZED VIEW m_ok AS SELECT order_id, cust FROM orders")
    for _ in range(10):
        fx.step()
        if fx.eng.progress("m_ok").state == "created":
            break
    assert_same_rows(
        fx.eng.read("m_ok"), fx.eng.read("orders").select("order_id", "cust"), label="m_ok"
    )


# --------------------------------------------------------------------------- #
# Reads
# --------------------------------------------------------------------------- #


def test_read_mv_while_backfilling(engine, spark):
    engine.sql("CREATE TABLE big (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    rows = [{"id": i, "v": i * 3} for i in range(1000)]
    engine.insert("big", rows)
    engine.step()
    engine.sql(
        "CREATE MATERIALIZED VIEW big_mv WITH (backfill = 'no_shuffle', backfill_chunk_rows = 50) "
        "AS SELECT id, v + 1 AS w FROM big"
    )
    epoch = engine.committed_epoch
    for attempt in (0, 1):
        assert engine.progress("big_mv").state != "created"
        with pytest.raises(MaterializedViewNotReady) as exc:
            engine.read("big_mv")
        assert "big_mv" in str(exc.value)
        with pytest.raises(MaterializedViewNotReady):
            engine.sql("SELECT count(*) FROM big_mv").collect()
        if attempt == 0:
            assert engine.committed_epoch == epoch
            engine.step()
    # the upstream is readable meanwhile and the job still completes
    assert_rows_equal(engine.read("big"), [(r["id"], r["v"]) for r in rows], label="big")
    for _ in range(40):
        engine.step()
        if engine.progress("big_mv").state == "created":
            break
    assert_same_rows(
        engine.read("big_mv"), spark.sql("SELECT id, v + 1 AS w FROM {s}", s=engine.read("big"))
    )


def test_read_uncommitted_epoch(fx):
    e = fx.eng.committed_epoch
    with pytest.raises(EpochNotRetained) as exc:
        fx.eng.read("orders", as_of=e + 5)
    assert str(e + 5) in str(exc.value)
    fx.expect_unchanged(e)


# --------------------------------------------------------------------------- #
# Second writer
# --------------------------------------------------------------------------- #

_SECOND_WRITER = r"""
import sys
from sparkfill import Engine
try:
    eng = Engine(sys.argv[1])
except Exception as exc:
    print("RESULT", type(exc).__name__, "|", str(exc).replace("\n", " "), flush=True)
else:
    print("RESULT OPENED", flush=True)
    eng.close()
"""


def test_second_writer_process_is_locked_out(fx, warehouse):
    epoch = fx.eng.committed_epoch
    proc = subprocess.run(
        [sys.executable, "-c", _SECOND_WRITER, warehouse],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env("local[1]"),
    )
    m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    assert m, f"child printed no result:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    result = m.group(1)
    assert result.startswith("WarehouseLocked |"), result
    assert "lock" in result.lower() or warehouse in result
    # the first writer is unaffected
    fx.expect_unchanged(epoch)


def test_second_writer_in_process_is_locked_out(fx, warehouse, spark):
    from sparkfill import Engine, WarehouseLocked

    epoch = fx.eng.committed_epoch
    with pytest.raises(WarehouseLocked):
        Engine(warehouse, spark=spark)
    fx.expect_unchanged(epoch)


def test_mv_whose_constant_cannot_be_computed(fx):
    # found by the fuzzer: the MV was created over an empty table, and every epoch
    # after the first insert failed planning Spark's folding of '‮' as a BIGINT
    raises(
        fx,
        DataError,
        lambda: fx.eng.sql("CREATE MATERIALIZED VIEW m_bad AS SELECT order_id FROM orders "
                           "WHERE amount % '\u202e' <> 0"),
        "\u202e",
    )


@pytest.mark.parametrize("values", [[True, False], [1.5j, 2j], [b"a", b"b"]],
                         ids=["bool", "complex", "bytes"])
def test_pandas_column_arrow_cannot_cast(fx, values):
    # found by the fuzzer: a pandas column of bools for a TIMESTAMP raised pyarrow's
    # ArrowNotImplementedError through the boundary's catch-all
    fx.eng.sql("CREATE TABLE events (id BIGINT, at TIMESTAMP, PRIMARY KEY (id))")
    fx.step()
    rows = pd.DataFrame({"id": [1, 2], "at": values})
    raises(fx, DataError, lambda: fx.eng.insert("events", rows), "events", "at", "row 0")


def test_sql_insert_of_a_timestamp_out_of_range(fx):
    # found by the fuzzer: Spark computes the timestamp (year -235198), and reading it
    # back raised Python's ValueError through the boundary's catch-all
    fx.eng.sql("CREATE TABLE events (id BIGINT, at TIMESTAMP, PRIMARY KEY (id))")
    fx.step()
    raises(fx, DataError, lambda: fx.eng.sql(
        "INSERT INTO events VALUES (1, TIMESTAMP '2024-01-01 00:00:00'), "
        "(2, TIMESTAMP 12345678901234567890.123)"), "events", "out of range")
