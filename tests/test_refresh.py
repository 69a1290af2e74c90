"""The refresh of a created MV: incremental, or a recompute whose difference is
its changelog (``refresh = 'incremental' | 'full' | 'auto'``).

The oracle checks every shape recomputed at every epoch, a switch between the
modes mid-stream, MVs downstream of a recomputed one (they take its difference as
their change) and the automatic choice on a large and a small change; the choice's
cost model is checked without Spark.
"""

from __future__ import annotations

import random

import pytest
from helpers import assert_rows_equal, assert_same_rows
from test_incremental_sql import GRAMMAR_SHAPES, _shape, check, dim_dml, start_workload

from sparkfill import Engine, InvalidOption, RefreshChoice
from sparkfill.options import BackfillOptions
from sparkfill.pipelines import refresh as refresh_policy
from sparkfill.pipelines.refresh import RefreshPolicy

#: shapes of every operator: rows, aggregates (running, kept input, global, DISTINCT,
#: FILTER), joins (inner, outer, with an aggregate, three-way), UNION ALL, window
#: functions, subqueries and an aggregate of an aggregate; CI runs the joins whose state
#: a switch of mode rebuilds (an outer join, a join under an aggregate, a three-way
#: chain), the other groups are extended variants
SHAPE_GROUPS = {
    "rows_and_aggregates": ["project", "agg", "global", "distinct", "filter_agg", "window",
                            "window_top", "agg_of_agg"],
    "joins": ["full_join", "join_agg", "three_way"],
    "links": ["join", "union", "in_subquery"],
}


def _shapes(kinds: list[str], seed: int) -> dict[str, tuple[str, list[str]]]:
    rng = random.Random(seed)
    out = {}
    for kind in kinds:
        where = "" if kind in GRAMMAR_SHAPES else rng.choice(["", " WHERE v % 3 <> 0"])
        out[f"m_{kind}"] = _shape(rng, kind, where)
    return out


@pytest.mark.parametrize("group", [
    g if g == "joins" else pytest.param(g, marks=pytest.mark.extended)
    for g in sorted(SHAPE_GROUPS)])
def test_recomputed_mvs_match_batch_every_epoch_and_feed_downstream(spark, tmp_path, group):
    """Every shape with ``refresh = 'full'``: exact at every epoch (time travel too),
    the report says each was recomputed; an incremental MV over each one takes the
    difference as its change; halfway the MVs switch to incremental and back."""
    rng = random.Random(7)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        work, dims = start_workload(eng, spark, rng, key_space=500, rows=300)
        shapes = _shapes(SHAPE_GROUPS[group], seed=len(group))
        for name, (sql, _) in shapes.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking', "
                    f"refresh = 'full') AS " + sql.format(t="t", d="d"))
        eng.step()
        # downstream of two recomputed MVs: incremental, over their differences
        first, second = list(shapes)[:2]
        down = {f"down_{first}": f"SELECT * FROM {first}",
                f"down_{second}": f"SELECT count(*) AS n FROM {second}"}
        for name, sql in down.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking', "
                    f"refresh = 'incremental') AS {sql}")
        eng.step()
        checked: list[int] = []
        took: dict[str, int] = {"full": 0, "incremental": 0}
        for epoch_no in range(3):
            want = "incremental" if epoch_no == 1 else "full"
            if epoch_no in (1, 2):  # to incremental mid-stream, and back to full after
                for name in shapes:
                    eng.sql(f"ALTER MATERIALIZED VIEW {name} SET refresh = '{want}'")
            work.random_epoch_dml()
            dim_dml(eng, rng, dims)
            report = eng.step()
            for name, (sql, tables) in shapes.items():
                check(eng, spark, name, sql, tables, report.epoch)
                if name in report.refresh:
                    choice = report.refresh[name]
                    assert isinstance(choice, RefreshChoice)
                    assert choice.mode == want, (name, report.epoch, choice)
                    assert choice.reason == f"refresh = '{want}'"
                    took[want] += 1
            for name, sql in down.items():
                assert_same_rows(eng.read(name, as_of=report.epoch),
                                 spark.sql(sql.replace(name[5:], "{u}"),
                                           u=eng.read(name[5:], as_of=report.epoch)),
                                 label=f"{name} at epoch {report.epoch}")
                if name in report.refresh:
                    assert report.refresh[name].mode == "incremental"
            checked.append(report.epoch)
        # most MVs changed in most epochs (a few DML rows may miss a filter or a join)
        assert took["full"] >= len(shapes) and took["incremental"] >= len(shapes) // 3, took
        recomputed = [n for n in shapes if eng.progress(n).state == "created"]
        assert recomputed == list(shapes)
        # time travel: a recomputed epoch still reads what the batch query said
        for name, (sql, tables) in shapes.items():
            check(eng, spark, name, sql, tables, checked[0])
        for name in shapes:
            assert eng.verify(name).count() == 0, name
    finally:
        eng.close()


def test_auto_recomputes_a_large_change_and_takes_a_small_one_incrementally(spark, tmp_path,
                                                                          monkeypatch):
    """``refresh = 'auto'`` (the default): a bulk UPDATE of the whole table is
    recomputed (by an aggregate; a projection's rows follow their leaf's one by
    one), a few changed rows are not; exact either way, downstream too; a
    running aggregate's emptied groups leave it under a recompute."""
    monkeypatch.setattr(refresh_policy, "MIN_FULL_ROWS", 200)
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        eng.insert("t", spark.range(3000).selectExpr("id", "CAST(id % 7 AS INT) AS g",
                                                     "id * 3 % 101 AS v"))
        eng.step()
        queries = {
            "agg": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx FROM t GROUP BY g",
            "proj": "SELECT id, g, v * 2 AS w FROM t WHERE v % 3 <> 0",
            "top": "SELECT g, c FROM agg WHERE c > 100",
        }
        for name, sql in queries.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
            eng.step()

        def step_and_check() -> dict[str, RefreshChoice]:
            report = eng.step()
            for name, sql in queries.items():
                tables = {"t", "agg"} & set(sql.replace(",", " ").split())
                frames = {n: eng.read(n, as_of=report.epoch) for n in tables}
                text = sql
                for n in tables:
                    text = text.replace(f"FROM {n}", "FROM {" + n + "}")
                assert_same_rows(eng.read(name, as_of=report.epoch), spark.sql(text, **frames),
                                 label=f"{name} at epoch {report.epoch}")
            return report.refresh

        eng.sql("UPDATE t SET v = v + 1 WHERE id < 20")  # 20 of 3,000 rows
        small = step_and_check()
        assert small["agg"].mode == "incremental" and "fewer than 200" in small["agg"].reason
        eng.sql("UPDATE t SET v = v + 1")  # every row
        large = step_and_check()
        assert large["agg"].mode == "full", large
        # a projection's change is all a recompute would find, but one about its size
        # costs more to apply than its rows written whole
        assert large["proj"].mode == "full" and "one by one" in large["proj"].reason
        assert small["proj"].mode == "incremental" and "one by one" in small["proj"].reason
        assert "both costs not measured yet" in large["agg"].reason
        # the groups g = 5 and 6 emptied by deletes: gone from a recomputed aggregate
        eng.sql("DELETE FROM t WHERE g >= 5 OR id % 2 = 0")
        emptied = step_and_check()
        assert emptied["agg"].mode == "full", emptied
        assert {r["g"] for r in eng.read("agg").collect()} == {0, 1, 2, 3, 4}
        assert eng.verify("agg").count() == 0 and eng.verify("proj").count() == 0
    finally:
        eng.close()


def test_refresh_option_is_validated_and_a_bad_value_changes_nothing(engine):
    engine.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    with pytest.raises(InvalidOption, match="unknown refresh mode 'sometimes'"):
        engine.sql("CREATE MATERIALIZED VIEW m WITH (refresh = 'sometimes') AS "
                   "SELECT id, v FROM t")
    assert [r.name for r in engine.catalog.all() if r.kind == "mv"] == []
    engine.sql("CREATE MATERIALIZED VIEW m WITH (refresh = 'FULL') AS SELECT id, v FROM t")
    assert engine.catalog.get("m").options.refresh == "full"
    assert engine.explain("m").splitlines()[-1] == "refresh: full"  # EXPLAIN says it
    with pytest.raises(InvalidOption, match="unknown refresh mode"):
        engine.sql("ALTER MATERIALIZED VIEW m SET refresh = 'never'")
    assert engine.catalog.get("m").options.refresh == "full"
    engine.sql("ALTER MATERIALIZED VIEW m SET refresh = DEFAULT")
    assert engine.catalog.get("m").options.refresh == "auto"
    engine.sql("SET refresh = 'incremental'")  # the session's default for new MVs
    engine.sql("CREATE MATERIALIZED VIEW m2 AS SELECT id FROM t")
    assert engine.catalog.get("m2").options.refresh == "incremental"


def test_an_option_stored_before_refresh_existed_reads_as_auto():
    stored = BackfillOptions().to_json()
    stored.pop("refresh")
    assert BackfillOptions.from_json(stored).refresh == "auto"


class _Mv:
    def __init__(self, refresh: str = "auto") -> None:
        self.id = 1
        self.options = BackfillOptions(refresh=refresh)
        self.plan = None  # (a plan's shape is checked by the engine tests above)


def test_the_choice_follows_the_change_then_the_measured_costs():
    policy = RefreshPolicy()
    mv = _Mv()
    small = policy.choose(mv, refresh_policy.MIN_FULL_ROWS - 1, 10**9)  # type: ignore[arg-type]
    assert small.mode == "incremental"
    below = policy.choose(mv, 400_000, 1_000_000)  # type: ignore[arg-type]
    above = policy.choose(mv, 600_000, 1_000_000)  # type: ignore[arg-type]
    assert (below.mode, above.mode) == ("incremental", "full")
    # measured: incremental costs 1 s + 40 us per row, a recompute 3 us per leaf row
    for rows in (10_000, 20_000, 40_000):
        policy.record(1, "incremental", rows, 1_000_000, 1.0 + 4e-5 * rows)
    policy.record(1, "full", 50_000, 1_000_000, 3.0)
    assert policy.incremental_seconds(1, 100_000) == pytest.approx(5.0)
    assert policy.full_seconds(1, 2_000_000) == pytest.approx(6.0)
    # 30,000 rows: incremental 2.2 s < 3 s; 60,000: 3.4 s > 3 s (both below 50%)
    at_30k = policy.choose(mv, 30_000, 1_000_000)  # type: ignore[arg-type]
    at_60k = policy.choose(mv, 60_000, 1_000_000)  # type: ignore[arg-type]
    assert (at_30k.mode, at_60k.mode) == ("incremental", "full")
    assert at_60k.reason.startswith("measured: incremental about 3.40s, recompute about 3.00s")
    # forced either way
    assert policy.choose(_Mv("full"), 1, 10**9).mode == "full"  # type: ignore[arg-type]
    assert policy.choose(_Mv("incremental"), 10**9, 1).mode == "incremental"  # type: ignore[arg-type]


def _tamper(eng, name: str, column: str, shift: int) -> int:
    """Add ``shift`` to ``column`` in every row of one of ``name``'s data files, in
    place (a hand-edited file); returns the rows changed."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    rel = eng.relation(name)
    files = [f for f in eng.store.files_at(rel.stored, eng.committed_epoch) if f.rows]
    target = max(files, key=lambda f: f.rows)
    table = pq.read_table(target.uri)
    i = table.schema.get_field_index(column)
    table = table.set_column(i, table.schema.field(i),
                             pc.add(table.column(i), pa.scalar(shift, table.schema.field(i).type)))
    pq.write_table(table, target.uri)
    return table.num_rows


def test_recompute_repairs_a_tampered_mv_and_its_state_without_touching_dependents(
        spark, tmp_path):
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
        eng.insert("t", spark.range(600).selectExpr("id", "CAST(id % 6 AS INT) AS g",
                                                    "id * 7 % 101 AS v"))
        eng.step()
        agg_sql = "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx FROM t GROUP BY g"
        eng.sql(f"CREATE MATERIALIZED VIEW agg WITH (backfill = 'blocking') AS {agg_sql}")
        eng.step()
        eng.sql("CREATE MATERIALIZED VIEW over_agg WITH (backfill = 'blocking') AS "
                "SELECT g, sv FROM agg WHERE c > 0")
        eng.step()
        # the max keeps no input rows (a lost one is found again in t): its hidden
        # count of each group's rows at the max is what a repair must also restore
        assert not eng.store.files_at(eng.relation(eng.relation("agg").plan.states[-1]).stored,
                                      eng.committed_epoch)
        ties = next(c.name for c in eng.relation("agg").columns
                    if c.hidden and c.name.endswith("_x"))
        assert _tamper(eng, "agg", "sv", 1000) > 0
        assert _tamper(eng, "agg", ties, 500) > 0
        assert eng.verify("agg").count() > 0  # VERIFY sees the tampering
        over_agg_dir = eng.relation("over_agg").dir

        eng.sql("ALTER MATERIALIZED VIEW agg RECOMPUTE")
        eng.close()  # the request is persisted: a restart still honours it
        eng = Engine(tmp_path / "wh", spark=spark)
        report = eng.step()  # no DML: the repair runs on its own
        assert report.refresh["agg"].mode == "full"
        assert "RECOMPUTE" in report.refresh["agg"].reason
        assert eng.verify("agg").count() == 0
        assert eng.verify("over_agg").count() == 0
        assert eng.relation("over_agg").dir == over_agg_dir  # never rebuilt
        # the counts at the max were repaired too: deletes that take every group's
        # max away find it again (a count left at 500 would keep the deleted max)
        eng.sql("DELETE FROM t WHERE v >= 90")
        report = eng.step()
        assert "agg" not in report.refresh or report.refresh["agg"].reason != \
            "ALTER MATERIALIZED VIEW ... RECOMPUTE"  # a request is honoured once
        assert_same_rows(eng.read("agg"), spark.sql(agg_sql.replace("FROM t", "FROM {t}"),
                                                    t=eng.read("t")), label="agg after deletes")
        assert eng.verify("over_agg").count() == 0
    finally:
        eng.close()


def test_recompute_is_refused_for_what_it_cannot_rebuild(engine):
    from sparkfill import SqlError, UnknownRelation
    engine.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
    with pytest.raises(SqlError, match="is a table"):
        engine.sql("ALTER MATERIALIZED VIEW t RECOMPUTE")
    with pytest.raises(UnknownRelation):
        engine.sql("ALTER MATERIALIZED VIEW nope RECOMPUTE")
    engine.sql("CREATE MATERIALIZED VIEW m AS SELECT id, v FROM t")
    with pytest.raises(SqlError, match="still being created"):
        engine.sql("ALTER MATERIALIZED VIEW m RECOMPUTE")
    assert engine.coordinator.recompute_requested() == []


def _tamper_one_row(eng, name: str, column: str) -> None:
    """Add 1,000 to ``column`` in the first row of one of ``name``'s data files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rel = eng.relation(name)
    target = next(f for f in eng.store.files_at(rel.stored, eng.committed_epoch) if f.rows)
    table = pq.read_table(target.uri)
    i = table.schema.get_field_index(column)
    values = table.column(i).to_pylist()
    values[0] += 1000
    table = table.set_column(i, table.schema.field(i),
                             pa.array(values, table.schema.field(i).type))
    pq.write_table(table, target.uri)


def test_a_sampled_verify_finds_a_wrong_row_with_its_probability_and_runs_every_n_epochs(
        spark, tmp_path):
    from sparkfill.cli import status_facts
    from sparkfill.sql.frontend import Verify, parse_statement

    assert parse_statement("VERIFY MATERIALIZED VIEW m SAMPLE 0.1") == Verify("m", None, 0.1)
    assert parse_statement("verify materialized view m as of 3 sample 10 percent") == \
        Verify("m", 3, 0.1)
    with pytest.raises(InvalidOption, match=r"fraction of rows in \(0, 1\]"):
        parse_statement("VERIFY MATERIALIZED VIEW m SAMPLE 5")
    eng = Engine(tmp_path / "wh", spark=spark)
    try:
        eng.sql("CREATE TABLE t (id BIGINT, v BIGINT, PRIMARY KEY (id))")
        eng.insert("t", spark.range(400).selectExpr("id", "id * 3 % 97 AS v"))
        eng.step()
        eng.sql("CREATE MATERIALIZED VIEW proj WITH (backfill = 'blocking') AS "
                "SELECT id, v * 2 AS w FROM t WHERE v % 5 <> 0")
        eng.step()
        assert all(eng.verify("proj", sample=0.5).count() == 0 for _ in range(3))
        with pytest.raises(InvalidOption):
            eng.verify("proj", sample=0)
        _tamper_one_row(eng, "proj", "w")
        assert eng.verify("proj", sample=1.0).count() == 2  # its wrong and its right image
        # each image is in a sample of 25% with probability 0.25: found with 1 - 0.75^2
        found = sum(eng.sql("VERIFY MATERIALIZED VIEW proj SAMPLE 25 PERCENT").count() > 0
                    for _ in range(16))
        # about 0.4375 * 16 = 7; outside [1, 13] has probability below 0.05%
        assert 1 <= found <= 13, found

        eng.sql("SET verify_every = 2")
        eng.sql("SET verify_sample = 1")
        reports = [eng.step() for _ in range(2)]
        flagged = [w for r in reports for w in r.warnings if "sampled VERIFY" in w]
        assert len(flagged) == 1 and "'proj'" in flagged[0] and "2 differing" in flagged[0]
        facts = status_facts(eng.meta, eng.path)
        assert facts["verified"] == [{"name": "proj", "epoch": reports[-1].epoch
                                      if reports[-1].epoch % 2 == 0 else reports[0].epoch,
                                      "sample": 1.0, "differences": 2}]
        eng.sql("ALTER MATERIALIZED VIEW proj RECOMPUTE")
        eng.step()
        assert eng.verify("proj").count() == 0
    finally:
        eng.close()


def _load_t_and_d(eng, spark, rows: int, groups: int) -> None:
    """``t(id, g, v)`` of ``rows`` rows over 7 groups and ``d(g, name)`` of ``groups``
    rows, committed."""
    eng.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    eng.sql("CREATE TABLE d (g INT, name STRING, PRIMARY KEY (g))")
    eng.insert("t", spark.range(rows).selectExpr("id", "CAST(id % 7 AS INT) AS g",
                                                 "id * 13 % 89 AS v"))
    eng.insert("d", [{"g": g, "name": f"n{g}"} for g in range(groups)])
    eng.step()


def _check_over_t_and_d(eng, spark, queries: dict[str, str], epoch: int,
                        mvs_read: tuple[str, ...] = ()) -> None:
    """Each MV of ``queries`` (over ``t``, ``d`` and the MVs ``mvs_read``) equals its
    batch query over their rows at ``epoch``."""
    frames = {n: eng.read(n, as_of=epoch) for n in ("t", "d", *mvs_read)}
    for name, sql in queries.items():
        text = sql.replace("FROM t", "FROM {t} AS t").replace("JOIN d", "JOIN {d} AS d")
        for mv in mvs_read:
            text = text.replace(f"FROM {mv}", "FROM {" + mv + "}")
        assert_same_rows(eng.read(name, as_of=epoch), spark.sql(text, **frames),
                         label=f"{name} at epoch {epoch}")


def _is_base_of(eng, stored, epoch: int) -> bool:
    """Whether the relation ``stored`` is a base written by ``epoch`` alone (as
    committed; in its latest Delta version once ``epoch`` failed before its commit)."""
    files = (eng.store.files_at(stored, epoch) if epoch <= eng.committed_epoch else
             eng.store.files(stored, eng.store.latest_version(stored)))
    return bool(files) and all(f.kind == "base" and f.compaction_epoch == epoch
                               for f in files)


def test_a_bulk_update_rewrites_state_tables_exactly_and_a_rerun_after_a_crash_too(
        spark, tmp_path, monkeypatch):
    """A state Δ of about as many rows as its table (a bulk UPDATE) is written as
    the table's new rows, not appended: exact then and after (the operators read the
    rewritten state), earlier epochs still readable, and an epoch that failed after
    its rewrites leaves none of the frames it cached in the session and re-runs to
    the same result."""
    from scale import at_scale, compact_often

    from sparkfill.pipelines import coordinator as coordinator_mod

    at_scale(monkeypatch)
    eng = Engine(tmp_path / "wh", spark=spark)
    compact_often(eng)
    queries = {
        # a running max over a join keeps its input rows (over one leaf it keeps none)
        "run_agg": "SELECT t.g, count(*) AS c, max(t.v) AS mx FROM t JOIN d ON t.g = d.g "
                   "GROUP BY t.g",
        "run_leaf": "SELECT g, count(*) AS c, max(v) AS mx FROM t GROUP BY g",
        "glob": "SELECT count(*) AS c, avg(v) AS av FROM t",
        "inner": "SELECT t.id, t.v, d.name FROM t JOIN d ON t.g = d.g",
    }

    def check_all(epoch: int) -> None:
        _check_over_t_and_d(eng, spark, queries, epoch)

    try:
        _load_t_and_d(eng, spark, rows=300, groups=5)
        for name, sql in queries.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS {sql}")
        eng.step()
        # d changes: the inner join looks t's side up, so that side's state is kept
        eng.insert("d", [{"g": 5, "name": "n5"}])
        assert not eng.store.files_at(eng.relation(eng.relation("inner").plan.states[0])
                                      .stored, eng.step().epoch - 1)
        check_all(eng.committed_epoch)
        before = eng.committed_epoch
        eng.sql("UPDATE t SET v = v + 3")  # every row: 600 changelog rows per state table
        report = eng.step()
        check_all(report.epoch)
        check_all(before)  # time travel: the state's old files wait for vacuum
        rewritten = {}
        for name, side in (("run_agg", -1), ("glob", -1), ("inner", 0)):  # t's states
            for state in [eng.relation(name).plan.states[side]]:
                rewritten[state] = _is_base_of(eng, eng.relation(state).stored, report.epoch)
        assert all(rewritten.values()), rewritten
        # small changes read the rewritten states
        eng.sql("UPDATE t SET v = v + 100 WHERE id % 37 = 1")
        eng.sql("DELETE FROM t WHERE id % 53 = 2")
        eng.insert("d", [{"g": 6, "name": "n6"}])
        check_all(eng.step().epoch)

        # an epoch that fails after its rewrites is re-run from its plan on reopen
        real_flush = coordinator_mod.EpochAppends.flush

        def failing_flush(self):
            raise RuntimeError("injected crash after the rewrites")
        monkeypatch.setattr(coordinator_mod.EpochAppends, "flush", failing_flush)
        eng.sql("UPDATE t SET v = v * 2")
        frame_class = type(spark.range(1))
        real_persist, cached = frame_class.persist, []

        def recorded_persist(self, *args, **kwargs):
            cached.append(real_persist(self, *args, **kwargs))
            return cached[-1]
        monkeypatch.setattr(frame_class, "persist", recorded_persist)
        with pytest.raises(Exception, match="injected crash"):
            eng.step()
        monkeypatch.setattr(frame_class, "persist", real_persist)
        # the failed epoch cached the rewritten tables' Δs; it released every one
        assert cached, "the failed epoch cached no frame: the check below proves nothing"
        still = [df for df in cached if df.is_cached or df.storageLevel.useMemory
                 or df.storageLevel.useDisk]
        assert not still, f"{len(still)} of {len(cached)} frames still cached"
        monkeypatch.setattr(coordinator_mod.EpochAppends, "flush", real_flush)
        eng.close()
        eng = Engine(tmp_path / "wh", spark=spark)  # recovers: re-runs the epoch
        compact_often(eng)
        check_all(eng.committed_epoch)
        for name in queries:
            assert eng.verify(name).count() == 0, name
    finally:
        eng.close()


def test_an_mv_nothing_reads_is_written_whole_and_a_retry_that_chooses_otherwise_is_exact(
        spark, tmp_path, monkeypatch):
    """A recomputed MV (and state) whose changelog nothing reads, and a table or MV
    whose Δ is about its size, are written as a new base, not compared and appended:
    exact at every epoch and by time travel, a sink behind one rewrites its table; a
    recomputed MV read by another is still compared (its Δ is its downstream's
    change), and a rewritten relation's Δ is still its readers' change. An epoch
    that failed after such a rewrite, re-run with the other choice (incremental),
    takes the rewritten rows and their difference, and its counts stay right."""
    from deltalake import DeltaTable
    from scale import at_scale, compact_often

    from sparkfill.pipelines import coordinator as coordinator_mod
    from sparkfill.progress import RefreshChoice as Choice

    at_scale(monkeypatch)
    rng = random.Random(11)
    eng = Engine(tmp_path / "wh", spark=spark)
    compact_often(eng)
    queries = {
        "agg_join": "SELECT t.g, count(*) AS c, max(t.v) AS mx FROM t JOIN d ON t.g = d.g "
                    "GROUP BY t.g",
        "inner": "SELECT t.id, t.v, d.name FROM t JOIN d ON t.g = d.g WHERE t.v % 2 = 0",
        "seen": "SELECT t.id, t.v, d.name FROM t JOIN d ON t.g = d.g",
        "proj": "SELECT id, g, v * 2 AS w FROM t WHERE v % 3 <> 0",
        "down": "SELECT name, count(*) AS n FROM seen GROUP BY name",
    }
    full = ("agg_join", "inner", "seen")

    def check_all(epoch: int) -> None:
        _check_over_t_and_d(eng, spark, queries, epoch, mvs_read=("seen",))

    def written_whole(name: str, epoch: int, state: bool = False) -> bool:
        """Whether ``name`` (its aggregate's state) is a base of ``epoch`` alone."""
        rel = eng.relation(name)
        return _is_base_of(eng, eng.relation(rel.plan.states[-1]).stored if state
                           else rel.stored, epoch)

    def state_written_whole(name: str, epoch: int) -> bool:
        return written_whole(name, epoch, state=True)

    def dml() -> None:
        eng.insert("t", [{"id": rng.randrange(600), "g": rng.randrange(7),
                          "v": rng.randrange(90)} for _ in range(30)])
        eng.delete("t", [{"id": rng.randrange(600)} for _ in range(8)])

    try:
        _load_t_and_d(eng, spark, rows=400, groups=6)
        for name, sql in queries.items():
            mode = "full" if name in full else "incremental"
            if name == "down":  # over `seen`, once it is created
                eng.step()
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking', "
                    f"refresh = '{mode}') AS {sql}")
        sink = tmp_path / "sink"
        eng.sql(f"CREATE SINK s FROM inner WITH (connector = 'delta', path = '{sink}')")
        eng.step()
        epochs = []
        for i in range(4):
            if i == 2:
                eng.sql("UPDATE t SET v = v + 1")  # every row: proj's Δ is twice its size
            else:
                dml()
            eng.insert("d", [{"g": rng.randrange(8), "name": f"x{i}"}])
            report = eng.step()
            check_all(report.epoch)
            epochs.append(report.epoch)
            assert written_whole("inner", report.epoch), report.epoch
            # the aggregate's input rows (kept: a max over a join) too
            assert state_written_whole("agg_join", report.epoch), report.epoch
            # read by `down`: compared, its difference appended as its log, or (a Δ
            # about its size) written whole, the difference `down`'s change
            assert written_whole("seen", report.epoch) == (i == 2), report.epoch
            # the table itself, when every row changed (its Δ is the MVs' change)
            assert written_whole("t", report.epoch) == (i == 2), report.epoch
            assert report.refresh["inner"].mode == "full"
            rows = eng.read("inner").select("id", "v", "name").collect()
            assert sorted(map(tuple, rows)) == sorted(
                tuple(r.values()) for r in DeltaTable(str(sink)).to_pyarrow_table()
                .select(["id", "v", "name"]).to_pylist())
        assert written_whole("proj", epochs[2])  # incremental, its Δ about its size
        for epoch in (epochs[0], epochs[2]):  # time travel: the oldest rewritten, the bulk one
            check_all(epoch)

        # an epoch fails after its rewrites; its retry takes the change incrementally
        real_flush = coordinator_mod.EpochAppends.flush

        def failing_flush(self):
            raise RuntimeError("injected crash after the rewrites")
        monkeypatch.setattr(coordinator_mod.EpochAppends, "flush", failing_flush)
        dml()  # a small change: the retry appends Δs where the first run rewrote
        with pytest.raises(Exception, match="injected crash"):
            eng.step()
        failed_epoch = eng.committed_epoch + 1
        assert written_whole("inner", failed_epoch)
        assert state_written_whole("agg_join", failed_epoch)
        monkeypatch.setattr(coordinator_mod.EpochAppends, "flush", real_flush)
        monkeypatch.setattr(RefreshPolicy, "choose", lambda self, mv, changed, leaf_rows:
                            Choice("incremental", "the retry's choice"))
        eng.close()
        eng = Engine(tmp_path / "wh", spark=spark)  # recovers: re-runs the epoch
        compact_often(eng)
        assert eng.committed_epoch == failed_epoch
        check_all(failed_epoch)
        for name in queries:
            assert eng.relation(name).row_count == eng.read(name).count(), name
        dml()
        eng.insert("d", [{"g": 3, "name": "after"}])
        check_all(eng.step().epoch)
        for name in queries:
            assert eng.verify(name).count() == 0, name
    finally:
        eng.close()


def test_an_update_of_every_row_is_the_tables_new_rows_with_any_dml_beside_it(
        spark, tmp_path, monkeypatch):
    """An UPDATE that sets no key column stages each key once; with no WHERE it
    stages every row of the committed epoch, so its epoch writes those rows as the
    table's new base with no old row kept and no pairing of keys. The table equals a
    model of the DML applied in order, and each MV its batch query, at every epoch:
    such an UPDATE alone, beside INSERTs before it and DELETEs after it, one with a
    WHERE (the other rows stay), and two UPDATEs in one epoch (the later one wins)."""
    from scale import at_scale

    from sparkfill.storage.dml import updated_at

    at_scale(monkeypatch)
    eng = Engine(tmp_path / "wh", spark=spark)
    queries = {
        "agg": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx FROM t GROUP BY g",
        "proj": "SELECT id, v * 2 AS w FROM t WHERE v % 3 <> 0",
        "inner": "SELECT t.id, t.v, d.name FROM t JOIN d ON t.g = d.g",
    }
    model = {i: (i % 7, i * 13 % 89) for i in range(300)}

    def check_epoch(epoch: int) -> None:
        assert_rows_equal(eng.read("t", as_of=epoch).select("id", "g", "v"),
                          [(i, g, v) for i, (g, v) in model.items()],
                          label=f"t at epoch {epoch}")
        _check_over_t_and_d(eng, spark, queries, epoch)

    def staged_shapes() -> list:
        return [updated_at(b.path) for b in eng.meta.staged()]

    try:
        _load_t_and_d(eng, spark, rows=300, groups=7)
        for name, sql in queries.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH (backfill = 'blocking') AS {sql}")
        check_epoch(eng.step().epoch)

        committed = eng.committed_epoch
        eng.sql("UPDATE t SET v = v + 1")
        assert staged_shapes() == [(committed, True)]
        model = {i: (g, v + 1) for i, (g, v) in model.items()}
        report = eng.step()
        check_epoch(report.epoch)
        assert _is_base_of(eng, eng.relation("t").stored, report.epoch)

        # an INSERT of a new key and of an existing one before it, a DELETE after: the
        # UPDATE's rows are the committed ones (it does not see the inserts)
        committed = eng.committed_epoch
        eng.insert("t", [{"id": 1000, "g": 2, "v": 1}, {"id": 5, "g": 5, "v": 777}])
        eng.sql("UPDATE t SET v = v * 2")
        eng.delete("t", [{"id": 7}])
        assert staged_shapes()[-2:] == [(committed, True), None]
        model = {i: (g, v * 2) for i, (g, v) in model.items() if i != 7}
        model[1000] = (2, 1)
        check_epoch(eng.step().epoch)

        # most rows, each key once (the table is still written whole); the rest stays
        eng.sql("UPDATE t SET v = v - 1 WHERE g <> 3")
        assert staged_shapes() == [(eng.committed_epoch, False)]
        model = {i: (g, v if g == 3 else v - 1) for i, (g, v) in model.items()}
        report = eng.step()
        check_epoch(report.epoch)
        assert _is_base_of(eng, eng.relation("t").stored, report.epoch)

        eng.sql("UPDATE t SET v = v + 5")
        eng.sql("UPDATE t SET v = v + 7 WHERE g = 1")  # from the committed rows too
        model = {i: (g, v + (7 if g == 1 else 5)) for i, (g, v) in model.items()}
        check_epoch(eng.step().epoch)
        for name in queries:
            assert eng.verify(name).count() == 0, name
    finally:
        eng.close()
