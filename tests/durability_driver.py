"""The workload of the durability harness (``durability.py``), resumable from a journal,
and its oracle.

``python durability_driver.py run WAREHOUSE JOURNAL`` installs the durability points
(``durability_points``: the environment says where to crash or fail), opens
``Engine(WAREHOUSE)`` (Spark from ``$SPARK_REMOTE`` or ``$SPARKFILL_MASTER``; meta store
from ``$SPARKFILL_TEST_META``), continues the workload from where the journal says and
prints ``DONE``; ``check`` instead finishes the workload (recovering the warehouse) and
checks it, printing ``CHECKED`` and exiting 0 when every check holds (1 and the
failures otherwise); ``reference`` runs it whole and records, per epoch, the source
table's rows (what ``check`` compares a crashed run's source with) and, with
``$SPARKFILL_DURABILITY_SAVES``, saves a copy of the site folder at every boundary (the
harness restores a site's run from there). Every mode closes and reopens the engine
after each epoch (a boundary), so the acts after a boundary are the same whether the
run got there itself or was restored from the copy.

The workload covers: DML (driver-staged lists and a Spark DataFrame, SQL ``UPDATE`` and
``DELETE``), a datagen source, every backfill strategy (arrangement, no_shuffle, buffer,
blocking, and snapshot with a rate limit), an MV over an MV, a join, aggregates whose
groups deletes empty, compaction (folds and merges, thresholds lowered) and vacuum
(``retain_epochs`` 3; every 3rd epoch, ``VACUUM_EVERY``, instead of every 10th),
three snapshot jobs (one rate-limited), three sinks (vacuumed),
``DROP`` of MVs being created and of a created one, and a ``CREATE OR REPLACE`` switch.

Invariant (what ``check`` asserts, after the workload is finished):

- every DML call that returned (the journal holds one line per call, appended and
  fsynced after it returned) applied exactly once: each table at each retained
  journaled epoch equals the journal replayed in pure Python;
- the source table at each retained epoch equals the reference run's at that epoch;
- every user MV created equals its batch query (``Engine.verify``) at every retained
  epoch from the one it was ready at;
- each sink equals its MV at the epoch its Delta table records (the committed one);
- every file a relation's Delta log references exists; no data file, relation folder,
  staged batch or pending folder is left that nothing references;
- the writer lock is free once the engine is closed (a second open succeeds).
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
from collections.abc import Callable
from typing import Any

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import durability_points  # noqa: E402
from crash_driver import append_journal, read_journal  # noqa: E402

META_ENV = "SPARKFILL_TEST_META"
SEED = 35
KEYS = 400
GROUPS = 8
RETAIN = 3
#: epochs between vacuums (the engine's default is 10)
VACUUM_EVERY = 3
#: steps after the scripted ones, at most, until every MV is created and switched
MAX_EXTRA = 30
SOURCE = "src"
#: user MVs and their queries (``m_proj``'s second definition is ``REPLACED``)
MVS = {
    "m_agg": ("backfill = 'arrangement', backfill_chunk_rows = 120",
              "SELECT g, COUNT(*) AS c, SUM(v) AS sv FROM t GROUP BY g"),
    "m_join": ("backfill = 'buffer', backfill_chunk_rows = 150",
               "SELECT t.id, t.v, u.name FROM t JOIN u ON t.g = u.g"),
    "m_proj": ("backfill = 'no_shuffle', backfill_chunk_rows = 150",
               "SELECT id, g, v * 2 AS w FROM t WHERE v % 3 <> 0"),
    "m_snap": ("backfill = 'snapshot', backfill_rate_limit = 150, backfill_chunk_rows = 100",
               "SELECT g, MAX(v) AS mx, COUNT(*) AS c FROM t GROUP BY g"),
    "m_src": ("backfill = 'blocking'",
              "SELECT k, COUNT(*) AS c, SUM(v) AS sv FROM src GROUP BY k"),
    "m_on": ("backfill = 'arrangement', backfill_chunk_rows = 100",
             "SELECT g, c FROM m_agg WHERE c > 1"),
    "m_drop": ("backfill = 'no_shuffle', backfill_chunk_rows = 20",
               "SELECT id, v FROM t WHERE g = 3"),
    "m_snap2": ("backfill = 'snapshot', backfill_chunk_rows = 150",
                "SELECT id, v FROM t WHERE g < 4"),
    "m_snap3": ("backfill = 'snapshot', backfill_rate_limit = 100",
                "SELECT k, SUM(v) AS sv FROM src GROUP BY k"),
    "m_tmp": ("backfill = 'blocking'", "SELECT g, MIN(v) AS mn FROM t GROUP BY g"),
    "m_drop2": ("backfill = 'no_shuffle', backfill_chunk_rows = 20",
                "SELECT id, g FROM t WHERE v > 50"),
}
#: MVs the workload drops (a creating one, a created one, a creating one)
DROPPED = ("m_drop", "m_tmp", "m_drop2")
#: sinks: name, MV, and the step that creates it
SINKS = {"s_agg": ("m_agg", 3), "s_join": ("m_join", 3), "s_src": ("m_src", 6)}
REPLACED = "SELECT id, g, v * 3 AS w FROM t WHERE v % 3 <> 1"
FIXED = "backfill_target_epoch_ms = 0"


def create_mv(name: str) -> str:
    opts, query = MVS[name]
    return f"CREATE MATERIALIZED VIEW {name} WITH ({opts}, {FIXED}) AS {query}"


# --------------------------------------------------------------------------- #
# The workload: a pure function of the step
# --------------------------------------------------------------------------- #


def _t_row(rng: random.Random, key: int) -> dict[str, Any]:
    return {"id": key, "g": rng.randrange(GROUPS), "v": rng.randrange(100)}


def _dml(rng: random.Random, ops: list[dict[str, Any]]) -> None:
    r = rng.random()
    if r < 0.3:
        ops.append({"kind": "sql_update", "g": rng.randrange(GROUPS), "v": rng.randrange(100)})
    elif r < 0.5:
        ops.append({"kind": "sql_delete", "g": rng.randrange(GROUPS), "v": rng.randrange(50, 100)})
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.6:
            keys = list(dict.fromkeys(rng.randrange(KEYS) for _ in range(rng.randint(5, 30))))
            ops.append({"kind": "insert", "rows": [_t_row(rng, k) for k in keys],
                        "spark": rng.random() < 0.25})
        else:
            keys = list(dict.fromkeys(rng.randrange(KEYS + 50) for _ in range(rng.randint(3, 20))))
            ops.append({"kind": "delete", "keys": keys})


def ops_for_step(i: int) -> list[dict[str, Any]]:
    """Step ``i``'s calls; SQL UPDATE/DELETE come first in a step (re-issuing one
    right after itself changes nothing)."""
    rng = random.Random(f"durability-{SEED}-{i}")
    ops: list[dict[str, Any]] = []
    if i == 0:
        ops.append({"kind": "sql", "sql": "CREATE TABLE t (id BIGINT, g INT, v BIGINT, "
                                          "PRIMARY KEY (id))"})
        ops.append({"kind": "sql", "sql": "CREATE TABLE u (g INT, name STRING, "
                                          "PRIMARY KEY (g))"})
        ops.append({"kind": "sql", "sql": (
            f"CREATE TABLE {SOURCE} (id BIGINT, k INT, v BIGINT, PRIMARY KEY (id)) WITH ("
            "connector = 'datagen', rows_per_epoch = 12, seed = 3, insert_ratio = 0.5, "
            "update_ratio = 0.3, delete_ratio = 0.2, key_lifetime = 3, value_range = 4)")})
        keys = rng.sample(range(KEYS), 260)
        ops.append({"kind": "insert", "rows": [_t_row(rng, k) for k in keys[:130]],
                    "spark": False})
        ops.append({"kind": "insert", "rows": [_t_row(rng, k) for k in keys[130:]],
                    "spark": True})
        ops.append({"kind": "insert_u", "rows": [{"g": g, "name": f"g{g}"}
                                                 for g in range(GROUPS - 1)]})
        return ops
    _dml(rng, ops)
    if i == 1:
        ops += [{"kind": "create", "name": "m_agg"}, {"kind": "create", "name": "m_join"}]
    elif i == 2:
        ops += [{"kind": "create", "name": n} for n in ("m_proj", "m_snap", "m_src", "m_snap2")]
    elif i == 3:
        # empty group 5: every row of it deleted (its key range is known to the model)
        ops.append({"kind": "empty_group", "g": 5})
        ops += [{"kind": "create", "name": "m_on", "after": "m_agg"},
                {"kind": "create", "name": "m_drop"},
                {"kind": "sink", "name": "s_agg"}, {"kind": "sink", "name": "s_join"}]
    elif i == 4:
        ops.append({"kind": "drop", "name": "m_drop"})
        ops.append({"kind": "insert_u", "rows": [{"g": 1, "name": "one"}]})
    elif i == 5:
        ops.append({"kind": "replace"})
    elif i == 6:
        ops += [{"kind": "create", "name": "m_tmp"}, {"kind": "create", "name": "m_snap3"},
                {"kind": "sink", "name": "s_src"}]
    elif i == 7:
        ops.append({"kind": "drop", "name": "m_tmp"})
    elif i == 8:
        ops.append({"kind": "create", "name": "m_drop2"})
    elif i == 9:
        ops.append({"kind": "drop", "name": "m_drop2"})
    return ops


#: the workload's scripted steps; fewer (``SPARKFILL_DURABILITY_STEPS``, CI's slice) stop
#: before the DROP (4) and the CREATE OR REPLACE (5)
STEPS_ENV = "SPARKFILL_DURABILITY_STEPS"
N_STEPS = int(os.environ.get(STEPS_ENV) or 12)
#: a *bounded finish*: the checking child runs this many scripted steps past the one
#: the journal ends in (the step the crash interrupted), not to the workload's end; the
#: check then holds the workload to what those steps did (``bounded_steps``)
FINISH_ENV = "SPARKFILL_DURABILITY_FINISH"


def bounded_steps(journal: str, finish: int) -> int:
    """The scripted steps a finish ``finish`` steps past the journal's last step runs:
    the step it ends in completed, then ``finish`` more, at most the workload's."""
    entries = [e for e in read_journal(journal, repair=True) if e["op"] != "extra"]
    last = entries[-1]["step"] if entries else 0
    return min(N_STEPS, last + 1 + finish)


# --------------------------------------------------------------------------- #
# Running it
# --------------------------------------------------------------------------- #


def _issue(eng, op: dict[str, Any], committed_t: Callable[[], dict[int, tuple]]) -> None:
    kind = op["kind"]
    if kind == "insert":
        if op["spark"]:
            eng.insert("t", eng.spark.createDataFrame(
                [(r["id"], r["g"], r["v"]) for r in op["rows"]], "id BIGINT, g INT, v BIGINT"))
        else:
            eng.insert("t", op["rows"])
    elif kind == "insert_u":
        eng.insert("u", op["rows"])
    elif kind == "delete":
        eng.delete("t", [{"id": k} for k in op["keys"]])
    elif kind == "sql_update":
        eng.sql(f"UPDATE t SET v = {op['v']} WHERE g = {op['g']}")
    elif kind == "sql_delete":
        eng.sql(f"DELETE FROM t WHERE g = {op['g']} AND v > {op['v']}")
    elif kind == "empty_group":
        eng.sql(f"DELETE FROM t WHERE g = {op['g']}")
    elif kind == "sql":
        if eng.catalog.find(op["sql"].split()[2]) is None:  # created before a crash
            eng.sql(op["sql"])
    elif kind == "create":
        if eng.catalog.find(op["name"]) is None:
            eng.sql(create_mv(op["name"]))
    elif kind == "drop":
        eng.sql(f"DROP MATERIALIZED VIEW IF EXISTS {op['name']}")
    elif kind == "sink":
        path = os.path.join(os.path.dirname(str(eng.path)), op["name"])
        eng.sql(f"CREATE SINK IF NOT EXISTS {op['name']} FROM {SINKS[op['name']][0]} WITH "
                f"(connector = 'delta', path = '{path}', buckets = 4, "
                "vacuum_retention_hours = 0)")
    elif kind == "replace":
        if eng.relation("m_proj").sql != REPLACED:
            eng.sql(f"CREATE OR REPLACE MATERIALIZED VIEW m_proj WITH "
                    f"(backfill = 'no_shuffle', backfill_chunk_rows = 150, {FIXED}) "
                    f"AS {REPLACED}")
    else:
        raise AssertionError(kind)


def open_engine(warehouse: str):
    from sparkfill import Engine

    eng = Engine(warehouse, meta=os.environ.get(META_ENV) or None, retain_epochs=RETAIN)
    # compaction thresholds lowered so that a short run folds and merges (not durable:
    # each process sets them)
    eng.store.max_log_files, eng.store.min_compact_rows, eng.store.log_fraction = 3, 150, 1.0
    # vacuum (the relation store's and the sinks') every 3rd epoch instead of every 10th:
    # the workload's ~15 epochs reach it several times
    eng.coordinator.vacuum_every = eng.sinks.vacuum_every = VACUUM_EVERY
    return eng


def _settled(eng) -> bool:
    """Every user MV created and ``m_proj`` switched to its new query."""
    for rel in eng.catalog.all():
        if rel.kind == "mv" and not rel.internal and rel.state != "created" \
                and rel.name not in DROPPED:  # dropped later (a shortened run: never)
            return False
    return N_STEPS <= 5 or eng.relation("m_proj").sql == REPLACED


def _step(eng, journal: str, i: int, emit: Callable[[str], None], extra: bool = False):
    """One epoch, journaled, then (unless a buffer job is in flight: a reopening would
    restart it, every epoch) a *boundary*: the engine is closed and reopened (every
    mode alike, so that a run restored from the copy the reference run saved there
    reaches the same acts in the same order as the reference did); the engine to go on
    with."""
    rep = eng.step()
    # an extra step (waiting for an MV) does not end its workload step
    append_journal(journal, {"step": i, "op": "extra" if extra else "step",
                             "epoch": rep.epoch})
    emit(f"STEP {i} {rep.epoch}")
    if ON_STEP:
        ON_STEP[0](eng, rep.epoch)
    if any(r.kind == "mv" and r.state == "creating" and r.options is not None
           and r.options.strategy == "buffer" for r in eng.catalog.all()):
        return eng  # no boundary: a reopening restarts a buffer job (state in memory)
    warehouse = str(eng.path)
    eng.close()
    if ON_BOUNDARY:
        ON_BOUNDARY[0](warehouse)
    return open_engine(warehouse)


#: called at each boundary, the engine closed, with the warehouse's path (the
#: reference run's saving of a copy)
ON_BOUNDARY: list[Callable[[str], None]] = []


#: called after each step with the engine and the epoch (the reference run's recorder)
ON_STEP: list[Callable[[Any, int], None]] = []


def run_workload(eng, journal: str, emit: Callable[[str], None] = lambda s: None):
    """Continue the workload from the journal to its end; the engine open at the end
    (each step's boundary reopens it)."""
    entries = [e for e in read_journal(journal, repair=True) if e["op"] != "extra"]
    i, j = 0, 0
    if entries:
        last = entries[-1]
        i, j = (last["step"] + 1, 0) if last["op"] == "step" else (last["step"], last["op"] + 1)
    while i < N_STEPS:
        ops = ops_for_step(i)
        for jj in range(j, len(ops)):
            # an MV over an MV, or replacing one, waits for it to be created
            first = "m_proj" if ops[jj]["kind"] == "replace" else ops[jj].get("after")
            if first is not None and eng.catalog.find(ops[jj].get("name", "")) is None:
                while eng.progress(first).state != "created":
                    eng = _step(eng, journal, i, emit, extra=True)
            _issue(eng, ops[jj], lambda: {})
            append_journal(journal, {"step": i, "op": jj, **ops[jj]})
            emit(f"OP {i} {jj} {ops[jj]['kind']}")
        eng = _step(eng, journal, i, emit)
        i, j = i + 1, 0
    for _ in range(MAX_EXTRA):
        if _settled(eng):
            break
        eng = _step(eng, journal, N_STEPS, emit, extra=True)
    else:
        raise AssertionError(f"the workload did not settle in {MAX_EXTRA} extra steps: "
                             f"{[(r.name, r.state) for r in eng.catalog.all()]}")
    # one epoch more after the switch: the new definition's first incremental epoch
    eng = _step(eng, journal, N_STEPS, emit, extra=True)
    emit(f"END {eng.committed_epoch}")
    return eng


# --------------------------------------------------------------------------- #
# The model of the journal
# --------------------------------------------------------------------------- #


def model_states(entries: list[dict[str, Any]]) -> dict[int, tuple[dict, dict]]:
    """The journal replayed in pure Python: {epoch of a journaled step: (t, u)} where
    t is {id: (id, g, v)} and u {g: (g, name)}."""
    t: dict[int, tuple] = {}
    u: dict[int, tuple] = {}
    pending: list[Callable[[dict, dict], None]] = []
    out: dict[int, tuple[dict, dict]] = {}
    for e in entries:
        kind = e.get("kind")
        if e["op"] in ("step", "extra"):
            nt, nu = dict(t), dict(u)
            for fn in pending:
                fn(nt, nu)
            pending = []
            t, u = nt, nu
            out[e["epoch"]] = (dict(t), dict(u))
        elif kind == "insert":
            rows = [(r["id"], r["g"], r["v"]) for r in e["rows"]]
            pending.append(lambda st, su, rows=rows: st.update({r[0]: r for r in rows}))
        elif kind == "insert_u":
            rows = [(r["g"], r["name"]) for r in e["rows"]]
            pending.append(lambda st, su, rows=rows: su.update({r[0]: r for r in rows}))
        elif kind == "delete":
            keys = list(e["keys"])
            pending.append(lambda st, su, keys=keys: [st.pop(k, None) for k in keys])
        elif kind in ("sql_update", "sql_delete", "empty_group"):
            # evaluated against the committed snapshot when called, staged as key changes
            if kind == "sql_update":
                staged = {k: (r[0], r[1], e["v"]) for k, r in t.items() if r[1] == e["g"]}
                pending.append(lambda st, su, staged=staged: st.update(staged))
            else:
                keys = [k for k, r in t.items() if r[1] == e["g"]
                        and (kind == "empty_group" or r[2] > e["v"])]
                pending.append(lambda st, su, keys=keys: [st.pop(k, None) for k in keys])
    return out


# --------------------------------------------------------------------------- #
# The oracle
# --------------------------------------------------------------------------- #


def _rows(df) -> list[tuple]:
    from helpers import rows_of

    return rows_of(df)


def check(eng, journal: str, reference: str | None) -> list[str]:
    """The invariant of the module docstring; the failures found (none: exact)."""
    from sparkfill import EpochNotRetained

    problems: list[str] = []
    entries = read_journal(journal)
    committed = eng.committed_epoch
    retained = [e for e in range(committed + 1) if _retained(eng, e)]
    if committed not in retained:
        problems.append(f"the committed epoch {committed} is not readable")
    # DML applied exactly once
    states = model_states(entries)
    compared = 0
    for epoch, (t, u) in sorted(states.items()):
        if epoch not in retained:
            continue
        compared += 1
        for name, want in (("t", t), ("u", u)):
            got = _rows(eng.read(name, as_of=epoch))
            if got != sorted(want.values()):
                problems.append(_diff(f"table {name} at epoch {epoch} vs journal replay",
                                      got, sorted(want.values())))
    if not compared:
        problems.append(f"no journaled epoch retained (committed {committed})")
    # the source, against the reference run
    if reference is not None and os.path.exists(reference):
        with open(reference) as f:
            ref = {int(k): [tuple(r) for r in v] for k, v in json.load(f).items()}
        for epoch in retained:
            if epoch in ref:
                got = _rows(eng.read(SOURCE, as_of=epoch))
                if got != sorted(ref[epoch]):
                    problems.append(_diff(f"source {SOURCE} at epoch {epoch} vs the "
                                          "reference run", got, sorted(ref[epoch])))
    # every MV = its batch query at every retained epoch
    for rel in eng.catalog.all():
        if rel.kind != "mv" or rel.internal:
            continue
        if rel.state != "created" and rel.name not in DROPPED:
            problems.append(f"MV {rel.name} is {rel.state} after the workload")
            continue
        for epoch in retained:
            if rel.ready_epoch is None or epoch < rel.ready_epoch:
                continue
            try:
                diff = eng.verify(rel.name, as_of=epoch).limit(6).collect()
            except EpochNotRetained:
                continue
            if diff:
                problems.append(f"MV {rel.name} differs from its query at epoch {epoch}: "
                                f"{[tuple(r) for r in diff]}")
    names = {r.name for r in eng.catalog.all()}
    for n, name in zip((4, 7, 9), DROPPED, strict=True):
        if N_STEPS > n and name in names:
            problems.append(f"{name} was dropped but exists")
    for name, (_, n) in SINKS.items():
        if N_STEPS > n:
            problems += _check_sink(eng, name)
    problems += _check_files(eng)
    return problems


def _retained(eng, epoch: int) -> bool:
    from sparkfill import EpochNotRetained

    try:
        eng.read("t", as_of=epoch)
        return epoch > 0
    except EpochNotRetained:
        return False
    except Exception:  # noqa: BLE001 - t did not exist then
        return False


def _diff(label: str, got: list[tuple], want: list[tuple]) -> str:
    extra = sorted(set(got) - set(want))[:5]
    missing = sorted(set(want) - set(got))[:5]
    return f"{label}: {len(got)} rows, expected {len(want)}; extra {extra}, missing {missing}"


def _check_sink(eng, name: str) -> list[str]:
    import pyarrow as pa
    from deltalake import DeltaTable

    sink = next((s for s in eng.meta.sinks() if s.name == name), None)
    if sink is None:
        return [f"sink {name} missing"]
    mv_name = eng.catalog.get_by_id(sink.rel_id).name
    columns = [c.name for c in eng.relation(mv_name).visible_columns]
    dt = DeltaTable(sink.path)
    synced = dt.transaction_version(f"sparkfill-sink-{sink.id}")
    if synced is None or int(synced) != eng.committed_epoch:
        return [f"sink {name} synced to {synced}, the committed epoch is {eng.committed_epoch}"]
    table = dt.to_pyarrow_table()
    from helpers import _sort_key

    got = sorted((tuple(r.values()) for r in table.select(columns).to_pylist()), key=_sort_key)
    want = _rows(eng.read(mv_name, as_of=int(synced)).select(*columns))
    problems = []
    if got != want:
        problems.append(_diff(f"sink {name} vs {mv_name} at epoch {synced}", got, want))
    for path in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist():
        if not os.path.isfile(os.path.join(sink.path, path)):
            problems.append(f"sink {name} references a missing file {path}")
    return problems


def _check_files(eng) -> list[str]:
    """Every referenced file exists; nothing is left that nothing references."""
    problems = []
    wh = eng.warehouse
    root = eng.store.root
    dirs = {}
    for rel in eng.catalog.all():
        dirs[rel.stored.dir] = rel
    for path in wh.list(root):
        name = wh.name_of(path)
        if name == "_jobs":
            for job in wh.list(path):
                rel = eng.catalog.find_by_id(int(wh.name_of(job)))
                if rel is None or rel.state == "created":
                    problems.append(f"snapshot job folder {job} left behind ({rel and rel.name})")
            continue
        if name not in dirs:
            problems.append(f"relation folder {name} left behind (no relation)")
    for dir_, rel in dirs.items():
        table = f"{root}/{dir_}"
        ever: set[str] = set()
        log = f"{table}/_delta_log"
        for entry in wh.list(log):
            if entry.endswith(".json"):
                for line in (wh.read_text(entry) or "").splitlines():
                    action = json.loads(line)
                    if "add" in action:
                        ever.add(action["add"]["path"])
        for path in eng.store.referenced(rel.stored):
            if wh.file_size(path) is None:
                problems.append(f"{rel.name}: referenced file {path} is missing")
        for sub in ("log", "base"):
            for folder in wh.list(f"{table}/{sub}"):
                for f in wh.list(folder):
                    rel_path = f[len(table) + 1:]
                    if f.endswith(".parquet") and rel_path not in ever:
                        problems.append(f"{rel.name}: orphan file {rel_path}")
    staged = {b.path for b in eng.meta.staged()}
    for f in wh.list(eng.stager.dir):
        if f not in staged:
            problems.append(f"staged DML {f} left behind")
    for _, d in eng.meta.pending_dirs():
        problems.append(f"pending folder {d} left registered")
    return problems


# --------------------------------------------------------------------------- #
# The reference run's copies
# --------------------------------------------------------------------------- #

#: the reference run saves a copy of everything the workload keeps at each boundary
#: into ``$SPARKFILL_DURABILITY_SAVES/<n>`` (n = 0, 1, ...)
SAVES_ENV = "SPARKFILL_DURABILITY_SAVES"
#: the harness's own files in a site's folder: not the workload's
HARNESS_FILES = ("*.err", "points.log", "reference.json")


def save_boundary(warehouse: str, saves: str) -> None:
    """Copy the site folder (the warehouse with its SQLite meta store, the sinks, the
    journal) to the next numbered copy and mark the boundary in the points log: the
    acts logged after mark n are those a run restored from copy n does."""
    import shutil

    base = os.path.dirname(os.path.abspath(warehouse))
    n = len(os.listdir(saves)) if os.path.isdir(saves) else 0
    shutil.copytree(base, os.path.join(saves, str(n)),
                    ignore=shutil.ignore_patterns(*HARNESS_FILES))
    durability_points.mark(f"{durability_points.BOUNDARY}{n}")


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #


def main(argv: list[str]) -> int:
    global N_STEPS
    mode, warehouse, journal = argv[1], argv[2], argv[3]
    reference = argv[4] if len(argv) > 4 else None
    if mode == "check" and os.environ.get(FINISH_ENV):
        N_STEPS = bounded_steps(journal, int(os.environ[FINISH_ENV]))
        print(f"FINISH {N_STEPS}", flush=True)
    durability_points.install()
    emit = lambda s: print(s, flush=True)  # noqa: E731
    eng = open_engine(warehouse)
    print("READY", flush=True)
    if mode == "reference":
        rows: dict[int, list] = {}

        def record(e, epoch: int) -> None:
            rows[epoch] = [list(r) for r in _rows(e.read(SOURCE, as_of=epoch))]

        ON_STEP.append(record)
        saves = os.environ.get(SAVES_ENV)
        if saves:
            ON_BOUNDARY.append(lambda wh: save_boundary(wh, saves))
        eng = run_workload(eng, journal, emit)
        with open(reference, "w") as f:
            json.dump(rows, f)
    else:
        eng = run_workload(eng, journal, emit)
    if mode == "check":
        try:
            problems = check(eng, journal, reference)
        except Exception:  # noqa: BLE001 - a check that cannot run is a failure
            problems = [traceback.format_exc()]
        eng.close()
        try:  # the writer lock is free once closed
            open_engine(warehouse).close()
        except Exception as exc:  # noqa: BLE001
            problems.append(f"reopening after close failed: {exc}")
        for p in problems:
            print(f"PROBLEM {p}", flush=True)
        print("CHECKED" if not problems else f"FAILED {len(problems)}", flush=True)
        return 1 if problems else 0
    eng.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
