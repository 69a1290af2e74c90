"""Seeded random DML against a table ``(id BIGINT, g INT, v BIGINT, s STRING)``,
issued to the engine and mirrored into a ``TableModel``.

Every operation is drawn from ``rng`` only, so a seed reproduces the workload.
Values stay non-negative so that ``%`` means the same in Python and Spark SQL.
"""

from __future__ import annotations

import random
import string
from typing import Any

import pandas as pd
from helpers import TableModel

COLUMNS = ["id", "g", "v", "s"]
SCHEMA_DDL = "id BIGINT, g INT, v BIGINT, s STRING"
N_GROUPS = 6


def create_table_sql(name: str) -> str:
    return f"CREATE TABLE {name} (id BIGINT, g INT, v BIGINT, s STRING, PRIMARY KEY (id))"


def random_s(rng: random.Random) -> str | None:
    if rng.random() < 0.1:
        return None
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 4)))


def random_row(rng: random.Random, key: int) -> dict[str, Any]:
    return {"id": key, "g": rng.randrange(N_GROUPS), "v": rng.randrange(1000), "s": random_s(rng)}


def sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


class Workload:
    """Random DML against table ``name`` of ``eng``, mirrored into ``model``."""

    def __init__(self, eng, spark, name: str, rng: random.Random, key_space: int):
        self.eng = eng
        self.spark = spark
        self.name = name
        self.rng = rng
        self.key_space = key_space
        self.model = TableModel(COLUMNS, key="id")
        self.log: list[str] = []

    # -- input formats ---------------------------------------------------- #
    def _as_format(self, rows: list[dict], fmt: str, ddl: str | None = SCHEMA_DDL):
        if fmt == "dicts":
            return rows
        if fmt == "pandas":
            return pd.DataFrame(rows, columns=list(rows[0].keys()))
        if fmt == "spark":
            cols = list(rows[0].keys())
            schema = ", ".join(f"{c} {t}" for c, t in _ddl_types(ddl).items() if c in cols)
            return self.spark.createDataFrame([tuple(r[c] for c in cols) for r in rows], schema)
        raise AssertionError(fmt)

    # -- operations ------------------------------------------------------- #
    def initial_load(self, n: int) -> None:
        keys = self.rng.sample(range(self.key_space), n)
        rows = [random_row(self.rng, k) for k in keys]
        for i in range(0, n, 1000):
            batch = rows[i : i + 1000]
            self.eng.insert(self.name, batch)
            self.model.insert(batch)
        self.log.append(f"initial_load {n}")

    def insert_batch(self) -> None:
        rng = self.rng
        existing = self.model.keys()
        n_old = min(len(existing), rng.randint(5, 40))
        n_new = rng.randint(5, 40)
        keys = rng.sample(existing, n_old) if n_old else []
        keys += [rng.randrange(self.key_space) for _ in range(n_new)]
        # one call never repeats a key (what a repeated key means is not specified)
        rows = _dedupe_last([random_row(rng, k) for k in keys])
        fmt = rng.choice(["dicts", "pandas", "spark"])
        self.eng.insert(self.name, self._as_format(rows, fmt))
        self.model.insert(rows)
        self.log.append(f"insert[{fmt}] {len(rows)} rows")

    def delete_batch(self) -> None:
        rng = self.rng
        existing = self.model.keys()
        keys = rng.sample(existing, min(len(existing), rng.randint(3, 30)))
        keys += [
            rng.randrange(self.key_space, 2 * self.key_space) for _ in range(rng.randint(1, 5))
        ]
        keys = list(dict.fromkeys(keys))
        fmt = rng.choice(["dicts", "pandas", "spark"])
        if rng.random() < 0.3:
            # rows holding more than the key columns are fine: only the key counts
            rows = [{"id": k, "g": rng.randrange(N_GROUPS)} for k in keys]
            ddl = "id BIGINT, g INT"
        else:
            rows = [{"id": k} for k in keys]
            ddl = "id BIGINT"
        self.eng.delete(self.name, self._as_format(rows, fmt, ddl))
        self.model.delete(rows)
        self.log.append(f"delete[{fmt}] {len(rows)} keys")

    def sql_insert(self) -> None:
        rng = self.rng
        keys = [rng.randrange(self.key_space) for _ in range(rng.randint(1, 4))]
        existing = self.model.keys()
        if existing and rng.random() < 0.5:
            keys.append(rng.choice(existing))
        rows = _dedupe_last([random_row(rng, k) for k in keys])
        values = ", ".join("(" + ", ".join(sql_literal(r[c]) for c in COLUMNS) + ")" for r in rows)
        sql = f"INSERT INTO {self.name} (id, g, v, s) VALUES {values}"
        self.eng.sql(sql)
        self.model.insert(rows)
        self.log.append(sql)

    def sql_update(self) -> None:
        rng = self.rng
        kind = rng.randrange(3)
        if kind == 0:
            g, k = rng.randrange(N_GROUPS), rng.randint(1, 5)
            sql = f"UPDATE {self.name} SET v = v + {k} WHERE g = {g}"
            self.eng.sql(sql)
            self.model.sql_update(lambda r: r["g"] == g, lambda r: {"v": r["v"] + k})
        elif kind == 1:
            m, rem = rng.randint(5, 9), rng.randrange(5)
            c = rng.choice("xyz")
            sql = f"UPDATE {self.name} SET s = concat(s, '{c}'), v = v * 2 WHERE id % {m} = {rem}"
            self.eng.sql(sql)
            self.model.sql_update(
                lambda r: r["id"] % m == rem,
                lambda r: {"s": None if r["s"] is None else r["s"] + c, "v": r["v"] * 2},
            )
        else:
            g, newg, lo = rng.randrange(N_GROUPS), rng.randrange(N_GROUPS), rng.randrange(800)
            sql = f"UPDATE {self.name} SET g = {newg} WHERE g = {g} AND v > {lo}"
            self.eng.sql(sql)
            self.model.sql_update(lambda r: r["g"] == g and r["v"] > lo, lambda r: {"g": newg})
        self.log.append(sql)

    def sql_delete(self) -> None:
        rng = self.rng
        g, rem = rng.randrange(N_GROUPS), rng.randrange(7)
        sql = f"DELETE FROM {self.name} WHERE g = {g} AND v % 7 = {rem}"
        self.eng.sql(sql)
        self.model.sql_delete(lambda r: r["g"] == g and r["v"] % 7 == rem)
        self.log.append(sql)

    def random_epoch_dml(self, n_ops: tuple[int, int] = (2, 4)) -> None:
        ops = [
            self.insert_batch,
            self.delete_batch,
            self.sql_insert,
            self.sql_update,
            self.sql_delete,
        ]
        weights = [4, 3, 1, 2, 1]
        for _ in range(self.rng.randint(*n_ops)):
            self.rng.choices(ops, weights)[0]()


def _dedupe_last(rows: list[dict]) -> list[dict]:
    out: dict[Any, dict] = {}
    for r in rows:
        out.pop(r["id"], None)
        out[r["id"]] = r
    return list(out.values())


def _ddl_types(ddl: str) -> dict[str, str]:
    out = {}
    for part in ddl.split(","):
        name, typ = part.strip().split(None, 1)
        out[name] = typ
    return out
