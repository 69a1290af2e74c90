"""A Spark Connect server for the tests, started from pyspark's own jars.

``make test`` runs a representative subset of the suite a second time with
``SPARKFILL_TEST_CONNECT=1``: the session fixture then starts one server (a
``local[2]`` Spark with sparkfill's settings) and hands the tests a Spark Connect
client of it, so the same tests check that the engine runs unchanged there.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
from helpers import free_port

from sparkfill.session import SESSION_CONF, driver_conf

#: set to 1 to run the session fixture against a Spark Connect server
CONNECT_ENV = "SPARKFILL_TEST_CONNECT"

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class ConnectServer:
    """A Spark Connect server process on a free loopback port; a context manager
    that stops it (and its JVM) on exit."""

    def __init__(self, workdir: Path, shuffle_partitions: int = 2,
                 start_timeout: float = 180.0,
                 extra_conf: dict[str, str] | None = None) -> None:
        """``extra_conf``: Spark settings on top of sparkfill's (the tests pass
        ``session_conf.TEST_SPARK_CONF``; a benchmark passes none)."""
        self.workdir = workdir
        self.extra_conf = dict(extra_conf or {})
        self.port = free_port()
        self.url = f"sc://localhost:{self.port}"
        self.shuffle_partitions = shuffle_partitions
        self.start_timeout = start_timeout
        self.log = workdir / "connect-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    #: starts tried: the port chosen free may be taken by another process (another
    #: test worker's server or driver) before the server binds it
    BIND_ATTEMPTS = 3

    def __enter__(self) -> ConnectServer:
        for attempt in range(self.BIND_ATTEMPTS):
            if attempt:
                self.port = free_port()
                self.url = f"sc://localhost:{self.port}"
            if self._start():
                return self
        raise RuntimeError(f"the Spark Connect server found no free port in "
                           f"{self.BIND_ATTEMPTS} attempts:\n{self._log_tail()}")

    def _start(self) -> bool:
        """Start the server on ``self.port``: True once it listens, False when the
        port was taken before it bound it; any other failure raises."""
        spark_home = Path(pyspark.__file__).parent
        conf = {
            **SESSION_CONF,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.default.parallelism": "2",
            "spark.driver.memory": "2g",
            **driver_conf(),  # the server's JVM as a local session's driver
            **self.extra_conf,
        }
        cmd = [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS,
               "--name", "sparkfill-tests-connect", "--master", "local[2]"]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd.append("spark-internal")
        # the server's Python workers run this interpreter (pyarrow, sparkfill)
        env = {**os.environ, "SPARK_HOME": str(spark_home),
               "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        env.pop("SPARK_REMOTE", None)
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "java.net.BindException" in self._log_tail(lines=200):
                    return False
                raise RuntimeError(f"the Spark Connect server exited with {self.proc.returncode}:"
                                   f"\n{self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the Spark Connect server did not listen on {self.port} within "
                           f"{self.start_timeout:.0f} s:\n{self._log_tail()}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
