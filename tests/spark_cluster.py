"""A standalone Spark cluster for the tests, started from pyspark's own jars.

``SparkCluster(workdir)`` starts a master and ``workers`` workers (each with one core
and a small memory) on loopback, on free ports, each in a process group of its own,
and waits until the master's JSON page shows them all ALIVE; on exit it stops them
and every executor they launched. The workers' executors run this interpreter
(``PYSPARK_PYTHON``), so they have pyarrow and the venv's packages.

``executor_pids()`` lists the executor JVMs (``CoarseGrainedExecutorBackend``) the
workers of this cluster launched, for fault tests that SIGKILL one; ``log_tail()``
gives the end of the master's, the workers' and the executors' logs for a failure
message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pyspark
from helpers import free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class SparkCluster:
    """A standalone master and its workers; a context manager that stops them."""

    def __init__(self, workdir: Path, workers: int = 2, worker_cores: int = 1,
                 worker_memory: str = "1g", start_timeout: float = 120.0) -> None:
        self.workdir = Path(workdir)
        self.n_workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.start_timeout = start_timeout
        self.spark_home = Path(pyspark.__file__).parent
        self.port = free_port()
        self.webui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.json_url = f"http://127.0.0.1:{self.webui_port}/json/"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.work_dirs: list[Path] = []

    # --- start / stop ---------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "SPARK_HOME": str(self.spark_home),
               "SPARK_LOCAL_IP": "127.0.0.1",
               # the daemons need little; their JVMs default to 1 GiB each
               "SPARK_DAEMON_MEMORY": "256m",
               # no REST submission server (it would take the fixed port 6066)
               "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
               "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        for var in ("SPARK_REMOTE", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR",
                    "SPARK_WORKER_INSTANCES"):
            env.pop(var, None)
        return env

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}.log"
        self.logs.append(log)
        cmd = [str(self.spark_home / "bin" / "spark-class"), *args]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def __enter__(self) -> SparkCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
                                   "--webui-port", str(self.webui_port)])
            for i in range(self.n_workers):
                work = self.workdir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self.work_dirs.append(work)
                self._start(f"worker-{i}", [
                    WORKER_CLASS, "--host", "127.0.0.1", "--port", str(free_port()),
                    "--webui-port", str(free_port()), "--cores", str(self.worker_cores),
                    "--memory", self.worker_memory, "--work-dir", str(work), self.url])
            self._wait_alive(self.n_workers)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_alive(self, n: int) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            for proc, log in zip(self.procs, self.logs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"{log.stem} exited with {proc.returncode}:\n"
                                       f"{self.log_tail()}")
            try:
                alive = self.alive_workers()
                last = f"{alive} ALIVE workers"
                if alive >= n:
                    return
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not show {n} ALIVE workers within "
                           f"{self.start_timeout:.0f} s ({last}):\n{self.log_tail()}")

    def status(self) -> dict:
        """The master's JSON status page."""
        with urllib.request.urlopen(self.json_url, timeout=5) as resp:
            return json.loads(resp.read().decode())

    def alive_workers(self) -> int:
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def __exit__(self, *exc: object) -> None:
        executors = self.executor_pids()
        # workers first (they stop their executors), the master last
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=20)
        # an executor a worker launched lives in the worker's process group; one that
        # outlived its worker is stopped by its id
        for pid in executors:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass

    # --- faults ---------------------------------------------------------------------------

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.procs[1:]]

    def executor_pids(self, app_id: str | None = None) -> list[int]:
        """Executor JVMs launched by this cluster's workers (of ``app_id`` if given)."""
        return executor_pids(self.worker_pids(), app_id)

    # --- diagnostics ----------------------------------------------------------------------

    def log_tail(self, lines: int = 25) -> str:
        parts = [f"--- {log.name} ---\n{_tail(log, lines)}" for log in self.logs]
        for work in self.work_dirs:
            for stderr in sorted(work.glob("*/*/stderr")):
                parts.append(f"--- {stderr.relative_to(self.workdir)} ---\n"
                             f"{_tail(stderr, lines)}")
        return "\n".join(parts)


def executor_pids(worker_pids: list[int], app_id: str | None = None) -> list[int]:
    """The ``CoarseGrainedExecutorBackend`` JVMs whose parent chain holds one of
    ``worker_pids`` (the workers' ``spark-class`` processes or their JVMs), of
    ``app_id`` when given."""
    roots = set(worker_pids)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if EXECUTOR_CLASS not in cmd:
                continue
            if app_id is not None and app_id not in cmd:
                continue
            if any(parent.pid in roots for parent in proc.parents()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return sorted(found)
