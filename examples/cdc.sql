-- Change data capture on sparkfill: Debezium JSON files landing in
-- examples/cdc_data/{customers,orders} (one file per epoch here), two
-- materialized views over them, and a Delta sink. (For joins, see
-- examples/nexmark.sql: an MV may join customers and orders the same way.)
--
--   sparkfill run examples/cdc.sql --warehouse /tmp/cdc --epochs 3
--
-- (run it from the repository's root: relative paths are relative to the
-- current directory). One file holds malformed records; they land in
-- orders__dead_letter with the reason:
--
--   sparkfill sql /tmp/cdc "SELECT * FROM orders__dead_letter"

CREATE TABLE IF NOT EXISTS customers (
    id BIGINT, name STRING NOT NULL, city STRING, PRIMARY KEY (id)
) WITH (connector = 'cdc_files', path = 'examples/cdc_data/customers',
        format = 'debezium_json', max_files_per_epoch = 1);

CREATE TABLE IF NOT EXISTS orders (
    id BIGINT, customer_id BIGINT, amount DECIMAL(10,2), status STRING,
    created_at TIMESTAMP, PRIMARY KEY (id)
) WITH (connector = 'cdc_files', path = 'examples/cdc_data/orders',
        format = 'debezium_json', max_files_per_epoch = 1);

CREATE MATERIALIZED VIEW IF NOT EXISTS revenue_by_customer AS
SELECT customer_id, count(*) AS n_orders, sum(amount) AS revenue, max(created_at) AS last_order
FROM orders WHERE status <> 'cancelled' GROUP BY customer_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS open_orders AS
SELECT id, customer_id, amount, created_at FROM orders WHERE status = 'open';

CREATE SINK IF NOT EXISTS revenue_sink FROM revenue_by_customer
WITH (connector = 'delta', path = '{warehouse}/sinks/revenue_by_customer');
