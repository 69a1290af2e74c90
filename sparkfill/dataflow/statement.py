"""An operator's rule as one SQL statement over its input frames.

Invariant: the statement reads exactly the frames it is given, each where its text
names it, and leaves every persisted frame cached.

A chain of DataFrame calls is analysed once per call, each time over the whole plan
so far (a steady three-MV epoch analysed about 430 plans for 5 Spark jobs:
bench/RESULTS.md, stop 49); one ``spark.sql`` statement is analysed once. The frames
go as ``spark.sql``'s DataFrame arguments: on Spark Connect, relations of the
statement's own plan (resolved when it runs, whenever that is); on a classic session,
temporary views under fresh names that pyspark drops when ``spark.sql`` returns (the
statement is analysed by then). Dropping a view uncaches a persisted frame whose plan
the view names (the same result: ``select("*")`` is), so a frame persisted on a
classic session goes in under a filter of its own (``WHERE TRUE``, which the optimizer
removes): the view names that filter, and the frame stays cached.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame

__all__ = ["sql_over"]

_NAME = re.compile(r"_sf_[a-z0-9_]+")


def sql_over(text: str, frames: Mapping[str, DataFrame]) -> DataFrame:
    """The rows of the SQL statement ``text``, in which ``{name}`` stands for the
    frame ``frames[name]``; every other brace of ``text`` is literal. A name starts
    with ``_sf_``, the prefix no user column may take, so quoted column names in
    ``text`` do not hold one (one that did, say a column named ``{_sf_rows}``, would
    name a view that is no column: an analysis error, never other rows). ``frames``
    is not empty and its frames share one session."""
    assert frames and all(_NAME.fullmatch(n) for n in frames), list(frames)
    escaped = text.replace("{", "{{").replace("}", "}}")
    for name in frames:
        escaped = escaped.replace("{{" + name + "}}", "{" + name + "}")
    spark = next(iter(frames.values())).sparkSession
    unpinned: dict[str, Any] = {name: _unpinned(df) for name, df in frames.items()}
    # no parameters, as an empty map: a classic session sends ``None`` as an empty
    # array it builds through ``PythonUtils`` (six Py4J round trips, not two)
    return spark.sql(escaped, {}, **unpinned)


def _unpinned(df: DataFrame) -> DataFrame:
    """``df``, or where a classic session's view of it would uncache it when dropped
    (it is persisted), ``df`` under a filter that keeps every row. ``is_cached`` is an attribute
    of a classic frame (set by ``persist``); on Spark Connect it is a property that
    asks the server, and a Connect statement makes no view, so it is not read there."""
    if vars(df).get("is_cached") is True:
        return df.where("TRUE")
    return df
