"""The Spark settings of the tests' own sessions (the shared local session and the
Spark Connect servers the fixtures start), on top of sparkfill's ``SESSION_CONF``.

A test's relations hold tens to hundreds of rows, and its plans change from epoch to
epoch: compiling each plan's generated Java (whole-stage code generation and each
expression's generated class) costs more CPU than evaluating those rows with Spark's
interpreted expressions. Measured on three test files with three workers, paired in
one sitting: 561 s and 1,101 CPU-seconds with code generation, 496 s and 971 without
(bench/RESULTS.md, stop 49). For the same reason they read Parquet row by row: over
files of a few rows the vectorized reader's column batches cost more than they save
(three tests' steps 0.83-0.96x, stop 80). Results are the same either way (Spark
keeps both paths equal); the engine's own sessions keep both, except in a small
epoch (``pipelines/codegen.py``).
"""

from __future__ import annotations

TEST_SPARK_CONF: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.parquet.enableVectorizedReader": "false",
}
