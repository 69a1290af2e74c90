"""Building the SparkSession sparkfill runs on.

Invariant: every session sparkfill creates is configured the same way —
UTC session time zone, Parquet timestamps as microseconds, small shuffle
partition counts, UI off, quiet logs — so that results do not depend on
where the engine runs. A caller's own session is used as given.

With ``remote`` (or ``$SPARK_REMOTE``, pyspark's own variable) the session is a
Spark Connect client of that server: the server owns its static settings (UI,
memory, retention); the client sets the runtime SQL ones (``RUNTIME_CONF``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["build_spark_session", "default_parallelism_of", "quiet_python_loggers",
           "driver_conf", "SESSION_CONF", "RUNTIME_CONF", "LOGS_ENV", "REMOTE_ENV"]

#: Settings applied to every session sparkfill builds.
SESSION_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.scheduler.mode": "FAIR",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # an epoch's plans reuse cached Δs many times; their full text is never needed
    "spark.sql.maxPlanStringLength": "65536",
    # an epoch runs many small queries: adaptive execution would submit each of
    # their stages as a job of its own (about 3x the jobs, 2x the epoch time)
    "spark.sql.adaptive.enabled": "false",
    # the status store keeps every finished query's plan graph and metrics even
    # with the UI off; an engine runs thousands of queries with large plans, so
    # the defaults (1000 executions, 1000 jobs) fill a 2 GiB driver heap
    "spark.sql.ui.retainedExecutions": "50",
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "200",
    "spark.ui.retainedTasks": "5000",
    "spark.ui.dagGraph.retainedRootRDDs": "200",
    # an epoch's queries compile about 160 generated classes, the same ones every
    # epoch; Spark's cache of compiled classes holds 100 by default, so each epoch
    # evicted the last one's and compiled them all again (~0.5 s of an epoch)
    "spark.sql.codegen.cache.maxEntries": "1000",
    # the keys and vnodes an epoch looks up change every epoch: as a hash set the
    # generated code refers to, not as constants (a short IN list) or a switch over
    # them (an IN list of ints) compiled into it, the code stays the same and is
    # compiled once
    "spark.sql.optimizer.inSetConversionThreshold": "1",
    "spark.sql.optimizer.inSetSwitchThreshold": "0",
    # pyspark records each Column call's Python call site for error messages: on a
    # classic session four Py4J round trips per call (a plan of the epoch makes
    # thousands), on Spark Connect a walk of the Python stack. Off, building
    # DataFrames costs 0.3x the round trips and 0.55x the time (bench/RESULTS.md,
    # stop 40). A static setting (a Connect server's, set when it starts); pyspark
    # reads it once per process, at the first Column call
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # a read names its files one by one; from 32 of them Spark lists them in a Spark
    # job of its own (about 1 s: a 16M-row relation is 256 files), where the driver
    # takes milliseconds to stat them in the warehouse's folder
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}

#: The settings of ``SESSION_CONF`` a Spark Connect client may set on its session
#: (runtime SQL settings; the others are the server's, fixed when it starts).
RUNTIME_CONF: tuple[str, ...] = (
    "spark.sql.session.timeZone",
    "spark.sql.parquet.outputTimestampType",
    "spark.sql.sources.partitionOverwriteMode",
    "spark.sql.parquet.compression.codec",
    "spark.sql.execution.arrow.pyspark.enabled",
    "spark.sql.maxPlanStringLength",
    "spark.sql.adaptive.enabled",
    "spark.sql.optimizer.inSetConversionThreshold",
    "spark.sql.optimizer.inSetSwitchThreshold",
    "spark.sql.sources.parallelPartitionDiscovery.threshold",
)

#: pyspark's variable naming a Spark Connect server (``sc://host:port``)
REMOTE_ENV = "SPARK_REMOTE"


def build_spark_session(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    driver_memory: str = "2g",
    app_name: str = "sparkfill",
    extra_conf: dict[str, Any] | None = None,
    remote: str | None = None,
) -> SparkSession:
    """Return a SparkSession configured for sparkfill: a Spark Connect session of
    ``remote`` (default ``$SPARK_REMOTE``) when one is named, else a local one.

    ``master`` defaults to ``$SPARKFILL_MASTER`` or ``local[*]``;
    ``shuffle_partitions`` to twice the local core count (at least 2).
    """
    master = master or os.environ.get("SPARKFILL_MASTER", "local[*]")
    cores = os.cpu_count() or 2
    partitions = shuffle_partitions or max(2, 2 * cores)
    remote = remote or os.environ.get(REMOTE_ENV)
    if remote:
        quiet_python_loggers()
        session = SparkSession.builder.remote(remote).getOrCreate()
        runtime = {k: SESSION_CONF[k] for k in RUNTIME_CONF}
        runtime["spark.sql.shuffle.partitions"] = str(partitions)
        for key, value in {**runtime, **(extra_conf or {})}.items():
            session.conf.set(key, str(value))
        return session
    # Spark's Python workers (an object-store warehouse's reads and writes) run the
    # driver's interpreter, with its packages, unless the user named another
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(max(1, cores)))
    )
    for key, value in {**SESSION_CONF, **driver_conf(), **(extra_conf or {})}.items():
        builder = builder.config(key, str(value))
    quiet_python_loggers()
    return builder.getOrCreate()


#: set to 1 to keep Spark's own log output (the JVM's defaults, pyspark's loggers)
LOGS_ENV = "SPARKFILL_SPARK_LOGS"


#: the driver JVM's garbage collector: an epoch is many short queries planned on the
#: driver (and, locally, run there); the throughput collector leaves both cores to
#: them where G1's concurrent threads compete (measured: steady `agg` epochs 0.8-0.95x
#: in paired runs, bench/RESULTS.md "Stop 31")
DRIVER_GC = "-XX:+UseParallelGC"


def driver_conf() -> dict[str, str]:
    """The driver JVM's options: its collector, and it logs errors only (read at its
    start: no start-up warnings) unless ``$SPARKFILL_SPARK_LOGS`` is 1."""
    options = [DRIVER_GC]
    if os.environ.get(LOGS_ENV) != "1":
        config = Path(__file__).with_name("log4j2-quiet.properties")
        options.append(f"-Dlog4j2.configurationFile=file:{config}")
    return {"spark.driver.extraJavaOptions": " ".join(options)}


def quiet_python_loggers() -> None:
    """pyspark's query-context loggers print every analysis error as a JSON record
    with a Java stack trace, and py4j a traceback when Ctrl-C interrupts a call;
    sparkfill reports those errors itself."""
    if os.environ.get(LOGS_ENV) == "1":
        return
    from pyspark.logger import PySparkLogger

    logging.getLogger("py4j").setLevel(logging.CRITICAL)

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def default_parallelism_of(spark: SparkSession) -> int:
    """Spark's default parallelism as the session's conf sets it (the local core
    count when unset); read through the conf, so a Spark Connect session answers."""
    conf = spark.conf.get("spark.default.parallelism", None)
    return int(conf) if conf else max(1, os.cpu_count() or 1)
