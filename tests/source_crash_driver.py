"""A pipeline of the three sources, an MV and a Delta sink, for the source crash test.

Run as a script (``python source_crash_driver.py WAREHOUSE LANDING EXT EPOCHS
[KILL_AT]``) it opens ``Engine(WAREHOUSE)`` (Spark master from
``$SPARKFILL_MASTER``), creates the pipeline if it is not there (every
statement ``IF NOT EXISTS``), prints ``READY``, then steps until the committed
epoch reaches ``EPOCHS``, printing ``STEP epoch`` after each, and ``DONE``.

``KILL_AT = point:epoch`` makes the process SIGKILL its own process group (the
JVM with it) at one point of that epoch:

* ``staged``: the sources' input is staged, the epoch has not begun;
* ``appended``: every relation's append landed, the epoch is not committed;
* ``sink``: the epoch is committed and the sink's files are written, the
  sink's Delta commit is not.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

CDC_FILES = 6
CDF_VERSIONS = 5  # versions 1..5 after the initial version 0
SINK_DIR = "sink"


def _die() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


def cdc_file_lines(i: int) -> list[Any]:
    """File ``i`` (1-based): upserts keys i..i+2 with value i and deletes key i-1, so a
    file applied twice or out of order leaves a different table; file 2 also holds a
    malformed line."""
    lines: list[Any] = [{"op": "c" if i == 1 else "u", "before": None,
                         "after": {"id": k, "v": i * 100 + k}} for k in range(i, i + 3)]
    if i > 1:
        lines.append({"op": "d", "before": {"id": i - 1}, "after": None})
    if i == 2:
        lines.append("{broken")
    return lines


def prepare_inputs(landing: str, ext: str) -> None:
    """The cdc files (arriving one second apart) and the external Delta table's versions."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    os.makedirs(landing, exist_ok=True)
    for i in range(1, CDC_FILES + 1):
        path = os.path.join(landing, f"{i:03d}.json")
        with open(path, "w") as f:
            for line in cdc_file_lines(i):
                f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    write_deltalake(ext, pa.table({"id": [1, 2, 3], "w": [10, 20, 30]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    for v in range(1, CDF_VERSIONS + 1):
        dt = DeltaTable(ext)
        if v % 2:
            dt.update(predicate=f"id = {v % 3 + 1}", updates={"w": f"w + {v}"})
        else:
            write_deltalake(ext, pa.table({"id": [100 + v], "w": [v]}), mode="append")
            DeltaTable(ext).delete(f"id = {100 + v - 2}")


def setup(eng, landing: str, ext: str, warehouse: str) -> None:
    eng.sql("CREATE TABLE IF NOT EXISTS g (id BIGINT, k INT, v BIGINT, PRIMARY KEY (id)) WITH ("
            "connector = 'datagen', rows_per_epoch = 30, seed = 5, insert_ratio = 0.5, "
            "update_ratio = 0.3, delete_ratio = 0.2, key_lifetime = 2, value_range = 50)")
    eng.sql(f"CREATE TABLE IF NOT EXISTS c (id BIGINT, v BIGINT, PRIMARY KEY (id)) WITH ("
            f"connector = 'cdc_files', path = '{landing}', max_files_per_epoch = 1)")
    eng.sql(f"CREATE TABLE IF NOT EXISTS d (id BIGINT, w BIGINT, PRIMARY KEY (id)) WITH ("
            f"connector = 'delta_cdf', path = '{ext}', starting_version = 0, "
            "max_versions_per_epoch = 1)")
    eng.sql("CREATE MATERIALIZED VIEW IF NOT EXISTS gm WITH (backfill = 'no_shuffle', "
            "backfill_chunk_rows = 1000) AS SELECT id, k, v * 2 AS w FROM g WHERE k % 5 <> 0")
    eng.sql(f"CREATE SINK IF NOT EXISTS gs FROM gm WITH (connector = 'delta', "
            f"path = '{os.path.join(os.path.dirname(warehouse), SINK_DIR)}')")


def arm(eng, kill_at: str) -> None:
    point, _, at = kill_at.partition(":")
    epoch = int(at)
    if point == "staged":
        step = eng.coordinator.step

        def staged_then_die():
            if eng.committed_epoch + 1 == epoch:
                _die()
            return step()
        eng.coordinator.step = staged_then_die
    elif point == "appended":
        commit = eng.meta.commit_epoch

        def appended_then_die(c):
            if c.epoch == epoch:
                _die()
            return commit(c)
        eng.meta.commit_epoch = appended_then_die
    elif point == "sink":
        listed = eng.sinks._listed

        def written_then_die(fs, target):
            out = listed(fs, target)  # the sink's files of the epoch, written, not committed
            if eng.committed_epoch == epoch:
                _die()
            return out
        eng.sinks._listed = written_then_die
    else:
        raise ValueError(kill_at)


def main(argv: list[str]) -> int:
    warehouse, landing, ext, epochs = argv[1], argv[2], argv[3], int(argv[4])
    from sparkfill import Engine

    eng = Engine(warehouse)
    setup(eng, landing, ext, warehouse)
    if len(argv) > 5:
        arm(eng, argv[5])
    print("READY", flush=True)
    while eng.committed_epoch < epochs:
        rep = eng.step()
        print(f"STEP {rep.epoch}", flush=True)
    eng.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
