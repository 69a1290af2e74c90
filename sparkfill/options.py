"""Options of CREATE MATERIALIZED VIEW ... WITH (...) and SET.

Invariant: an option reaches the catalog only after it has been validated
here; unknown names and bad values raise ``InvalidOption`` naming both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .errors import InvalidOption

__all__ = ["BackfillOptions", "STRATEGIES", "OPTION_NAMES", "validate_option", "resolve_options"]

STRATEGIES = ("no_shuffle", "blocking", "buffer")
DEFAULT_STRATEGY = "no_shuffle"
DEFAULT_CHUNK_ROWS = 10_000

OPTION_NAMES = ("backfill", "backfill_chunk_rows", "backfill_rate_limit")


@dataclass(frozen=True)
class BackfillOptions:
    strategy: str = DEFAULT_STRATEGY
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    rate_limit: int | None = None  # snapshot rows per second; None: unlimited

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> BackfillOptions:
        return BackfillOptions(d["strategy"], int(d["chunk_rows"]),
                               None if d.get("rate_limit") is None else int(d["rate_limit"]))


def _as_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise InvalidOption(f"option {name} must be an integer, got {value!r}")
    try:
        number = int(str(value))
    except ValueError as exc:
        raise InvalidOption(f"option {name} must be an integer, got {value!r}") from exc
    if number < minimum:
        raise InvalidOption(f"option {name} must be >= {minimum}, got {number}")
    return number


def validate_option(name: str, value: Any) -> Any:
    """Return the validated value of one option (None means DEFAULT)."""
    key = name.lower()
    if key not in OPTION_NAMES:
        raise InvalidOption(f"unknown option {name!r}; known options: {', '.join(OPTION_NAMES)}")
    if value is None:
        return None
    if key == "backfill":
        strategy = str(value).lower()
        if strategy not in STRATEGIES:
            raise InvalidOption(
                f"unknown backfill strategy {value!r}; choose one of {', '.join(STRATEGIES)}")
        return strategy
    if key == "backfill_chunk_rows":
        return _as_int(key, value, 1)
    return _as_int(key, value, 0)


def resolve_options(session: dict[str, Any], given: dict[str, Any]) -> BackfillOptions:
    """Options of a new MV: WITH (...) over SET defaults over built-in defaults."""
    merged: dict[str, Any] = {}
    for source in (session, given):
        for name, value in source.items():
            merged[name.lower()] = validate_option(name, value)
    return BackfillOptions(
        strategy=merged.get("backfill") or DEFAULT_STRATEGY,
        chunk_rows=merged.get("backfill_chunk_rows") or DEFAULT_CHUNK_ROWS,
        rate_limit=merged.get("backfill_rate_limit"),
    )
