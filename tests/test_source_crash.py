"""Sources and sinks across SIGKILL: every source's input is applied exactly
once and the sink is written exactly once per epoch, whatever point an epoch
was killed at.

The driver (tests/source_crash_driver.py) runs datagen, cdc_files and delta_cdf
tables, an MV and a Delta sink, and kills itself (its whole process group: the
JVM too) after the sources staged an epoch's input, after an epoch's appends
landed but before it committed, and after the sink's files were written but
before its Delta commit; the test finishes the pipeline in its own process.
Then, at every epoch, each source table equals a replay of its input up to that
epoch (datagen batches 1..e; cdc files 1..e; the external table at version
e-1) — a lost or doubled batch shifts every later epoch; the dead-letter row
was written once, by epoch 2; every version of the sink equals the MV at the
epoch it records, and every committed epoch has one; the MV equals its batch
query.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import source_crash_driver as drv
from deltalake import DeltaTable
from helpers import assert_rows_equal, subprocess_env

from sparkfill.sinks import APP_PREFIX
from sparkfill.sources.base import BatchContext, TableShape
from sparkfill.sources.datagen import DatagenConnector

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "source_crash_driver.py")
EPOCHS = 5


def _run(args: list[str], log) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, DRIVER, *args], stdout=subprocess.PIPE,
                            stderr=log, env=subprocess_env("local[2]"),
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out


def test_sources_and_sink_are_exactly_once_across_sigkill(spark, tmp_path):
    from sparkfill import Engine

    wh = str(tmp_path / "warehouse")
    landing, ext = str(tmp_path / "landing"), str(tmp_path / "ext")
    drv.prepare_inputs(landing, ext)
    latest_version = DeltaTable(ext).version()
    base = [wh, landing, ext, str(EPOCHS)]
    with open(tmp_path / "driver.log", "a") as log:
        for point in ("staged:2", "appended:3", "sink:4"):
            code, out = _run([*base, point], log)
            assert code == -signal.SIGKILL, f"{point}: exit {code}\n{out}"
            epoch = int(point.split(":")[1])
            assert f"STEP {epoch}" not in out, f"{point}: epoch {epoch} returned\n{out}"

    # finish in this process (recovering the warehouse once more)
    with Engine(wh, spark=spark) as eng:
        while eng.committed_epoch < EPOCHS:
            eng.step()
        g = eng.relation("g")
        src = {eng.catalog.get_by_id(s.rel_id).name: s for s in eng.sources.sources()}
        assert src["g"].position == {"batch": EPOCHS}
        assert src["d"].position == {"version": min(EPOCHS - 1, latest_version)}
        assert eng.meta.source_files(eng.relation("c").id) == {
            f"{i:03d}.json" for i in range(1, min(EPOCHS, drv.CDC_FILES) + 1)}

        gen = DatagenConnector(spark, TableShape("g", g.columns, g.key), src["g"].options)
        g_model: dict = {}
        c_model: dict = {}
        for e in range(1, EPOCHS + 1):
            batch = sorted(gen.read(BatchContext(e, e, None)).rows.collect(),
                           key=lambda r: r["_sf_idx"])
            for r in batch:
                if r["_sf_kind"] == "D":
                    g_model.pop(r["id"], None)
                else:
                    g_model[r["id"]] = (r["id"], r["k"], r["v"])
            assert_rows_equal(eng.read("g", as_of=e), g_model.values(), label=f"g at epoch {e}")
            if e <= drv.CDC_FILES:
                for line in drv.cdc_file_lines(e):
                    if isinstance(line, str):
                        continue
                    if line["op"] == "d":
                        c_model.pop(line["before"]["id"], None)
                    else:
                        c_model[line["after"]["id"]] = (line["after"]["id"], line["after"]["v"])
            assert_rows_equal(eng.read("c", as_of=e), c_model.values(), label=f"c at epoch {e}")
            ext_rows = DeltaTable(ext, version=min(e - 1, latest_version)).to_pyarrow_table()
            assert_rows_equal(eng.read("d", as_of=e),
                              [(r["id"], r["w"]) for r in ext_rows.to_pylist()],
                              label=f"d at epoch {e}")
        assert eng.verify("gm").count() == 0
        dead = [(r.file, r.line, r.reason, r.epoch)
                for r in eng.read("c__dead_letter").collect()]
        assert dead == [("002.json", 5, "bad JSON: not a JSON object", 2)]

        sink = eng.sinks.find("gs")
        path = sink.path
        app = f"{APP_PREFIX}{sink.id}"
        assert DeltaTable(path).transaction_version(app) == EPOCHS
        seen = set()
        for version in range(DeltaTable(path).version() + 1):
            dt = DeltaTable(path, version=version)
            at = dt.transaction_version(app)
            rows = [(r["id"], r["k"], r["w"]) for r in dt.to_pyarrow_table().to_pylist()]
            if at is None:
                assert rows == []
                continue
            seen.add(at)
            assert_rows_equal(eng.read("gm", as_of=at), rows,
                              label=f"sink version {version} vs gm at epoch {at}")
        ready = eng.relation("gm").ready_epoch
        assert seen == set(range(ready, EPOCHS + 1)), "a committed epoch has no sink version"
        # nothing a killed sync wrote is left behind
        referenced = {p.split("/")[0] for v in range(DeltaTable(path).version() + 1)
                      for p in DeltaTable(path, version=v).get_add_actions(flatten=True)
                      .column("path").to_pylist()}
        written = {d for d in os.listdir(path) if d.startswith("e")}
        assert written == referenced, written ^ referenced
