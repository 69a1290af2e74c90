"""Source tables: datagen (and its Nexmark mode), cdc_files, delta_cdf.

Oracles: a pure-Python replay of each source's input (the datagen batches as
the connector generates them, the Debezium records, the external Delta table at
each version), applied in order with sparkfill's upsert/delete semantics, must
equal the source table at every epoch; datagen's updates and deletes must hit
keys that exist in the snapshot before the epoch; malformed records must land in
the dead-letter table with their reason, once.
"""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from helpers import assert_rows_equal, rows_of
from pyspark.sql import functions as F

from sparkfill import InvalidOption, RelationExists, SourceError, SqlError
from sparkfill.sources.base import BatchContext, TableShape
from sparkfill.sources.datagen import DatagenConnector, KeySchedule
from sparkfill.sources.nexmark import ID_BASE

GEN = ("CREATE TABLE g (id BIGINT, k INT, v BIGINT, s STRING, PRIMARY KEY (id)) WITH ("
       "connector = 'datagen', rows_per_epoch = 40, seed = 7, insert_ratio = 0.5, "
       "update_ratio = 0.3, delete_ratio = 0.2, key_lifetime = 2, value_range = 5)")


def _replay(state: dict, batch_rows: list, columns: list[str], key: str) -> None:
    """Apply one staged batch (rows with _sf_idx, _sf_kind) in order: the last change
    of a key wins."""
    for r in sorted(batch_rows, key=lambda r: r["_sf_idx"]):
        if r["_sf_kind"] == "D":
            state.pop(r[key], None)
        else:
            state[r[key]] = tuple(r[c] for c in columns)


@pytest.mark.connect
def test_datagen_hits_live_keys_replays_exactly_and_is_deterministic(engine, spark):
    eng = engine
    eng.sql(GEN)
    rel = eng.relation("g")
    src = eng.sources.source_of(rel)
    sched = KeySchedule.of(40, (0.5, 0.3, 0.2), 2, 7)
    assert (sched.inserts, sched.updates, sched.deletes) == (20, 12, 8)
    connector = DatagenConnector(spark, TableShape("g", rel.columns, rel.key), src.options)
    cols = [c.name for c in rel.columns]
    model: dict = {}
    for n in range(1, 6):
        if n == 3:  # an MV created online while the source flows
            eng.sql("CREATE MATERIALIZED VIEW gm WITH (backfill = 'no_shuffle', "
                    "backfill_chunk_rows = 15) AS SELECT id, v * 2 AS w, s FROM g WHERE k <> 0")
        # deletes of batch n: the mortal ranks whose lifetime ends now
        n_del = sum(1 for r in range(sched.deletes) if n - 1 - r % 2 >= 1)
        batch = connector.read(BatchContext(n, n, None)).rows.collect()
        if n == 2:
            again = connector.read(BatchContext(n, n, None)).rows.collect()
            assert sorted(map(tuple, batch)) == sorted(map(tuple, again)), \
                "a datagen batch is not a function of (seed, n)"
        _replay(model, [r.asDict() for r in batch], cols, "id")

        rep = eng.step()
        assert rep.source_rows == {"g": sched.inserts + (sched.updates if n > 1 else 0) + n_del}
        assert rep.dead_letters == {}
        # every insert is a new key (+, not U+), every delete and update hits a live
        # key (a delete of a missing key emits nothing, an update of one emits +)
        log = eng.store.changelog(rel.stored, rep.epoch - 1, rep.epoch)
        ops = {r[0]: r[1] for r in log.groupBy("_op").count().collect()}
        assert ops.get("+", 0) == sched.inserts
        assert ops.get("-", 0) == n_del
        assert ops.get("U+", 0) == ops.get("U-", 0) and (n == 1 or ops.get("U+", 0) > 0)
        assert_rows_equal(eng.read("g"), model.values(), label=f"g at epoch {rep.epoch}")
        assert len(model) == sched.live_after(n)
        if n >= 3 and eng.progress("gm").state == "created":
            assert eng.verify("gm").count() == 0
            assert n > 3  # it backfilled over more than one epoch
    assert eng.progress("gm").state == "created"
    other = DatagenConnector(spark, TableShape("g", rel.columns, rel.key),
                             {**src.options, "seed": 8})
    assert rows_of(other.read(BatchContext(2, 2, None)).rows) != rows_of(
        connector.read(BatchContext(2, 2, None)).rows)


NEXMARK = {
    "person": "id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, "
              "state STRING, date_time TIMESTAMP, extra STRING",
    "auction": "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, "
               "reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, "
               "category BIGINT, extra STRING",
    "bid": "id BIGINT, auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
           "date_time TIMESTAMP, extra STRING",
}


def test_nexmark_streams_have_the_standard_columns_and_refer_to_each_other(engine, spark):
    eng = engine
    for stream, cols in NEXMARK.items():
        eng.sql(f"CREATE TABLE {stream} ({cols}, PRIMARY KEY (id)) WITH (connector = 'datagen',"
                f" mode = 'nexmark', nexmark_stream = '{stream}', rows_per_epoch = 500, "
                "seed = 3)")
    for n in (1, 2):
        rep = eng.step()
        assert rep.source_rows == {"person": 10, "auction": 30, "bid": 460}
        person, auction, bid = (eng.read(s) for s in NEXMARK)
        assert person.count() == 10 * n and auction.count() == 30 * n and bid.count() == 460 * n
        assert sorted(r[0] for r in person.select("id").collect()) == list(
            range(ID_BASE["person"], ID_BASE["person"] + 10 * n))
        # references: sellers and bidders are persons, bids are on auctions
        assert auction.join(person, auction.seller == person.id, "left_anti").count() == 0
        assert bid.join(person, bid.bidder == person.id, "left_anti").count() == 0
        assert bid.join(auction, bid.auction == auction.id, "left_anti").count() == 0
        assert person.where(~F.col("state").isin("AZ", "CA", "ID", "OR", "WA", "WY")
                            | ~F.col("email_address").contains("@")).count() == 0
        assert auction.where((F.col("category") < 10) | (F.col("category") > 14)
                             | (F.col("expires") <= F.col("date_time"))
                             | (F.col("reserve") < F.col("initial_bid"))).count() == 0
        assert bid.where(F.col("price") <= 0).count() == 0
    # a bid stays within its auction's window often enough for q4
    b, a = eng.read("bid").alias("b"), eng.read("auction").alias("a")
    assert b.join(a, F.col("b.auction") == F.col("a.id")).where(
        F.col("b.date_time").between(F.col("a.date_time"), F.col("a.expires"))).count() > 0
    with pytest.raises(InvalidOption, match="not fields of the Nexmark bid stream"):
        eng.sql("CREATE TABLE b2 (id BIGINT, colour STRING, PRIMARY KEY (id)) WITH ("
                "connector = 'datagen', mode = 'nexmark', nexmark_stream = 'bid')")


# --------------------------------------------------------------------------- #
# cdc_files
# --------------------------------------------------------------------------- #


def _land(directory, name: str, lines: list, mtime: float) -> None:
    """Write a file of JSON lines (dicts are dumped, strings written as they are)
    under a hidden name, then rename it: how a landing directory gets files."""
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    os.utime(tmp, (mtime, mtime))
    os.replace(tmp, os.path.join(directory, name))


CDC = ("CREATE TABLE c (id BIGINT, name STRING NOT NULL, amount DECIMAL(10,2), "
       "ts TIMESTAMP, PRIMARY KEY (id)) WITH (connector = 'cdc_files', path = '{path}', "
       "format = 'debezium_json', max_files_per_epoch = {limit})")


def _ev(op, before=None, after=None, wrap=False):
    env = {"op": op, "before": before, "after": after}
    return {"schema": {}, "payload": env} if wrap else env


def test_cdc_files_apply_in_arrival_order_and_malformed_records_go_to_dead_letters(
        engine, tmp_path):
    eng = engine
    land = tmp_path / "landing"
    land.mkdir()
    t0 = time.time() - 1000
    # b-first.json arrives first although its name sorts second
    _land(land, "b-first.json", [
        _ev("r", after={"id": 1, "name": "a", "amount": "1.50", "ts": "2024-01-01T00:00:00Z"}),
        _ev("r", after={"id": 2, "name": "b", "amount": 2, "ts": 1704067200000}),
        _ev("c", after={"id": 3, "name": "c", "amount": "3"}, wrap=True),
    ], t0)
    _land(land, "a-second.json", [
        _ev("u", before={"id": 1}, after={"id": 1, "name": "a2", "amount": "1.75"}),
        _ev("u", before={"id": 2, "name": "b"}, after={"id": 20, "name": "b2", "amount": 20},
            wrap=True),                                              # the key moves: 2 -> 20
        "",                                                         # blank: skipped
        "{not json",                                                # bad JSON
        _ev("x", after={"id": 5, "name": "x"}),                     # unknown op
        _ev("c", after={"name": "nokey"}),                          # missing key
        _ev("c", after={"id": 6, "name": "f", "amount": "lots"}),   # does not cast
        _ev("c", after={"id": 7, "name": None}),                    # NULL in NOT NULL
        _ev("d", before={"id": 3, "name": "c"}),
        _ev("c", after={"id": 3, "name": "c-again", "amount": "3.25"}),  # later line wins
        _ev("d"),                                                   # d without before
    ], t0 + 10)
    eng.sql(CDC.format(path=land, limit=1))
    cols = ["id", "name", "amount", "ts"]

    import datetime as dt
    from decimal import Decimal
    ts = dt.datetime(2024, 1, 1)
    rep = eng.step()
    assert rep.source_rows == {"c": 3} and rep.dead_letters == {"c": 0}
    want = {1: (1, "a", Decimal("1.50"), ts), 2: (2, "b", Decimal("2.00"), ts),
            3: (3, "c", Decimal("3.00"), None)}
    assert_rows_equal(eng.read("c").select(*cols), want.values(), label="after b-first.json")

    rep = eng.step()
    assert rep.dead_letters == {"c": 6}
    want[1] = (1, "a2", Decimal("1.75"), None)
    del want[2]
    want[20] = (20, "b2", Decimal("20.00"), None)
    want[3] = (3, "c-again", Decimal("3.25"), None)
    assert_rows_equal(eng.read("c").select(*cols), want.values(), label="after a-second.json")
    dead = {(r.file, r.line): (r.reason, r.raw, r.epoch)
            for r in eng.read("c__dead_letter").collect()}
    reasons = {line: reason for (_, line), (reason, _, _) in dead.items()}
    assert set(f for f, _ in dead) == {"a-second.json"}
    assert reasons == {
        4: "bad JSON: not a JSON object",
        5: "unknown op 'x'",
        6: "key column 'id' is missing or null",
        7: "column 'amount': value 'lots' is not a valid DECIMAL(10,2)",
        8: "NOT NULL column 'name' is null",
        11: "op 'd' has no before image",
    }
    assert dead[("a-second.json", 4)][1] == "{not json"
    assert {e for _, _, e in dead.values()} == {rep.epoch}
    assert eng.sql("SELECT count(*) AS n FROM c__dead_letter").collect()[0].n == 6

    # nothing new: an empty epoch; a consumed file that changes is not read again
    rep = eng.step()
    assert rep.source_rows == {"c": 0} and rep.dead_letters == {"c": 0}
    _land(land, "b-first.json", [_ev("d", before={"id": 1})], t0 + 20)
    _land(land, "c-third.json", [_ev("c", after={"id": 8, "name": "h"})], t0 + 30)
    _land(land, "_partial.json", [_ev("c", after={"id": 9, "name": "i"})], t0 + 40)
    rep = eng.step()
    assert rep.source_rows == {"c": 1}
    want[8] = (8, "h", None, None)
    assert_rows_equal(eng.read("c").select(*cols), want.values(), label="after c-third.json")
    assert eng.sql("SELECT count(*) AS n FROM c__dead_letter").collect()[0].n == 6
    assert eng.meta.source_files(eng.relation("c").id) == {
        "b-first.json", "a-second.json", "c-third.json"}


# --------------------------------------------------------------------------- #
# delta_cdf
# --------------------------------------------------------------------------- #


def _external_rows(path: str, version: int) -> list[tuple]:
    t = DeltaTable(path, version=version).to_pyarrow_table().to_pylist()
    return [(r["id"], r["v"]) for r in t]


def test_delta_cdf_follows_the_change_feed_version_by_version(engine, tmp_path):
    eng = engine
    ext = str(tmp_path / "ext")
    cdf = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(ext, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "w": [1.0, 2.0, 3.0]}),
                    configuration=cdf)                                   # v0
    write_deltalake(ext, pa.table({"id": [4], "v": ["d"], "w": [4.0]}), mode="append")  # v1
    eng.sql(f"CREATE TABLE d (id BIGINT, v STRING, PRIMARY KEY (id)) WITH ("
            f"connector = 'delta_cdf', path = '{ext}', starting_version = 1, "
            "max_versions_per_epoch = 1)")
    DeltaTable(ext).update(predicate="id = 2", updates={"v": "'bb'"})   # v2
    DeltaTable(ext).delete("id = 3")                                     # v3
    DeltaTable(ext).merge(pa.table({"id": [1, 5], "v": ["A", "E"], "w": [0.0, 0.0]}),
                          predicate="t.id = s.id", source_alias="s", target_alias="t"
                          ).when_matched_update_all().when_not_matched_insert_all().execute()  # v4
    DeltaTable(ext).update(predicate="id = 4", updates={"id": "40"})     # v5: the key moves
    for version in range(1, 6):
        rep = eng.step()
        assert rep.source_rows["d"] > 0
        assert_rows_equal(eng.read("d"), _external_rows(ext, version),
                          label=f"d vs the external table at version {version}")
    write_deltalake(ext, pa.table({"id": [6], "v": ["f"], "w": [6.0]}), mode="overwrite")  # v6
    rep = eng.step()
    assert_rows_equal(eng.read("d"), [(6, "f")], label="after an overwrite")
    rep = eng.step()
    assert rep.source_rows == {"d": 0}
    assert eng.sources.source_of(eng.relation("d")).position == {"version": 6}

    plain = str(tmp_path / "plain")
    write_deltalake(plain, pa.table({"id": [1], "v": ["a"]}))
    tables = [r.name for r in eng.sql("SHOW TABLES").collect()]
    with pytest.raises(SourceError, match="no change data feed"):
        eng.sql(f"CREATE TABLE p (id BIGINT, v STRING, PRIMARY KEY (id)) WITH ("
                f"connector = 'delta_cdf', path = '{plain}')")
    with pytest.raises(SourceError, match="no column"):
        eng.sql(f"CREATE TABLE p (id BIGINT, zz STRING, PRIMARY KEY (id)) WITH ("
                f"connector = 'delta_cdf', path = '{ext}')")
    assert [r.name for r in eng.sql("SHOW TABLES").collect()] == tables


# --------------------------------------------------------------------------- #
# DDL and DML around sources
# --------------------------------------------------------------------------- #


def test_source_tables_refuse_dml_and_rejected_definitions_change_nothing(engine, tmp_path):
    eng = engine
    land = tmp_path / "in"
    land.mkdir()
    eng.sql(CDC.format(path=land, limit=5))
    eng.sql("CREATE TABLE gen (id BIGINT, v INT, PRIMARY KEY (id)) WITH (connector = 'datagen',"
            " rows_per_epoch = 5)")
    for stmt in ("INSERT INTO c VALUES (1, 'a', 1.0, NULL)", "UPDATE gen SET v = 1",
                 "DELETE FROM c WHERE id = 1", "INSERT INTO c__dead_letter VALUES "
                 "('f', 1, 'r', 'x', 1)"):
        with pytest.raises(SqlError, match="source|dead-letter"):
            eng.sql(stmt)
    with pytest.raises(SqlError, match="fed by its datagen source"):
        eng.insert("gen", [{"id": 1, "v": 1}])
    with pytest.raises(SqlError, match="fed by its cdc_files source"):
        eng.delete("c", [{"id": 1}])
    with pytest.raises(SqlError, match="dropped with that table"):
        eng.sql("DROP TABLE c__dead_letter")

    before = [tuple(r) for r in eng.sql("SHOW TABLES").collect()]
    bad = [
        (InvalidOption, "unknown connector", "WITH (connector = 'kafka')"),
        (InvalidOption, "needs connector", "WITH (rows_per_epoch = 3)"),
        (InvalidOption, "unknown option 'colour'", "WITH (connector = 'datagen', colour = 1)"),
        (InvalidOption, "deletes must stay below inserts",
         "WITH (connector = 'datagen', insert_ratio = 0.2, delete_ratio = 0.5, "
         "update_ratio = 0.3)"),
        (InvalidOption, "must be an integer", "WITH (connector = 'datagen', rows_per_epoch = 'x')"),
        (SourceError, "is not a directory",
         f"WITH (connector = 'cdc_files', path = '{tmp_path / 'nope'}')"),
        (InvalidOption, "format must be one of",
         f"WITH (connector = 'cdc_files', path = '{land}', format = 'avro')"),
    ]
    for exc, msg, with_ in bad:
        with pytest.raises(exc, match=msg):
            eng.sql(f"CREATE TABLE bad (id BIGINT, v INT, PRIMARY KEY (id)) {with_}")
    with pytest.raises(RelationExists):
        eng.sql("CREATE TABLE gen (id BIGINT, PRIMARY KEY (id)) WITH (connector = 'datagen')")
    with pytest.raises(InvalidOption, match="one-column primary key"):
        eng.sql("CREATE TABLE bad (a BIGINT, b BIGINT, PRIMARY KEY (a, b)) WITH ("
                "connector = 'datagen')")
    assert [tuple(r) for r in eng.sql("SHOW TABLES").collect()] == before

    eng.step()
    eng.sql("CREATE MATERIALIZED VIEW cm AS SELECT reason FROM c__dead_letter")
    with pytest.raises(Exception, match="read 'c__dead_letter'"):
        eng.sql("DROP TABLE c")
    eng.sql("DROP MATERIALIZED VIEW cm")
    eng.sql("DROP TABLE c")
    names = [r.name for r in eng.sql("SHOW TABLES").collect()]
    assert names == ["gen"]
    assert [eng.catalog.get_by_id(s.rel_id).name for s in eng.sources.sources()] == ["gen"]
    rep = eng.step()
    assert rep.source_rows == {"gen": 5}
