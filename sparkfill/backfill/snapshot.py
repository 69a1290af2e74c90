"""Snapshot backfill: a creating job reads a fixed snapshot ``U(s)`` in its own
background loop, isolated from the upstream's epochs; then it consumes ``U``'s
change log from ``s`` until it has caught up; then it joins the epoch loop.

Invariants:

* Phase 1 (this module's thread) touches neither the meta store nor any Delta
  log. Its checkpoints are its own, files under the warehouse (local or an
  object store, reached through ``Warehouse``): the chunk plan (``plan.json``) is
  fixed when the job starts, and a chunk is done exactly when its marker file
  exists — the marker is written after the chunk's data — so a restarted job
  redoes at most the chunk it was in. Each attempt at a chunk writes to a
  directory of its own, which the marker names (with the files the write
  reported); only named attempts are read. A killed Spark Connect
  client's write goes on at the server after the kill, so the directory of an
  attempt no marker names may still be filled later: it is never read. Its last
  step writes the initial rows of the MV and of its state tables (``Q(U(s))``;
  not an inner join's sides, kept by need: ``join.py``) as files no commit
  references yet, then a manifest.
* The epoch loop commits the manifest's files as each relation's append of epoch
  ``s`` (idempotent per epoch) and the job's position becomes ``s``.
* Phases 2 and 3 run in the epoch loop (``SnapshotCatchUp``): with position
  ``p``, epoch ``e`` consumes the net change of ``U`` over ``(p, q]`` from its log
  store and appends the result as of ``q``; once the lag is small, ``q = e``
  (with ``e``'s own change) and the MV is created. So the MV, read as of its
  position, is always ``Q(U(p))``.
* While the job exists the upstream keeps the log rows after ``p`` and the files
  of ``U(s)`` (retention horizon = position; no compaction of the relations it
  reads or writes).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from ..dataflow.aggregate import changed_rows_bound, estimate_groups
from ..dataflow.changelog import union_all
from ..dataflow.join import born_unkept
from ..dataflow.recompute import contents, leaf_part
from ..storage.catalog import Relation
from ..storage.relation_store import DataFile, RelationStore
from ..storage.schema import VNODE, VNODE_COUNT, user_struct, vnode_expr
from ..storage.spark_files import read_parquet, write_parquet
from ..storage.warehouse import Warehouse

__all__ = ["JobControl", "SnapshotJob", "chunk_files", "chunk_plan", "job_status", "leaf_span",
           "read_plan", "write_chunk"]


@dataclass
class JobControl:
    """What the epoch loop tells a running job, and what it reports back."""

    rate_limit: int | None
    cancelled: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    #: the exception the job died of (the epoch loop re-raises an error of the rows)
    failure: BaseException | None = None


def chunk_plan(estimates: Sequence[Sequence[float]], chunk_rows: int) -> list[dict[str, int]]:
    """Chunks of vnode ranges per leaf, each of about ``chunk_rows`` estimated rows."""
    chunks = []
    for leaf, estimate in enumerate(estimates):
        lo, acc = 0, 0.0
        for v in range(VNODE_COUNT):
            acc += estimate[v]
            if acc >= chunk_rows or v == VNODE_COUNT - 1:
                chunks.append({"leaf": leaf, "lo": lo, "hi": v, "estimate": int(acc)})
                lo, acc = v + 1, 0.0
    return chunks


def _read_json(warehouse: Warehouse, uri: str) -> Any:
    """The JSON object in the file ``uri``; None when it does not exist."""
    text = warehouse.read_text(uri)
    return None if text is None else json.loads(text)


def read_plan(warehouse: Warehouse, job_dir: str) -> list[dict[str, int]]:
    """The job's chunk plan (none before the job was started)."""
    return list(_read_json(warehouse, f"{job_dir}/plan.json") or [])


def job_status(warehouse: Warehouse, job_dir: str) -> dict[str, Any]:
    """Phase 1's checkpoints as the epoch loop sees them: rows done per leaf, and
    the manifest once the initial rows are written."""
    plan = read_plan(warehouse, job_dir)
    rows: dict[int, int] = {}
    done = 0
    for c in plan:
        marker = _read_json(warehouse, _marker(job_dir, c))
        if marker is not None:
            rows[c["leaf"]] = rows.get(c["leaf"], 0) + int(marker["rows"])
            done += 1
    manifest = _read_json(warehouse, f"{job_dir}/manifest.json")
    return {"rows": rows, "chunks_done": done, "chunks": len(plan), "manifest": manifest}


def _chunk_dir(job_dir: str, c: dict[str, int]) -> str:
    """The directory of chunk ``c``: its marker, and a directory per attempt."""
    return f"{job_dir}/leaf{c['leaf']}/v{c['lo']:03d}-{c['hi']:03d}"


def _marker(job_dir: str, c: dict[str, int]) -> str:
    """The file that says chunk ``c`` is done (rows, attempt): beside its attempts."""
    return f"{_chunk_dir(job_dir, c)}/_DONE.json"


def chunk_files(warehouse: Warehouse, job_dir: str, plan: Sequence[dict[str, int]],
                leaf: int) -> list[str]:
    """The data files (URIs) of ``leaf``'s done chunks: those of the attempt each
    marker names, none of any other attempt."""
    files: list[str] = []
    for c in plan:
        if c["leaf"] != leaf:
            continue
        marker = _read_json(warehouse, _marker(job_dir, c))
        if marker is None:
            continue
        attempt = _chunk_dir(job_dir, c)
        if marker.get("attempt"):  # a marker of an earlier layout names none: files beside it
            attempt = f"{attempt}/{marker['attempt']}"
        if "files" in marker:  # the files the attempt's write reported, exactly
            files.extend(f"{attempt}/{name}" for name in marker["files"])
        else:  # a marker of an earlier layout: the attempt's Parquet files, listed
            files.extend(uri for uri in warehouse.list(attempt)
                         if Warehouse.name_of(uri).endswith(".parquet")
                         and warehouse.is_file(uri))
    return files


def write_chunk(warehouse: Warehouse, job_dir: str, chunk: dict[str, int], out: DataFrame,
                rows: Callable[[], int]) -> int:
    """One attempt at ``chunk``: write ``out`` to a fresh directory of its own, then
    the chunk's marker naming it (and the files its write reported) with the rows
    read (``rows()``, known once the write ran); returns them."""
    attempt = f"a{uuid.uuid4().hex}"
    written = write_parquet(out, warehouse, f"{_chunk_dir(job_dir, chunk)}/{attempt}", [])
    n = rows()
    # the marker, after the data: the chunk is done, with this attempt's files
    warehouse.write_text(_marker(job_dir, chunk), json.dumps(
        {"rows": n, "attempt": attempt, "files": [Warehouse.name_of(f.uri) for f in written]}))
    return n


class SnapshotJob(threading.Thread):
    """Phase 1 of one snapshot-backfill job: read ``U(s)`` chunk by chunk, then
    write ``Q(U(s))`` for the MV and its state tables."""

    def __init__(self, spark: SparkSession, store: RelationStore, job_dir: str,
                 mv: Relation, leaves: Sequence[Relation], states: Sequence[Relation],
                 leaf_files: Sequence[Sequence[DataFile]], snapshot_epoch: int,
                 control: JobControl, parallelism: int) -> None:
        super().__init__(name=f"sparkfill-snapshot-{mv.name}", daemon=True)
        self.spark = spark
        self.store = store
        self.warehouse = store.warehouse
        self.job_dir = job_dir
        self.mv = mv
        self.leaves = list(leaves)
        self.states = list(states)
        self.leaf_files = [list(f) for f in leaf_files]
        self.s = snapshot_epoch
        self.control = control
        self.parallelism = parallelism
        self.group = f"sparkfill-snapshot-{mv.id}"

    def run(self) -> None:
        # the session's operation tag (thread-local: this thread's Spark jobs only)
        # lets ``cancel`` interrupt them, on a classic and a Spark Connect session alike
        self.spark.addTag(self.group)
        try:
            self._run()
        except Exception as exc:  # reported through progress; the job restarts on open
            if not self.control.cancelled.is_set():
                self.control.error = f"{type(exc).__name__}: {exc}"
                self.control.failure = exc
        finally:
            self.spark.removeTag(self.group)

    def cancel(self) -> None:
        self.control.cancelled.set()
        self.spark.interruptTag(self.group)

    # --- phase 1 --------------------------------------------------------------------------

    def _run(self) -> None:
        plan = read_plan(self.warehouse, self.job_dir)
        started, rows_read = time.time(), 0
        for chunk in plan:
            if self.control.cancelled.is_set():
                return
            if self.warehouse.exists(_marker(self.job_dir, chunk)):
                continue
            while self.control.rate_limit == 0:  # paused
                if self.control.cancelled.wait(0.2):
                    return
            rows_read += self._read_chunk(chunk)
            limit = self.control.rate_limit
            if limit:
                ahead = rows_read / limit - (time.time() - started)
                if ahead > 0 and self.control.cancelled.wait(ahead):
                    return
        if not self.control.cancelled.is_set() and \
                not self.warehouse.exists(f"{self.job_dir}/manifest.json"):
            self._write_initial_rows()

    def _read_chunk(self, chunk: dict[str, int]) -> int:
        leaf = self.leaves[chunk["leaf"]]
        # guarded: the MV's filter above never runs on a base row the log replaced
        # (the job runs beside the epochs, which cannot run it again merged by key)
        rows = self.store.snapshot(leaf.stored, self.s,
                                   vnodes=range(chunk["lo"], chunk["hi"] + 1),
                                   files=self.leaf_files[chunk["leaf"]], bulk=True,
                                   guarded=True)
        files = [f for f in self.leaf_files[chunk["leaf"]]
                 if f.vnode_max >= chunk["lo"] and f.vnode_min <= chunk["hi"]]
        if len(files) < self.parallelism:  # fewer files than tasks: spread the work
            rows = rows.repartition(self.parallelism)
        # one Spark job per chunk: the rows read are counted by the write itself
        observed = Observation(f"chunk-{chunk['leaf']}-{chunk['lo']}")
        out = leaf_part(self.mv, self.states, chunk["leaf"],
                        rows.observe(observed, F.count(F.lit(1)).alias("rows")).drop(VNODE))
        return write_chunk(self.warehouse, self.job_dir, chunk, out,
                           lambda: int(observed.get["rows"]))

    def _chunks_of(self, leaf: int, rel: Relation) -> DataFrame:
        files = chunk_files(self.warehouse, self.job_dir, read_plan(self.warehouse, self.job_dir),
                            leaf)
        schema = self.spark.createDataFrame([], _schema_of(rel)).schema
        return read_parquet(self.spark, self.warehouse, schema, files)

    def _write_initial_rows(self) -> None:
        """``Q(U(s))`` for the MV and each state table, as uncommitted files: each
        written by one Spark job that counts its rows (no cache, no count job); the
        files of a write are as many as the rows it is expected to hold: a leaf's
        rows read in phase 1, or for an aggregate's MV the groups its state's write
        observed."""
        leaf_rows = job_status(self.warehouse, self.job_dir)["rows"]
        targets = contents(self.mv, self.leaves, self.states, self._chunks_of,
                           [leaf_rows.get(i, 0) for i in range(len(self.leaves))])
        manifest: dict[str, Any] = {}
        groups = 0  # observed by the last write: an aggregate's state comes before its MV
        unkept = born_unkept(self.mv.plan, self.states)
        for target in targets:
            rel, hint = target.rel, target.rows_hint
            if rel.id in unkept:
                continue  # its rows are the leaf's at ``s`` (``join.py``)
            if hint is None:  # an aggregate's MV: a row per group its state's write observed
                hint = changed_rows_bound(groups if groups or target.stage_rows is None
                                          else estimate_groups(target.stage_rows))
            self._clear_uncommitted(rel)
            rows = target.rows.withColumn(VNODE, vnode_expr(list(target.dist or rel.key)))
            files, observed = self.store.prepare_files(
                rel.stored, self.s, rows, hint, "snap",
                count_column=target.dist[0] if target.dist else None)
            groups = observed.key_count or 0
            manifest[str(rel.id)] = {"rows": sum(observed.counts.values()), "files": files}
            if self.control.cancelled.is_set():
                return
        self.warehouse.write_text(f"{self.job_dir}/manifest.json", json.dumps(manifest))

    def _clear_uncommitted(self, rel: Relation) -> None:
        """Files of an earlier, interrupted attempt (never committed)."""
        prefix = f"e{self.s:010d}-snap-"
        for uri in self.warehouse.list(f"{self.store.path(rel.stored)}/log"):
            if Warehouse.name_of(uri).startswith(prefix):
                try:
                    self.warehouse.rmtree(uri)
                except OSError:  # as before: what cannot be removed is left (never read)
                    pass


def _schema_of(rel: Relation) -> Any:
    return user_struct(list(rel.columns))


def leaf_span(store: RelationStore, leaf: Relation, after: int, upto: int,
              current: DataFrame | None, epoch: int) -> DataFrame | None:
    """The log rows of ``leaf`` over ``(after, upto]`` plus, when given, the epoch
    ``epoch``'s own change (not in the log yet); None when there are none."""
    files = [f for f in store.files_at(leaf.stored, upto) if f.kind == "log"
             and f.epoch_max > after and f.epoch_min <= upto] if upto > after else []
    parts = []
    if files:
        parts.append(store.changelog(leaf.stored, after, upto)
                     .select(*[c.name for c in leaf.columns], VNODE, "_epoch", "_op"))
    if current is not None:
        parts.append(current.withColumn("_epoch", F.lit(epoch).cast("bigint"))
                     .select(*[c.name for c in leaf.columns], VNODE, "_epoch", "_op"))
    if not parts:
        return None
    return union_all(parts)
