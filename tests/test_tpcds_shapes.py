"""Shapes of TPC-DS statements that the online sweep (bench/tpcds_bench.py) found
wrong or worth pinning down, over tiny tables: each created online and compared
with Spark's batch query (or, where Spark's query fails, with what the README says
the MV holds)."""

from __future__ import annotations

import pytest


def _step_until_created(engine, name: str, limit: int = 10):
    for _ in range(limit):
        report = engine.step()
        if engine.progress(name).state == "created":
            return report
    raise AssertionError(f"{name} not created after {limit} epochs")


def test_scalar_subquery_over_several_rows_is_null_and_verify_says_so(engine):
    """An uncorrelated scalar subquery that does not aggregate: over more than one
    row Spark's query fails; the MV holds NULL there (it does not fail its epochs),
    and VERIFY — run by hand, or every N epochs by ``verify_every`` — reports
    Spark's error, so the difference does not pass unseen."""
    engine.sql("CREATE TABLE t (id BIGINT, g INT, PRIMARY KEY (id))")
    engine.sql("CREATE TABLE d (k BIGINT, g INT, m INT, PRIMARY KEY (k))")
    engine.insert("t", [{"id": i, "g": i % 3} for i in range(6)])
    engine.insert("d", [{"k": 1, "g": 1, "m": 5}])
    engine.step()
    engine.sql("CREATE MATERIALIZED VIEW m AS SELECT id, "
               "(SELECT g FROM d WHERE m = 5) AS sg FROM t WHERE g = (SELECT g FROM d WHERE m = 5)")
    _step_until_created(engine, "m")
    assert sorted(r.id for r in engine.read("m").collect()) == [1, 4]
    assert engine.verify("m").count() == 0
    engine.insert("d", [{"k": 2, "g": 2, "m": 5}])  # the subquery now has two rows
    engine.sql("SET verify_every = 1")
    report = engine.step()
    assert engine.read("m").count() == 0  # g = NULL holds for no row
    assert any("VERIFY failed" in w for w in report.warnings), report.warnings
    with pytest.raises(Exception, match="TOO_MANY_ROWS"):  # Spark's own error
        engine.verify("m").count()
    engine.delete("d", [{"k": 2}])
    report = engine.step()
    assert sorted(r.id for r in engine.read("m").collect()) == [1, 4]
    assert not report.warnings, report.warnings


def test_a_ratio_of_counts_is_created_online_while_a_count_is_still_zero(engine, spark):
    """TPC-DS q90's shape: the ratio of two one-row counts cross joined. While the
    divisor's link is backfilling its count is 0 — a state Spark's query never sees
    — and ``a / 0`` raised there (DIVIDE_BY_ZERO under ANSI) in every epoch, so the
    MV was never created; a division is ``try_divide`` in an MV."""
    from helpers import assert_same_rows

    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "g": i % 7, "v": i} for i in range(80)])
    engine.step()
    sql = ("SELECT cast(a AS DECIMAL(15, 4)) / cast(p AS DECIMAL(15, 4)) AS ratio, "
           "a / p AS plain FROM (SELECT count(*) AS a FROM t WHERE g < 5) x, "
           "(SELECT count(*) AS p FROM t WHERE v >= 75) y ORDER BY ratio LIMIT 100")
    engine.sql(f"CREATE MATERIALIZED VIEW r WITH (backfill_chunk_rows = 4) AS {sql}")
    checked = 0
    for n in range(40):
        engine.insert("t", [{"id": 100 + n, "g": n % 7, "v": n}])
        engine.delete("t", [{"id": n}])
        report = engine.step()
        if engine.progress("r").state == "created":
            for table in ("t",):
                engine.read(table, as_of=report.epoch).createOrReplaceTempView(table)
            assert_same_rows(engine.read("r", as_of=report.epoch), spark.sql(sql),
                             label=f"r at epoch {report.epoch}")
            checked += 1
            if checked >= 2:
                break
    assert checked == 2


def test_try_divide_has_the_type_and_value_of_a_division(spark):
    exprs = ["7 / 2", "CAST(7 AS DECIMAL(15, 4)) / CAST(3 AS DECIMAL(15, 4))",
             "CAST(7.25 AS DECIMAL(7, 2)) / 3", "7L / 2.5D", "sum(x) / count(x)",
             "INTERVAL '10' DAY / 4"]
    for e in exprs:
        try_e = "try_divide(" + e.rsplit(" / ", 1)[0] + ", " + e.rsplit(" / ", 1)[1] + ")"
        a = spark.sql(f"SELECT {e} AS v FROM VALUES (1), (4) AS t(x)")
        b = spark.sql(f"SELECT {try_e} AS v FROM VALUES (1), (4) AS t(x)")
        assert [f.dataType for f in a.schema] == [f.dataType for f in b.schema], e
        assert a.collect() == b.collect(), e


def test_unnamed_outputs_are_named_by_the_function_the_query_calls(engine, spark):
    """TPC-DS q62 and q85 (``substr(w_warehouse_name, 1, 20)``, unnamed): the MV's
    column was ``substring(...)``, Spark's ``substr(...)`` — sqlglot writes SUBSTR as
    SUBSTRING, and Spark names an output after the function as called. Each alias
    below is one sqlglot rewrites."""
    from helpers import assert_same_rows

    engine.sql("CREATE TABLE w (id BIGINT, name STRING, v DOUBLE, PRIMARY KEY (id))")
    engine.insert("w", [{"id": i, "name": f"warehouse {i % 3}", "v": i / 2}
                        for i in range(12)])
    engine.step()
    sql = ("SELECT substr(name, 1, 5), ucase(name), lcase(name), nvl(name, 'x'), "
           "pow(v, 2), sum(v), count(*) FROM w GROUP BY substr(name, 1, 5), ucase(name), "
           "lcase(name), nvl(name, 'x'), pow(v, 2)")
    engine.sql(f"CREATE MATERIALIZED VIEW names_kept WITH (backfill_chunk_rows = 4) AS {sql}")
    _step_until_created(engine, "names_kept")
    expected = spark.sql(sql.replace("FROM w", "FROM {w}"), w=engine.read("w"))
    assert engine.read("names_kept").columns == expected.columns
    assert_same_rows(engine.read("names_kept"), expected, label="names_kept")


def test_a_ratio_over_a_union_of_sums_keeps_sparks_decimal_type(engine, spark):
    """TPC-DS q66's shape: ``sum(s / sq_ft)`` over a UNION ALL of two grouped sums
    of ``decimal(7,2) * int``. Spark types each inner sum decimal(28,2) and the
    ratio decimal(38,12); the MV's ratio held values rounded to scale 6 (the inner
    sum, kept wider, made the division fall to Spark's minimum scale)."""
    from helpers import assert_same_rows

    engine.sql("CREATE TABLE s (id BIGINT, w INT, price DECIMAL(7,2), q INT, "
               "PRIMARY KEY (id))")
    engine.sql("CREATE TABLE c (id BIGINT, w INT, price DECIMAL(7,2), q INT, "
               "PRIMARY KEY (id))")
    engine.sql("CREATE TABLE wh (w INT, sq_ft INT, PRIMARY KEY (w))")
    from decimal import Decimal
    engine.insert("s", [{"id": i, "w": i % 3, "price": Decimal(f"{i * 7 % 100}.{i % 97:02d}"),
                         "q": i % 11 + 1} for i in range(40)])
    engine.insert("c", [{"id": i, "w": i % 3, "price": Decimal(f"{i * 3 % 100}.{i % 89:02d}"),
                         "q": i % 5 + 1} for i in range(30)])
    engine.insert("wh", [{"w": w, "sq_ft": 977_777 + w * 12_345} for w in range(3)])
    engine.step()
    sql = ("SELECT w, sq_ft, sum(sales) AS sales, sum(sales / sq_ft) AS per_ft FROM ("
           "(SELECT wh.w, sq_ft, sum(CASE WHEN q > 2 THEN price * q ELSE 0 END) AS sales "
           " FROM s, wh WHERE s.w = wh.w GROUP BY wh.w, sq_ft) UNION ALL "
           "(SELECT wh.w, sq_ft, sum(CASE WHEN q > 2 THEN price * q ELSE 0 END) AS sales "
           " FROM c, wh WHERE c.w = wh.w GROUP BY wh.w, sq_ft)) x "
           "GROUP BY w, sq_ft ORDER BY w LIMIT 100")
    engine.sql(f"CREATE MATERIALIZED VIEW per_ft WITH (backfill_chunk_rows = 8) AS {sql}")
    report = _step_until_created(engine, "per_ft")
    for table in ("s", "c", "wh"):
        engine.read(table, as_of=report.epoch).createOrReplaceTempView(table)
    expected = spark.sql(sql)
    got = engine.read("per_ft", as_of=report.epoch)
    assert got.schema == expected.schema
    assert_same_rows(got, expected, label="per_ft")
    engine.insert("s", [{"id": 100, "w": 1, "price": Decimal("12.34"), "q": 7}])
    engine.delete("c", [{"id": 4}])
    report = engine.step()
    for table in ("s", "c", "wh"):
        engine.read(table, as_of=report.epoch).createOrReplaceTempView(table)
    assert_same_rows(engine.read("per_ft", as_of=report.epoch), spark.sql(sql),
                     label="per_ft after a change")


def test_a_running_sum_at_decimal_38_adds_at_its_scale_or_fails_loudly(spark):
    """``exact_add_sql``: Spark's ``+`` of two decimal(38,12) gives decimal(38,11);
    the running sum adds at scale 12 as Spark's ``sum`` does, and past the range it
    can add exactly it raises rather than round."""
    from sparkfill.dataflow.aggregate import exact_add_sql

    t = "decimal(38,12)"
    add = exact_add_sql("a", "b", t)
    rows = spark.sql(f"SELECT {add} AS r FROM VALUES (CAST('0.000000000001' AS {t}), "
                     f"CAST('9999999999999999999999.999999999999' AS {t})) AS v(a, b)")
    assert str(rows.schema[0].dataType) == "DecimalType(38,12)"
    assert str(rows.collect()[0].r) == "10000000000000000000000.000000000000"
    with pytest.raises(Exception, match="running sum of decimal"):
        spark.sql(f"SELECT {add} AS r FROM VALUES (CAST('1' AS {t}), "
                  f"CAST('10000000000000000000000000.5' AS {t})) AS v(a, b)").collect()
    assert exact_add_sql("a", "b", "decimal(28,2)") == "(a + b)"
