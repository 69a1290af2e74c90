"""TPC-H for tests and the benchmark: the schema, the 22 queries (validation
parameters, Spark SQL), data from the ``tpchgen-cli`` generator, and refresh
streams.

The data comes from ``tpchgen-cli`` (a dev dependency: a TPC-H ``dbgen``
reimplementation) written as Parquet, read by Spark and inserted through the
engine. A refresh pair is TPC-H's RF1/RF2 in spirit: RF1 inserts new orders
(copies of existing ones under new order keys) with their line items, RF2
deletes existing orders and their line items.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

DDL = {
    "region": "CREATE TABLE region (r_regionkey BIGINT, r_name STRING, r_comment STRING, "
              "PRIMARY KEY (r_regionkey))",
    "nation": "CREATE TABLE nation (n_nationkey BIGINT, n_name STRING, n_regionkey BIGINT, "
              "n_comment STRING, PRIMARY KEY (n_nationkey))",
    "supplier": "CREATE TABLE supplier (s_suppkey BIGINT, s_name STRING, s_address STRING, "
                "s_nationkey BIGINT, s_phone STRING, s_acctbal DECIMAL(15,2), s_comment STRING, "
                "PRIMARY KEY (s_suppkey))",
    "customer": "CREATE TABLE customer (c_custkey BIGINT, c_name STRING, c_address STRING, "
                "c_nationkey BIGINT, c_phone STRING, c_acctbal DECIMAL(15,2), "
                "c_mktsegment STRING, c_comment STRING, PRIMARY KEY (c_custkey))",
    "part": "CREATE TABLE part (p_partkey BIGINT, p_name STRING, p_mfgr STRING, p_brand STRING, "
            "p_type STRING, p_size INT, p_container STRING, p_retailprice DECIMAL(15,2), "
            "p_comment STRING, PRIMARY KEY (p_partkey))",
    "partsupp": "CREATE TABLE partsupp (ps_partkey BIGINT, ps_suppkey BIGINT, ps_availqty INT, "
                "ps_supplycost DECIMAL(15,2), ps_comment STRING, "
                "PRIMARY KEY (ps_partkey, ps_suppkey))",
    "orders": "CREATE TABLE orders (o_orderkey BIGINT, o_custkey BIGINT, o_orderstatus STRING, "
              "o_totalprice DECIMAL(15,2), o_orderdate DATE, o_orderpriority STRING, "
              "o_clerk STRING, o_shippriority INT, o_comment STRING, PRIMARY KEY (o_orderkey))",
    "lineitem": "CREATE TABLE lineitem (l_orderkey BIGINT, l_partkey BIGINT, l_suppkey BIGINT, "
                "l_linenumber INT, l_quantity DECIMAL(15,2), l_extendedprice DECIMAL(15,2), "
                "l_discount DECIMAL(15,2), l_tax DECIMAL(15,2), l_returnflag STRING, "
                "l_linestatus STRING, l_shipdate DATE, l_commitdate DATE, l_receiptdate DATE, "
                "l_shipinstruct STRING, l_shipmode STRING, l_comment STRING, "
                "PRIMARY KEY (l_orderkey, l_linenumber))",
}

#: the 22 queries with TPC-H's validation parameters, as Spark SQL
QUERIES: dict[str, str] = {
    "q1": """select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty,
  sum(l_extendedprice) as sum_base_price, sum(l_extendedprice * (1 - l_discount)) as sum_disc_price,
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge, avg(l_quantity) as avg_qty,
  avg(l_extendedprice) as avg_price, avg(l_discount) as avg_disc, count(*) as count_order
from lineitem where l_shipdate <= date '1998-12-01' - interval '90' day
group by l_returnflag, l_linestatus order by l_returnflag, l_linestatus""",
    "q2": """select s_acctbal, s_name, n_name, p_partkey, p_mfgr, s_address, s_phone, s_comment
from part, supplier, partsupp, nation, region
where p_partkey = ps_partkey and s_suppkey = ps_suppkey and p_size = 15 and p_type like '%BRASS'
  and s_nationkey = n_nationkey and n_regionkey = r_regionkey and r_name = 'EUROPE'
  and ps_supplycost = (select min(ps_supplycost) from partsupp, supplier, nation, region
    where p_partkey = ps_partkey and s_suppkey = ps_suppkey and s_nationkey = n_nationkey
      and n_regionkey = r_regionkey and r_name = 'EUROPE')
order by s_acctbal desc, n_name, s_name, p_partkey limit 100""",
    "q3": """select l_orderkey, sum(l_extendedprice * (1 - l_discount)) as revenue, o_orderdate,
  o_shippriority
from customer, orders, lineitem
where c_mktsegment = 'BUILDING' and c_custkey = o_custkey and l_orderkey = o_orderkey
  and o_orderdate < date '1995-03-15' and l_shipdate > date '1995-03-15'
group by l_orderkey, o_orderdate, o_shippriority order by revenue desc, o_orderdate limit 10""",
    "q4": """select o_orderpriority, count(*) as order_count from orders
where o_orderdate >= date '1993-07-01' and o_orderdate < date '1993-07-01' + interval '3' month
  and exists (select * from lineitem where l_orderkey = o_orderkey
              and l_commitdate < l_receiptdate)
group by o_orderpriority order by o_orderpriority""",
    "q5": """select n_name, sum(l_extendedprice * (1 - l_discount)) as revenue
from customer, orders, lineitem, supplier, nation, region
where c_custkey = o_custkey and l_orderkey = o_orderkey and l_suppkey = s_suppkey
  and c_nationkey = s_nationkey and s_nationkey = n_nationkey and n_regionkey = r_regionkey
  and r_name = 'ASIA' and o_orderdate >= date '1994-01-01'
  and o_orderdate < date '1994-01-01' + interval '1' year
group by n_name order by revenue desc""",
    "q6": """select sum(l_extendedprice * l_discount) as revenue from lineitem
where l_shipdate >= date '1994-01-01' and l_shipdate < date '1994-01-01' + interval '1' year
  and l_discount between .06 - 0.01 and .06 + 0.01 and l_quantity < 24""",
    "q7": """select supp_nation, cust_nation, l_year, sum(volume) as revenue
from (select n1.n_name as supp_nation, n2.n_name as cust_nation,
        extract(year from l_shipdate) as l_year, l_extendedprice * (1 - l_discount) as volume
      from supplier, lineitem, orders, customer, nation n1, nation n2
      where s_suppkey = l_suppkey and o_orderkey = l_orderkey and c_custkey = o_custkey
        and s_nationkey = n1.n_nationkey and c_nationkey = n2.n_nationkey
        and ((n1.n_name = 'FRANCE' and n2.n_name = 'GERMANY')
          or (n1.n_name = 'GERMANY' and n2.n_name = 'FRANCE'))
        and l_shipdate between date '1995-01-01' and date '1996-12-31') as shipping
group by supp_nation, cust_nation, l_year order by supp_nation, cust_nation, l_year""",
    "q8": """select o_year, sum(case when nation = 'BRAZIL' then volume else 0 end) / sum(volume)
  as mkt_share
from (select extract(year from o_orderdate) as o_year,
        l_extendedprice * (1 - l_discount) as volume, n2.n_name as nation
      from part, supplier, lineitem, orders, customer, nation n1, nation n2, region
      where p_partkey = l_partkey and s_suppkey = l_suppkey and l_orderkey = o_orderkey
        and o_custkey = c_custkey and c_nationkey = n1.n_nationkey
        and n1.n_regionkey = r_regionkey and r_name = 'AMERICA'
        and s_nationkey = n2.n_nationkey
        and o_orderdate between date '1995-01-01' and date '1996-12-31'
        and p_type = 'ECONOMY ANODIZED STEEL') as all_nations
group by o_year order by o_year""",
    "q9": """select nation, o_year, sum(amount) as sum_profit
from (select n_name as nation, extract(year from o_orderdate) as o_year,
        l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity as amount
      from part, supplier, lineitem, partsupp, orders, nation
      where s_suppkey = l_suppkey and ps_suppkey = l_suppkey and ps_partkey = l_partkey
        and p_partkey = l_partkey and o_orderkey = l_orderkey and s_nationkey = n_nationkey
        and p_name like '%green%') as profit
group by nation, o_year order by nation, o_year desc""",
    "q10": """select c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) as revenue,
  c_acctbal, n_name, c_address, c_phone, c_comment
from customer, orders, lineitem, nation
where c_custkey = o_custkey and l_orderkey = o_orderkey and o_orderdate >= date '1993-10-01'
  and o_orderdate < date '1993-10-01' + interval '3' month and l_returnflag = 'R'
  and c_nationkey = n_nationkey
group by c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
order by revenue desc limit 20""",
    "q11": """select ps_partkey, sum(ps_supplycost * ps_availqty) as value
from partsupp, supplier, nation
where ps_suppkey = s_suppkey and s_nationkey = n_nationkey and n_name = 'GERMANY'
group by ps_partkey having sum(ps_supplycost * ps_availqty) > (
  select sum(ps_supplycost * ps_availqty) * 0.0001 from partsupp, supplier, nation
  where ps_suppkey = s_suppkey and s_nationkey = n_nationkey and n_name = 'GERMANY')
order by value desc""",
    "q12": """select l_shipmode,
  sum(case when o_orderpriority = '1-URGENT' or o_orderpriority = '2-HIGH' then 1 else 0 end)
    as high_line_count,
  sum(case when o_orderpriority <> '1-URGENT' and o_orderpriority <> '2-HIGH' then 1 else 0 end)
    as low_line_count
from orders, lineitem
where o_orderkey = l_orderkey and l_shipmode in ('MAIL', 'SHIP')
  and l_commitdate < l_receiptdate and l_shipdate < l_commitdate
  and l_receiptdate >= date '1994-01-01' and l_receiptdate < date '1994-01-01' + interval '1' year
group by l_shipmode order by l_shipmode""",
    "q13": """select c_count, count(*) as custdist
from (select c_custkey, count(o_orderkey)
      from customer left outer join orders on c_custkey = o_custkey
        and o_comment not like '%special%requests%'
      group by c_custkey) as c_orders (c_custkey, c_count)
group by c_count order by custdist desc, c_count desc""",
    "q14": """select 100.00 * sum(case when p_type like 'PROMO%'
    then l_extendedprice * (1 - l_discount) else 0 end)
  / sum(l_extendedprice * (1 - l_discount)) as promo_revenue
from lineitem, part
where l_partkey = p_partkey and l_shipdate >= date '1995-09-01'
  and l_shipdate < date '1995-09-01' + interval '1' month""",
    "q15": """with revenue0 (supplier_no, total_revenue) as (
  select l_suppkey, sum(l_extendedprice * (1 - l_discount))
  from lineitem where l_shipdate >= date '1996-01-01'
    and l_shipdate < date '1996-01-01' + interval '3' month
  group by l_suppkey)
select s_suppkey, s_name, s_address, s_phone, total_revenue
from supplier, revenue0
where s_suppkey = supplier_no and total_revenue = (select max(total_revenue) from revenue0)
order by s_suppkey""",
    "q16": """select p_brand, p_type, p_size, count(distinct ps_suppkey) as supplier_cnt
from partsupp, part
where p_partkey = ps_partkey and p_brand <> 'Brand#45' and p_type not like 'MEDIUM POLISHED%'
  and p_size in (49, 14, 23, 45, 19, 3, 36, 9)
  and ps_suppkey not in (select s_suppkey from supplier
                         where s_comment like '%Customer%Complaints%')
group by p_brand, p_type, p_size order by supplier_cnt desc, p_brand, p_type, p_size""",
    "q17": """select sum(l_extendedprice) / 7.0 as avg_yearly
from lineitem, part
where p_partkey = l_partkey and p_brand = 'Brand#23' and p_container = 'MED BOX'
  and l_quantity < (select 0.2 * avg(l_quantity) from lineitem where l_partkey = p_partkey)""",
    "q18": """select c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity)
from customer, orders, lineitem
where o_orderkey in (select l_orderkey from lineitem group by l_orderkey
                     having sum(l_quantity) > 300)
  and c_custkey = o_custkey and o_orderkey = l_orderkey
group by c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
order by o_totalprice desc, o_orderdate limit 100""",
    "q19": """select sum(l_extendedprice * (1 - l_discount)) as revenue
from lineitem, part
where (p_partkey = l_partkey and p_brand = 'Brand#12'
    and p_container in ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
    and l_quantity >= 1 and l_quantity <= 1 + 10 and p_size between 1 and 5
    and l_shipmode in ('AIR', 'AIR REG') and l_shipinstruct = 'DELIVER IN PERSON')
  or (p_partkey = l_partkey and p_brand = 'Brand#23'
    and p_container in ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
    and l_quantity >= 10 and l_quantity <= 10 + 10 and p_size between 1 and 10
    and l_shipmode in ('AIR', 'AIR REG') and l_shipinstruct = 'DELIVER IN PERSON')
  or (p_partkey = l_partkey and p_brand = 'Brand#34'
    and p_container in ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
    and l_quantity >= 20 and l_quantity <= 20 + 10 and p_size between 1 and 15
    and l_shipmode in ('AIR', 'AIR REG') and l_shipinstruct = 'DELIVER IN PERSON')""",
    "q20": """select s_name, s_address from supplier, nation
where s_suppkey in (
    select ps_suppkey from partsupp
    where ps_partkey in (select p_partkey from part where p_name like 'forest%')
      and ps_availqty > (select 0.5 * sum(l_quantity) from lineitem
                         where l_partkey = ps_partkey and l_suppkey = ps_suppkey
                           and l_shipdate >= date '1994-01-01'
                           and l_shipdate < date '1994-01-01' + interval '1' year))
  and s_nationkey = n_nationkey and n_name = 'CANADA'
order by s_name""",
    "q21": """select s_name, count(*) as numwait
from supplier, lineitem l1, orders, nation
where s_suppkey = l1.l_suppkey and o_orderkey = l1.l_orderkey and o_orderstatus = 'F'
  and l1.l_receiptdate > l1.l_commitdate
  and exists (select * from lineitem l2 where l2.l_orderkey = l1.l_orderkey
              and l2.l_suppkey <> l1.l_suppkey)
  and not exists (select * from lineitem l3 where l3.l_orderkey = l1.l_orderkey
                  and l3.l_suppkey <> l1.l_suppkey and l3.l_receiptdate > l3.l_commitdate)
  and s_nationkey = n_nationkey and n_name = 'SAUDI ARABIA'
group by s_name order by numwait desc, s_name limit 100""",
    "q22": """select cntrycode, count(*) as numcust, sum(c_acctbal) as totacctbal
from (select substring(c_phone, 1, 2) as cntrycode, c_acctbal from customer
      where substring(c_phone, 1, 2) in ('13', '31', '23', '29', '30', '18', '17')
        and c_acctbal > (select avg(c_acctbal) from customer where c_acctbal > 0.00
                         and substring(c_phone, 1, 2) in ('13', '31', '23', '29', '30', '18',
                                                         '17'))
        and not exists (select * from orders where o_custkey = c_custkey)) as custsale
group by cntrycode order by cntrycode""",
}

#: tables in creation order (dimensions first)
TABLES = list(DDL)


def generate(scale: float, out: Path) -> Path:
    """Write every table at ``scale`` as ``out/<table>.parquet`` (kept if present)."""
    if all((out / f"{t}.parquet").exists() for t in TABLES):
        return out
    tool = shutil.which("tpchgen-cli") or str(Path(sys.executable).with_name("tpchgen-cli"))
    subprocess.run([tool, "parquet", "-s", str(scale), "--output-dir", str(out)], check=True,
                   capture_output=True)
    return out


def frame(spark: Any, data: Path, table: str) -> Any:
    """A generated table as a Spark DataFrame with the schema of ``DDL``."""
    from pyspark.sql import functions as F

    from sparkfill.sql.frontend import parse_statement

    df = spark.read.parquet(str(data / f"{table}.parquet"))
    create = parse_statement(DDL[table])
    return df.select(*[F.col(c.name).cast(c.type).alias(c.name)
                       for c in create.columns])  # type: ignore[attr-defined]


def create_and_load(eng: Any, spark: Any, data: Path) -> None:
    for table in TABLES:
        eng.sql(DDL[table])
        eng.insert(table, frame(spark, data, table))


class Refresh:
    """Refresh pairs over the loaded data: RF1 inserts ``orders`` new orders (copies
    of random existing orders under new keys, with their line items), RF2 deletes
    as many existing orders and their line items."""

    def __init__(self, spark: Any, data: Path, seed: int = 1) -> None:
        self.orders = frame(spark, data, "orders").cache()
        self.lineitem = frame(spark, data, "lineitem").cache()
        self.keys = sorted(r[0] for r in self.orders.select("o_orderkey").collect())
        self.rng = random.Random(seed)
        self.next_key = max(self.keys) + 1
        self.alive = set(self.keys)

    def apply(self, eng: Any, orders: int) -> None:
        from pyspark.sql import functions as F

        picked = self.rng.sample(sorted(self.alive), min(orders, len(self.alive)))
        # RF1: copies of some orders under new keys
        sources = self.rng.sample(self.keys, orders)
        mapping = {src: self.next_key + i for i, src in enumerate(sources)}
        self.next_key += orders
        self.alive |= set(mapping.values())
        new_key = F.create_map(*[F.lit(x) for kv in mapping.items() for x in kv])
        src = list(mapping)
        eng.insert("orders", self.orders.where(F.col("o_orderkey").isin(src))
                   .withColumn("o_orderkey", new_key[F.col("o_orderkey")]))
        eng.insert("lineitem", self.lineitem.where(F.col("l_orderkey").isin(src))
                   .withColumn("l_orderkey", new_key[F.col("l_orderkey")]))
        # RF2: delete some orders with their line items
        self.alive -= set(picked)
        eng.delete("orders", [{"o_orderkey": k} for k in picked])
        eng.delete("lineitem", [{"l_orderkey": k, "l_linenumber": n}
                                for k in picked for n in range(1, 8)])


def batch(spark: Any, eng: Any, query: str, epoch: int) -> Any:
    """Spark running ``query`` as a batch query over the engine's snapshots at
    ``epoch`` (temporary views named like the tables)."""
    for table in TABLES:
        eng.read(table, as_of=epoch).createOrReplaceTempView(table)
    return spark.sql(query)
