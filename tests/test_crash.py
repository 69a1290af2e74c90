"""Crash recovery: SIGKILL the writer at chosen and random moments, reopen, continue.

The driver (tests/crash_driver.py) journals every DML call after it returns.
After several kills (before the MV exists, mid-backfill, right after a DML
returned, at a random time) the workload is finished in this process and:

* the table equals the journaled DML applied in order (pure Python replay):
  nothing lost, nothing applied twice, nothing from a torn call half-applied;
* the MV equals the batch query over the table, at the final epoch and at
  every retained epoch committed by the final run;
* the table at those epochs equals the replay at the matching journal position.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

import crash_driver as cd
import pytest
from helpers import assert_rows_equal, check_mv, subprocess_env

from sparkfill import EpochNotRetained

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_driver.py")
READY_TIMEOUT = 180.0


class Child:
    def __init__(self, warehouse: str, journal: str, seed: int, log_path: str,
                 driver: str = DRIVER, *more: str):
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, driver, warehouse, journal, str(seed), *more],
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=subprocess_env("local[1]"),
            start_new_session=True,  # its own process group: the JVM dies with it
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").strip())
        self.lines.put(None)

    def wait_for(self, pred, timeout: float) -> str | None:
        """Next stdout line satisfying ``pred``; None if the child exited first."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"child gave no matching line within {timeout}s; seen {self.seen[-5:]}"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                return None
            self.seen.append(line)
            if pred(line):
                return line

    def kill(self) -> bool:
        """SIGKILL the whole process group; True if it was still running."""
        alive = self.proc.poll() is None
        if alive:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.log.close()
        return alive


def _tail(path: str, n: int = 4000) -> str:
    with open(path, "rb") as f:
        return f.read()[-n:].decode(errors="replace")


@pytest.mark.extended
def test_sigkill_during_backfill_loses_nothing(spark, tmp_path):
    from sparkfill import Engine

    seed = 20240611
    rng = random.Random(seed)
    wh = str(tmp_path / "warehouse")
    os.makedirs(wh)
    journal = str(tmp_path / "journal.jsonl")
    log_path = str(tmp_path / "driver.log")

    # (description, predicate on stdout lines that arms the kill, extra delay range)
    plans = [
        ("around MV creation", lambda ln: ln.startswith("STEP 1 "), (0.0, 1.5)),
        (
            "mid-backfill",
            lambda ln: ln.startswith("STEP") and ln.endswith("backfilling"),
            (0.0, 1.0),
        ),
        (
            "right after a DML returned",
            lambda ln: ln.startswith("DML") and int(ln.split()[1]) >= 5,
            (0.0, 0.05),
        ),
        ("random", lambda ln: ln == "READY", (2.0, 9.0)),
    ]
    killed = []
    for desc, pred, (lo, hi) in plans:
        child = Child(wh, journal, seed, log_path)
        ready = child.wait_for(lambda ln: ln == "READY", READY_TIMEOUT)
        assert ready is not None, f"driver died before READY:\n{_tail(log_path)}"
        armed = pred("READY") or child.wait_for(pred, 300) is not None
        if armed:
            time.sleep(rng.uniform(lo, hi))
        before = len(cd.read_journal(journal))
        was_alive = child.kill()
        if was_alive:
            killed.append((desc, child.seen[-1] if child.seen else "", before))
        else:
            # it ran to the end: it must have finished cleanly
            assert child.proc.returncode == 0, f"driver failed:\n{_tail(log_path)}"
            assert "DONE" in child.seen, _tail(log_path)
            break

    assert killed, "no run was killed while working"
    assert any(d == "mid-backfill" for d, _, _ in killed) or any(
        "backfilling" in s for _, s, _ in killed
    ), f"no kill landed during the backfill: {killed}"

    # finish in this process (recovering the warehouse once more)
    with Engine(wh, spark=spark) as eng:
        start_epoch = eng.committed_epoch
        assert start_epoch > 0
        final_steps = cd.run_workload(eng, journal, seed)
        assert eng.progress(cd.MV).state == "created"
        final_steps += cd.post_steps(eng, journal, seed, 2)
        entries = cd.read_journal(journal)
        assert entries[-1]["op"] == "step"

        final_state, after_step = cd.model_states(entries)

        # every op of the workload was journaled exactly once, in order
        done_ops = [
            (e["step"], e["op"]) for e in entries if e["op"] != "step" and not e.get("post")
        ]
        expected_ops = [
            (i, j) for i in range(cd.N_STEPS) for j in range(len(cd.ops_for_step(seed, i)))
        ]
        assert done_ops == expected_ops

        # the table = the journaled DML applied in order
        assert_rows_equal(
            eng.read(cd.TABLE), final_state.values(), label="table after crashes vs journal replay"
        )
        assert eng.committed_epoch == final_steps[-1]["epoch"]
        check_mv(eng, spark, cd.MV, cd.MV_TEMPLATE, cd.TABLE, eng.committed_epoch)

        # every epoch of this run: table = replay at that point; MV = batch query
        by_epoch = {}
        for n, e in enumerate(entries):
            if e["op"] == "step":
                by_epoch[e["epoch"]] = n
        retained = 0
        for st in final_steps:
            e = st["epoch"]
            n = by_epoch[e]
            try:
                t = eng.read(cd.TABLE, as_of=e)
                assert_rows_equal(t, after_step[n].values(), label=f"table at epoch {e}")
            except EpochNotRetained:
                assert e != eng.committed_epoch
                continue
            retained += 1
            if st["state"] == "created":
                check_mv(eng, spark, cd.MV, cd.MV_TEMPLATE, cd.TABLE, e)
        assert retained >= 1
