"""The Nexmark queries as materialized views over sparkfill's Nexmark datagen.

The standard set (q0-q22) and the common extensions (q101-q106), written as the
streaming engines ship them as materialized views, adapted to Spark SQL and to our
streams: ``bid`` has a key (``id``) and a processing-time column (``p_time
TIMESTAMP AS PROCTIME()``: the time of the epoch that wrote the row, which q12's
windows are over), and a time window is a ``TUMBLE`` or ``HOP`` in FROM.
A query the engine refuses is named in ``REFUSED`` (none now). Shared by
``tests/test_nexmark.py`` and ``bench/nexmark_bench.py``.
"""

from __future__ import annotations

from typing import Any

import sqlglot

from sparkfill.sql.rewrite import time_windows_to_derived

#: the three generated streams (10 events per epoch and table unless changed) and
#: the bounded side input of q13
DDL = {
    "person": (
        "CREATE TABLE person (id BIGINT, name STRING, email_address STRING, "
        "credit_card STRING, city STRING, state STRING, date_time TIMESTAMP, extra STRING, "
        "PRIMARY KEY (id)) WITH (connector = 'datagen', mode = 'nexmark', "
        "nexmark_stream = 'person', rows_per_epoch = {rows}, seed = 42)"),
    "auction": (
        "CREATE TABLE auction (id BIGINT, item_name STRING, description STRING, "
        "initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, "
        "seller BIGINT, category BIGINT, extra STRING, PRIMARY KEY (id)) WITH "
        "(connector = 'datagen', mode = 'nexmark', nexmark_stream = 'auction', "
        "rows_per_epoch = {rows}, seed = 42)"),
    "bid": (
        "CREATE TABLE bid (id BIGINT, auction BIGINT, bidder BIGINT, price BIGINT, "
        "channel STRING, url STRING, date_time TIMESTAMP, extra STRING, "
        "p_time TIMESTAMP AS PROCTIME(), PRIMARY KEY (id)) "
        "WITH (connector = 'datagen', mode = 'nexmark', nexmark_stream = 'bid', "
        "rows_per_epoch = {rows}, seed = 42, insert_ratio = 0.9, update_ratio = 0.08, "
        "delete_ratio = 0.02)"),
    "side_input": "CREATE TABLE side_input (key BIGINT, value STRING, PRIMARY KEY (key))",
}
TABLES = list(DDL)

_RANKS = (
    "count(*) FILTER (WHERE price < 10000) AS rank1_bids, "
    "count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, "
    "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids")
_DISTINCT_RANKS = (
    "count(DISTINCT bidder) AS total_bidders, "
    "count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, "
    "count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, "
    "count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, "
    "count(DISTINCT auction) AS total_auctions, "
    "count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, "
    "count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) "
    "AS rank2_auctions, "
    "count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions")

QUERIES: dict[str, str] = {
    # passthrough
    "q0": "SELECT auction, bidder, price, date_time FROM bid",
    # currency conversion
    "q1": "SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid",
    # selection
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    # local item suggestion
    "q3": ("SELECT p.name, p.city, p.state, a.id FROM auction AS a INNER JOIN person AS p "
           "ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')"),
    # average price per category: an aggregate over an aggregate
    "q4": ("SELECT q.category, avg(q.final) AS avg FROM (SELECT max(b.price) AS final, "
           "a.category FROM auction a, bid b WHERE a.id = b.auction AND b.date_time "
           "BETWEEN a.date_time AND a.expires GROUP BY a.id, a.category) q "
           "GROUP BY q.category"),
    # hot items: sliding (HOP) windows
    "q5": ("SELECT auctionbids.auction, auctionbids.num FROM (SELECT bid.auction, count(*) "
           "AS num, window_start AS starttime FROM HOP(bid, date_time, INTERVAL '2' SECOND, "
           "INTERVAL '10' SECOND) GROUP BY window_start, bid.auction) AS auctionbids JOIN "
           "(SELECT max(countbids.num) AS maxn, countbids.starttime_c FROM (SELECT count(*) "
           "AS num, window_start AS starttime_c FROM HOP(bid, date_time, INTERVAL '2' SECOND, "
           "INTERVAL '10' SECOND) GROUP BY bid.auction, window_start) AS countbids GROUP BY "
           "countbids.starttime_c) AS maxbids ON auctionbids.starttime = maxbids.starttime_c "
           "AND auctionbids.num >= maxbids.maxn"),
    # average selling price by seller: its last 10 closed auctions (a top-N per seller)
    "q6": ("SELECT seller, avg(final) AS avg FROM (SELECT seller, final, row_number() OVER "
           "(PARTITION BY seller ORDER BY date_time DESC, id) AS rank FROM (SELECT a.id, "
           "a.seller, a.date_time, max(b.price) AS final FROM auction a JOIN bid b "
           "ON a.id = b.auction WHERE b.date_time BETWEEN a.date_time AND a.expires "
           "GROUP BY a.id, a.seller, a.date_time) q) r WHERE rank <= 10 GROUP BY seller"),
    # highest bid per tumbling window
    "q7": ("SELECT b.auction, b.price, b.bidder, b.date_time FROM bid b JOIN (SELECT "
           "max(price) AS maxprice, window_end AS date_time FROM TUMBLE(bid, date_time, "
           "INTERVAL '10' SECOND) GROUP BY window_end) b1 ON b.price = b1.maxprice "
           "WHERE b.date_time BETWEEN b1.date_time - INTERVAL '10' SECOND AND b1.date_time"),
    # monitor new users: persons who opened an auction in the window they joined
    "q8": ("SELECT p.id, p.name, p.starttime FROM (SELECT id, name, window_start AS "
           "starttime, window_end AS endtime FROM TUMBLE(person, date_time, INTERVAL '10' "
           "SECOND) GROUP BY id, name, window_start, window_end) p JOIN (SELECT seller, "
           "window_start AS starttime, window_end AS endtime FROM TUMBLE(auction, "
           "date_time, INTERVAL '10' SECOND) GROUP BY seller, window_start, window_end) a "
           "ON p.id = a.seller AND p.starttime = a.starttime AND p.endtime = a.endtime"),
    # winning bids: the highest bid of each auction while it was open
    "q9": ("SELECT id, item_name, description, initial_bid, reserve, date_time, expires, "
           "seller, category, auction, bidder, price, bid_date_time FROM (SELECT a.id, "
           "a.item_name, a.description, a.initial_bid, a.reserve, a.date_time, a.expires, "
           "a.seller, a.category, b.auction, b.bidder, b.price, b.date_time AS bid_date_time, "
           "row_number() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time, b.id) "
           "AS rownum FROM auction a JOIN bid b ON a.id = b.auction WHERE b.date_time "
           "BETWEEN a.date_time AND a.expires) w WHERE rownum <= 1"),
    # log to file: formatted dates
    "q10": ("SELECT auction, bidder, price, date_time, date_format(date_time, 'yyyy-MM-dd') "
            "AS date, date_format(date_time, 'HH:mm') AS time FROM bid"),
    # user sessions: a bidder's session ends after 10 s without a bid (Spark's
    # session_window, as Flink's SESSION)
    "q11": ("SELECT bidder, count(*) AS bid_count, session_window.start AS starttime, "
            "session_window.end AS endtime FROM bid GROUP BY bidder, "
            "session_window(date_time, '10 seconds')"),
    # processing-time windows: over bid's processing-time column (as RisingWave's
    # PROCTIME()), stored with each row, so a replay reads the same windows
    "q12": ("SELECT bidder, count(*) AS bid_count, window_start, window_end FROM TUMBLE("
            "bid, p_time, INTERVAL '10' SECOND) GROUP BY bidder, window_start, window_end"),
    # bounded side input join
    "q13": ("SELECT b.auction, b.bidder, b.price, b.date_time, s.value FROM bid b JOIN "
            "side_input s ON b.auction % 10000 = s.key"),
    # calculation: a CASE over the hour and a character count
    "q14": ("SELECT auction, bidder, 0.908 * price AS price, CASE WHEN hour(date_time) >= 8 "
            "AND hour(date_time) <= 18 THEN 'dayTime' WHEN hour(date_time) <= 6 OR "
            "hour(date_time) >= 20 THEN 'nightTime' ELSE 'otherTime' END AS bidtimetype, "
            "date_time, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts "
            "FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000"),
    # bidding statistics per day
    "q15": (f"SELECT date_format(date_time, 'yyyy-MM-dd') AS day, count(*) AS total_bids, "
            f"{_RANKS}, {_DISTINCT_RANKS} FROM bid "
            "GROUP BY date_format(date_time, 'yyyy-MM-dd')"),
    # channel statistics per day
    "q16": (f"SELECT channel, date_format(date_time, 'yyyy-MM-dd') AS day, "
            f"max(date_format(date_time, 'HH:mm')) AS minute, count(*) AS total_bids, "
            f"{_RANKS}, {_DISTINCT_RANKS} FROM bid "
            "GROUP BY channel, date_format(date_time, 'yyyy-MM-dd')"),
    # auction statistics per day
    "q17": (f"SELECT auction, date_format(date_time, 'yyyy-MM-dd') AS day, count(*) AS "
            f"total_bids, {_RANKS}, min(price) AS min_price, max(price) AS max_price, "
            "avg(price) AS avg_price, sum(price) AS sum_price FROM bid "
            "GROUP BY auction, date_format(date_time, 'yyyy-MM-dd')"),
    # the last bid of each bidder on each auction
    # (q18 and q19 name the derived table's columns in a list, as Nexmark's suites do)
    "q18": ("SELECT auction, bidder, price, channel, url, date_time, extra FROM (SELECT *, "
            "row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC, id DESC) "
            "FROM bid) AS b (id, auction, bidder, price, channel, url, date_time, extra, "
            "p_time, rank_number) WHERE rank_number <= 1"),
    # the ten highest bids of each auction
    "q19": ("SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY auction ORDER BY "
            "price DESC, id) FROM bid) AS b (id, auction, bidder, price, channel, url, "
            "date_time, extra, p_time, rank_number) WHERE rank_number <= 10"),
    # bids with their auction, in one category
    "q20": ("SELECT auction, bidder, price, channel, url, b.date_time AS bid_date_time, "
            "b.extra AS bid_extra, item_name, description, initial_bid, reserve, "
            "a.date_time AS auction_date_time, expires, seller, category, a.extra AS "
            "auction_extra FROM bid AS b INNER JOIN auction AS a ON b.auction = a.id "
            "WHERE a.category = 10"),
    # add a channel id
    "q21": ("SELECT auction, bidder, price, channel, CASE WHEN lower(channel) = 'apple' "
            "THEN '0' WHEN lower(channel) = 'google' THEN '1' WHEN lower(channel) = "
            "'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3' ELSE "
            "regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id FROM bid "
            "WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL OR "
            "lower(channel) IN ('apple', 'google', 'facebook', 'baidu')"),
    # directories of the url
    "q22": ("SELECT auction, bidder, price, channel, split_part(url, '/', 4) AS dir1, "
            "split_part(url, '/', 5) AS dir2, split_part(url, '/', 6) AS dir3 FROM bid"),
    # extensions: the highest bid of every auction (LEFT JOIN an aggregate)
    "q101": ("SELECT a.id AS auction_id, a.item_name AS auction_item_name, b.max_price AS "
             "current_highest_bid FROM auction a LEFT OUTER JOIN (SELECT b1.auction, "
             "max(b1.price) AS max_price FROM bid b1 GROUP BY b1.auction) b "
             "ON a.id = b.auction"),
    # auctions with more bids than the average (HAVING over a scalar subquery)
    "q102": ("SELECT a.id AS auction_id, a.item_name AS auction_item_name, count(b.auction) "
             "AS bid_count FROM auction a JOIN bid b ON a.id = b.auction GROUP BY a.id, "
             "a.item_name HAVING count(b.auction) >= (SELECT count(*) / count(DISTINCT "
             "auction) FROM bid)"),
    # auctions with at least 20 bids (IN over an aggregate)
    "q103": ("SELECT a.id AS auction_id, a.item_name AS auction_item_name FROM auction a "
             "WHERE a.id IN (SELECT b.auction FROM bid b GROUP BY b.auction "
             "HAVING count(*) >= 20)"),
    # auctions without fewer than 20 bids (NOT IN over an aggregate)
    "q104": ("SELECT a.id AS auction_id, a.item_name AS auction_item_name FROM auction a "
             "WHERE a.id NOT IN (SELECT b.auction FROM bid b GROUP BY b.auction "
             "HAVING count(*) < 20)"),
    # the 1000 auctions with the most bids (ORDER BY ... LIMIT)
    "q105": ("SELECT a.id AS auction_id, a.item_name AS auction_item_name, count(b.auction) "
             "AS bid_count FROM auction a JOIN bid b ON a.id = b.auction GROUP BY a.id, "
             "a.item_name ORDER BY bid_count DESC, auction_id LIMIT 1000"),
    # the lowest final price (an aggregate over an aggregate)
    "q106": ("SELECT min(final) AS min_final FROM (SELECT auction.id, max(price) AS final "
             "FROM auction, bid WHERE bid.auction = auction.id AND bid.date_time BETWEEN "
             "auction.date_time AND auction.expires GROUP BY auction.id) q"),
}

#: refused with UnsupportedQuery, and why (every other query is accepted): none since
#: q12's processing time became a column (``AS PROCTIME()``)
REFUSED: dict[str, str] = {}


def create(eng: Any, rows: int = 100) -> None:
    """The tables, the side input filled; nothing generated yet."""
    for ddl in DDL.values():
        eng.sql(ddl.replace("{rows}", str(rows)))
    eng.insert("side_input", [{"key": k, "value": f"v{k}"} for k in range(0, 10_000, 7)])


def batch(spark: Any, eng: Any, query: str, epoch: int) -> Any:
    """Spark running ``query`` over the engine's snapshots at ``epoch`` (a ``TUMBLE``
    as the derived table that defines it: Spark has no TUMBLE)."""
    for table in TABLES:
        eng.read(table, as_of=epoch).createOrReplaceTempView(table)
    tree = time_windows_to_derived(sqlglot.parse_one(query, read="spark"))
    return spark.sql(tree.sql(dialect="spark"))
