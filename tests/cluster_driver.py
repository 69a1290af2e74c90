"""The engine on a standalone cluster while executors are SIGKILLed mid-epoch.

Run as a script (``python cluster_driver.py MASTER_URL WAREHOUSE SEED WORKER_PIDS``;
``WORKER_PIDS`` comma-separated) it runs the engine on sessions of the cluster at
``MASTER_URL`` (two one-core executors each) in two phases, one Spark application
each, over the same warehouse:

1. ``spark-retries`` (Spark's defaults: a task is tried 4 times): create a table,
   load it, create three MVs that backfill over several epochs (arrangement,
   no_shuffle and snapshot strategies), run epochs with random DML;
2. ``step-raises`` (``spark.task.maxFailures=1``: a task lost with its executor
   fails its job): reopen the engine (with DML staged by phase 1 and not yet
   stepped), create a fourth MV, run epochs with random DML.

In each phase a thread SIGKILLs one of the application's executor JVMs (found under
the workers' ``WORKER_PIDS``) while ``step()`` runs: once while an MV is
backfilling, once in steady state (all MVs created). The standalone worker
launches a new executor in its place.

The engine's contract is checked on every step: a ``step()`` that raises (a
``SparkfillError``) has committed nothing, and the next ``step()`` redoes the epoch;
a ``step()`` that returns committed the next epoch. At the end every MV is compared
with Spark running its SQL as a batch query over the table, ``verify()`` must be
empty, and the table must equal a Python model of the DML (``helpers.TableModel``).

The last line of output is ``SUMMARY {json}``: the kills, the steps that raised, what
Spark's event log says it did (failed tasks by reason, stage retries, failed jobs),
the final epoch and the exactness flags.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import signal
import string
import sys
import threading
import time
import traceback
from typing import Any

import psutil
from helpers import TableModel, assert_rows_equal, assert_same_rows
from spark_cluster import executor_pids

TABLE = "t"
COLUMNS = ["id", "g", "v", "s"]
INITIAL_ROWS = 2000
KEY_SPACE = 5000
CHUNK = 800
#: name -> (WITH options, SELECT over {src})
MVS: dict[str, tuple[str, str]] = {
    "m": (f"backfill_chunk_rows = {CHUNK}, backfill_target_epoch_ms = 0",
          "SELECT g, count(*) AS c, sum(v) AS sv FROM {src} GROUP BY g"),
    "f": (f"backfill = 'no_shuffle', backfill_chunk_rows = {CHUNK}",
          "SELECT id, g, v * 2 AS w, s FROM {src} WHERE v % 3 <> 0"),
    "sn": ("backfill = 'snapshot', backfill_chunk_rows = 1000",
           "SELECT s, max(v) AS mx, count(*) AS c FROM {src} GROUP BY s"),
    "m2": ("backfill_chunk_rows = 1200, backfill_target_epoch_ms = 0",
           "SELECT s, g, count(*) AS c, min(v) AS mn FROM {src} GROUP BY s, g"),
}
#: redo attempts of one epoch after step() raised
MAX_TRIES = 5
#: epochs of one phase, at most
MAX_STEPS = 15
#: epochs of a phase that kills until a step raises, at most: a kill lands in a task
#: Spark counts against the job only when the task had started on the executor (one
#: still launching, or one that ended between the look and the kill, costs nothing)
MAX_STEPS_UNTIL_RAISED = 25
#: a busy executor is killed when seen running a task in two looks this far apart
BUSY_CONFIRM_SECONDS = 0.04
#: Python stacks go to stderr when one step takes longer than this
STEP_STACKS_AFTER = 120.0
#: seconds to wait for the application to have its two executors again
EXECUTORS_TIMEOUT = 90.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _row(rng: random.Random, key: int) -> dict[str, Any]:
    s = None if rng.random() < 0.1 else rng.choice(string.ascii_lowercase[:6])
    return {"id": key, "g": rng.randrange(10), "v": rng.randrange(1000), "s": s}


class Killer:
    """SIGKILLs one executor of the application while a step runs, when armed."""

    def __init__(self, worker_pids: list[int], app_id: str, spark: Any,
                 rng: random.Random) -> None:
        self.worker_pids = worker_pids
        self.app_id = app_id
        self.spark = spark
        self.rng = rng
        self.kills: list[dict[str, Any]] = []
        #: armed kills that did not happen, and why (the summary shows them)
        self.misses: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._ports: dict[int, set[int]] = {}

    def executors(self) -> list[int]:
        return executor_pids(self.worker_pids, self.app_id)

    def wait_executors(self, n: int = 2, timeout: float = EXECUTORS_TIMEOUT) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = len(self.executors())
            if found >= n:
                return found
            time.sleep(0.5)
        return len(self.executors())

    def _listening(self, pid: int) -> set[int]:
        if pid not in self._ports:
            self._ports[pid] = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                                if c.status == psutil.CONN_LISTEN}
        return self._ports[pid]

    def busy_executor(self, pids: list[int]) -> int | None:
        """An executor running a task now (Spark's status tracker names it by its block
        manager's port, which the executor's JVM listens on), if any."""
        infos = self.spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
        busy = {info.port() for info in infos if info.numRunningTasks() > 0}
        if not busy:
            return None
        for pid in pids:
            try:
                if self._listening(pid) & busy:
                    return pid
            except psutil.Error:
                continue
        return None

    def arm(self, label: str, delay: float, step_no: int, attempt: int,
            busy: bool = False) -> None:
        """Kill an executor ``delay`` seconds from now, if the step still runs then;
        with ``busy``, from then on the first one seen running a task."""
        self._done.clear()

        def miss(why: str) -> None:
            self.misses.append({"label": label, "step": step_no, "attempt": attempt,
                                "delay": round(delay, 2), "why": why[:300]})
            log(f"kill '{label}' not done: {why}")

        def busy_pid(pids: list[int]) -> int | None:
            """An executor seen running a task in two looks BUSY_CONFIRM_SECONDS apart
            (a task Spark still launches, or one about to end, would not fail its job)."""
            while not self._done.wait(0.02):
                pid = self.busy_executor(pids)
                if pid is not None and not self._done.wait(BUSY_CONFIRM_SECONDS) \
                        and self.busy_executor([pid]) == pid:
                    return pid
            return None

        def run() -> None:
            try:
                if self._done.wait(delay):
                    miss(f"the step ended within {delay:.2f} s")
                    return
                pids = self.executors()
                if not pids:
                    miss(f"no executor of {self.app_id} to kill")
                    return
                pid = busy_pid(pids) if busy else self.rng.choice(pids)
                if pid is None:
                    miss(f"no executor ran a task after {delay:.2f} s before the step "
                         f"ended")
                    return
                psutil.Process(pid).send_signal(signal.SIGKILL)
            except Exception as exc:  # noqa: BLE001 - the summary shows it
                miss(f"{type(exc).__name__}: {exc}")
                return
            during = not self._done.is_set()
            self.kills.append({"label": label, "pid": pid, "step": step_no, "attempt": attempt,
                               "delay": round(delay, 2), "busy": busy, "during_step": during,
                               "executors_before": len(pids)})
            log(f"KILL '{label}' executor pid {pid}{' (running a task)' if busy else ''} "
                f"after {delay:.2f} s (step {step_no} attempt {attempt}; during step: {during})")

        self._thread = threading.Thread(target=run, name="executor-killer", daemon=True)
        self._thread.start()

    def disarm(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None


def spark_events(event_dir: str, app_id: str) -> dict[str, Any]:
    """What Spark's event log says it did about the lost executors: tasks that failed
    (by reason), stage attempts after the first, jobs that failed."""
    counts: dict[str, Any] = {"task_failures": {}, "stage_retries": 0, "failed_jobs": 0,
                              "executors_removed": 0}
    path = os.path.join(event_dir, app_id)
    if not os.path.exists(path):
        path += ".inprogress"
    try:
        with open(path) as f:
            for line in f:
                ev = json.loads(line)
                kind = ev.get("Event")
                if kind == "SparkListenerTaskEnd":
                    reason = ev.get("Task End Reason", {}).get("Reason", "?")
                    if reason != "Success":
                        tf = counts["task_failures"]
                        tf[reason] = tf.get(reason, 0) + 1
                elif kind == "SparkListenerStageSubmitted":
                    if ev.get("Stage Info", {}).get("Stage Attempt ID", 0) > 0:
                        counts["stage_retries"] += 1
                elif kind == "SparkListenerJobEnd":
                    if ev.get("Job Result", {}).get("Result") != "JobSucceeded":
                        counts["failed_jobs"] += 1
                elif kind == "SparkListenerExecutorRemoved":
                    counts["executors_removed"] += 1
    except (OSError, ValueError) as exc:
        counts["error"] = f"{type(exc).__name__}: {exc}"
    return counts


class Run:
    """The workload, its model, and the phases (one Spark application each)."""

    def __init__(self, master: str, warehouse: str, worker_pids: list[int],
                 event_dir: str, rng: random.Random) -> None:
        self.master = master
        self.warehouse = warehouse
        self.worker_pids = worker_pids
        self.event_dir = event_dir
        self.rng = rng
        self.model = TableModel(COLUMNS)
        self.mvs: dict[str, tuple[str, str]] = {}
        self.last_seconds = 3.0
        self.summary: dict[str, Any] = {"phases": [], "kills": [], "misses": [], "raised": [],
                                        "steps": 0, "final_epoch": None, "exact": {},
                                        "verify": {}, "warnings": [], "errors": []}
        self.eng: Any = None
        self.spark: Any = None
        self.killer: Killer | None = None
        self.phase = ""
        self.busy_kills = False

    # --- one Spark application ------------------------------------------------------------

    def open(self, phase: str, task_max_failures: int | None, busy_kills: bool) -> None:
        """A Spark application of the cluster and the engine on it; ``busy_kills``:
        kill an executor while it runs a task (else one at a random moment)."""
        from sparkfill import Engine
        from sparkfill.session import build_spark_session

        extra = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.executor.memory": "512m",
            "spark.default.parallelism": "2",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": "file://" + self.event_dir,
            # one plain JSON file per application (Spark 4 rolls and compresses)
            "spark.eventLog.rolling.enabled": "false",
            "spark.eventLog.compress": "false",
        }
        if os.environ.get("JAVA_TOOL_OPTIONS"):
            extra["spark.executor.extraJavaOptions"] = os.environ["JAVA_TOOL_OPTIONS"]
        if task_max_failures:
            extra["spark.task.maxFailures"] = str(task_max_failures)
        self.phase = phase
        self.busy_kills = busy_kills
        self.spark = build_spark_session(master=self.master, shuffle_partitions=2,
                                         driver_memory="1g",
                                         app_name=f"sparkfill-cluster-faults-{phase}",
                                         extra_conf=extra)
        app_id = self.spark.sparkContext.applicationId
        self.summary["phases"].append({"phase": phase, "app_id": app_id,
                                       "task_max_failures": task_max_failures or "default"})
        self.eng = Engine(self.warehouse, spark=self.spark)
        self.killer = Killer(self.worker_pids, app_id, self.spark, self.rng)
        log(f"READY {phase}: app {app_id}, task.maxFailures "
            f"{task_max_failures or 'default'}, {self.killer.wait_executors()} executors, "
            f"committed epoch {self.eng.committed_epoch}")

    def close(self) -> None:
        if self.killer is not None:
            self.killer.disarm()
            self.summary["kills"] += [{"phase": self.phase, **k} for k in self.killer.kills]
            self.summary["misses"] += [{"phase": self.phase, **k}
                                       for k in self.killer.misses]
            self.killer.kills, self.killer.misses = [], []
        try:
            if self.eng is not None:
                self.eng.close()
        finally:
            self.eng = None
            if self.spark is not None:
                app_id = self.spark.sparkContext.applicationId
                self.spark.stop()
                self.spark = None
                self.summary["phases"][-1]["spark"] = spark_events(self.event_dir, app_id)

    # --- epochs ---------------------------------------------------------------------------

    def step(self, no: int, kill: str | None) -> Any:
        """One epoch, redone after a raise; the report of the step that returned."""
        from sparkfill import SparkfillError

        eng, killer = self.eng, self.killer
        assert killer is not None
        before = eng.committed_epoch
        for attempt in range(1, MAX_TRIES + 1):
            if kill is not None and attempt == 1:
                # somewhere in the middle of a step as long as the last one
                killer.arm(kill, self.rng.uniform(0.1, 0.6) * self.last_seconds, no, attempt,
                           busy=self.busy_kills)
            faulthandler.dump_traceback_later(STEP_STACKS_AFTER, repeat=True, file=sys.stderr)
            t0 = time.monotonic()
            try:
                rep = eng.step()
            except SparkfillError as exc:
                took = time.monotonic() - t0
                now = eng.committed_epoch
                # the Spark error under the engine's (its message names the call only)
                cause = str(exc.__cause__ or "")
                lines = [ln.strip() for ln in cause.splitlines()]
                why = next((ln for ln in lines if "Job aborted" in ln),
                           next((ln for ln in lines if "Exception:" in ln), ""))
                self.summary["raised"].append({
                    "phase": self.phase, "step": no, "attempt": attempt,
                    "error": f"{type(exc).__name__}: {exc}"[:600], "cause": why[:600],
                    "seconds": round(took, 1), "epoch_moved": now != before})
                log(f"STEP {no} attempt {attempt} RAISED after {took:.1f} s "
                    f"({type(exc).__name__}: {str(exc)[:400]}); committed {before} -> {now}"
                    f"\n  cause: {why[:400]}")
                if now != before:
                    raise AssertionError(f"step() raised but the committed epoch moved "
                                         f"from {before} to {now}") from exc
                log(f"  executors now: {killer.wait_executors()}")
                continue
            finally:
                faulthandler.cancel_dump_traceback_later()
                killer.disarm()
            took = time.monotonic() - t0
            self.last_seconds = took
            self.summary["steps"] += 1
            assert rep.epoch == before + 1 == eng.committed_epoch, \
                (rep.epoch, before, eng.committed_epoch)
            self.model.step()
            if rep.warnings:
                self.summary["warnings"] += [f"epoch {rep.epoch}: {w}"[:400]
                                             for w in rep.warnings]
            states = {n: eng.progress(n).state for n in self.mvs}
            log(f"STEP {no} epoch {rep.epoch} in {took:.1f} s (attempt {attempt}, "
                f"{rep.spark_jobs} jobs) {states}")
            return rep
        raise AssertionError(f"step {no}: epoch {before + 1} still failing after "
                             f"{MAX_TRIES} attempts")

    def all_created(self) -> bool:
        return all(self.eng.progress(n).state == "created" for n in self.mvs)

    def create_mv(self, name: str) -> None:
        options, sql = MVS[name]
        self.eng.sql(f"CREATE MATERIALIZED VIEW {name} WITH ({options}) AS "
                     + sql.replace("{src}", TABLE))
        self.mvs[name] = MVS[name]

    def random_dml(self) -> None:
        eng, model, rng = self.eng, self.model, self.rng
        r = rng.random()
        if r < 0.25:
            g, d = rng.randrange(10), rng.randrange(1, 50)
            eng.sql(f"UPDATE {TABLE} SET v = v + {d} WHERE g = {g}")
            model.sql_update(lambda row, g=g: row["g"] == g,
                             lambda row, d=d: {"v": row["v"] + d})
        elif r < 0.4:
            g, lim = rng.randrange(10), rng.randrange(700, 1000)
            eng.sql(f"DELETE FROM {TABLE} WHERE g = {g} AND v > {lim}")
            model.sql_delete(lambda row, g=g, lim=lim: row["g"] == g and row["v"] > lim)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.65:
                keys = list(dict.fromkeys(rng.randrange(KEY_SPACE) for _ in range(40)))
                rows = [_row(rng, k) for k in keys]
                eng.insert(TABLE, rows)
                model.insert(rows)
            else:
                keys = [{"id": k} for k in dict.fromkeys(rng.randrange(KEY_SPACE)
                                                        for _ in range(25))]
                eng.delete(TABLE, keys)
                model.delete(keys)

    def epochs_with_kills(self, first_no: int, until_raised: bool = False) -> int:
        """Epochs with random DML; an executor killed during one while an MV backfills
        and during one after all are created (with ``until_raised``, steady-state kills
        until one made a step raise: a kill between two tasks costs Spark nothing);
        returns the next step number."""
        assert self.killer is not None
        landed: dict[str, bool] = {}
        no = first_no
        steps = MAX_STEPS_UNTIL_RAISED if until_raised else MAX_STEPS
        for no in range(first_no, first_no + steps):
            self.random_dml()
            backfilling = not self.all_created()
            kill = None
            if "backfill" not in landed and backfilling:
                kill = "backfill"
            elif not backfilling and "steady" not in landed:
                kill = "steady"
            # a kill only when both executors are up (the last one was replaced)
            if kill is not None and self.killer.wait_executors() < 2:
                log("fewer than 2 executors: no kill this step")
                kill = None
            n_kills, n_raised = len(self.killer.kills), len(self.summary["raised"])
            self.step(no, kill)
            if kill is not None and len(self.killer.kills) > n_kills \
                    and self.killer.kills[-1]["during_step"]:
                raised = len(self.summary["raised"]) > n_raised
                if kill == "backfill" or raised or not until_raised:
                    landed[kill] = True
            if "backfill" not in landed and self.all_created():
                landed["backfill"] = False  # the backfill ended before a kill landed in it
            if landed.get("steady"):
                break
        self.summary["phases"][-1]["landed"] = landed
        return no + 1

    # --- the oracle -----------------------------------------------------------------------

    def check(self) -> None:
        eng = self.eng
        epoch = eng.committed_epoch
        self.summary["final_epoch"] = epoch
        table = eng.read(TABLE)
        for name, (_, sql) in self.mvs.items():
            state = eng.progress(name).state
            if state != "created":
                self.summary["exact"][name] = False
                self.summary["errors"].append(f"{name} not created at the end: {state}")
                continue
            try:
                assert_same_rows(eng.read(name), eng.spark.sql(sql, src=table),
                                 label=f"MV {name} vs batch at epoch {epoch}")
                self.summary["exact"][name] = True
            except AssertionError as exc:
                self.summary["exact"][name] = False
                self.summary["errors"].append(str(exc)[:2000])
            self.summary["verify"][name] = eng.verify(name).count()
        try:
            assert_rows_equal(table, self.model.rows(), label=f"table {TABLE} vs model")
            self.summary["exact"][TABLE] = True
        except AssertionError as exc:
            self.summary["exact"][TABLE] = False
            self.summary["errors"].append(str(exc)[:2000])


def main(argv: list[str]) -> int:
    master, warehouse, seed = argv[1], argv[2], int(argv[3])
    worker_pids = [int(p) for p in argv[4].split(",") if p]
    event_dir = os.path.join(os.path.dirname(os.path.abspath(warehouse)), "spark-events")
    os.makedirs(event_dir, exist_ok=True)
    rng = random.Random(seed)
    started = time.monotonic()
    run = Run(master, warehouse, worker_pids, event_dir, rng)
    try:
        # phase 1: Spark's defaults (a task is tried 4 times): Spark retries the
        # killed executor's tasks, resubmits stages whose shuffle output it held
        run.open("spark-retries", None, busy_kills=False)
        run.eng.sql(f"CREATE TABLE {TABLE} (id BIGINT, g INT, v BIGINT, s STRING, "
                    f"PRIMARY KEY (id))")
        keys = rng.sample(range(KEY_SPACE), INITIAL_ROWS)
        for j in range(0, INITIAL_ROWS, 1000):
            rows = [_row(rng, k) for k in keys[j:j + 1000]]
            run.eng.insert(TABLE, rows)
            run.model.insert(rows)
        run.step(0, None)
        for name in ("m", "f", "sn"):
            run.create_mv(name)
        no = run.epochs_with_kills(1)
        run.random_dml()  # staged, not yet stepped: the next application's first epoch
        run.close()
        # phase 2: a task is tried once: the killed executor's tasks fail their job
        # and step() raises; the driver redoes the epoch
        run.open("step-raises", 1, busy_kills=True)
        run.create_mv("m2")
        no = run.epochs_with_kills(no, until_raised=True)
        run.random_dml()
        run.step(no, None)
        run.check()
    except Exception as exc:  # reported in the summary; the test fails on it
        run.summary["errors"].append("".join(traceback.format_exception(exc))[-4000:])
    finally:
        try:
            run.close()
        finally:
            run.summary["seconds"] = round(time.monotonic() - started, 1)
            print("SUMMARY " + json.dumps(run.summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
