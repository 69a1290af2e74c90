"""Code generation by the epoch's size (``pipelines/codegen.py``): a small epoch's
queries run interpreted, a bulk epoch's under the session's own settings, and the
session's settings are back as they were after every epoch, failed ones included.
The tests' session interprets already (``session_conf.py``), so each test here
turns code generation on first and watches what the epoch's writes run under."""

from __future__ import annotations

import pytest
from helpers import check_mv, mv_sql

from sparkfill import SparkfillError
from sparkfill.pipelines.codegen import INTERPRETED_CONF, INTERPRETED_ROWS
from sparkfill.storage import relation_store

AGG = "SELECT g, count(*) AS n, sum(v) AS s, max(v) AS m FROM {src} GROUP BY g"
COMPILED = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK",
            "spark.sql.constraintPropagation.enabled": "true",
            "spark.sql.parquet.enableVectorizedReader": "true"}


@pytest.fixture
def compiled(spark):
    """The session with code generation on for the test (the suite's settings back
    after it)."""
    saved = {k: spark.conf.get(k, None) for k in COMPILED}
    for key, value in COMPILED.items():
        spark.conf.set(key, value)
    yield
    for key, value in saved.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


@pytest.fixture
def settings_seen(monkeypatch, spark):
    """The code-generation settings each append of the epoch ran under."""
    seen: list[dict[str, str | None]] = []

    def watch(real):
        def spy(store, *args, **kwargs):
            seen.append({k: spark.conf.get(k, None) for k in COMPILED})
            return real(store, *args, **kwargs)
        return spy
    for name in ("append", "append_many"):
        monkeypatch.setattr(relation_store.RelationStore, name,
                            watch(getattr(relation_store.RelationStore, name)))
    return seen


def _settings(spark):
    return {k: spark.conf.get(k, None) for k in COMPILED}


def _rows(lo, hi):
    return [{"id": i, "g": i % 7, "v": (i * 37) % 101} for i in range(lo, hi)]


def test_small_epochs_are_interpreted_bulk_ones_compiled(engine, spark, compiled,
                                                          settings_seen):
    """The first load (bulk) runs compiled; epochs of a few changes run interpreted;
    an epoch while an MV is created runs compiled; after each, the session holds its
    own settings, and the MVs equal their batch queries."""
    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.sql(f"CREATE MATERIALIZED VIEW agg AS {mv_sql(AGG, 't')}")
    engine.insert("t", _rows(0, INTERPRETED_ROWS))
    report = engine.step()
    assert settings_seen and all(s == COMPILED for s in settings_seen), settings_seen
    assert _settings(spark) == COMPILED
    check_mv(engine, spark, "agg", AGG, "t", report.epoch)

    settings_seen.clear()
    engine.insert("t", _rows(INTERPRETED_ROWS, INTERPRETED_ROWS + 5))
    engine.delete("t", [{"id": 3}, {"id": 4}])
    report = engine.step()
    assert settings_seen and all(s == INTERPRETED_CONF for s in settings_seen), settings_seen
    assert _settings(spark) == COMPILED
    check_mv(engine, spark, "agg", AGG, "t", report.epoch)

    # an MV being created: its backfill chunks are bulk work
    engine.sql("CREATE MATERIALIZED VIEW big WITH (backfill_chunk_rows = 1000) AS "
               "SELECT g, sum(v) AS s FROM t GROUP BY g")
    settings_seen.clear()
    engine.insert("t", _rows(INTERPRETED_ROWS + 5, INTERPRETED_ROWS + 8))
    report = engine.step()
    assert report.backfill_rows.get("big"), report
    assert settings_seen and all(s == COMPILED for s in settings_seen), settings_seen
    assert _settings(spark) == COMPILED
    check_mv(engine, spark, "agg", AGG, "t", report.epoch)


def test_a_failed_small_epoch_leaves_the_session_settings(engine, spark, compiled,
                                                         monkeypatch):
    """An epoch that fails after it turned code generation off puts the session's
    settings back; the next step runs it again, exact."""
    engine.sql("CREATE TABLE t (id BIGINT, g INT, v BIGINT, PRIMARY KEY (id))")
    engine.sql(f"CREATE MATERIALIZED VIEW agg AS {mv_sql(AGG, 't')}")
    engine.insert("t", _rows(0, 50))
    engine.step()
    real = relation_store.RelationStore.append_many
    under: list[dict[str, str | None]] = []

    def broken(store, *args, **kwargs):
        under.append(_settings(spark))
        raise OSError("disk gone")
    monkeypatch.setattr(relation_store.RelationStore, "append_many", broken)
    engine.insert("t", _rows(50, 53))
    with pytest.raises(SparkfillError, match="disk gone"):
        engine.step()
    assert under == [INTERPRETED_CONF]
    assert _settings(spark) == COMPILED
    monkeypatch.setattr(relation_store.RelationStore, "append_many", real)
    report = engine.step()
    assert _settings(spark) == COMPILED
    check_mv(engine, spark, "agg", AGG, "t", report.epoch)


def test_an_epoch_error_is_not_hidden_by_a_session_that_cannot_restore():
    """When the epoch failed and the session cannot take its settings back (it is
    gone), the epoch's own error is the one raised; without an epoch error, the
    restore's own error is raised."""
    from sparkfill.pipelines.codegen import Interpreted

    class Conf:
        def __init__(self):
            self.values: dict[str, str] = {}
            self.broken = False

        def get(self, key, default=None):
            return self.values.get(key, default)

        def set(self, key, value):
            if self.broken:
                raise ConnectionError("session gone")
            self.values[key] = value

        def unset(self, key):
            self.set(key, None)

    class Session:
        conf = Conf()

    session = Session()
    with pytest.raises(ValueError, match="the epoch's error"):
        with Interpreted(session) as codegen:
            codegen.interpret()
            assert session.conf.values == INTERPRETED_CONF
            session.conf.broken = True
            raise ValueError("the epoch's error")
    with pytest.raises(ConnectionError):
        with Interpreted(session) as codegen:
            session.conf.broken = False
            codegen.interpret()
            session.conf.broken = True
