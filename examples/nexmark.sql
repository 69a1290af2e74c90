-- Nexmark on sparkfill: three generated streams, a few Nexmark queries as
-- incremental materialized views, one of them created online while the
-- streams flow, and a Delta sink other tools can read.
--
--   sparkfill run examples/nexmark.sql --warehouse /tmp/nexmark --epochs 3
--
-- rows_per_epoch counts Nexmark events per epoch, split 1 : 3 : 46 between
-- persons, auctions and bids; the same seed makes the streams refer to each
-- other (an auction's seller is a generated person, a bid's auction a recent
-- auction). Bids also get a few updates (price corrections) and deletes.

CREATE TABLE IF NOT EXISTS person (
    id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING,
    state STRING, date_time TIMESTAMP, extra STRING, PRIMARY KEY (id)
) WITH (connector = 'datagen', mode = 'nexmark', nexmark_stream = 'person',
        rows_per_epoch = 1000, seed = 42);

CREATE TABLE IF NOT EXISTS auction (
    id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT,
    date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING,
    PRIMARY KEY (id)
) WITH (connector = 'datagen', mode = 'nexmark', nexmark_stream = 'auction',
        rows_per_epoch = 1000, seed = 42);

CREATE TABLE IF NOT EXISTS bid (
    id BIGINT, auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
    date_time TIMESTAMP, extra STRING, PRIMARY KEY (id)
) WITH (connector = 'datagen', mode = 'nexmark', nexmark_stream = 'bid',
        rows_per_epoch = 1000, seed = 42,
        insert_ratio = 0.9, update_ratio = 0.08, delete_ratio = 0.02);

-- q1: currency conversion
CREATE MATERIALIZED VIEW IF NOT EXISTS q1 AS
SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid;

-- q2: selection
CREATE MATERIALIZED VIEW IF NOT EXISTS q2 AS
SELECT auction, price FROM bid WHERE auction % 123 = 0;

-- let the streams flow for a while: the next MVs are created over history
STEP 1;

-- q3: local item suggestion (person x auction), created online over the
-- history of the first epoch while the streams keep flowing (watch its bar)
CREATE MATERIALIZED VIEW IF NOT EXISTS q3 AS
SELECT p.name, p.city, p.state, a.id
FROM auction a JOIN person p ON a.seller = p.id
WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA');

-- q4-ish: bids on open auctions per category (join, then aggregates)
CREATE MATERIALIZED VIEW IF NOT EXISTS q4 AS
SELECT a.category, count(*) AS bids, count(DISTINCT b.bidder) AS bidders,
       avg(b.price) AS avg_price, max(b.price) AS max_price
FROM auction a JOIN bid b ON a.id = b.auction
WHERE b.date_time BETWEEN a.date_time AND a.expires
GROUP BY a.category;

-- q17: auction statistics per day, with aggregates FILTER (WHERE ...)
CREATE MATERIALIZED VIEW IF NOT EXISTS q17 AS
SELECT auction, to_char(date_time, 'yyyy-MM-dd') AS day, count(*) AS total_bids,
       count(*) FILTER (WHERE price < 10000) AS rank1_bids,
       count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
       min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price,
       sum(price) AS sum_price
FROM bid
GROUP BY auction, to_char(date_time, 'yyyy-MM-dd');

-- a plain Delta table kept equal to q4 at every epoch (it starts writing
-- once q4 is created)
CREATE SINK IF NOT EXISTS q4_sink FROM q4
WITH (connector = 'delta', path = '{warehouse}/sinks/q4');
