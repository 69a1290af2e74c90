"""Columns, their Spark and Arrow types, and the physical layout of relations.

Invariant: a relation's stored rows are its columns (visible, then hidden key
columns) followed by the physical columns ``_vnode`` (int), ``_epoch`` (bigint)
and ``_op`` (string); every reader and writer derives its schema from here.
Key positions persisted with backfill progress are encoded and decoded here,
so that a position read back compares exactly like the one written.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import xxhash
from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import SqlError

__all__ = [
    "Column",
    "quoted",
    "comparable_key_sql",
    "names_sql",
    "vnode_sql",
    "VNODE",
    "EPOCH",
    "OP",
    "VNODE_COUNT",
    "HIDDEN_PREFIX",
    "spark_type",
    "arrow_type",
    "normalize_type_name",
    "user_struct",
    "physical_struct",
    "physical_arrow_schema",
    "vnode_expr",
    "vnodes_of",
    "vnode_each",
    "HASHED_KEY_WIDTHS",
    "encode_key_value",
    "decode_key_value",
]

VNODE = "_vnode"
EPOCH = "_epoch"
OP = "_op"
VNODE_COUNT = 256
#: Prefix of hidden columns: the upstream key kept when a query does not select it.
HIDDEN_PREFIX = "_sf_k_"

_SIMPLE_TYPES: dict[str, T.DataType] = {
    "bigint": T.LongType(),
    "int": T.IntegerType(),
    "smallint": T.ShortType(),
    "tinyint": T.ByteType(),
    "string": T.StringType(),
    "double": T.DoubleType(),
    "float": T.FloatType(),
    "boolean": T.BooleanType(),
    "date": T.DateType(),
    "timestamp": T.TimestampType(),
    "timestamp_ntz": T.TimestampNTZType(),
}

_ALIASES = {
    "long": "bigint",
    "integer": "int",
    "short": "smallint",
    "byte": "tinyint",
    "varchar": "string",
    "text": "string",
    "real": "float",
    "bool": "boolean",
    "timestamp_ltz": "timestamp",
}


@dataclass(frozen=True)
class Column:
    """One column of a relation. ``type`` is a Spark simple type string."""

    name: str
    type: str
    nullable: bool = True
    hidden: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "nullable": self.nullable,
                "hidden": self.hidden}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Column:
        return Column(d["name"], d["type"], bool(d["nullable"]), bool(d.get("hidden", False)))


def normalize_type_name(name: str) -> str:
    """Canonical Spark simple-string of a type name, or raise ``SqlError``."""
    text = name.strip().lower().replace(" ", "")
    text = _ALIASES.get(text, text)
    if text in _SIMPLE_TYPES:
        return text
    if text.startswith("decimal") or text.startswith("numeric"):
        inner = text[text.find("(") + 1: text.rfind(")")] if "(" in text else "10,0"
        try:
            parts = [int(p) for p in inner.split(",")]
        except ValueError as exc:
            raise SqlError(f"bad DECIMAL type {name!r}") from exc
        precision, scale = (parts + [0])[:2]
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            raise SqlError(f"bad DECIMAL type {name!r}: need 1 <= p <= 38 and 0 <= s <= p")
        return f"decimal({precision},{scale})"
    raise SqlError(
        f"unsupported column type {name!r}; supported: BIGINT, INT, SMALLINT, TINYINT, STRING, "
        "DOUBLE, FLOAT, BOOLEAN, DATE, TIMESTAMP, DECIMAL(p,s)"
    )


def spark_type(type_name: str) -> T.DataType:
    name = normalize_type_name(type_name)
    if name.startswith("decimal"):
        p, s = name[8:-1].split(",")
        return T.DecimalType(int(p), int(s))
    return _SIMPLE_TYPES[name]


def arrow_type(type_name: str) -> pa.DataType:
    t = spark_type(type_name)
    if isinstance(t, T.LongType):
        return pa.int64()
    if isinstance(t, T.IntegerType):
        return pa.int32()
    if isinstance(t, T.ShortType):
        return pa.int16()
    if isinstance(t, T.ByteType):
        return pa.int8()
    if isinstance(t, T.StringType):
        return pa.string()
    if isinstance(t, T.DoubleType):
        return pa.float64()
    if isinstance(t, T.FloatType):
        return pa.float32()
    if isinstance(t, T.BooleanType):
        return pa.bool_()
    if isinstance(t, T.DateType):
        return pa.date32()
    if isinstance(t, T.TimestampNTZType):
        return pa.timestamp("us")
    if isinstance(t, T.TimestampType):
        return pa.timestamp("us", tz="UTC")
    if isinstance(t, T.DecimalType):
        return pa.decimal128(t.precision, t.scale)
    raise SqlError(f"no Arrow type for {type_name!r}")


def user_struct(columns: Sequence[Column]) -> T.StructType:
    return T.StructType([T.StructField(c.name, spark_type(c.type), True) for c in columns])


def physical_struct(columns: Sequence[Column]) -> T.StructType:
    return T.StructType(
        list(user_struct(columns).fields)
        + [
            T.StructField(VNODE, T.IntegerType(), True),
            T.StructField(EPOCH, T.LongType(), True),
            T.StructField(OP, T.StringType(), True),
        ]
    )


def physical_arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema(
        [pa.field(c.name, arrow_type(c.type)) for c in columns]
        + [pa.field(VNODE, pa.int32()), pa.field(EPOCH, pa.int64()), pa.field(OP, pa.string())]
    )


def vnode_expr(key: Sequence[str]) -> SparkColumn:
    """``pmod(xxhash64(key...), 256)``: the fixed hash partition of a key."""
    return F.expr(vnode_sql([quoted(k) for k in key]))


def vnode_sql(key_sql: Sequence[str]) -> str:
    """``vnode_expr`` as SQL text over the key's expressions (SQL text each)."""
    return f"CAST(pmod(xxhash64({', '.join(key_sql)}), {VNODE_COUNT}) AS INT)"


#: Spark's seed of ``xxhash64``
XXHASH_SEED = 42


def vnodes_of(values: Sequence[Any], type_name: str) -> list[int] | None:
    """The sorted distinct vnodes ``vnode_expr`` gives the one-column keys
    ``values`` of SQL type ``type_name``, computed on the driver; None for types
    ``vnode_each`` cannot hash."""
    each = vnode_each(values, type_name)
    return None if each is None else sorted(set(each))


def vnode_each(values: Sequence[Any], type_name: str) -> list[int] | None:
    """The vnode ``vnode_expr`` gives each one-column key of ``values`` (SQL type
    ``type_name``), in order, computed on the driver (Spark's ``xxhash64`` hashes an
    integer of at most 32 bits as 4 little-endian bytes, a BIGINT as 8, a string as
    its UTF-8 bytes); None for other types."""
    width = HASHED_KEY_WIDTHS.get(normalize_type_name(type_name))
    if width is None:
        return None
    return [xxhash.xxh64_intdigest(v.encode() if width == 0 else
                                   int(v).to_bytes(width, "little", signed=True),
                                   XXHASH_SEED) % VNODE_COUNT for v in values]


#: the key types whose vnodes the driver computes (``vnode_each``): bytes hashed
#: per value (0: a string's UTF-8 bytes)
HASHED_KEY_WIDTHS = {"tinyint": 4, "smallint": 4, "int": 4, "bigint": 8, "string": 0}


def quoted(name: str) -> str:
    """A column name as a SQL identifier (backquoted)."""
    return "`" + name.replace("`", "``") + "`"


def names_sql(names: Iterable[str]) -> list[str]:
    """Column names as SQL identifiers, for ``df.selectExpr(*names_sql(names))``: a
    classic session converts a select of name strings column by column (about three
    Py4J round trips each), a list of SQL texts as one list (one per name)."""
    return [quoted(n) for n in names]


# --- key values persisted in progress -----------------------------------------------------


def encode_key_value(value: Any) -> Any:
    """A JSON-safe, type-tagged form of one key value collected from Spark."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float | str):
        return value
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, dt.datetime):
        return {"timestamp_us": value}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    raise TypeError(f"cannot persist key value {value!r}")


def decode_key_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "decimal" in value:
            return Decimal(value["decimal"])
        if "date" in value:
            return dt.date.fromisoformat(value["date"])
        if "timestamp_us" in value:
            return int(value["timestamp_us"])
    return value


def _compares_as_micros(type_name: str) -> bool:
    return isinstance(spark_type(type_name), T.TimestampType | T.TimestampNTZType)


def comparable_key_expr(name: str, type_name: str) -> SparkColumn:
    """An expression ordered like the key column whose values JSON can hold exactly.

    Timestamps compare as microseconds since the Unix epoch; other types as
    themselves.
    """
    if _compares_as_micros(type_name):
        return F.unix_micros(F.col(name).cast("timestamp"))
    return F.col(name)


def comparable_key_sql(name: str, type_name: str) -> str:
    """``comparable_key_expr`` as SQL text."""
    if _compares_as_micros(type_name):
        return f"unix_micros(CAST({quoted(name)} AS TIMESTAMP))"
    return quoted(name)


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
