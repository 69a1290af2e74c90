"""What ``sparkfill status`` and ``sparkfill ui`` show, as JSON-ready facts built from
the meta store alone.

Invariant: every function here only reads — a meta store opened read-only
(``open_meta``: no writer lock) and, for sizes and sinks, Delta logs — and never
starts Spark, so it is safe beside a running writer. The facts of one call are read
in one read transaction (``MetaStore.snapshot``): an epoch that commits meanwhile is
seen whole or not at all. Rates, ETAs and stalls are computed from what the epochs
recorded (each row of ``epochs`` holds the rows each creating job had backfilled),
so any reader gets the same numbers the writer's ``Engine.progress`` measures,
without having watched the epochs go by.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SparkfillError
from ..storage.warehouse import Warehouse

if TYPE_CHECKING:
    from ..storage.catalog import Catalog, Relation
    from ..storage.meta_store import EpochRow, MetaStore, ProgressRow

__all__ = ["open_meta", "status_facts", "watch_facts", "job_facts", "SizeCache",
           "RATE_EPOCHS", "VNODE_STATES"]

#: the epochs a job's rate is measured over (as ``Engine.progress``: the last 12)
RATE_EPOCHS = 12
#: a vnode's state in a job's progress strip: done, in progress, not started
VNODE_STATES = {"done": "d", "in_progress": "p", "not_started": "n"}


def open_meta(warehouse: Warehouse, meta_url: str | None) -> MetaStore:
    """The warehouse's meta store, opened read-only (no writer lock); raises
    ``SparkfillError`` for a folder that is not a warehouse or a wrong ``meta_url``."""
    from ..storage.meta_store import MetaStore, check_meta, open_postgres

    url = check_meta(warehouse, meta_url)
    if url is not None:
        target, _ = open_postgres(warehouse, url, read_only=True)
        return MetaStore(target, read_only=True)
    if warehouse.local_path is None or not (warehouse.local_path / "meta.sqlite").is_file():
        raise SparkfillError(f"{warehouse} is not a sparkfill warehouse")
    return MetaStore(warehouse.local_path / "meta.sqlite", read_only=True)


# --- jobs -----------------------------------------------------------------------------------

def _started_at(mv: Relation, epochs: dict[int, EpochRow]) -> float | None:
    """When the job's first epoch began (the epoch after the one its MV was created
    at), if recorded."""
    first = epochs.get(mv.created_epoch + 1)
    return None if first is None else first.finished_at - first.seconds


def job_facts(catalog: Catalog, progress: dict[int, list[ProgressRow]],
              epochs: Sequence[EpochRow], committed: int, queued: set[int],
              now: float | None = None) -> list[dict[str, Any]]:
    """One fact per creating MV's job (its join chain's links counted in, as
    ``Engine.progress`` does): strategy, state (``JOB_STATES``) and phase
    (``snapshot``, ``catching up``, ``queued``, ``waiting``: for an upstream MV),
    rows done of about how many, percent, rows/s and ETA over the last
    ``RATE_EPOCHS`` epochs that recorded the job, stalled (no rows for
    ``STALL_EPOCHS`` epochs while not paused), the rate limit, parallelism, when it
    started and for how long it has run, the epochs a snapshot job lags while it
    catches up, and for the arrangement strategy each leaf's 256 vnodes as a strip
    of ``VNODE_STATES`` letters. ``epochs``: the recent rows of ``epochs``, oldest
    first, with the first epoch of each job among them."""
    from ..pipelines.coordinator import STALL_EPOCHS

    now = time.time() if now is None else now
    by_epoch = {e.epoch: e for e in epochs}
    out: list[dict[str, Any]] = []
    for user in catalog.all():
        if user.kind != "mv" or user.internal:
            continue
        # a created MV's job is the replacement being built for it (CREATE OR REPLACE)
        found = user if user.state != "created" else catalog.replacement_of(user)
        if found is None or found.state == "created" or found.options is None:
            continue
        mv = found
        parts = [*catalog.internals_of(mv), mv]
        ids = {p.id for p in parts}
        active = next((p for p in parts if p.state != "created"), mv)
        done = total = 0
        for part in parts:
            part_done = sum(r.rows for r in progress.get(part.id, []))
            done += part_done
            total += part_done if part.state == "created" else max(
                part_done, sum(leaf.row_count for leaf in catalog.leaves_of(part)))
        total = max(done, total)
        samples = [(e.finished_at, sum(n for i, n in e.jobs.items() if i in ids))
                   for e in epochs if ids & e.jobs.keys()][-RATE_EPOCHS:]
        rate = 0.0
        if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
            rate = max(0.0, (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]))
        opts = found.options
        rows = progress.get(active.id, [])
        lag: int | None = None
        paused = opts.rate_limit == 0
        if mv.id in queued:
            state, phase = "queued", "queued"
        elif catalog.is_waiting(active):
            state, phase = ("paused" if paused else "backfilling"), "waiting"
        elif opts.strategy == "snapshot" and rows and all(r.state == "done" for r in rows):
            state, phase = ("paused" if paused else "catching_up"), "catching up"
            lag = max(0, committed - min(int(r.pinned_epoch or 0) for r in rows))
        else:
            state, phase = ("paused" if paused else "backfilling"), "snapshot"
        recent = samples[-STALL_EPOCHS:]
        stalled = (phase == "snapshot" and not paused and len(recent) == STALL_EPOCHS
                   and recent[-1][1] == recent[0][1])
        strips: list[str] = []
        if opts.strategy == "arrangement":
            for leaf in sorted({r.leaf for r in rows}):
                cells = ["n"] * 256
                for r in rows:
                    if r.leaf == leaf and 0 <= r.vnode < 256:
                        cells[r.vnode] = VNODE_STATES.get(r.state, "n")
                strips.append("".join(cells))
        vnodes_done = (sum(s.count("d") for s in strips) // max(1, len(strips)) if strips
                       else 256 if phase == "catching up" else 0)
        started = _started_at(mv, by_epoch)
        out.append({
            "name": user.name, "replacing": mv is not user,
            "strategy": opts.strategy, "state": state, "phase": phase,
            "rows_done": done, "rows_total_estimate": total,
            "percent": 100.0 * done / total if total > 0 else 0.0,
            "rows_per_second": rate,
            "eta_seconds": (total - done) / rate if rate > 0 else None,
            "stalled": stalled, "paused": paused, "rate_limit": opts.rate_limit,
            "parallelism": opts.parallelism, "lag_epochs": lag,
            "created_epoch": mv.created_epoch, "started_at": started,
            "running_seconds": None if started is None else max(0.0, now - started),
            "vnodes_done": vnodes_done, "vnodes": strips,
        })
    return out


# --- status -----------------------------------------------------------------------------------

def _read(meta: MetaStore, epochs: int) -> dict[str, Any]:
    """Everything the facts are built from, read in one read transaction."""
    from ..pipelines.coordinator import queued_jobs
    from ..pipelines.failures import load_failures
    from ..storage.catalog import Catalog

    with meta.snapshot():
        catalog = Catalog(meta)
        progress = meta.all_progress()
        starts = [r.created_epoch + 1 for r in catalog.all()
                  if r.kind == "mv" and not r.internal]
        return {"committed": meta.committed_epoch, "catalog": catalog, "progress": progress,
                "epochs": meta.epoch_rows(epochs, starts),
                "queued": queued_jobs(meta, catalog, progress),
                "sources": meta.sources(), "sinks": meta.sinks(),
                "verified": json.loads(meta.get("verify_last") or "{}"),
                "versions": meta.last_versions(), "pending": meta.pending_epoch(),
                "failures": load_failures(meta)}


def status_facts(meta: Any, warehouse: Warehouse | Any,
                 _read_facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``status`` shows, as JSON-ready facts read from the meta store only:
    the committed epoch; each relation (kind, strategy, state, rows; an MV's
    backfilled rows and vnodes done); each creating job (``job_facts``); each
    source (connector, last epoch, batches, position, rows, dead letters); each sink
    (its MV, connector, path, epoch written); the last sampled VERIFY of each MV."""
    from ..pipelines.failures import failed_upstream, failure_message

    read = _read_facts if _read_facts is not None else _read(meta, RATE_EPOCHS + 8)
    catalog: Catalog = read["catalog"]
    progress: dict[int, list[ProgressRow]] = read["progress"]
    relations: list[dict[str, Any]] = []
    names: dict[int, str] = {}
    for rel in catalog.all():
        names[rel.id] = rel.name
        rows = progress.get(rel.id, [])
        state = rel.state
        vnodes: int | None = None
        backfilled: int | None = None
        if rel.kind == "mv":
            backfilled = sum(p.rows for p in rows)
            vnodes = sum(1 for p in rows if p.state == "done" and p.vnode >= 0)
            if state == "creating":
                options = rel.options
                state = ("paused" if options is not None and options.rate_limit == 0
                         else "backfilling")
                if options is None or options.strategy != "arrangement":
                    vnodes = 0
            else:
                vnodes = 256
        failed = (failed_upstream(catalog, rel, read.get("failures") or {})
                  if rel.kind == "mv" else None)
        if failed is not None:
            state = "failed"
        relations.append({"name": rel.name, "kind": rel.kind,
                          "strategy": rel.options.strategy if rel.options else None,
                          "state": state, "rows": rel.row_count, "backfilled_rows": backfilled,
                          "vnodes_done": vnodes,
                          **({"failed": failure_message(catalog, rel, *failed)}
                             if failed is not None else {})})
    sources = [{"name": names.get(src.rel_id, str(src.rel_id)), "connector": src.connector,
                "last_epoch": src.epoch, "batches": src.batch, "position": src.position,
                "rows": src.total_rows,
                "dead_letters": src.total_dead_letters if src.dead_letter_id is not None
                else None}
               for src in read["sources"]]
    sinks: list[dict[str, Any]] = []
    if read["sinks"]:
        from ..sinks import synced_epoch

        wh = warehouse if isinstance(warehouse, Warehouse) else None
        sinks = [{"name": sink.name, "from": names.get(sink.rel_id, str(sink.rel_id)),
                  "connector": sink.connector, "path": sink.path,
                  "epoch_written": synced_epoch(
                      sink.path, sink.id, wh.options_for(sink.path) if wh else None)}
                 for sink in read["sinks"]]
    # the last periodic sampled VERIFY of each MV (``SET verify_every = N``)
    verified = read["verified"]
    return {"warehouse": str(warehouse), "committed_epoch": read["committed"],
            "relations": relations,
            "jobs": job_facts(catalog, progress, read["epochs"], read["committed"],
                              read["queued"]),
            "sources": sources, "sinks": sinks,
            "verified": [{"name": name, **found} for name, found in sorted(verified.items())
                         if name in names.values()]}


# --- the page ---------------------------------------------------------------------------------

class SizeCache:
    """The bytes of a relation's live files at a Delta version, read from its Delta
    log (no Spark) once per version. A call reads logs for at most ``budget``
    seconds and leaves the sizes it did not reach unknown (None) until a later call,
    so a page over many relations answers at once and fills its sizes in."""

    def __init__(self, warehouse: Warehouse, budget: float = 0.05) -> None:
        self.warehouse = warehouse
        self.budget = budget
        self._sizes: dict[tuple[str, int], int | None] = {}
        self._lock = threading.Lock()

    def sizes(self, wanted: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """Bytes of each (relation dir, version) of ``wanted``; None: not read yet, or
        unreadable (a relation dropped meanwhile)."""
        deadline = time.monotonic() + self.budget
        out: dict[tuple[str, int], int | None] = {}
        with self._lock:
            for key in wanted:
                if key not in self._sizes and time.monotonic() < deadline:
                    self._sizes[key] = self._read(*key)
                out[key] = self._sizes.get(key)
            keep = set(wanted)
            for key in [k for k in self._sizes if k not in keep]:
                del self._sizes[key]  # an older version, or a relation dropped
        return out

    def _read(self, dir_: str, version: int) -> int | None:
        import pyarrow as pa

        try:
            dt = self.warehouse.delta(self.warehouse.join("relations", dir_), version)
            sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes")
            return int(sum(v for v in sizes.to_pylist() if v is not None))
        except Exception:  # noqa: BLE001 - a table being dropped or compacted: unknown
            return None


def _dag(catalog: Catalog, status: dict[str, Any], jobs: dict[str, dict[str, Any]],
         versions: dict[int, tuple[int, int]], sizes: dict[tuple[str, int], int | None],
         committed: int) -> dict[str, Any]:
    """Nodes (tables, MVs, sources, sinks) and edges (data flows along them) of the
    warehouse's dataflow, internal relations folded into the MV that owns them."""
    rels = catalog.all()
    owned: dict[int, list[Relation]] = {}
    for r in rels:
        if r.kind == "state" or r.owner is not None:
            owner = r.owner
            if owner is None:  # a state table: its MV owns it
                owner = next((m.id for m in rels if m.plan is not None
                              and r.name in m.plan.states), None)
            if owner is not None:
                owned.setdefault(owner, []).append(r)

    def visible(name: str, seen: frozenset[str] = frozenset()) -> list[Relation]:
        rel = catalog.find(name)
        if rel is None or name.lower() in seen:
            return []
        if not rel.internal:
            return [rel]
        return [v for u in rel.upstreams for v in visible(u, seen | {name.lower()})]

    def size(rel: Relation) -> int | None:
        total = 0
        for r in [rel, *owned.get(rel.id, [])]:
            version = versions.get(r.id)
            if version is None:
                continue
            got = sizes.get((r.dir, version[1]))
            if got is None:
                return None
            total += got
        return total

    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, str]] = []
    for rel in rels:
        if rel.internal:
            continue
        node_id = f"rel:{rel.name}"
        last = max((versions[r.id][0] for r in [rel, *owned.get(rel.id, [])]
                    if r.id in versions), default=None)
        node: dict[str, Any] = {"id": node_id, "name": rel.name, "kind": rel.kind,
                                "state": rel.state, "rows": rel.row_count, "bytes": size(rel),
                                "last_epoch": last}
        if rel.kind == "mv":
            job = jobs.get(rel.name)
            node["strategy"] = rel.options.strategy if rel.options else None
            if job is not None:
                node["state"] = ("stalled" if job["stalled"] else "paused" if job["paused"]
                                 else "queued" if job["phase"] == "queued" else "creating")
                node["percent"] = job["percent"]
            sources: list[Relation] = []
            for u in rel.upstreams:
                sources += [v for v in visible(u) if v.id not in {s.id for s in sources}]
            edges += [{"from": f"rel:{s.name}", "to": node_id} for s in sources]
        nodes.append(node)
    for src in status["sources"]:
        node_id = f"source:{src['name']}"
        nodes.append({"id": node_id, "name": src["connector"], "kind": "source",
                      "state": "running", "rows": src["rows"], "bytes": None,
                      "last_epoch": src["last_epoch"], "dead_letters": src["dead_letters"]})
        edges.append({"from": node_id, "to": f"rel:{src['name']}"})
        if src["dead_letters"] is not None:
            edges.append({"from": node_id, "to": f"rel:{src['name']}__dead_letter"})
    for sink in status["sinks"]:
        node_id = f"sink:{sink['name']}"
        written = sink["epoch_written"]
        upstream = catalog.find(sink["from"])
        waiting = upstream is not None and upstream.state != "created"
        nodes.append({"id": node_id, "name": sink["name"], "kind": "sink",
                      "state": "waiting" if waiting else "created" if written == committed
                      else "behind", "rows": None, "bytes": None, "last_epoch": written,
                      "connector": sink["connector"]})
        edges.append({"from": f"rel:{sink['from']}", "to": node_id})
    known = {n["id"] for n in nodes}
    return {"nodes": nodes, "edges": [e for e in edges if e["from"] in known
                                      and e["to"] in known]}


def _timeline(catalog: Catalog, epochs: Sequence[EpochRow], limit: int) -> dict[str, Any]:
    """The last ``limit`` epochs as columns (the chart's series), and each backfill's
    first and last epoch that falls among them."""
    rows = list(epochs)[-limit:]
    first = rows[0].epoch if rows else 0
    backfills = []
    for mv in catalog.all():
        if mv.kind != "mv" or mv.internal:
            continue
        start, end = mv.created_epoch + 1, mv.ready_epoch
        if end is not None and end < first:
            continue  # a backfill that ended before the epochs shown
        backfills.append({"name": mv.name, "start_epoch": start, "end_epoch": end})
    return {
        "epoch": [e.epoch for e in rows],
        "finished_at": [e.finished_at for e in rows],
        "seconds": [e.seconds for e in rows],
        "backfill_seconds": [e.backfill_seconds for e in rows],
        "changes_seconds": [None if e.backfill_seconds is None
                            else max(0.0, e.seconds - e.backfill_seconds) for e in rows],
        "commit_seconds": [e.commit_seconds for e in rows],
        "changes": [e.changes for e in rows],
        "spark_jobs": [e.spark_jobs for e in rows],
        "backfills": backfills,
    }


def _notices(status: dict[str, Any], jobs: Sequence[dict[str, Any]],
             epochs: Sequence[EpochRow], pending: tuple[int, dict[str, Any]] | None,
             committed: int, now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Warnings (work after a commit that failed, sinks behind, sampled VERIFY
    differences, stalled jobs, dead letters) and errors (an epoch planned long ago
    that has not committed: the writer stopped or failed in it)."""
    warnings: list[dict[str, Any]] = []
    for e in reversed(epochs):
        warnings += [{"epoch": e.epoch, "kind": "epoch", "text": w} for w in e.warnings]
    for sink in status["sinks"]:
        written = sink["epoch_written"]
        if written is None or written < committed:
            warnings.append({"epoch": written, "kind": "sink",
                             "text": f"sink {sink['name']} ({sink['path']}) has written "
                                     f"{'nothing' if written is None else f'epoch {written}'}"
                                     f" of {committed}"})
    for v in status["verified"]:
        if v.get("differences"):
            warnings.append({"epoch": v.get("epoch"), "kind": "verify",
                             "text": f"sampled VERIFY of {v['name']} at epoch {v.get('epoch')} "
                                     f"found {v['differences']:,} differing rows"})
    for job in jobs:
        if job["stalled"]:
            warnings.append({"epoch": committed, "kind": "job",
                             "text": f"{job['name']}: no progress for several epochs "
                                     f"(stalled) at {job['percent']:.1f}%"})
    for src in status["sources"]:
        if src["dead_letters"]:
            warnings.append({"epoch": src["last_epoch"], "kind": "source",
                             "text": f"source {src['name']}: {src['dead_letters']:,} "
                                     f"malformed records in {src['name']}__dead_letter"})
    errors: list[dict[str, Any]] = [
        {"epoch": committed, "kind": "mv", "text": r["failed"]}
        for r in status["relations"] if "failed" in r and not r["name"].startswith("__sf_")]
    if pending is not None:
        epoch, plan = pending
        planned = plan.get("proctime_us")
        age = None if planned is None else max(0.0, now - int(planned) / 1e6)
        typical = statistics.median([e.seconds for e in epochs[-20:]]) if epochs else 0.0
        if age is not None and age > max(60.0, 10 * typical):
            errors.append({"epoch": epoch, "kind": "epoch",
                           "text": f"epoch {epoch} was planned {age:,.0f}s ago and has not "
                                   "committed: its writer stopped or failed (the next open "
                                   "of the warehouse re-runs it)"})
    return warnings, errors


def watch_facts(meta: MetaStore, warehouse: Warehouse, sizes: SizeCache | None = None,
                epochs: int = 120) -> dict[str, Any]:
    """What the ``sparkfill ui`` page shows: ``status_facts`` (``status``), plus the
    dataflow graph (``dag``), the epoch timeline (``timeline``: the last ``epochs``
    epochs), the epoch in flight (``pending``), ``warnings`` and ``errors``."""
    now = time.time()
    read = _read(meta, max(epochs, RATE_EPOCHS + 8))
    status = status_facts(meta, warehouse, read)
    catalog: Catalog = read["catalog"]
    versions: dict[int, tuple[int, int]] = read["versions"]
    by_dir = {r.id: r.dir for r in catalog.all()}
    wanted = [(by_dir[i], v) for i, (_, v) in versions.items() if i in by_dir]
    found = sizes.sizes(wanted) if sizes is not None else {}
    jobs = {j["name"]: j for j in status["jobs"]}
    committed = read["committed"]
    rows: list[EpochRow] = read["epochs"]
    recent = [e for e in rows if e.epoch > committed - epochs]
    warnings, errors = _notices(status, status["jobs"], recent, read["pending"], committed, now)
    pending = None
    if read["pending"] is not None:
        epoch, plan = read["pending"]
        planned = plan.get("proctime_us")
        pending = {"epoch": epoch,
                   "planned_at": None if planned is None else int(planned) / 1e6}
    last = rows[-1] if rows else None
    return {"now": now, "status": status,
            "dag": _dag(catalog, status, jobs, versions, found, committed),
            "timeline": _timeline(catalog, recent, epochs), "pending": pending,
            "last_commit_at": None if last is None else last.finished_at,
            "warnings": warnings, "errors": errors}
