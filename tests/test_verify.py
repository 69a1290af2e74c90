"""VERIFY with ties at a limit: ``sparkfill.verify.differences`` over hand-made
DataFrames (any of the tied rows is a right answer; anything else is reported)."""

from __future__ import annotations

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
