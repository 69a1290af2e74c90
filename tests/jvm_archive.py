"""A class-data-sharing archive of the classes a test's JVM loads, so that each JVM the
tests start maps Spark's classes from one file instead of reading, parsing and verifying
them again.

The suite starts many JVMs besides its workers' sessions: a crash driver, the CLI, a
Spark Connect server, a cluster's processes. Each spends most of its first seconds
loading classes: a local session and its first job took 15.4 CPU-seconds from a cold
start, 8.4 with this archive (bench/RESULTS.md, stop 72).

The archive is Java's dynamic archive (``-XX:ArchiveClassesAtExit``, Java 13 and
later), written once by a short engine run (``python tests/jvm_archive.py OUT``) and
named by what it depends on: the ``java`` binary's version and the jars on Spark's class
path (their names, sizes and modification times). A JVM whose class path or ``java``
differs from the archive's ignores it and loads its classes as before (its warning is
silenced): the archive can make a JVM faster, never wrong.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: silences the warning a JVM prints (on its standard output, which Spark's launcher
#: parses) when it cannot use the archive
QUIET = "-Xlog:cds*=off"


def _key(java: str) -> str:
    """A digest of the ``java`` binary's version and of pyspark's jars."""
    import pyspark

    digest = hashlib.sha256()
    version = subprocess.run([java, "-version"], capture_output=True, text=True,
                             check=True).stderr
    digest.update(version.encode())
    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()
        digest.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_options(options: str) -> str:
    """The JVM options that use the tests' archive, written first if there is none
    (one engine run with ``options``, about 40 s); empty when there is no Java to
    write it with or its writing fails (the JVMs then start as they would without
    it)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        return ""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    try:
        key = _key(java)
    except (subprocess.SubprocessError, OSError):
        return ""
    path = cache / "sparkfill-tests" / f"spark-classes-{key}.jsa"
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, partial = tempfile.mkstemp(suffix=".jsa", dir=path.parent)
            os.close(fd)
            os.unlink(partial)
            # Spark's launcher JVM writes there too as it exits; the session's JVM,
            # which exits after it, writes the archive kept
            env = {**os.environ,
                   "JDK_JAVA_OPTIONS": f"{options} {QUIET} -XX:ArchiveClassesAtExit={partial}"}
            try:
                subprocess.run([sys.executable, __file__], env=env, check=True, timeout=600,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                os.replace(partial, path)  # one writer wins; no reader sees half a file
            finally:
                Path(partial).unlink(missing_ok=True)
        except (subprocess.SubprocessError, OSError) as err:
            print(f"jvm_archive: no archive written to {path} ({err}); the tests' JVMs "
                  "load their classes as without it", file=sys.stderr)
            return ""
        for stale in path.parent.glob("spark-classes-*.jsa"):  # of other jars or Javas
            if stale != path:
                stale.unlink(missing_ok=True)
    return f"{QUIET} -XX:SharedArchiveFile={path}"


def _workload() -> None:
    """An engine run that loads the classes the tests' sessions use: Parquet reads and
    writes, joins, aggregates, windows, Arrow both ways, the tests' session settings."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from session_conf import TEST_SPARK_CONF

    from sparkfill import Engine
    from sparkfill.session import build_spark_session

    spark = build_spark_session(master="local[2]", shuffle_partitions=2,
                                extra_conf=TEST_SPARK_CONF)
    with tempfile.TemporaryDirectory() as warehouse:
        eng = Engine(warehouse, spark=spark)
        eng.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, g INT, v INT, s STRING)")
        eng.sql("CREATE TABLE d (g INT PRIMARY KEY, name STRING)")
        eng.insert("t", [{"id": i, "g": i % 5, "v": i, "s": f"s{i}"} for i in range(200)])
        eng.insert("d", [{"g": g, "name": f"n{g}"} for g in range(5)])
        eng.step()
        for name, sql in {
            "agg": "SELECT g, count(*) AS c, sum(v) AS sv, max(v) AS mx FROM t GROUP BY g",
            "joined": "SELECT t.id, t.v, d.name FROM t JOIN d ON t.g = d.g WHERE t.v % 2 = 0",
            "ranked": "SELECT id, g, v, row_number() OVER (PARTITION BY g ORDER BY v DESC)"
                      " AS r FROM t",
            "outer": "SELECT d.name, count(t.id) AS n FROM d LEFT JOIN t ON t.g = d.g "
                     "GROUP BY d.name",
        }.items():
            eng.sql(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        for epoch in range(4):
            eng.insert("t", [{"id": 1000 + 10 * epoch + i, "g": i % 6, "v": i, "s": "x"}
                             for i in range(10)])
            eng.sql(f"UPDATE t SET v = v + 1 WHERE id % 7 = {epoch}")
            eng.sql(f"DELETE FROM t WHERE id % 11 = {epoch}")
            eng.step()
        for name in ("agg", "joined", "ranked", "outer"):
            eng.read(name).toArrow()
            eng.verify(name).count()
        eng.close()
    from pyspark import SparkContext

    jvm = SparkContext._gateway.proc  # type: ignore[attr-defined]
    spark.stop()
    # the JVM exits when its standard input closes, writing the archive as it goes:
    # wait for it, or the archive is taken before it is written
    jvm.stdin.close()
    jvm.wait(timeout=300)


if __name__ == "__main__":
    _workload()
