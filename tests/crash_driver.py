"""Deterministic workload for the crash test, resumable from a journal.

Run as a script (``python crash_driver.py WAREHOUSE JOURNAL SEED``) it opens
``Engine(WAREHOUSE)`` (Spark master from ``$SPARKFILL_MASTER``, meta store from
``$SPARKFILL_TEST_META``), prints
``READY``, and continues the workload from where the journal says, printing
one line per event (``DML step op``, ``STEP step epoch state``) and ``DONE``
at the end. The parent test SIGKILLs it at chosen moments.

The journal holds one JSON line per call that RETURNED, appended (and fsynced)
right after it returned, so it is the exact list of DML the engine promised to
apply. A call that was cut off by a kill is re-issued on resume. Every op is
safe to re-issue right after itself: inserts are upserts of fixed rows,
deletes remove fixed keys, and the only SQL ops (``UPDATE .. SET v = const``,
``DELETE .. WHERE``) are idempotent and always come first in their step, so
that nothing staged before them in the same step could change what they see.
"""

from __future__ import annotations

import json
import os
import random
import string
import sys
from collections.abc import Callable
from typing import Any

#: the meta store URL the driver opens its warehouse with (unset: SQLite)
META_ENV = "SPARKFILL_TEST_META"
TABLE = "ct"
MV = "cmv"
MV_TEMPLATE = "SELECT id, g, v + g AS w, s FROM {src} WHERE v % 4 <> 1"
COLUMNS = ["id", "g", "v", "s"]
N_STEPS = 9
MV_STEP = 2
CHUNK = 120
INITIAL_ROWS = 1200
KEY_SPACE = 2000
MAX_FINISH_STEPS = 60


# --------------------------------------------------------------------------- #
# The workload (pure function of seed and step)
# --------------------------------------------------------------------------- #


def _row(rng: random.Random, key: int) -> dict[str, Any]:
    s = (
        None
        if rng.random() < 0.1
        else "".join(rng.choice(string.ascii_lowercase) for _ in range(3))
    )
    return {"id": key, "g": rng.randrange(8), "v": rng.randrange(1000), "s": s}


def ops_for_step(seed: int, i: int) -> list[dict[str, Any]]:
    rng = random.Random(f"crash-{seed}-{i}")
    ops: list[dict[str, Any]] = []
    if i == 0:
        ops.append({"kind": "create_table"})
        keys = rng.sample(range(KEY_SPACE), INITIAL_ROWS)
        for j in range(0, INITIAL_ROWS, 400):
            ops.append({"kind": "insert", "rows": [_row(rng, k) for k in keys[j : j + 400]]})
        return ops
    r = rng.random()
    if r < 0.3:
        ops.append({"kind": "sql_update", "g": rng.randrange(8), "v": rng.randrange(1000)})
    elif r < 0.5:
        ops.append({"kind": "sql_delete", "g": rng.randrange(8), "v": rng.randrange(500, 1000)})
    for _ in range(rng.randint(2, 4)):
        if rng.random() < 0.6:
            keys = list(dict.fromkeys(rng.randrange(KEY_SPACE) for _ in range(rng.randint(10, 60))))
            ops.append({"kind": "insert", "rows": [_row(rng, k) for k in keys]})
        else:
            keys = list(
                dict.fromkeys(rng.randrange(KEY_SPACE + 200) for _ in range(rng.randint(5, 40)))
            )
            ops.append({"kind": "delete", "keys": keys})
    if i == MV_STEP:
        ops.insert(len(ops) // 2, {"kind": "create_mv"})
    return ops


def sql_of(op: dict[str, Any]) -> str | None:
    if op["kind"] == "sql_update":
        return f"UPDATE {TABLE} SET v = {op['v']} WHERE g = {op['g']}"
    if op["kind"] == "sql_delete":
        return f"DELETE FROM {TABLE} WHERE g = {op['g']} AND v > {op['v']}"
    if op["kind"] == "create_table":
        return f"CREATE TABLE {TABLE} (id BIGINT, g INT, v BIGINT, s STRING, PRIMARY KEY (id))"
    if op["kind"] == "create_mv":
        return (
            f"CREATE MATERIALIZED VIEW {MV} WITH (backfill = 'no_shuffle', "
            f"backfill_chunk_rows = {CHUNK}) AS " + MV_TEMPLATE.replace("{src}", TABLE)
        )
    return None


# --------------------------------------------------------------------------- #
# Journal
# --------------------------------------------------------------------------- #


def read_journal(path: str, repair: bool = False) -> list[dict[str, Any]]:
    """Complete lines of the journal; with ``repair``, cut a torn last line off."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    end = data.rfind(b"\n") + 1
    if repair and end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    return [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]


def append_journal(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def next_position(entries: list[dict[str, Any]]) -> tuple[int, int]:
    if not entries:
        return 0, 0
    last = entries[-1]
    if last["op"] == "step":
        return last["step"] + 1, 0
    return last["step"], last["op"] + 1


# --------------------------------------------------------------------------- #
# Running it
# --------------------------------------------------------------------------- #


def _issue(eng, op: dict[str, Any]) -> None:
    from sparkfill import RelationExists

    kind = op["kind"]
    if kind == "insert":
        eng.insert(TABLE, op["rows"])
    elif kind == "delete":
        eng.delete(TABLE, [{"id": k} for k in op["keys"]])
    elif kind in ("create_table", "create_mv"):
        try:
            eng.sql(sql_of(op))
        except RelationExists:
            pass  # created by a run that was killed before it could journal it
    else:
        eng.sql(sql_of(op))


def run_workload(
    eng, journal: str, seed: int, emit: Callable[[str], None] = lambda s: None
) -> list[dict[str, Any]]:
    """Continue the workload from the journal to the end; return this run's step entries."""
    entries = read_journal(journal, repair=True)
    i, j = next_position(entries)
    steps: list[dict[str, Any]] = []
    while True:
        if i < N_STEPS:
            ops = ops_for_step(seed, i)
            for jj in range(j, len(ops)):
                _issue(eng, ops[jj])
                append_journal(journal, {"step": i, "op": jj, **ops[jj]})
                emit(f"DML {i} {jj} {ops[jj]['kind']}")
        elif i >= N_STEPS + MAX_FINISH_STEPS:
            raise RuntimeError(f"{MV} not created after {MAX_FINISH_STEPS} extra steps")
        elif i > MV_STEP and eng.progress(MV).state == "created":
            break
        rep = eng.step()
        state = eng.progress(MV).state if i >= MV_STEP else "none"
        entry = {"step": i, "op": "step", "epoch": rep.epoch, "state": state}
        append_journal(journal, entry)
        steps.append(entry)
        emit(f"STEP {i} {rep.epoch} {state}")
        i, j = i + 1, 0
    return steps


def post_steps(eng, journal: str, seed: int, k: int) -> list[dict[str, Any]]:
    """``k`` more journaled steps of DML after the workload (the MV exists by then)."""
    steps = []
    for x in range(k):
        i = 1000 + x
        for jj, op in enumerate(ops_for_step(seed, i)):
            _issue(eng, op)
            append_journal(journal, {"step": i, "op": jj, "post": True, **op})
        rep = eng.step()
        entry = {
            "step": i,
            "op": "step",
            "post": True,
            "epoch": rep.epoch,
            "state": eng.progress(MV).state,
        }
        append_journal(journal, entry)
        steps.append(entry)
    return steps


# --------------------------------------------------------------------------- #
# Model of the journal
# --------------------------------------------------------------------------- #


def model_states(entries: list[dict[str, Any]]):
    """Replay the journal in pure Python.

    Returns (final committed state, {index of step entry: committed state after it})
    where a state is {id: (id, g, v, s)}.
    """
    committed: dict[int, tuple] = {}
    pending: list[Callable[[dict], None]] = []
    after_step: dict[int, dict[int, tuple]] = {}

    for n, e in enumerate(entries):
        kind = e.get("kind")
        if e["op"] == "step":
            state = dict(committed)
            for fn in pending:
                fn(state)
            pending = []
            committed = state
            after_step[n] = dict(committed)
        elif kind == "insert":
            rows = [tuple(r[c] for c in COLUMNS) for r in e["rows"]]
            pending.append(lambda st, rows=rows: st.update({r[0]: r for r in rows}))
        elif kind == "delete":
            keys = list(e["keys"])
            pending.append(lambda st, keys=keys: [st.pop(k, None) for k in keys])
        elif kind == "sql_update":
            # evaluated against the committed snapshot at call time
            staged = {k: (r[0], r[1], e["v"], r[3]) for k, r in committed.items() if r[1] == e["g"]}
            pending.append(lambda st, staged=staged: st.update(staged))
        elif kind == "sql_delete":
            keys = [k for k, r in committed.items() if r[1] == e["g"] and r[2] > e["v"]]
            pending.append(lambda st, keys=keys: [st.pop(k, None) for k in keys])
    return committed, after_step


def main(argv: list[str]) -> int:
    warehouse, journal, seed = argv[1], argv[2], int(argv[3])
    from sparkfill import Engine

    # a warehouse on an object store names its PostgreSQL meta store here
    eng = Engine(warehouse, meta=os.environ.get(META_ENV) or None)
    print("READY", flush=True)
    run_workload(eng, journal, seed, emit=lambda s: print(s, flush=True))
    eng.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
