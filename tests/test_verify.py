"""VERIFY with ties at a limit: ``sparkfill.verify.differences`` over hand-made
DataFrames (any of the tied rows is a right answer; anything else is reported) and
``Engine.verify`` of top-N MVs and ``row_number()`` filters whose inputs tie at the
limit, with the MV's rows replaced by other valid and invalid choices."""

from __future__ import annotations

import pytest

from sparkfill.verify import RankedSelection, differences

SCHEMA = "id BIGINT, g INT, v BIGINT"
#: id, g, v: by v descending, 0 and 1 lead; 2..9 tie at v = 50; 10 trails
ROWS = [(0, 0, 90), (1, 0, 80), *[(i, 0, 50) for i in range(2, 10)], (10, 0, 10)]
TOP4 = RankedSelection((), (("v", True, False),), 1, 4)


def df(spark, rows, schema=SCHEMA):
    return spark.createDataFrame(rows, schema)


def sides(diff) -> list[tuple]:
    return sorted((*r[:-1], r["side"]) for r in diff.collect())


def test_any_tied_rows_at_the_limit_are_right_and_the_exact_comparison_is_not(spark):
    """Two MVs holding different tied rows at the limit are both right; against
    one batch choice the exact comparison calls at least one of them wrong."""
    candidates = df(spark, ROWS)
    low = df(spark, [ROWS[0], ROWS[1], (2, 0, 50), (3, 0, 50)])
    high = df(spark, [ROWS[0], ROWS[1], (8, 0, 50), (9, 0, 50)])
    assert differences(low, candidates, TOP4).count() == 0
    assert differences(high, candidates, TOP4).count() == 0
    one_batch = df(spark, candidates.orderBy("v", ascending=False).limit(4).collect())
    assert differences(low, one_batch).count() + differences(high, one_batch).count() > 0


def test_a_row_inside_the_limit_missing_or_wrong_is_reported(spark):
    candidates = df(spark, ROWS)
    missing = df(spark, [ROWS[1], (2, 0, 50), (3, 0, 50), (4, 0, 50)])
    assert (0, 0, 90, "missing") in sides(differences(missing, candidates, TOP4))
    wrong = df(spark, [(0, 0, 91), ROWS[1], (2, 0, 50), (3, 0, 50)])
    assert sides(differences(wrong, candidates, TOP4)) == [(0, 0, 90, "missing"),
                                                          (0, 0, 91, "extra")]


def test_the_boundary_needs_the_right_number_of_tied_candidates(spark):
    candidates = df(spark, ROWS)
    # one tied row short: one of the other tied rows is missing
    short = sides(differences(df(spark, [ROWS[0], ROWS[1], (5, 0, 50)]), candidates, TOP4))
    assert len(short) == 1 and short[0][0] != 5 and short[0][2:] == (50, "missing")
    # one too many: one of them is extra
    more = df(spark, [ROWS[0], ROWS[1], (5, 0, 50), (6, 0, 50), (7, 0, 50)])
    extra = sides(differences(more, candidates, TOP4))
    assert len(extra) == 1 and extra[0][0] in (5, 6, 7) and extra[0][2:] == (50, "extra")
    # a row with the boundary value that is no candidate (id 11 does not exist)
    foreign = sides(differences(df(spark, [ROWS[0], ROWS[1], (5, 0, 50), (11, 0, 50)]),
                                candidates, TOP4))
    assert (11, 0, 50, "extra") in foreign
    # a row after the limit, and a duplicate of a tied row
    after = df(spark, [ROWS[0], ROWS[1], (5, 0, 50), (10, 0, 10)])
    assert (10, 0, 10, "extra") in sides(differences(after, candidates, TOP4))
    twice = df(spark, [ROWS[0], ROWS[1], (5, 0, 50), (5, 0, 50)])
    assert (5, 0, 50, "extra") in sides(differences(twice, candidates, TOP4))


def test_offset_ties_at_both_ends(spark):
    """OFFSET 3 LIMIT 3 over 90, 80, 50 x8, 10: positions 4..6 are all tied rows,
    any three of the eight."""
    candidates = df(spark, ROWS)
    window = RankedSelection((), (("v", True, False),), 4, 6)
    assert differences(df(spark, [(9, 0, 50), (4, 0, 50), (7, 0, 50)]), candidates,
                       window).count() == 0
    assert differences(df(spark, [(9, 0, 50), (4, 0, 50), (1, 0, 80)]), candidates,
                       window).count() > 0
    # the whole group inside: exact (OFFSET 2 LIMIT 8 holds every v = 50)
    whole = RankedSelection((), (("v", True, False),), 3, 10)
    tied = [(i, 0, 50) for i in range(2, 10)]
    assert differences(df(spark, tied), candidates, whole).count() == 0
    assert differences(df(spark, tied[:-1] + [(10, 0, 10)]), candidates, whole).count() > 0


def test_row_number_per_partition_with_its_position_column(spark):
    """rn <= 2 per g, rn among the columns: tied rows may hold either number, but
    the numbers of a group must be its positions, each once."""
    schema = "id BIGINT, g INT, v BIGINT, rn INT"
    # g 0: v 9, then 5, 5, 5 (tie at rn 2); g 1: 7, 7 (one group, both kept); g NULL: 3
    cand = [(0, 0, 9, 1), (1, 0, 5, 2), (2, 0, 5, 3), (3, 0, 5, 4),
            (4, 1, 7, 1), (5, 1, 7, 2), (6, None, 3, 1)]
    candidates = df(spark, cand, schema)
    sel = RankedSelection(("g",), (("v", True, False),), 1, 2, "rn")
    good = [(0, 0, 9, 1), (3, 0, 5, 2), (5, 1, 7, 1), (4, 1, 7, 2), (6, None, 3, 1)]
    assert differences(df(spark, good, schema), candidates, sel).count() == 0
    # rn 2 twice in g 1
    bad = sides(differences(df(spark, [*good[:2], (5, 1, 7, 2), (4, 1, 7, 2), good[4]],
                                   schema), candidates, sel))
    assert bad and {(s[1], s[-1]) for s in bad} <= {(1, "missing"), (1, "extra")}
    # a number past the filter
    past = df(spark, [(0, 0, 9, 1), (3, 0, 5, 3), *good[2:]], schema)
    assert (3, 0, 5, 3, "extra") in sides(differences(past, candidates, sel))
    # the partition of NULLs is one partition
    lost = df(spark, good[:4], schema)
    assert sides(differences(lost, candidates, sel)) == [(6, None, 3, 1, "missing")]


def test_without_a_selection_the_comparison_is_exact(spark):
    a = df(spark, [(1, 0, 1), (1, 0, 1)])
    b = df(spark, [(1, 0, 1)]).toDF("x", "y", "z")  # by position, as the batch names them
    assert sides(differences(a, b)) == [(1, 0, 1, "extra")]
    assert differences(a, a).count() == 0


# --- Engine.verify ---------------------------------------------------------------------------


def _mv_rows(engine, monkeypatch, name, rows):
    """Make ``engine`` read ``rows`` (a DataFrame of its columns) as the MV ``name``."""
    real = engine._snapshot

    def replaced(rel, epoch):
        return rows if rel.name == name else real(rel, epoch)
    monkeypatch.setattr(engine, "_snapshot", replaced)


def _ties_table(engine, n: int = 40) -> None:
    """t: ids 0..n-1 in 4 groups g; v is 100 + id for ids < 4 and 50 for the others,
    written highest id first."""
    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "g": i % 4, "v": 100 + i if i < 4 else 50}
                        for i in reversed(range(n))])
    engine.step()


def _create(engine, name: str, sql: str) -> None:
    engine.sql(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
    while engine.progress(name).state != "created":
        engine.step()


def test_verify_top_n_with_ties_at_the_limit(engine, spark, monkeypatch):
    """ORDER BY v DESC LIMIT 6 over 4 leading rows and 36 tied at v = 50: VERIFY is
    empty for the MV and for other choices of 2 tied rows (the exact comparison with
    one batch run calls one of two disjoint choices wrong), and reports a lost row
    inside the limit, a tied row too many and a row that is no candidate."""
    _ties_table(engine)
    _create(engine, "top", "SELECT id, v FROM t ORDER BY v DESC LIMIT 6")
    assert engine.verify("top").count() == 0
    assert engine.sql("VERIFY MATERIALIZED VIEW top").count() == 0
    mv = engine.read("top")
    assert sorted(r["v"] for r in mv.collect()) == [50, 50, 100, 101, 102, 103]
    inside = [(i, 100 + i) for i in range(4)]
    one_batch = spark.createDataFrame(
        engine.read("t").orderBy("v", ascending=False).limit(6).select("id", "v").collect(),
        mv.schema)
    exact = 0
    for tied in ([10, 20], [33, 39]):
        rows = spark.createDataFrame([*inside, *[(i, 50) for i in tied]], mv.schema)
        _mv_rows(engine, monkeypatch, "top", rows)
        assert engine.verify("top").count() == 0
        exact += differences(rows, one_batch).count()
    assert exact > 0

    def verified(rows):
        _mv_rows(engine, monkeypatch, "top", spark.createDataFrame(rows, mv.schema))
        return sorted((r["id"], r["v"], r["side"]) for r in engine.verify("top").collect())

    # a row inside the limit lost, its place taken by a third tied row
    lost = verified([*inside[1:], (10, 50), (20, 50), (30, 50)])
    assert lost[0] == (0, 100, "missing") and len(lost) == 2
    assert lost[1][0] in (10, 20, 30) and lost[1][1:] == (50, "extra")
    # a tied row too many: one of them is extra
    more = verified([*inside, (10, 50), (20, 50), (30, 50)])
    assert len(more) == 1 and more[0][0] in (10, 20, 30) and more[0][1:] == (50, "extra")
    # a row with the boundary value that is no candidate, and one tied row short
    foreign = verified([*inside, (10, 50), (99, 50)])
    assert foreign[-1] == (99, 50, "extra") and len(foreign) == 2
    assert foreign[0][0] not in (10, 99) and foreign[0][1:] == (50, "missing")


def test_verify_offset_and_an_order_on_an_aggregate(engine, spark, monkeypatch):
    """ORDER BY an aggregate DESC LIMIT 2 OFFSET 1 (the Nexmark hot-items shape): the
    groups' counts tie at both ends of the range."""
    _ties_table(engine)
    engine.insert("t", [{"id": 100 + i, "g": 0, "v": 1} for i in range(3)])
    engine.step()
    # counts per g: 13, 10, 10, 10: offset 1 skips g 0, then any two of g 1..3
    _create(engine, "hot", "SELECT g, count(*) AS c FROM t GROUP BY g "
            "ORDER BY c DESC LIMIT 2 OFFSET 1")
    assert engine.verify("hot").count() == 0
    mv = engine.read("hot")
    for rows in ([(1, 10), (3, 10)], [(2, 10), (3, 10)]):
        _mv_rows(engine, monkeypatch, "hot", spark.createDataFrame(rows, mv.schema))
        assert engine.verify("hot").count() == 0
    _mv_rows(engine, monkeypatch, "hot", spark.createDataFrame([(0, 13), (3, 10)], mv.schema))
    assert (0, 13, "extra") in [(r["g"], r["c"], r["side"]) for r in
                                engine.verify("hot").collect()]


@pytest.mark.parametrize("numbered", [True, False])
def test_verify_row_number_filter_with_ties(engine, spark, monkeypatch, numbered):
    """rn <= 2 per g over rows that tie at rn 2 (and 1): VERIFY is empty for the MV
    and for other tied rows with their numbers swapped, and reports a lost row, a
    number given twice (with the rn column) and a row of the wrong group."""
    _ties_table(engine)
    cols = "g, id, v, rn" if numbered else "g, id, v"
    _create(engine, "w", f"SELECT {cols} FROM (SELECT g, id, v, row_number() OVER "
            "(PARTITION BY g ORDER BY v DESC) AS rn FROM t) r WHERE rn <= 2")
    assert engine.verify("w").count() == 0
    schema = engine.read("w").schema
    # g 0..3: id g leads (v 100 + g), then 9 rows tie at v = 50
    lead = [(g, g, 100 + g) for g in range(4)]
    choice = [(g, 36 + g, 50) for g in range(4)]

    def rows(pairs):
        return [(*r, n) if numbered else r for r, n in pairs]

    def verified(pairs):
        _mv_rows(engine, monkeypatch, "w", spark.createDataFrame(rows(pairs), schema))
        return engine.verify("w").collect()

    assert verified([*[(r, 1) for r in lead], *[(r, 2) for r in choice]]) == []
    lost = verified([*[(r, 1) for r in lead[1:]], *[(r, 2) for r in choice]])
    assert [(r["id"], r["side"]) for r in lost] == [(0, "missing")]
    wrong_group = verified([*[(r, 1) for r in lead], *[(r, 2) for r in choice[:3]],
                            ((3, 4, 50), 2)])
    assert (4, "extra") in [(r["id"], r["side"]) for r in wrong_group]
    if numbered:
        twice = verified([*[(r, 1) for r in lead], *[(r, 1) for r in choice]])
        assert twice and {r["g"] for r in twice} == {0, 1, 2, 3}


def test_verify_unfiltered_row_number_with_ties(engine, spark, monkeypatch):
    """row_number() over ties, unfiltered: a tied row may hold any of its group's
    numbers, each once."""
    engine.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    engine.insert("t", [{"id": i, "v": 1 if i < 3 else 2} for i in range(5)])
    engine.step()
    _create(engine, "n", "SELECT id, v, row_number() OVER (ORDER BY v) AS pos FROM t")
    assert engine.verify("n").count() == 0
    schema = engine.read("n").schema
    swapped = [(2, 1, 1), (0, 1, 2), (1, 1, 3), (4, 2, 4), (3, 2, 5)]
    _mv_rows(engine, monkeypatch, "n", spark.createDataFrame(swapped, schema))
    assert engine.verify("n").count() == 0
    crossed = [(2, 1, 1), (0, 1, 2), (1, 1, 4), (4, 2, 3), (3, 2, 5)]
    _mv_rows(engine, monkeypatch, "n", spark.createDataFrame(crossed, schema))
    assert engine.verify("n").count() > 0


def test_verify_rank_filter_is_exact(engine, spark, monkeypatch):
    """rank() gives tied rows one value, so rk <= 2 keeps every tied row: exact."""
    _ties_table(engine, 12)
    _create(engine, "rk", "SELECT g, id, rk FROM (SELECT g, id, rank() OVER (PARTITION BY g "
            "ORDER BY v DESC) AS rk FROM t) r WHERE rk <= 2")
    assert engine.verify("rk").count() == 0
    mv = engine.read("rk")
    assert mv.count() == 12  # per g: the lead and both tied rows
    _mv_rows(engine, monkeypatch, "rk", mv.where("id <> 11"))
    assert [(r["id"], r["side"]) for r in engine.verify("rk").collect()] == [(11, "missing")]
