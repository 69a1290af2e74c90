"""Test helpers: multiset comparison of DataFrames, the batch-query oracle, and a
pure-Python model of a keyed table under sparkfill's DML semantics.

The model follows the documented semantics:
  * ``insert`` upserts (an existing key is overwritten), ``delete`` removes keys
    (a missing key is a no-op);
  * SQL ``UPDATE`` / ``DELETE`` are evaluated when called against the latest
    COMMITTED snapshot and staged as key-level changes;
  * staged changes apply in call order when the next epoch runs (``step``).
"""

from __future__ import annotations

import collections
import datetime
import decimal
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession

# --------------------------------------------------------------------------- #
# Row comparison
# --------------------------------------------------------------------------- #


def _norm(value: Any) -> Any:
    """Make a collected value hashable and comparable."""
    if isinstance(value, list):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _norm(v)) for k, v in value.items()))
    return value


def _sort_key(row: tuple) -> tuple:
    """None-safe, type-safe sort key for a row of a single schema."""
    out = []
    for value in row:
        if value is None:
            out.append((1, "", ""))
        elif isinstance(value, bool):
            out.append((0, "bool", int(value)))
        elif isinstance(value, (int, float, decimal.Decimal)):
            out.append((0, "num", value))
        elif isinstance(value, (datetime.datetime, datetime.date)):
            out.append((0, type(value).__name__, value))
        else:
            out.append((0, type(value).__name__, value if isinstance(value, str) else repr(value)))
    return tuple(out)


def to_tuples(rows: Iterable[Any]) -> list[tuple]:
    return [tuple(_norm(v) for v in r) for r in rows]


def sorted_tuples(rows: Iterable[Any]) -> list[tuple]:
    """Rows as tuples, in one order whatever order they came in."""
    return sorted(to_tuples(rows), key=_sort_key)


def rows_of(df: DataFrame) -> list[tuple]:
    """Collect a (small) DataFrame to a sorted list of tuples."""
    return sorted_tuples(df.collect())


#: the column that tells the two sides of ``_rows_of_both``'s union apart
_SIDE = "__sf_test_side"


def _rows_of_both(df_a: DataFrame, df_b: DataFrame) -> tuple[list[tuple], list[tuple]]:
    """``rows_of`` of two frames of one schema, collected by one Spark job (a union
    of both, each row tagged with its side; columns renamed by position, so that
    duplicate names stay apart)."""
    names = [f"c{i}" for i in range(len(df_a.columns))]
    both = (df_a.toDF(*names).selectExpr(f"0 AS {_SIDE}", "*")
            .unionAll(df_b.toDF(*names).selectExpr(f"1 AS {_SIDE}", "*")))
    sides: tuple[list[Any], list[Any]] = ([], [])
    for row in both.collect():
        sides[row[0]].append(row[1:])
    return sorted_tuples(sides[0]), sorted_tuples(sides[1])


def schema_of(df: DataFrame) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in df.schema.fields]


def _diff_message(got: list[tuple], want: list[tuple], label: str, limit: int = 15) -> str:
    cg, cw = collections.Counter(got), collections.Counter(want)
    extra = sorted((cg - cw).elements(), key=_sort_key)
    missing = sorted((cw - cg).elements(), key=_sort_key)
    lines = [
        f"{label}: row multisets differ: got {len(got)} rows, expected {len(want)} rows; "
        f"{len(extra)} unexpected, {len(missing)} missing",
    ]
    if extra:
        lines.append(f"  unexpected (in actual, not in expected), first {limit}:")
        lines += [f"    + {r}" for r in extra[:limit]]
    if missing:
        lines.append(f"  missing (in expected, not in actual), first {limit}:")
        lines += [f"    - {r}" for r in missing[:limit]]
    return "\n".join(lines)


def assert_same_rows(
    df_a: DataFrame, df_b: DataFrame, *, label: str = "dataframes", check_schema: bool = True
) -> None:
    """Assert two DataFrames hold the same rows as multisets (and the same columns)."""
    if check_schema:
        sa, sb = schema_of(df_a), schema_of(df_b)
        assert sa == sb, f"{label}: schemas differ:\n  actual:   {sa}\n  expected: {sb}"
        got, want = _rows_of_both(df_a, df_b)
    else:  # a union would cast one side's values to the other's types
        got, want = rows_of(df_a), rows_of(df_b)
    if got != want:
        raise AssertionError(_diff_message(got, want, label))


def assert_rows_equal(
    df: DataFrame, expected: Iterable[Sequence[Any]], *, label: str = "rows"
) -> None:
    """Assert a DataFrame holds exactly ``expected`` (tuples in column order) as a multiset."""
    got = rows_of(df)
    want = sorted_tuples(expected)
    if got != want:
        raise AssertionError(_diff_message(got, want, label))


# --------------------------------------------------------------------------- #
# The oracle
# --------------------------------------------------------------------------- #


def mv_sql(template: str, upstream: str) -> str:
    """The MV's SELECT with its FROM bound to a relation name."""
    return template.replace("{src}", upstream)


def oracle(spark: SparkSession, template: str, upstream_df: DataFrame) -> DataFrame:
    """Spark running the MV's SELECT as a batch query over ``upstream_df``."""
    return spark.sql(template, src=upstream_df)


def check_mv(eng, spark, mv: str, template: str, upstream: str, epoch: int) -> None:
    """The invariant: read(mv, as_of=e) == batch SELECT over read(upstream, as_of=e)."""
    got = eng.read(mv, as_of=epoch)
    want = oracle(spark, template, eng.read(upstream, as_of=epoch))
    assert_same_rows(
        got, want, label=f"MV {mv!r} vs batch query over {upstream!r} at epoch {epoch}"
    )


def step_checking_queries(eng, spark, queries: dict[str, str], batch: Callable[..., DataFrame],
                          before_epoch: Callable[[], object], limit: int,
                          label: str) -> dict[str, int]:
    """Epochs (``before_epoch()`` before each, at least 4, at most ``limit``) until
    every MV of ``queries`` (name -> SQL) was checked twice: once created, at every
    epoch, ``read(mv, as_of=e)`` equals ``batch(spark, eng, sql, e)``, Spark running
    the query over the snapshots of ``e``. Returns the checks per MV."""
    checked = {name: 0 for name in queries}
    for n in range(limit):
        before_epoch()
        report = eng.step()
        for name, sql in queries.items():
            if eng.progress(name).state == "created":
                assert_same_rows(eng.read(name, as_of=report.epoch),
                                 batch(spark, eng, sql, report.epoch),
                                 label=f"{label} {name} at epoch {report.epoch}")
                checked[name] += 1
        if n >= 3 and min(checked.values()) >= 2:
            break
    return checked


# --------------------------------------------------------------------------- #
# Table model
# --------------------------------------------------------------------------- #


class TableModel:
    """Pure-Python model of one keyed table under sparkfill's DML semantics."""

    def __init__(self, columns: Sequence[str], key: str | Sequence[str] = "id"):
        self.columns = list(columns)
        self.key_cols = [key] if isinstance(key, str) else list(key)
        self.committed: dict[Any, dict[str, Any]] = {}
        self.pending: list[Callable[[dict], None]] = []

    # -- helpers ---------------------------------------------------------- #
    def _key(self, row: dict) -> Any:
        if len(self.key_cols) == 1:
            return row[self.key_cols[0]]
        return tuple(row[c] for c in self.key_cols)

    def _full(self, row: dict) -> dict:
        return {c: row.get(c) for c in self.columns}

    # -- DML ----------------------------------------------------------------- #
    def insert(self, rows: Iterable[dict]) -> None:
        rows = [self._full(r) for r in rows]

        def apply(state: dict) -> None:
            for r in rows:
                state[self._key(r)] = dict(r)

        self.pending.append(apply)

    def delete(self, rows: Iterable[dict]) -> None:
        keys = [self._key(r) for r in rows]

        def apply(state: dict) -> None:
            for k in keys:
                state.pop(k, None)

        self.pending.append(apply)

    def sql_update(self, pred: Callable[[dict], bool], change: Callable[[dict], dict]) -> None:
        """UPDATE: evaluated now against the committed snapshot, staged as upserts."""
        staged = {}
        for k, row in self.committed.items():
            if pred(row):
                new = dict(row)
                new.update(change(row))
                staged[k] = new

        def apply(state: dict) -> None:
            for k, r in staged.items():
                state[k] = dict(r)

        self.pending.append(apply)

    def sql_delete(self, pred: Callable[[dict], bool]) -> None:
        """DELETE: evaluated now against the committed snapshot, staged as key deletes."""
        keys = [k for k, row in self.committed.items() if pred(row)]

        def apply(state: dict) -> None:
            for k in keys:
                state.pop(k, None)

        self.pending.append(apply)

    def step(self) -> bool:
        """Apply staged DML in call order; return whether the committed state changed."""
        state = {k: dict(v) for k, v in self.committed.items()}
        for fn in self.pending:
            fn(state)
        self.pending = []
        changed = state != self.committed
        self.committed = state
        return changed

    # -- views --------------------------------------------------------------- #
    def rows(self) -> list[tuple]:
        return [tuple(r[c] for c in self.columns) for r in self.committed.values()]

    def keys(self) -> list[Any]:
        return list(self.committed.keys())

    def snapshot(self) -> list[tuple]:
        return self.rows()


# --------------------------------------------------------------------------- #
# Subprocesses
# --------------------------------------------------------------------------- #


#: JVM options of the Spark a child process starts: the JIT's first tier only. A
#: child lives seconds to a minute; the optimizing tier's compiler threads took CPU
#: from its short queries on a 2-core machine (6 epochs in a fresh JVM: 145 and
#: 157 s against 180 and 196 s). The suite's own session runs for the whole suite
#: and keeps the default.
CHILD_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def child_submit_args() -> str:
    """``PYSPARK_SUBMIT_ARGS`` of a child process: the Spark driver it starts (the
    engine's default session) runs with the tests' session settings
    (``session_conf.py``: interpreted plans, Parquet read row by row), as the shared
    session does. Five tests of SIGKILLed drivers on three workers: their durations
    summed 742 s with the engine's defaults, 554 s with these (bench/RESULTS.md,
    stop 81)."""
    from session_conf import TEST_SPARK_CONF

    conf = [f"--conf {key}={value}" for key, value in TEST_SPARK_CONF.items()]
    return " ".join([*conf, "pyspark-shell"])


def subprocess_env(master: str = "local[1]") -> dict[str, str]:
    """Environment for a child Python process that runs sparkfill."""
    env = dict(os.environ)
    env["SPARKFILL_MASTER"] = master
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(tests_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [repo, tests_dir, env.get("PYTHONPATH", "")] if p
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("JAVA_TOOL_OPTIONS", CHILD_JVM_OPTIONS)
    env.setdefault("PYSPARK_SUBMIT_ARGS", child_submit_args())
    return env


def free_port() -> int:
    """A free TCP port on loopback (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
