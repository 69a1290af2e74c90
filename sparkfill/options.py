"""Options of CREATE MATERIALIZED VIEW ... WITH (...) and SET.

Invariant: an option reaches the catalog only after it has been validated
here; unknown names and bad values raise ``InvalidOption`` naming both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import InvalidOption

__all__ = [
    "BackfillOptions", "STRATEGIES", "REFRESH_MODES", "OPTION_NAMES", "ALTERABLE",
    "WAREHOUSE_OPTIONS", "DEFAULT_VERIFY_SAMPLE", "validate_option", "sample_fraction",
    "resolve_options",
]

STRATEGIES = ("arrangement", "snapshot", "no_shuffle", "blocking", "buffer")
DEFAULT_STRATEGY = "arrangement"
DEFAULT_CHUNK_ROWS = 10_000
#: snapshot's phase-1 chunks run beside the epoch loop, not inside it: a chunk only
#: bounds one Spark job (which streams and spills), and each chunk has a fixed cost
DEFAULT_SNAPSHOT_CHUNK_ROWS = 1_000_000
DEFAULT_TARGET_EPOCH_MS = 5_000
DEFAULT_MAX_LAG_EPOCHS = 2
#: how a created MV takes an epoch's change: its incremental rules, a recompute of
#: the MV (and its state) whose difference is its Δ, or per epoch whichever is cheaper
REFRESH_MODES = ("auto", "incremental", "full")
DEFAULT_REFRESH = "auto"

OPTION_NAMES = ("backfill", "backfill_chunk_rows", "backfill_rate_limit",
                "backfill_parallelism", "backfill_target_epoch_ms", "backfill_order",
                "snapshot_backfill_max_lag_epochs", "max_concurrent_creating_jobs", "refresh",
                "verify_every", "verify_sample")
#: options of the warehouse (persisted), not of one MV
WAREHOUSE_OPTIONS = ("max_concurrent_creating_jobs", "verify_every", "verify_sample")
#: the fraction of rows a periodic VERIFY (``verify_every``) checks by default
DEFAULT_VERIFY_SAMPLE = 0.01
#: options ALTER MATERIALIZED VIEW ... SET can change while the job runs
ALTERABLE = ("backfill_rate_limit", "backfill_parallelism", "backfill_target_epoch_ms",
             "refresh")


@dataclass(frozen=True)
class BackfillOptions:
    strategy: str = DEFAULT_STRATEGY
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    rate_limit: int | None = None  # snapshot rows per second; None: unlimited
    parallelism: int | None = None  # Spark tasks per chunk read; None: Spark's default
    #: adaptive chunk: grow or shrink the chunk to keep epochs near this; 0: fixed chunk
    target_epoch_ms: int = DEFAULT_TARGET_EPOCH_MS
    #: leaves (aliases or relation names) to backfill first, in this order
    backfill_order: tuple[str, ...] = ()
    #: snapshot: the job joins the epoch loop once it lags by at most this many epochs
    max_lag_epochs: int = DEFAULT_MAX_LAG_EPOCHS
    #: once created: ``REFRESH_MODES``
    refresh: str = DEFAULT_REFRESH

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> BackfillOptions:
        def opt(name: str) -> int | None:
            return None if d.get(name) is None else int(d[name])
        return BackfillOptions(d["strategy"], int(d["chunk_rows"]), opt("rate_limit"),
                               opt("parallelism"),
                               int(d.get("target_epoch_ms", DEFAULT_TARGET_EPOCH_MS)),
                               tuple(d.get("backfill_order") or ()),
                               int(d.get("max_lag_epochs", DEFAULT_MAX_LAG_EPOCHS)),
                               str(d.get("refresh") or DEFAULT_REFRESH))

    def altered(self, name: str, value: Any) -> BackfillOptions:
        """These options with one alterable option set (None: its default)."""
        key = name.lower()
        if key not in ALTERABLE:
            raise InvalidOption(f"option {name!r} cannot be altered on a running job; "
                                f"alterable: {', '.join(ALTERABLE)}")
        value = validate_option(key, value)
        if key == "backfill_rate_limit":
            return replace(self, rate_limit=value)
        if key == "backfill_parallelism":
            return replace(self, parallelism=value)
        if key == "refresh":
            return replace(self, refresh=DEFAULT_REFRESH if value is None else value)
        return replace(self, target_epoch_ms=DEFAULT_TARGET_EPOCH_MS if value is None else value)


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


def _one_of(what: str, value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` as one of the ``allowed`` words (any case)."""
    word = str(value).lower()
    if word not in allowed:
        raise InvalidOption(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
    return word


def sample_fraction(value: Any) -> float:
    """A sampled VERIFY's fraction of rows: a number in (0, 1]."""
    try:
        fraction = float(str(value))
    except ValueError as exc:
        raise InvalidOption(f"a sample must be a fraction of rows in (0, 1], got {value!r}"
                            ) from exc
    if not 0 < fraction <= 1:
        raise InvalidOption(f"a sample must be a fraction of rows in (0, 1], got {value!r}")
    return fraction


def validate_option(name: str, value: Any) -> Any:
    """Return the validated value of one option (None means DEFAULT)."""
    key = name.lower()
    if key not in OPTION_NAMES:
        raise InvalidOption(f"unknown option {name!r}; known options: {', '.join(OPTION_NAMES)}")
    if value is None:
        return None
    if key == "backfill":
        return _one_of("backfill strategy", value, STRATEGIES)
    if key == "refresh":
        return _one_of("refresh mode", value, REFRESH_MODES)
    if key == "backfill_order":
        parts = value if isinstance(value, tuple | list) else str(value).split(",")
        names = tuple(str(n).strip() for n in parts if str(n).strip())
        if not names:
            raise InvalidOption("backfill_order must name the MV's relations, e.g. "
                                "'customers, orders'")
        return names
    if key == "verify_sample":
        return sample_fraction(value)
    if key in ("backfill_chunk_rows", "backfill_parallelism", "max_concurrent_creating_jobs",
               "verify_every"):
        return _as_int(key, value, 1)
    return _as_int(key, value, 0)


def resolve_options(session: dict[str, Any], given: dict[str, Any]) -> BackfillOptions:
    """Options of a new MV: WITH (...) over SET defaults over built-in defaults."""
    merged: dict[str, Any] = {}
    for source in (session, given):
        for name, value in source.items():
            if name.lower() in WAREHOUSE_OPTIONS:
                raise InvalidOption(f"{name} is a warehouse setting: use SET {name} = N")
            merged[name.lower()] = validate_option(name, value)
    strategy = merged.get("backfill") or DEFAULT_STRATEGY
    return BackfillOptions(
        strategy=strategy,
        chunk_rows=merged.get("backfill_chunk_rows") or (
            DEFAULT_SNAPSHOT_CHUNK_ROWS if strategy == "snapshot" else DEFAULT_CHUNK_ROWS),
        rate_limit=merged.get("backfill_rate_limit"),
        parallelism=merged.get("backfill_parallelism"),
        target_epoch_ms=(DEFAULT_TARGET_EPOCH_MS if merged.get("backfill_target_epoch_ms") is None
                         else merged["backfill_target_epoch_ms"]),
        backfill_order=merged.get("backfill_order") or (),
        max_lag_epochs=(DEFAULT_MAX_LAG_EPOCHS
                        if merged.get("snapshot_backfill_max_lag_epochs") is None
                        else merged["snapshot_backfill_max_lag_epochs"]),
        refresh=merged.get("refresh") or DEFAULT_REFRESH,
    )
