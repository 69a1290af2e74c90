"""A statement fuzzer for sparkfill (issue 35, item 3).

Random statements from a grammar of the whole SQL surface (README's SQL reference,
``sparkfill/sql/frontend.py``): DDL, DML, MV queries of every supported shape with
their options, ALTER / CANCEL / SET / SHOW / VERIFY / EXPLAIN, sinks and source
tables; most of them then mutated (tokens dropped, swapped, duplicated or spliced,
types changed, names misspelt or replaced by odd ones, literals made huge, empty,
Unicode or NULL, the text cut short); and random calls of the public Python API
(``sparkfill.__all__``'s ``Engine``) with arguments of the wrong types and values.

The contract each one is held to (``Fuzzer.run``):

* it works, or raises a ``SparkfillError`` subclass whose message names the problem:
  never another exception, never the engine boundary's catch-all translation of
  one (an ``AssertionError``, ``KeyError``, ``TypeError``, a Py4J or sqlglot error
  that nothing anticipated), never a traceback in the message (``internal_reason``);
* a refused one leaves the warehouse byte-for-byte as it was: every table of the
  SQLite meta store and every file of the warehouse (names, sizes and hashes) are
  compared before and after (``warehouse_state``); so does a read-only statement
  that works (SHOW, EXPLAIN, VERIFY, a query);
* a VERIFY of a created MV that runs finds no differing row (an MV the fuzzer made
  is exact, whatever statements came before).

It runs in the test's process with the shared Spark session; most mutated
statements fail at parse or plan time without a Spark job, and the expensive ones
are capped (relations alive, epochs, VERIFYs collected). ``tests/torture.py`` runs it
at scale (``make torture``), ``tests/test_fuzz.py`` a fixed slice in CI.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import hashlib
import os
import random
import re
import sqlite3
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfill import SparkfillError

# --------------------------------------------------------------------------- #
# Classification of a failure
# --------------------------------------------------------------------------- #

#: exception types that mean a bug when the engine boundary had to translate them
INTERNAL_TYPES = (AssertionError, KeyError, IndexError, AttributeError, NameError, TypeError,
                  RecursionError, NotImplementedError, ZeroDivisionError, UnboundLocalError,
                  UnicodeError, OverflowError, sqlite3.Error)

#: words of a message that only an untranslated failure holds
_RAW_WORDS = ("INTERNAL_ERROR", "NullPointerException", "Py4JJavaError",
              "An error occurred while calling", "Traceback (most recent call last)")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 20:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__


def internal_reason(exc: BaseException) -> str | None:
    """Why ``exc`` is an internal error rather than a refusal naming the problem
    (None: a proper ``SparkfillError``)."""
    if not isinstance(exc, SparkfillError):
        return f"{type(exc).__module__}.{type(exc).__name__} is not a SparkfillError"
    text = str(exc)
    if not text.strip():
        return "a SparkfillError without a message"
    for word in _RAW_WORDS:
        if word in text:
            return f"the message holds {word!r}"
    if re.search(r"\n\s+at [\w$.]+\(", text):
        return "a JVM stack trace in the message"
    cause = exc.__cause__
    # Engine._translate's last resort: a failure nothing anticipated
    if type(exc) is SparkfillError and cause is not None \
            and not isinstance(cause, SparkfillError):
        return f"the boundary's catch-all translated {type(cause).__name__}"
    # the boundary translated it (its message starts with the method's name): by the
    # words of its text, which an internal failure may happen to hold
    if re.match(r"^Engine\.\w+: ", text):
        for c in list(_chain(exc))[1:]:
            if isinstance(c, INTERNAL_TYPES) or type(c).__module__.startswith(("py4j",
                                                                                 "sqlglot")):
                return f"the boundary translated {type(c).__name__}: {str(c)[:200]}"
    return None


# --------------------------------------------------------------------------- #
# The warehouse's state, byte for byte
# --------------------------------------------------------------------------- #

#: files of a warehouse that are not its contents: the meta store (compared by its
#: tables' rows) and the writer lock
_NOT_CONTENTS = ("meta.sqlite", "meta.sqlite-wal", "meta.sqlite-shm", "meta.sqlite-journal",
                 "writer.lock")


@dataclass
class WarehouseState:
    #: table name -> its rows (as text, sorted)
    meta: dict[str, list[str]]
    #: path under the warehouse -> (size, sha1)
    files: dict[str, tuple[int, str]]

    def diff(self, other: WarehouseState, limit: int = 8) -> list[str]:
        """What changed from ``self`` to ``other`` (empty: nothing)."""
        out: list[str] = []
        for table in sorted(set(self.meta) | set(other.meta)):
            a, b = self.meta.get(table, []), other.meta.get(table, [])
            if a != b:
                gone = sorted(set(a) - set(b))[:2]
                new = sorted(set(b) - set(a))[:2]
                out.append(f"meta table {table}: {len(a)} -> {len(b)} rows; gone {gone}; "
                           f"new {new}")
        for path in sorted(set(self.files) | set(other.files)):
            a_f, b_f = self.files.get(path), other.files.get(path)
            if a_f != b_f:
                out.append(f"file {path}: {a_f} -> {b_f}")
        return out[:limit]


_hash_cache: dict[tuple[str, int, int, int], str] = {}


def _file_hash(path: str, st: os.stat_result) -> str:
    """The file's SHA-1 (cached by inode, size and modification time in ns: a file whose
    bytes change without those changing is not a case the engine can produce)."""
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    found = _hash_cache.get(key)
    if found is None:
        with open(path, "rb") as fh:
            found = hashlib.sha1(fh.read()).hexdigest()
        if len(_hash_cache) > 200_000:
            _hash_cache.clear()
        _hash_cache[key] = found
    return found


def warehouse_state(path: str | Path, *others: str | Path) -> WarehouseState:
    """Every row of every table of the warehouse's SQLite meta store and every file
    of the warehouse (but the meta store's own and the lock) with its size and hash;
    and every file under the folders ``others`` (where sinks write)."""
    root = Path(path)
    meta: dict[str, list[str]] = {}
    con = sqlite3.connect(f"file:{root / 'meta.sqlite'}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        for table in tables:
            meta[table] = sorted(repr(tuple(r)) for r in con.execute(f'SELECT * FROM "{table}"'))
    finally:
        con.close()
    files: dict[str, tuple[int, str]] = {}
    for top in (root, *map(Path, others)):
        for dirpath, _, names in os.walk(top):
            for name in names:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                if rel in _NOT_CONTENTS:
                    continue
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                files[rel] = (st.st_size, _file_hash(full, st))
    return WarehouseState(meta, files)


# --------------------------------------------------------------------------- #
# The catalog as the grammar sees it
# --------------------------------------------------------------------------- #

NUMERIC = ("bigint", "int", "smallint", "tinyint", "double", "float")


@dataclass
class Rel:
    name: str
    kind: str  # "table" | "mv"
    cols: list[tuple[str, str]]  # visible (name, type)
    key: list[str]
    created: bool
    proctime: str | None = None
    source: bool = False

    def of(self, *types: str) -> list[str]:
        return [n for n, t in self.cols if any(t.startswith(x) for x in types)]

    @property
    def numeric(self) -> list[str]:
        return [n for n, t in self.cols if t in NUMERIC or t.startswith("decimal")]

    @property
    def writable(self) -> list[tuple[str, str]]:
        return [(n, t) for n, t in self.cols if n != self.proctime]


def catalog_view(eng: Any) -> list[Rel]:
    """The user's relations (tables and MVs, not internal ones)."""
    sources = {r.name.lower() for r in eng.catalog.all()
               if eng.sources.source_of(r) is not None}
    out = []
    for r in eng.catalog.all():
        if r.internal or r.kind not in ("table", "mv"):
            continue
        out.append(Rel(r.name, r.kind, [(c.name, c.type) for c in r.visible_columns],
                       list(r.key), r.state == "created", r.proctime,
                       r.name.lower() in sources or r.name.endswith("__dead_letter")))
    return out


def q(name: str) -> str:
    """An identifier as SQL (backticks where it needs them)."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("`", "``") + "`"


# --------------------------------------------------------------------------- #
# The grammar
# --------------------------------------------------------------------------- #

TYPES = ["BIGINT", "INT", "SMALLINT", "TINYINT", "STRING", "DOUBLE", "FLOAT", "BOOLEAN",
         "DATE", "TIMESTAMP", "DECIMAL(10,2)", "TIMESTAMPTZ", "TIMESTAMP_LTZ"]
ODD_TYPES = ["FANCYTYPE", "DECIMAL(99,100)", "DECIMAL(0,0)", "VARCHAR(-1)", "CHAR(3)",
             "ARRAY<INT>", "MAP<STRING,INT>", "STRUCT<a:INT>", "INTERVAL", "BINARY", "VOID",
             "TIMESTAMP_NTZ", "DECIMAL", "DECIMAL(38,38)", "INT(11)", "VARIANT", "NUMERIC",
             "DOUBLE PRECISION", "GEOMETRY", "UNSIGNED INT", "SERIAL"]
OPTIONS = {
    "backfill": ["'arrangement'", "'no_shuffle'", "'blocking'", "'buffer'", "'snapshot'"],
    "backfill_chunk_rows": ["3", "50", "1000"],
    "backfill_rate_limit": ["0", "5", "100000", "DEFAULT"],
    "backfill_parallelism": ["1", "2"],
    "backfill_target_epoch_ms": ["0", "500", "5000"],
    "backfill_order": ["'a, b'", "'t_a'"],
    "snapshot_backfill_max_lag_epochs": ["0", "2"],
    "refresh": ["'auto'", "'incremental'", "'full'"],
}
SET_OPTIONS = {**OPTIONS, "max_concurrent_creating_jobs": ["1", "4"],
               "verify_every": ["0", "3"], "verify_sample": ["0.5", "1"]}
ALTERABLE = ("backfill_rate_limit", "backfill_parallelism", "backfill_target_epoch_ms",
             "refresh")
#: names the fuzzer creates relations under (few, so that names collide)
TABLE_NAMES = [f"fz_t{i}" for i in range(6)]
MV_NAMES = [f"fz_m{i}" for i in range(10)]
SINK_NAMES = ["fz_s0", "fz_s1"]
#: names that are odd as relation or column names
ODD_NAMES = ["", " ", "a b", "Ünïcödé", "名前", "emoji😀", "__sf_x", "_vnode", "_sf_k_id",
             "_epoch", "_op", "x" * 300, "a/b", "../escape", "a*b", "a?b", "c[1]", "{x}",
             "a:b", "a%20b", "a\\b", "tab\tname", "new\nline", "nul\x00x", "select",
             "TABLE", "a.b", "`", "x`y", "\u202eevil", "\u200b", "null", "NULL"]
ODD_LITERALS = ["NULL", "''", "'" + "x" * 3000 + "'", "99999999999999999999999999999999999999",
                "-9223372036854775809", "9223372036854775807", "-1", "0", "1e308", "-1e308",
                "'NaN'", "CAST('NaN' AS DOUBLE)", "1/0", "'😀'", "'Ünï'", "'\u202e'",
                "'a\x00b'", "X'00FF'", "DATE '2024-13-45'", "TIMESTAMP 'garbage'",
                "TRUE", "CAST(NULL AS INT)", "'1'", "1.5", "-0.0", "ARRAY(1, 2)",
                "MAP('a', 1)", "NAMED_STRUCT('a', 1)", "INTERVAL '1' DAY", "'''", "(SELECT 1)",
                "current_timestamp()", "rand()", "uuid()", "12345678901234567890.123",
                "'2024-01-01'", "DATE '2024-01-01'", "TIMESTAMP '2024-01-01 00:00:00'"]
KEYWORDS = ["SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "LIMIT", "JOIN", "ON",
            "UNION", "ALL", "AS", "WITH", "(", ")", ",", ";", "--", "/*", "*/", "'", "\"",
            "`", "*", "=", "NOT", "NULL", "AND", "OR", "IN", "EXISTS", "DISTINCT", "OVER",
            "PARTITION BY", "HAVING", "PRIMARY KEY", "IF NOT EXISTS", "IF EXISTS", "DEFAULT",
            "MATERIALIZED", "VIEW", "TABLE", "SINK", "VALUES", "SET", "RECOMPUTE", "CANCEL",
            "JOBS", "EPOCH", "SAMPLE", "PERCENT", "AS OF", "LATERAL", "CROSS", "NATURAL",
            "USING", "WINDOW", "QUALIFY", "PIVOT", "TABLESAMPLE", "{", "}", "$", "?", "%s",
            "\\", "\x00", "\ufeff", "😀"]
FUNCTIONS = ["count", "sum", "avg", "min", "max", "stddev", "variance", "count_if",
             "bool_and", "bool_or", "first", "collect_list", "rand", "now", "uuid",
             "current_timestamp", "abs", "upper", "coalesce", "no_such_fn", "explode",
             "row_number", "rank", "lag", "window", "session_window", "TUMBLE", "HOP",
             "SESSION", "monotonically_increasing_id", "input_file_name", "spark_partition_id"]


def literal(rng: random.Random, type_: str, key: int | None = None) -> str:
    """A SQL literal of ``type_`` (a key: the given small integer where numeric)."""
    t = type_.lower()
    if t in ("bigint", "int", "smallint", "tinyint"):
        return str(key if key is not None else rng.randint(-3, 40))
    if t in ("double", "float"):
        return repr(round(rng.uniform(-5, 50), 2))
    if t.startswith("decimal"):
        return f"{rng.randint(0, 999)}.{rng.randint(0, 99):02d}"
    if t == "boolean":
        return rng.choice(["TRUE", "FALSE"])
    if t == "date":
        return f"DATE '2024-01-{rng.randint(1, 28):02d}'"
    if t.startswith("timestamp"):
        return f"TIMESTAMP '2024-01-01 00:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}'"
    if key is not None:
        return f"'k{key}'"
    return "'" + rng.choice(["a", "b", "c", "x y", "Ü", ""]) + "'"


def py_value(rng: random.Random, type_: str, key: int | None = None) -> Any:
    """A Python value of ``type_`` for ``Engine.insert``."""
    t = type_.lower()
    if t in ("bigint", "int", "smallint", "tinyint"):
        return key if key is not None else rng.randint(-3, 40)
    if t in ("double", "float"):
        return round(rng.uniform(-5, 50), 2)
    if t.startswith("decimal"):
        return decimal.Decimal(f"{rng.randint(0, 999)}.{rng.randint(0, 99):02d}")
    if t == "boolean":
        return rng.random() < 0.5
    if t == "date":
        return datetime.date(2024, 1, rng.randint(1, 28))
    if t.startswith("timestamp"):
        return datetime.datetime(2024, 1, 1, 0, rng.randint(0, 59), rng.randint(0, 59))
    return f"k{key}" if key is not None else rng.choice(["a", "b", "c", "Ü"])


class Grammar:
    """Valid-looking statements over the relations the warehouse holds."""

    def __init__(self, rng: random.Random, sink_root: str) -> None:
        self.rng = rng
        self.sink_root = sink_root
        self.rels: list[Rel] = []

    # --- picking ----------------------------------------------------------------------

    def pick(self, kind: str | None = None, created: bool | None = None,
             writable: bool = False) -> Rel | None:
        cands = [r for r in self.rels if (kind is None or r.kind == kind)
                 and (created is None or r.created == created)
                 and not (writable and r.source)]
        return self.rng.choice(cands) if cands else None

    def readable(self) -> Rel | None:
        """A relation an MV or a query may read: a table or a created MV."""
        cands = [r for r in self.rels if r.kind == "table" or r.created]
        return self.rng.choice(cands) if cands else None

    def col(self, rel: Rel, *types: str) -> str:
        names = rel.of(*types) if types else [n for n, _ in rel.cols]
        return self.rng.choice(names or [rel.key[0] if rel.key else rel.cols[0][0]])

    def num(self, rel: Rel) -> str:
        return self.rng.choice(rel.numeric or [rel.cols[0][0]])

    def pred(self, rel: Rel, alias: str = "") -> str:
        p = f"{alias}." if alias else ""
        c = self.col(rel)
        t = dict(rel.cols).get(c, "bigint")
        return self.rng.choice([
            f"{p}{q(c)} IS NOT NULL",
            f"{p}{q(c)} <> {literal(self.rng, t)}",
            f"{p}{q(self.num(rel))} % 3 <> 0",
            f"({p}{q(c)} IS NULL OR {p}{q(self.num(rel))} > 2)",
        ])

    # --- statements -------------------------------------------------------------------

    def statement(self) -> str:
        kinds: list[tuple[Callable[[], str | None], int]] = [
            (self.create_table, 4), (self.insert, 12), (self.update, 6), (self.delete, 5),
            (self.create_mv, 20), (self.explain_create, 5), (self.explain_existing, 2),
            (self.select, 7), (self.drop, 5), (self.alter, 4), (self.recompute, 2),
            (self.cancel, 2), (self.set_option, 4), (self.show, 3), (self.verify, 4),
            (self.create_sink, 2), (self.drop_sink, 1), (self.create_source, 1),
        ]
        while True:
            fn = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            sql = fn()
            if sql is not None:
                return sql

    def create_table(self) -> str:
        rng = self.rng
        n = rng.randint(1, 5)
        cols = [("id", rng.choice(["BIGINT", "INT", "STRING"]))]
        cols += [(f"c{i}", rng.choice(TYPES)) for i in range(n)]
        parts = [f"{c} {t}" + (" NOT NULL" if rng.random() < 0.15 else "") for c, t in cols]
        if rng.random() < 0.2:
            parts.append("p_time TIMESTAMP AS PROCTIME()")
        key = ["id"] if rng.random() < 0.8 else ["id", "c0"]
        parts.append(f"PRIMARY KEY ({', '.join(key)})")
        ine = "IF NOT EXISTS " if rng.random() < 0.2 else ""
        return f"CREATE TABLE {ine}{rng.choice(TABLE_NAMES)} ({', '.join(parts)})"

    def create_source(self) -> str:
        rng = self.rng
        name = rng.choice(TABLE_NAMES)
        if rng.random() < 0.5:
            opts = (f"connector = 'datagen', rows_per_epoch = {rng.choice([1, 3, 5])}, "
                    f"seed = {rng.randint(0, 9)}")
        else:
            opts = (f"connector = 'cdc_files', path = '{self.sink_root}/cdc_{rng.randint(0, 3)}',"
                    " format = 'debezium_json'")
        return (f"CREATE TABLE {name} (id BIGINT, v BIGINT, s STRING, PRIMARY KEY (id)) "
                f"WITH ({opts})")

    def insert(self) -> str | None:
        rel = self.pick("table", writable=True)
        if rel is None:
            return None
        rng = self.rng
        cols = rel.writable
        named = rng.random() < 0.6
        if named and rng.random() < 0.3:
            keep = [c for c in cols if c[0] in rel.key]
            cols = keep + [c for c in cols if c[0] not in rel.key and rng.random() < 0.5]
        rows = []
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(0, 30)
            rows.append("(" + ", ".join(literal(rng, t, k if n in rel.key else None)
                                        for n, t in cols) + ")")
        names = f" ({', '.join(q(n) for n, _ in cols)})" if named else ""
        return f"INSERT INTO {q(rel.name)}{names} VALUES {', '.join(rows)}"

    def update(self) -> str | None:
        rel = self.pick("table", writable=True)
        if rel is None:
            return None
        rng = self.rng
        cands = [c for c in rel.writable if c[0] not in rel.key] or rel.writable
        c, t = rng.choice(cands)
        value = (f"{q(c)} + 1" if t in NUMERIC and rng.random() < 0.5 else literal(rng, t))
        where = f" WHERE {self.pred(rel)}" if rng.random() < 0.7 else ""
        return f"UPDATE {q(rel.name)} SET {q(c)} = {value}{where}"

    def delete(self) -> str | None:
        rel = self.pick("table", writable=True)
        if rel is None:
            return None
        where = f" WHERE {self.pred(rel)}" if self.rng.random() < 0.85 else ""
        return f"DELETE FROM {q(rel.name)}{where}"

    def with_options(self) -> str:
        rng = self.rng
        if rng.random() < 0.4:
            return ""
        names = rng.sample(sorted(OPTIONS), rng.randint(1, 3))
        opts = []
        for n in names:
            value = rng.choice(OPTIONS[n])
            if n == "backfill" and value == "'snapshot'" and rng.random() < 0.7:
                value = "'arrangement'"  # a phase-1 thread per MV costs; keep some
            opts.append(f"{n} = {value}")
        return f"WITH ({', '.join(opts)}) "

    def create_mv(self) -> str | None:
        query = self.query()
        if query is None:
            return None
        ine = "IF NOT EXISTS " if self.rng.random() < 0.15 else ""
        return (f"CREATE MATERIALIZED VIEW {ine}{self.rng.choice(MV_NAMES)} "
                f"{self.with_options()}AS {query}")

    def explain_create(self) -> str | None:
        query = self.query()
        if query is None:
            return None
        return f"EXPLAIN CREATE MATERIALIZED VIEW fz_explained AS {query}"

    def explain_existing(self) -> str | None:
        rel = self.pick("mv")
        name = rel.name if rel is not None else self.rng.choice(MV_NAMES)
        return f"EXPLAIN MATERIALIZED VIEW {q(name)}"

    def select(self) -> str | None:
        query = self.query()
        if query is None:
            return None
        return query

    def drop(self) -> str | None:
        rng = self.rng
        rel = self.pick()
        ie = "IF EXISTS " if rng.random() < 0.3 else ""
        if rel is None or rng.random() < 0.1:
            kind = rng.choice(["TABLE", "MATERIALIZED VIEW"])
            return f"DROP {kind} {ie}{rng.choice(TABLE_NAMES + MV_NAMES)}"
        kind = "TABLE" if rel.kind == "table" else "MATERIALIZED VIEW"
        if rng.random() < 0.1:
            kind = "VIEW" if rng.random() < 0.5 else ("TABLE" if rel.kind == "mv"
                                                      else "MATERIALIZED VIEW")
        return f"DROP {kind} {ie}{q(rel.name)}"

    def alter(self) -> str | None:
        rel = self.pick("mv")
        if rel is None:
            return None
        opt = self.rng.choice([*ALTERABLE, "backfill", "backfill_chunk_rows"])
        value = self.rng.choice(OPTIONS.get(opt, ["1"]) + ["DEFAULT"])
        return f"ALTER MATERIALIZED VIEW {q(rel.name)} SET {opt} = {value}"

    def recompute(self) -> str | None:
        rel = self.pick("mv")
        name = rel.name if rel is not None else self.rng.choice(MV_NAMES)
        return f"ALTER MATERIALIZED VIEW {q(name)} RECOMPUTE"

    def cancel(self) -> str | None:
        rels = [r.name for r in self.rels if r.kind == "mv" and not r.created]
        if not rels or self.rng.random() < 0.3:
            rels = [self.rng.choice(MV_NAMES + TABLE_NAMES)]
        return f"CANCEL JOBS {', '.join(q(n) for n in rels[:2])}"

    def set_option(self) -> str:
        name = self.rng.choice(sorted(SET_OPTIONS))
        value = self.rng.choice(SET_OPTIONS[name] + ["DEFAULT"])
        if name == "verify_every" and value not in ("0", "DEFAULT"):
            value = "0"  # a sampled VERIFY every few epochs is expensive; rarely
        return f"SET {name} {self.rng.choice(['=', 'TO'])} {value}"

    def show(self) -> str:
        return "SHOW " + self.rng.choice(["TABLES", "MATERIALIZED VIEWS", "JOBS", "SINKS"])

    def verify(self) -> str | None:
        rel = self.pick("mv")
        if rel is None:
            return None
        tail = ""
        if self.rng.random() < 0.3:
            tail += f" AS OF {self.rng.randint(0, 40)}"
        if self.rng.random() < 0.3:
            tail += f" SAMPLE {self.rng.choice(['0.5', '1', '50 PERCENT', '0', '2'])}"
        return f"VERIFY MATERIALIZED VIEW {q(rel.name)}{tail}"

    def create_sink(self) -> str | None:
        rel = self.pick("mv")
        name = rel.name if rel is not None else self.rng.choice(MV_NAMES)
        path = f"{self.sink_root}/sink_{self.rng.randint(0, 99)}"
        return (f"CREATE SINK {self.rng.choice(SINK_NAMES)} FROM {q(name)} WITH "
                f"(connector = 'delta', path = '{path}', buckets = {self.rng.choice([1, 4])})")

    def drop_sink(self) -> str:
        return f"DROP SINK {'IF EXISTS ' if self.rng.random() < 0.3 else ''}" \
               f"{self.rng.choice(SINK_NAMES)}"

    # --- MV queries of every shape ----------------------------------------------------

    def query(self) -> str | None:
        r = self.readable()
        if r is None:
            return None
        s = self.readable() or r
        shapes = [self.q_project, self.q_group, self.q_global, self.q_distinct, self.q_join,
                  self.q_join3, self.q_union_all, self.q_setop, self.q_topn, self.q_derived,
                  self.q_in, self.q_exists, self.q_not_in, self.q_scalar, self.q_cte,
                  self.q_window, self.q_topn_per_partition, self.q_tumble, self.q_session,
                  self.q_comma_join, self.q_filter_agg, self.q_alias_list]
        return self.rng.choice(shapes)(r, s)

    def q_project(self, r: Rel, s: Rel) -> str:
        k, n = q(self.col(r)), q(self.num(r))
        return (f"SELECT {k}, {n} * 2 AS w, coalesce(CAST({n} AS STRING), 'none') AS t "
                f"FROM {q(r.name)} WHERE {self.pred(r)}")

    def q_group(self, r: Rel, s: Rel) -> str:
        g, n = q(self.col(r)), q(self.num(r))
        aggs = self.rng.sample(["count(*) AS n", f"sum({n}) AS s", f"min({n}) AS lo",
                                f"max({n}) AS hi", f"avg({n}) AS a", f"count(DISTINCT {n}) AS d",
                                f"count_if({n} > 1) AS ci", f"stddev({n}) AS sd",
                                f"bool_or({n} > 3) AS bo", f"count({n}) AS cn"],
                               self.rng.randint(1, 4))
        having = " HAVING count(*) > 1" if self.rng.random() < 0.3 else ""
        return f"SELECT {g}, {', '.join(aggs)} FROM {q(r.name)} GROUP BY {g}{having}"

    def q_global(self, r: Rel, s: Rel) -> str:
        n = q(self.num(r))
        return f"SELECT count(*) AS n, sum({n}) AS s, max({n}) AS m FROM {q(r.name)}"

    def q_distinct(self, r: Rel, s: Rel) -> str:
        return f"SELECT DISTINCT {q(self.col(r))} FROM {q(r.name)}"

    def _join_cols(self, r: Rel, s: Rel) -> tuple[str, str]:
        """Columns of ``r`` and ``s`` of one type class, to join on."""
        for a, ta in self.rng.sample(r.cols, len(r.cols)):
            for b, tb in s.cols:
                if (ta in NUMERIC) == (tb in NUMERIC) and (ta == "string") == (tb == "string"):
                    return a, b
        return r.cols[0][0], s.cols[0][0]

    def q_join(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        kind = self.rng.choice(["JOIN", "INNER JOIN", "LEFT JOIN", "RIGHT JOIN",
                                "FULL OUTER JOIN"])
        tail = ""
        if self.rng.random() < 0.3:
            tail = f" GROUP BY x.{q(a)}"
            sel = f"x.{q(a)}, count(*) AS n"
        else:
            sel = f"x.{q(self.col(r))} AS l, y.{q(self.col(s))} AS r"
        return (f"SELECT {sel} FROM {q(r.name)} x {kind} {q(s.name)} y "
                f"ON x.{q(a)} = y.{q(b)}{tail}")

    def q_join3(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        return (f"SELECT x.{q(a)} AS k, y.{q(self.col(s))} AS v, z.{q(self.col(r))} AS w "
                f"FROM {q(r.name)} x JOIN {q(s.name)} y ON x.{q(a)} = y.{q(b)} "
                f"LEFT JOIN {q(r.name)} z ON y.{q(b)} = z.{q(a)} WHERE {self.pred(r, 'x')}")

    def q_union_all(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        return (f"SELECT {q(a)} AS k FROM {q(r.name)} UNION ALL "
                f"SELECT {q(b)} AS k FROM {q(s.name)} WHERE {self.pred(s)}")

    def q_setop(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        op = self.rng.choice(["UNION", "INTERSECT", "EXCEPT", "INTERSECT ALL", "EXCEPT ALL"])
        return f"SELECT {q(a)} AS k FROM {q(r.name)} {op} SELECT {q(b)} AS k FROM {q(s.name)}"

    def q_topn(self, r: Rel, s: Rel) -> str:
        k, n = q(self.col(r)), q(self.num(r))
        off = f" OFFSET {self.rng.randint(0, 3)}" if self.rng.random() < 0.3 else ""
        cols = f"{k}, {n}" if k != n else k
        return (f"SELECT {cols} FROM {q(r.name)} ORDER BY {n} DESC "
                f"LIMIT {self.rng.randint(1, 5)}{off}")

    def q_derived(self, r: Rel, s: Rel) -> str:
        g = q(self.col(r))
        return (f"SELECT g, n FROM (SELECT {g} AS g, count(*) AS n FROM {q(r.name)} "
                f"GROUP BY {g}) AS d WHERE n >= 1")

    def q_in(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        return (f"SELECT {q(a)}, {q(self.col(r))} AS c FROM {q(r.name)} "
                f"WHERE {q(a)} IN (SELECT {q(b)} FROM {q(s.name)})")

    def q_exists(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        neg = "NOT " if self.rng.random() < 0.5 else ""
        return (f"SELECT x.{q(a)} FROM {q(r.name)} x WHERE {neg}EXISTS "
                f"(SELECT 1 FROM {q(s.name)} y WHERE y.{q(b)} = x.{q(a)})")

    def q_not_in(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        return (f"SELECT {q(a)} FROM {q(r.name)} WHERE {q(a)} NOT IN "
                f"(SELECT {q(b)} FROM {q(s.name)})")

    def q_scalar(self, r: Rel, s: Rel) -> str:
        n, m = q(self.num(r)), q(self.num(s))
        return (f"SELECT {q(self.col(r))} AS k, {n} FROM {q(r.name)} "
                f"WHERE {n} >= (SELECT avg({m}) FROM {q(s.name)})")

    def q_cte(self, r: Rel, s: Rel) -> str:
        g = q(self.col(r))
        return (f"WITH c AS (SELECT {g} AS g, count(*) AS n FROM {q(r.name)} GROUP BY {g}) "
                f"SELECT g, n FROM c WHERE n > 0")

    def q_window(self, r: Rel, s: Rel) -> str:
        p, o = q(self.col(r)), q(self.num(r))
        fn = self.rng.choice(["row_number()", "rank()", "dense_rank()", f"lag({o})",
                              f"sum({o})"])
        return (f"SELECT {q(r.key[0] if r.key else r.cols[0][0])} AS k, {p} AS p, "
                f"{fn} OVER (PARTITION BY {p} ORDER BY {o}) AS w FROM {q(r.name)}")

    def q_topn_per_partition(self, r: Rel, s: Rel) -> str:
        p, o = q(self.col(r)), q(self.num(r))
        return (f"SELECT p, o, rn FROM (SELECT {p} AS p, {o} AS o, row_number() OVER "
                f"(PARTITION BY {p} ORDER BY {o} DESC) AS rn FROM {q(r.name)}) s WHERE rn <= 2")

    def q_tumble(self, r: Rel, s: Rel) -> str:
        ts = r.of("timestamp")
        col = q(ts[0]) if ts else q(self.col(r))
        if self.rng.random() < 0.5:
            return (f"SELECT window_start, count(*) AS n FROM TUMBLE({q(r.name)}, {col}, "
                    f"INTERVAL '10' SECOND) GROUP BY window_start")
        return (f"SELECT window_start, window_end, count(*) AS n FROM HOP({q(r.name)}, {col}, "
                f"INTERVAL '10' SECOND, INTERVAL '20' SECOND) GROUP BY window_start, window_end")

    def q_session(self, r: Rel, s: Rel) -> str:
        ts = r.of("timestamp")
        col = q(ts[0]) if ts else q(self.col(r))
        g = q(self.col(r))
        return (f"SELECT {g} AS g, session_window.start AS st, count(*) AS n FROM {q(r.name)} "
                f"GROUP BY {g}, session_window({col}, '10 seconds')")

    def q_comma_join(self, r: Rel, s: Rel) -> str:
        a, b = self._join_cols(r, s)
        return (f"SELECT x.{q(a)} AS k, y.{q(self.col(s))} AS v FROM {q(r.name)} x, "
                f"{q(s.name)} y WHERE x.{q(a)} = y.{q(b)}")

    def q_filter_agg(self, r: Rel, s: Rel) -> str:
        g, n = q(self.col(r)), q(self.num(r))
        return (f"SELECT {g}, sum({n}) FILTER (WHERE {n} > 1) AS s FROM {q(r.name)} "
                f"GROUP BY {g}")

    def q_alias_list(self, r: Rel, s: Rel) -> str:
        g = q(self.col(r))
        return (f"SELECT a, b FROM (SELECT {g}, count(*) FROM {q(r.name)} GROUP BY {g}) "
                f"AS d (a, b)")


# --------------------------------------------------------------------------- #
# Mutations
# --------------------------------------------------------------------------- #

_TOKEN = re.compile(r"'(?:[^']|'')*'?|\"[^\"]*\"?|`[^`]*`?|\d+(?:\.\d+)?(?:e[+-]?\d+)?|"
                    r"\w+|\s+|.", re.IGNORECASE | re.DOTALL)
_TYPE_WORDS = {t.split("(")[0] for t in TYPES} | {"DECIMAL"}


def tokens(sql: str) -> list[str]:
    return _TOKEN.findall(sql)


class Mutator:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ops: list[Callable[[list[str], list[int]], None]] = [
            self.drop_token, self.swap_tokens, self.duplicate_token, self.change_type,
            self.misspell, self.odd_literal, self.odd_name, self.truncate, self.insert_token,
            self.null_literal, self.change_operator, self.change_function, self.splice,
            self.second_statement, self.case_change, self.unbalance,
        ]
        self.previous: list[str] = ["SELECT 1"]

    def mutate(self, sql: str, n: int) -> str:
        toks = tokens(sql)
        for _ in range(n):
            idx = [i for i, t in enumerate(toks) if not t.isspace()]
            if not idx:
                break
            self.rng.choice(self.ops)(toks, idx)
        out = "".join(toks)
        self.previous = (self.previous + [sql])[-20:]
        return out

    def drop_token(self, toks: list[str], idx: list[int]) -> None:
        toks[self.rng.choice(idx)] = ""

    def swap_tokens(self, toks: list[str], idx: list[int]) -> None:
        i, j = self.rng.choice(idx), self.rng.choice(idx)
        toks[i], toks[j] = toks[j], toks[i]

    def duplicate_token(self, toks: list[str], idx: list[int]) -> None:
        i = self.rng.choice(idx)
        toks[i] = toks[i] + " " + toks[i]

    def change_type(self, toks: list[str], idx: list[int]) -> None:
        at = [i for i in idx if toks[i].upper() in _TYPE_WORDS]
        i = self.rng.choice(at or idx)
        toks[i] = self.rng.choice(TYPES + ODD_TYPES)

    def misspell(self, toks: list[str], idx: list[int]) -> None:
        words = [i for i in idx if re.fullmatch(r"\w+", toks[i])]
        if not words:
            return
        i = self.rng.choice(words)
        w = toks[i]
        p = self.rng.randrange(len(w) + 1)
        toks[i] = self.rng.choice([w[:p] + w[p + 1:], w[:p] + "x" + w[p:],
                                   w[:p] + w[p:].swapcase(), w + "_", w[::-1]])

    def odd_literal(self, toks: list[str], idx: list[int]) -> None:
        lits = [i for i in idx if re.fullmatch(r"'.*'|\d+(\.\d+)?|TRUE|FALSE|NULL", toks[i],
                                               re.IGNORECASE | re.DOTALL)]
        i = self.rng.choice(lits or idx)
        toks[i] = self.rng.choice(ODD_LITERALS)

    def odd_name(self, toks: list[str], idx: list[int]) -> None:
        words = [i for i in idx if re.fullmatch(r"[A-Za-z_]\w*|`[^`]*`", toks[i])]
        if not words:
            return
        name = self.rng.choice(ODD_NAMES)
        toks[self.rng.choice(words)] = self.rng.choice([
            "`" + name.replace("`", "``") + "`", name])

    def truncate(self, toks: list[str], idx: list[int]) -> None:
        cut = self.rng.choice(idx)
        for i in range(cut, len(toks)):
            toks[i] = ""

    def insert_token(self, toks: list[str], idx: list[int]) -> None:
        i = self.rng.choice(idx)
        toks[i] = toks[i] + " " + self.rng.choice(KEYWORDS) + " "

    def null_literal(self, toks: list[str], idx: list[int]) -> None:
        lits = [i for i in idx if re.fullmatch(r"'.*'|\d+(\.\d+)?", toks[i], re.DOTALL)]
        if lits:
            toks[self.rng.choice(lits)] = "NULL"

    def change_operator(self, toks: list[str], idx: list[int]) -> None:
        ops = [i for i in idx if toks[i] in ("=", "<", ">", "+", "-", "*", "%", ",")
               or toks[i].upper() in ("AND", "OR", "NOT", "IS", "IN")]
        if ops:
            toks[self.rng.choice(ops)] = self.rng.choice(
                ["=", "<>", "<=>", "||", "+", "/", "AND", "OR", "NOT", "IS", "IN", "LIKE", ","])

    def change_function(self, toks: list[str], idx: list[int]) -> None:
        fns = [i for i in idx[:-1] if re.fullmatch(r"[A-Za-z_]\w*", toks[i])
               and "(" in "".join(toks[i + 1:i + 3])]
        if fns:
            toks[self.rng.choice(fns)] = self.rng.choice(FUNCTIONS)

    def splice(self, toks: list[str], idx: list[int]) -> None:
        other = tokens(self.rng.choice(self.previous))
        if not other:
            return
        a = self.rng.randrange(len(other))
        b = min(len(other), a + self.rng.randint(1, 12))
        i = self.rng.choice(idx)
        toks[i] = toks[i] + " " + "".join(other[a:b]) + " "

    def second_statement(self, toks: list[str], idx: list[int]) -> None:
        toks.append(self.rng.choice(["; SELECT 1", ";", "; DROP TABLE fz_t0", " -- comment",
                                     " /* open comment", ";;"]))

    def case_change(self, toks: list[str], idx: list[int]) -> None:
        i = self.rng.choice(idx)
        toks[i] = toks[i].swapcase()

    def unbalance(self, toks: list[str], idx: list[int]) -> None:
        i = self.rng.choice(idx)
        toks[i] = toks[i] + self.rng.choice(["(", ")", "'", "\"", "`", "[", "{", "((", "))"])


# --------------------------------------------------------------------------- #
# Python API calls with wrong types
# --------------------------------------------------------------------------- #

class _Weird:
    """An object no API call expects."""

    def __repr__(self) -> str:
        return "<weird object>"


def odd_values(rng: random.Random) -> Any:
    return rng.choice([None, 0, -1, 2**70, -(2**70), 1.5, float("nan"), float("inf"), True,
                       "", "x" * 10_000, "😀", "\ud800", "a\x00b", b"bytes", bytearray(b"x"),
                       [1, 2], (1,), {"a": 1}, {1, 2}, _Weird(), decimal.Decimal("1e40"),
                       decimal.Decimal("NaN"), datetime.date(1, 1, 1),
                       datetime.datetime(9999, 12, 31, 23, 59, 59),
                       datetime.timedelta(days=1), complex(1, 2), "12", "1e3", "NULL",
                       datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)])


@dataclass
class ApiCall:
    what: str
    call: Callable[[], Any]
    #: whether it may write (a refused one must change nothing; an accepted read
    #: neither)
    writes: bool
    #: the call as a step of a trace (``replay``); None: not replayed
    replay: tuple[Any, ...] | None = None


class ApiCalls:
    def __init__(self, rng: random.Random, grammar: Grammar) -> None:
        self.rng = rng
        self.grammar = grammar

    def name(self, kind: str | None = None) -> Any:
        rng = self.rng
        r = self.grammar.pick(kind)
        roll = rng.random()
        if r is not None and roll < 0.6:
            return r.name if rng.random() < 0.8 else r.name.upper()
        if roll < 0.8:
            return rng.choice(ODD_NAMES + TABLE_NAMES + MV_NAMES)
        return odd_values(rng)

    def rows(self, rel: Rel | None) -> Any:
        rng = self.rng
        roll = rng.random()
        if rel is None or roll < 0.12:
            return odd_values(rng)
        rows = []
        for _ in range(rng.randint(0, 4)):
            k = rng.randint(0, 30)
            rows.append({n: py_value(rng, t, k if n in rel.key else None)
                         for n, t in rel.writable})
        if roll < 0.75 and rows:
            # one thing wrong in one row
            row = rng.choice(rows)
            what = rng.randrange(7)
            cols = list(row)
            if what == 0:
                row[rng.choice(cols)] = odd_values(rng)
            elif what == 1:
                row.pop(rng.choice(cols))
            elif what == 2:
                row[rng.choice(["colour", "", "😀", 5, None, "_vnode"])] = 1
            elif what == 3 and rel.key:
                row[rel.key[0]] = None
            elif what == 4:
                rows.append(rng.choice([None, 1, "row", [1, 2], (1,), _Weird()]))
            elif what == 5 and rel.proctime:
                row[rel.proctime] = datetime.datetime(2024, 1, 1)
            else:
                row[rng.choice(cols).upper()] = row.pop(rng.choice(cols), None)
        form = rng.random()
        if form < 0.15:
            import pandas as pd
            try:
                return pd.DataFrame(rows)
            except Exception:  # noqa: BLE001 - pandas refuses odd rows itself
                return rows
        if form < 0.2:
            return (r for r in rows)  # an iterator
        if form < 0.25:
            return rows[0] if rows else {}
        return rows

    def as_of(self) -> Any:
        rng = self.rng
        return rng.choice([None, 0, 1, -1, 10**20, "3", "x", 1.5, float("nan"), True, [1],
                           odd_values(rng)])

    def call(self, eng: Any) -> ApiCall:
        rng = self.rng
        g = self.grammar
        choice = rng.randrange(12)
        if choice <= 2:
            rel = g.pick("table")
            table = rel.name if rel is not None and rng.random() < 0.8 else self.name()
            rows = self.rows(rel)
            if isinstance(rows, Iterator):
                rows = list(rows)
            return ApiCall(f"insert({table!r}, {_short(rows)})",
                           lambda: eng.insert(table, rows), True, ("insert", table, rows))
        if choice == 3:
            rel = g.pick("table")
            table = rel.name if rel is not None and rng.random() < 0.8 else self.name()
            keys = self.rows(rel)
            if isinstance(keys, Iterator):
                keys = list(keys)
            return ApiCall(f"delete({table!r}, {_short(keys)})",
                           lambda: eng.delete(table, keys), True, ("delete", table, keys))
        if choice == 4:
            name, as_of = self.name(), self.as_of()
            return ApiCall(f"read({name!r}, as_of={as_of!r})",
                           lambda: eng.read(name, as_of=as_of), False)
        if choice == 5:
            name = self.name("mv") if rng.random() < 0.9 else None
            return ApiCall(f"progress({name!r})", lambda: eng.progress(name), False)
        if choice == 6:
            arg = rng.choice([None, 1, b"SHOW TABLES", ["SHOW TABLES"], "", "   ", ";",
                              "\x00", "SHOW TABLES;;", "--", "/*", odd_values(rng)])
            return ApiCall(f"sql({_short(arg)})", lambda: eng.sql(arg), True)
        if choice == 7:
            arg = self.name("mv") if rng.random() < 0.7 else odd_values(rng)
            return ApiCall(f"explain({_short(arg)})", lambda: eng.explain(arg), False)
        if choice == 8:
            name, as_of = self.name("mv"), self.as_of()
            sample = rng.choice([None, 0.5, 1, 0, -1, 2, "0.5", "x", float("nan"), True])
            return ApiCall(f"verify({name!r}, as_of={as_of!r}, sample={sample!r})",
                           lambda: eng.verify(name, as_of=as_of, sample=sample), False)
        if choice == 9:
            as_of = self.as_of()
            return ApiCall(f"create_temp_views(as_of={as_of!r})",
                           lambda: eng.create_temp_views(as_of=as_of), False)
        if choice == 10:
            name = self.name()
            return ApiCall(f"relation({name!r})", lambda: eng.relation(name), False)
        if choice == 11 and rng.random() < 0.5:
            return self.open(eng)
        return ApiCall("session_options()", eng.session_options, False)

    def open(self, eng: Any) -> ApiCall:
        """``Engine(...)`` with odd arguments (opened, then closed); never ``spark=None``,
        which would build a session of the engine's own and stop it on close."""
        from sparkfill import Engine

        rng = self.rng
        location = rng.choice([f"wh_{rng.randint(0, 3)}", str(eng.path),
                               f"{eng.path}/meta.sqlite", "/proc/sparkfill", "", "ftp://x/y",
                               "s3://", odd_values(rng)])
        kwargs: dict[str, Any] = {"spark": eng.spark}
        if rng.random() < 0.3:
            kwargs["spark"] = rng.choice(["spark", 5, _Weird()])
        if rng.random() < 0.3:
            kwargs["meta"] = rng.choice([5, "", "mysql://x", "postgresql://u@127.0.0.1:1/db",
                                         odd_values(rng)])
        if rng.random() < 0.3:
            kwargs["retain_epochs"] = rng.choice(["x", -1, 2.5, True, 0, 10**30, odd_values(rng)])
        if rng.random() < 0.3:
            kwargs["storage_options"] = rng.choice([{}, [1], "x", {"a": 1}, odd_values(rng)])
        if rng.random() < 0.3:
            kwargs["read_only"] = True

        def open_close() -> None:
            Engine(location, **kwargs).close()
        shown = {k: v for k, v in kwargs.items() if k != "spark" or not hasattr(v, "conf")}
        return ApiCall(f"Engine({_short(location)}, **{_short(shown)})", open_close, True)


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


def replay(eng: Any, trace: list[tuple[Any, ...]], sink_root: str,
           check: Callable[[int], None] | None = None) -> None:
    """Run a trace of ``Fuzzer.trace`` again against a new engine (``check(i)`` after
    each step): a case the fuzzer found, reproduced without the fuzzer."""
    for i, item in enumerate(trace):
        if item[0] == "setup":
            Fuzzer(eng, 0, sink_root).setup()
        elif item[0] == "sql":
            eng.sql(item[1])
        elif item[0] == "insert":
            eng.insert(item[1], item[2])
        elif item[0] == "delete":
            eng.delete(item[1], item[2])
        elif item[0] == "step":
            eng.step()
            if check is not None:
                check(i)


# --------------------------------------------------------------------------- #
# The run
# --------------------------------------------------------------------------- #

#: statements that only read: when they work they must change nothing either
_READS = re.compile(r"^\s*(SELECT|WITH|SHOW|EXPLAIN|VERIFY)\b", re.IGNORECASE)


@dataclass
class Counts:
    statements: int = 0
    api_calls: int = 0
    accepted: int = 0
    refused: int = 0
    steps: int = 0
    verified: int = 0
    #: refusals per SparkfillError subclass
    by_error: collections.Counter[str] = field(default_factory=collections.Counter)
    #: (what, reason, traceback)
    internal: list[tuple[str, str, str]] = field(default_factory=list)
    #: (what, differences) of a refused call (or a read that worked) that changed the
    #: warehouse
    changed: list[tuple[str, list[str]]] = field(default_factory=list)
    #: (mv, differing rows) of a VERIFY that found a difference
    inexact: list[tuple[str, str]] = field(default_factory=list)
    #: seconds spent per kind of work (calls accepted / refused, state comparisons,
    #: epochs, housekeeping)
    seconds: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def tried(self) -> int:
        return self.statements + self.api_calls

    def summary(self) -> str:
        top = ", ".join(f"{k} {v}" for k, v in self.by_error.most_common())
        return (f"tried {self.tried} ({self.statements} statements, {self.api_calls} API "
                f"calls): accepted {self.accepted}, refused with SparkfillError "
                f"{self.refused} ({top}); internal errors {len(self.internal)}; changed "
                f"warehouses on refusal {len(self.changed)}; epochs {self.steps}; VERIFYs "
                f"collected {self.verified}, inexact {len(self.inexact)}; seconds "
                + ", ".join(f"{k} {v:.0f}" for k, v in self.seconds.most_common()))

    def problems(self) -> str:
        lines = []
        for what, reason, tb in self.internal[:20]:
            lines.append(f"INTERNAL {reason}\n    call: {what[:400]}\n{tb}")
        for what, diff in self.changed[:20]:
            lines.append(f"CHANGED on refusal: {what[:400]}\n    " + "\n    ".join(diff))
        for mv, rows in self.inexact[:20]:
            lines.append(f"INEXACT {mv}: {rows}")
        return "\n".join(lines)


@dataclass
class Limits:
    """Caps on the expensive work a run does."""

    #: user MVs alive at once (more: the fuzzer drops some)
    mvs: int = 6
    #: user tables alive at once
    tables: int = 7
    #: an epoch after this many statements
    step_every: int = 40
    #: VERIFYs collected at most (each a batch query)
    verifies: int = 10
    #: seconds to wait for a snapshot job's phase 1 before dropping its MV
    snapshot_wait: float = 20.0
    #: the rows a query's result collected shows at most
    collect_rows: int = 5
    #: the share of statements mutated (the others are run as the grammar made them,
    #: and mostly work: they cost Spark jobs, a mutated one mostly fails parsing)
    mutated: float = 0.75


class Fuzzer:
    """Runs statements and API calls against one engine, checking each."""

    def __init__(self, eng: Any, seed: int, sink_root: str,
                 limits: Limits | None = None, log: Callable[[str], None] | None = None):
        self.eng = eng
        self.rng = random.Random(seed)
        self.sink_root = sink_root
        self.grammar = Grammar(self.rng, sink_root)
        self.mutator = Mutator(self.rng)
        self.api = ApiCalls(self.rng, self.grammar)
        self.limits = limits or Limits()
        self.counts = Counts()
        self.log = log or (lambda _msg: None)
        self._state: WarehouseState | None = None
        #: every call that worked and may have written, in order, with the setup's
        #: and the housekeeping's (``replay`` runs them again)
        self.trace: list[tuple[Any, ...]] = []

    # --- setup ------------------------------------------------------------------------

    def setup(self) -> None:
        """Two tables of every type with a few rows, and an MV over them, created."""
        eng = self.eng
        eng.sql("CREATE TABLE fz_a (id BIGINT, g INT, v BIGINT, s STRING, d DOUBLE, "
                "dt DATE, ts TIMESTAMP, amt DECIMAL(10,2), b BOOLEAN, PRIMARY KEY (id))")
        eng.sql("CREATE TABLE fz_b (k BIGINT, g INT, w BIGINT, name STRING NOT NULL, "
                "p_time TIMESTAMP AS PROCTIME(), PRIMARY KEY (k))")
        rng = random.Random(1)
        eng.insert("fz_a", [{"id": i, "g": i % 4, "v": rng.randint(0, 9), "s": f"s{i % 3}",
                             "d": i / 2, "dt": datetime.date(2024, 1, 1 + i % 28),
                             "ts": datetime.datetime(2024, 1, 1, 0, 0, i * 3),
                             "amt": decimal.Decimal(f"{i}.25"), "b": i % 2 == 0}
                            for i in range(12)])
        eng.insert("fz_b", [{"k": i, "g": i % 3, "w": i * 10, "name": f"n{i}"}
                            for i in range(8)])
        eng.step()
        eng.sql("CREATE MATERIALIZED VIEW fz_m0 AS SELECT g, count(*) AS n, sum(v) AS s "
                "FROM fz_a GROUP BY g")
        eng.step()
        self.counts.steps += 2
        self.trace.append(("setup",))
        self._refresh()

    # --- helpers ----------------------------------------------------------------------

    def _refresh(self) -> None:
        self.grammar.rels = catalog_view(self.eng)

    def _state_now(self) -> WarehouseState:
        return warehouse_state(self.eng.path, self.sink_root)

    def _quiesce(self) -> None:
        """Let the snapshot jobs' phase-1 threads finish (they write beside the
        statements); drop the MVs of those still running after ``snapshot_wait``."""
        threads = self.eng.coordinator.snapshots.threads
        deadline = time.time() + self.limits.snapshot_wait
        for thread in list(threads.values()):
            thread.join(max(0.0, deadline - time.time()))
        stuck = [mv_id for mv_id, t in threads.items() if t.is_alive()]
        for mv_id in stuck:
            rel = self.eng.catalog.get_by_id(mv_id)
            owner = rel if rel.owner is None else self.eng.catalog.get_by_id(rel.owner)
            self._housekeeping_drop(owner.name)

    def _housekeeping_drop(self, name: str) -> None:
        """Drop a relation (and what reads it) as housekeeping, not as a fuzzed call."""
        eng = self.eng
        for owned in (name, f"{name}__dead_letter"):  # a source's goes with it
            if (found := eng.catalog.find(owned)) is not None:
                for dep in eng.catalog.dependents(owned):
                    self._housekeeping_drop(dep.name)
                for sink in eng.sinks.sinks_of(found):
                    eng.sql(f"DROP SINK {q(sink.name)}")
                    self.trace.append(("sql", f"DROP SINK {q(sink.name)}"))
        rel = eng.catalog.find(name)
        if rel is None:
            return
        kind = "TABLE" if rel.kind == "table" else "MATERIALIZED VIEW"
        eng.sql(f"DROP {kind} {q(rel.name)}")
        self.trace.append(("sql", f"DROP {kind} {q(rel.name)}"))

    def _trim(self) -> None:
        """Keep the relations alive under the limits (housekeeping)."""
        rels = catalog_view(self.eng)
        mvs = [r for r in rels if r.kind == "mv"]
        while len(mvs) > self.limits.mvs:
            victim = self.rng.choice(mvs)
            self._housekeeping_drop(victim.name)
            rels = catalog_view(self.eng)
            mvs = [r for r in rels if r.kind == "mv"]
        def droppable(rels: list[Rel]) -> list[Rel]:  # (a dead-letter table goes with
            return [r for r in rels if r.kind == "table" and r.name.startswith("fz_t")
                    and not r.name.endswith("__dead_letter")]  # its source)
        tables = droppable(rels)
        while len(tables) > self.limits.tables:
            self._housekeeping_drop(self.rng.choice(tables).name)
            tables = droppable(catalog_view(self.eng))

    # --- one call ---------------------------------------------------------------------

    def _check(self, what: str, call: Callable[[], Any], reads: bool,
               replay: tuple[Any, ...] | None = None) -> None:
        before = self._state if self._state is not None else self._state_now()
        began = time.time()
        try:
            result = call()
            if reads and result is not None and hasattr(result, "collect") \
                    and what.lstrip().upper().startswith(("SHOW", "EXPLAIN")):
                result.limit(self.limits.collect_rows).collect()
        except SparkfillError as exc:
            reason = internal_reason(exc)
            if reason is not None:
                self.counts.internal.append((what, reason, traceback.format_exc(limit=12)))
                self._state = None
                return
            self.counts.refused += 1
            self.counts.by_error[type(exc).__name__] += 1
            self.counts.seconds["refused"] += time.time() - began
            began = time.time()
            after = self._state_now()
            self.counts.seconds["compare"] += time.time() - began
            diff = before.diff(after)
            if diff:
                self.counts.changed.append((f"{what}  -> {type(exc).__name__}: {exc}"[:800],
                                            diff))
            self._state = after
            return
        except Exception as exc:  # noqa: BLE001 - the very thing this looks for
            self.counts.internal.append((what, internal_reason(exc) or "?",
                                         traceback.format_exc(limit=12)))
            self._state = None
            self._refresh()
            return
        self.counts.accepted += 1
        self.counts.seconds["accepted"] += time.time() - began
        if replay is not None and not reads:
            self.trace.append(replay)
        began = time.time()
        if reads:
            after = self._state_now()
            diff = before.diff(after)
            if diff:
                self.counts.changed.append((f"{what}  (a read that worked)", diff))
            self._state = after
            self.counts.seconds["compare"] += time.time() - began
        else:
            self._after_write()
            self.counts.seconds["housekeeping"] += time.time() - began
        if reads and what.lstrip().upper().startswith("VERIFY") and result is not None:
            self._collect_verify(what, result)

    def _after_write(self) -> None:
        try:
            self._quiesce()
            self._trim()
        except Exception as exc:  # noqa: BLE001 - housekeeping's statements must work
            self.counts.internal.append(("housekeeping", f"{type(exc).__name__}: "
                                         f"{str(exc)[:300]}", traceback.format_exc(limit=12)))
        self._refresh()
        self._state = self._state_now()

    def _collect_verify(self, what: str, result: Any) -> None:
        if self.counts.verified >= self.limits.verifies:
            return
        self.counts.verified += 1
        try:
            rows = result.limit(self.limits.collect_rows).collect()
        except Exception as exc:  # noqa: BLE001 - a VERIFY that cannot run is a bug
            self.counts.internal.append((what + " (collected)", f"{type(exc).__name__}",
                                         traceback.format_exc(limit=12)))
            return
        if rows:
            m = re.match(r"\s*VERIFY\s+MATERIALIZED\s+VIEW\s+(\S+)", what, re.IGNORECASE)
            rel = self.eng.catalog.find(m.group(1).strip("`")) if m else None
            sql = rel.sql if rel is not None else "?"
            where = self._dump_trace()
            self.counts.inexact.append((f"{what} (epoch {self.eng.committed_epoch}; "
                                        f"the MV: {sql}; trace: {where})", repr(rows)[:600]))

    def _dump_trace(self) -> str:
        """The trace so far, pickled in a folder beside the sinks' (for ``replay``)."""
        import pickle

        folder = self.sink_root.rstrip("/") + "-traces"  # not under a compared folder
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"trace-{len(self.trace)}.pickle")
        with open(path, "wb") as fh:
            pickle.dump(self.trace, fh)
        return path

    def step(self) -> None:
        """An epoch (housekeeping: it must work)."""
        began = time.time()
        try:  # whatever the calls before it left staged, an epoch must run
            self.eng.step()
        except Exception as exc:  # noqa: BLE001 - recorded, and the run goes on
            self.counts.internal.append(("step()", f"an epoch failed: {type(exc).__name__}: "
                                         f"{str(exc)[:300]}", traceback.format_exc(limit=12)))
            self._state = None
            return
        self.trace.append(("step",))
        self.counts.steps += 1
        self._after_write()
        self.counts.seconds["epochs"] += time.time() - began

    def one(self) -> None:
        rng = self.rng
        if rng.random() < 0.12:
            api = self.api.call(self.eng)
            self.counts.api_calls += 1
            self._check(api.what, api.call, not api.writes, api.replay)
            return
        sql = self.grammar.statement()
        if rng.random() < self.limits.mutated:
            sql = self.mutator.mutate(sql, rng.choice([1, 1, 1, 2, 2, 3]))
        else:
            self.mutator.previous = (self.mutator.previous + [sql])[-20:]
        self.counts.statements += 1
        self._check(sql, lambda: self.eng.sql(sql), bool(_READS.match(sql)), ("sql", sql))

    def run(self, n: int, progress_every: int = 0) -> Counts:
        """``n`` statements and API calls (an epoch every ``step_every``); each new
        problem is logged as it is found."""
        self._refresh()
        started = time.time()
        for i in range(n):
            seen = (len(self.counts.internal), len(self.counts.changed),
                    len(self.counts.inexact))
            self.one()
            if (i + 1) % self.limits.step_every == 0:
                self.step()
            for kind, found, before in zip(("INTERNAL", "CHANGED", "INEXACT"),
                                           (self.counts.internal, self.counts.changed,
                                            self.counts.inexact), seen, strict=True):
                for item in found[before:]:
                    self.log(f"{kind} at call {i + 1}: " + " | ".join(
                        str(x) for x in item)[:3000])
            if progress_every and (i + 1) % progress_every == 0:
                self.log(f"[{i + 1}/{n}, {time.time() - started:.0f} s] "
                         f"{self.counts.summary()}")
        return self.counts
