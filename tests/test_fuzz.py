"""The statement fuzzer's CI slice (issue 35, item 3), its own checks, and the
regression tests of the bugs it found.

``test_fuzz_slice`` runs a fixed, seeded slice of ``tests/fuzz.py`` (``make torture``
runs it at scale): every statement and API call works or raises a SparkfillError
naming the problem, never an internal error; a refused one leaves the meta store
and every file of the warehouse as they were; a VERIFY of an MV it made is exact.
"""

from __future__ import annotations

import datetime
import decimal
import logging
import math

import pytest
from fuzz import Fuzzer, Limits, internal_reason, warehouse_state

from sparkfill import (
    EpochNotRetained,
    SparkfillError,
    SqlError,
    UnknownRelation,
)

#: the slice: a few hundred calls from a fixed seed (about a minute on 2 cores)
SEED = 35
CALLS = 300


def test_fuzz_slice(engine, tmp_path, monkeypatch):
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    sinks = tmp_path / "sinks"
    sinks.mkdir()
    monkeypatch.chdir(sinks)  # a relative path (a sink's) lands in a compared folder
    fuzzer = Fuzzer(engine, SEED, str(sinks),
                    Limits(step_every=100, verifies=2, mvs=3, mutated=0.9))
    fuzzer.setup()
    counts = fuzzer.run(CALLS)
    summary = counts.summary()
    print(summary)
    assert not counts.internal and not counts.changed and not counts.inexact, \
        summary + "\n" + counts.problems()
    assert counts.tried == CALLS
    # the slice exercised both sides of the contract, and statements of each kind
    assert counts.accepted >= CALLS // 10 and counts.refused >= CALLS // 3, summary
    assert {"SqlError", "UnsupportedQuery", "InvalidOption"} <= set(counts.by_error), summary
    assert counts.api_calls >= 10 and counts.steps >= 4 and counts.verified, summary


# --------------------------------------------------------------------------- #
# The fuzzer's checks can fail
# --------------------------------------------------------------------------- #


def test_internal_reason_tells_translations_from_refusals():
    cause = KeyError("x")
    caught = SparkfillError("Engine.sql: KeyError: 'x'")
    caught.__cause__ = cause
    assert "catch-all" in internal_reason(caught)
    assert internal_reason(ValueError("raw")) is not None
    assert internal_reason(SqlError("")) is not None
    assert internal_reason(SqlError("Engine.sql: An error occurred while calling o1.sql")) \
        is not None
    refused = SqlError("cannot parse statement: bad")
    refused.__cause__ = ValueError("bad")
    assert internal_reason(refused) is None
    assert internal_reason(UnknownRelation("no table named 'x'")) is None


def test_warehouse_state_sees_every_change(tmp_path):
    import sqlite3

    con = sqlite3.connect(tmp_path / "meta.sqlite")
    con.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT)")
    con.commit()
    (tmp_path / "relations").mkdir()
    (tmp_path / "relations" / "f.parquet").write_bytes(b"abcd")
    before = warehouse_state(tmp_path)
    assert before.diff(warehouse_state(tmp_path)) == []
    (tmp_path / "relations" / "f.parquet").write_bytes(b"abce")  # same size
    assert any("f.parquet" in d for d in before.diff(warehouse_state(tmp_path)))
    con.execute("INSERT INTO kv VALUES ('a', 'b')")
    con.commit()
    after = warehouse_state(tmp_path)
    assert any("kv" in d for d in warehouse_state(tmp_path).diff(before))
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "x").write_bytes(b"")
    assert any("staging/x" in d for d in after.diff(warehouse_state(tmp_path)))
    con.close()


# --------------------------------------------------------------------------- #
# Bugs the fuzzer found
# --------------------------------------------------------------------------- #


def refused(exc_type, fn, *words: str) -> SparkfillError:
    with pytest.raises(exc_type) as info:
        fn()
    assert internal_reason(info.value) is None, internal_reason(info.value)
    for word in words:
        assert word.lower() in str(info.value).lower(), (str(info.value), word)
    return info.value


@pytest.mark.parametrize("sql", [
    "SELECT 'abc",  # a quote left open: sqlglot's TokenError, not its ParseError
    "SELECT `abc FROM t",
    'SELECT "abc FROM t',
    "CREATE MATERIALIZED VIEW m AS SELECT 'a FROM t",
    "CREATE TABLE t2 (id BIGINT, PRIMARY KEY (id)) /* a comment left open",
])
def test_unterminated_tokens_are_sql_errors(engine, sql):
    epoch, state = engine.committed_epoch, warehouse_state(engine.path)
    refused(SqlError, lambda: engine.sql(sql), "cannot parse")
    assert engine.committed_epoch == epoch and warehouse_state(engine.path).diff(state) == []


def test_wrong_argument_types(engine):
    eng = engine
    eng.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    eng.insert("t", [{"id": 1, "v": 2}])
    eng.step()
    state = warehouse_state(eng.path)
    # a relation named by something else than a string
    for name in ([1, 2], 7, None, b"t", decimal.Decimal("1E+40")):
        refused(UnknownRelation, lambda name=name: eng.read(name), "string")
        if name is not None:  # progress(None): every job's
            refused(UnknownRelation, lambda name=name: eng.progress(name), "string")
        refused(UnknownRelation, lambda name=name: eng.insert(name, [{"id": 1}]), "string")
        refused(UnknownRelation, lambda name=name: eng.verify(name), "string")
    # an epoch that is not an integer
    for as_of in ([1], float("nan"), 1.5, "x", True, datetime.timedelta(days=1)):
        refused(EpochNotRetained, lambda as_of=as_of: eng.read("t", as_of=as_of), "as_of")
        refused(EpochNotRetained, lambda as_of=as_of: eng.create_temp_views(as_of=as_of),
                "as_of")
    assert eng.read("t", as_of="1").count() == 1  # its digits still name it
    # a statement that is not a string
    for statement in (None, 1, b"SHOW TABLES", ["SHOW TABLES"], math.pi):
        refused(SqlError, lambda s=statement: eng.sql(s), "string")
        refused(SqlError, lambda s=statement: eng.explain(s), "string")
    # a statement that is not valid Unicode (a lone surrogate): Spark's parser raised a
    # raw Py4JError, a sink's path a UnicodeEncodeError
    for statement in ("SELECT '\ud800' AS x", "INSERT INTO t VALUES (3, 4) -- \udfff",
                      "CREATE SINK s FROM t WITH (connector = 'delta', path = '/tmp/\ud800')"):
        refused(SqlError, lambda s=statement: eng.sql(s), "not valid unicode")
    assert warehouse_state(eng.path).diff(state) == []


@pytest.mark.parametrize("sql", [
    "DELETE t WHERE id IS NOT NULL",  # no FROM: the parser reads a boolean as the target
    "INSERT INTO (id) VALUES (1)",
    # an EXPLAIN whose CREATE has no name, or a quoted string for one, failed an assert
    "EXPLAIN CREATE MATERIALIZED VIEW ",
    "EXPLAIN CREATE MATERIALIZED VIEW '\u202e' AS SELECT id AS k FROM t",
])
def test_statement_without_a_relation_name(engine, sql):
    engine.sql("CREATE TABLE t (id BIGINT, PRIMARY KEY (id))")
    state = warehouse_state(engine.path)
    refused(SqlError, lambda: engine.sql(sql), "needs the name of a relation")
    assert warehouse_state(engine.path).diff(state) == []


def test_engine_arguments(spark, tmp_path, monkeypatch):
    """Engine(...) with arguments of the wrong type or value: the fuzzer found raw
    TypeError, ValueError, FileNotFoundError and OSError, an AttributeError through
    the catch-all, and warehouses opened in folders named "None" or "[1]"."""
    from sparkfill import Engine, InvalidOption

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    cases = [
        (SparkfillError, (None,), {}, "path or a uri"),
        (SparkfillError, (123,), {}, "path or a uri"),
        (SparkfillError, (b"wh",), {}, "path or a uri"),
        (SparkfillError, ([1],), {}, "path or a uri"),
        (SparkfillError, ("",), {}, "not a path"),
        (SparkfillError, ("x\x00y",), {}, "not a path"),
        (SparkfillError, ("\ud800",), {}, "not valid unicode"),  # a lone surrogate
        (SparkfillError, (str(tmp_path / "a_file"),), {}, "cannot create its folder"),
        (SparkfillError, ("wh",), {"spark": "spark"}, "SparkSession"),
        (InvalidOption, ("wh",), {"meta": 5}, "meta"),
        (InvalidOption, ("wh",), {"retain_epochs": "x"}, "retain_epochs"),
        (InvalidOption, ("wh",), {"retain_epochs": -1}, "retain_epochs"),
        (InvalidOption, ("wh",), {"storage_options": [1]}, "storage_options"),
        (InvalidOption, ("wh",), {"storage_options": {"a": 1}}, "storage_options"),
    ]
    for exc_type, args, kwargs, words in cases:
        refused(exc_type, lambda a=args, k=kwargs: Engine(*a, **{"spark": spark, **k}), words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"], "a refused open created"
    Engine("wh", spark=spark, retain_epochs=0).close()  # the same, right, opens


def test_relation_names_that_cannot_name_a_folder(engine):
    """A relation's data lives in a folder named after it: the fuzzer found `c[1]`
    (a Spark glob: every later epoch failed on its file), `a:b` (a URI to Spark),
    `a%20b` (decoded by delta-rs), tabs and over-long names failing in CREATE, and
    `a/b` or `../esc` accepted, their folders outside ``relations/``."""
    state = warehouse_state(engine.path)
    for name in ("a/b", "../esc", "c[1]", "{x}", "a:b", "a%20b", "a*b", "a b", "tab\tname",
                 ".", "a.b", "", "x" * 101):
        quoted = "`" + name.replace("`", "``") + "`"
        for sql in (f"CREATE TABLE {quoted} (id BIGINT, PRIMARY KEY (id))",
                    f"CREATE MATERIALIZED VIEW {quoted} AS SELECT 1 AS id"):
            if name or "TABLE" in sql:  # (CREATE MATERIALIZED VIEW `` is not one)
                refused(SqlError, lambda sql=sql: engine.sql(sql), "relation name")
    assert warehouse_state(engine.path).diff(state) == []
    # letters of any script are letters
    engine.sql("CREATE TABLE `名前_1` (id BIGINT, v STRING, PRIMARY KEY (id))")
    engine.insert("名前_1", [{"id": 1, "v": "ü"}])
    engine.step()
    assert [tuple(r) for r in engine.read("名前_1").collect()] == [(1, "ü")]


def test_a_job_waits_for_a_slot_with_its_links(engine):
    """With max_concurrent_creating_jobs, the slots were counted per creating
    relation, an MV's internal links included: a session-window MV (three links)
    created beside another had its links run while the MV itself waited, so it
    missed the rows they passed on from birth (the fuzzer's VERIFY found the MV
    empty). A job is the MV with its links: they wait or run together."""
    eng = engine
    eng.sql("CREATE TABLE t (id BIGINT, c1 DATE, c2 TIMESTAMP, PRIMARY KEY (id))")
    eng.sql("SET max_concurrent_creating_jobs = 4")
    eng.sql("CREATE MATERIALIZED VIEW top2 AS SELECT p, o, rn FROM (SELECT c2 AS p, id AS o, "
            "row_number() OVER (PARTITION BY c2 ORDER BY id DESC) AS rn FROM t) s "
            "WHERE rn <= 2")
    eng.sql("CREATE MATERIALIZED VIEW sess AS SELECT c1 AS g, session_window.start AS st, "
            "count(*) AS n FROM t GROUP BY c1, session_window(c2, '10 seconds')")
    eng.sql("INSERT INTO t VALUES (5, DATE '2024-01-13', TIMESTAMP '2024-01-01 00:24:01'), "
            "(3, DATE '2024-01-01', TIMESTAMP '2024-01-01 00:36:59')")
    for _ in range(4):
        eng.step()
        if {j.state for j in eng.progress()} == {"created"}:
            break
    assert eng.progress("sess").state == "created"
    assert eng.read("sess").count() == 2
    assert eng.verify("sess").count() == 0 and eng.verify("top2").count() == 0


def test_cancel_jobs_is_all_or_nothing(engine, tmp_path):
    """CANCEL JOBS a, b dropped a, then found b could not go (a sink writes it) and
    raised, a changed: the fuzzer's check of the warehouse after a refusal saw it."""
    from sparkfill import DependentObjects

    eng = engine
    eng.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    eng.sql("CREATE MATERIALIZED VIEW a AS SELECT id, v FROM t")
    eng.sql("CREATE MATERIALIZED VIEW b AS SELECT id, v + 1 AS w FROM t")
    eng.sql(f"CREATE SINK s FROM b WITH (connector = 'delta', path = '{tmp_path / 's'}')")
    state = warehouse_state(eng.path, tmp_path)
    refused(DependentObjects, lambda: eng.sql("CANCEL JOBS a, b"), "sink")
    assert warehouse_state(eng.path, tmp_path).diff(state) == []
    assert {j.name for j in eng.progress()} == {"a", "b"}
    eng.sql("DROP SINK s")
    eng.sql("CANCEL JOBS a, b")
    assert eng.progress() == []
