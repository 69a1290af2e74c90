"""Crash at every durability point (issue 35, item 1): the harness.

A *site* is the ``k``-th occurrence of a durability point ``p`` (``durability_points``)
in a run of the workload (``durability_driver``) from an empty warehouse. The harness

1. runs the workload once whole (the *reference*), logging every point it reaches:
   the sites, and the source table's rows per epoch. The workload closes and reopens
   its engine after every epoch (a *boundary*, in every run alike); at each boundary
   the reference run saves a copy of the site folder (the warehouse with its SQLite
   meta store, the sinks, the DML journal; the datagen source's offsets are in the
   meta store) and marks the boundary in the points log;
2. for each site chosen: restores the copy saved at the last boundary before the site
   (an empty folder for a site before the first) and, from there, continues the
   workload in a child process that ``os._exit``\\ s right after the site's occurrence
   counted from the boundary (``k`` minus the occurrences of ``p`` before it in the
   reference log: the reference run reopened its engine there too, so a run restored
   from the copy does the same acts in the same order); optionally
   reopens it in a second child that is killed during its recovery (after its
   ``n``-th durable act of any kind); then finishes the workload in a last child,
   which recovers, runs to the end and checks the oracle (``durability_driver.check``:
   DML exactly once against the journal, every MV against its batch query at every
   retained epoch, the sink against its MV, no dangling or orphan file, no leaked
   lock).

The finishing child runs a *bounded finish* (``--finish``, default 2): the step the
crash interrupted, two more scripted steps, then extra epochs until every MV it has
created is created (and switched, for a ``CREATE OR REPLACE`` issued), and checks the
workload as those steps left it: the MVs those steps dropped dropped, each sink they
created synced at the last epoch. ``--finish 0`` runs the workload to its end. So a
site costs the steps from its boundary to a few past the site and the check, not the
steps before its boundary nor the rest of the workload. Every run happens in the same
folder (``<root>/site``; the meta store records the sinks' absolute paths), so sites
run one at a time; a failed site's folder is moved aside.

The children are light Python processes: they share one Spark Connect server (a
child's ``os._exit`` kills the engine, its Python process, for real; the server, which
holds nothing durable, lives on), so a site does not also cost two Spark start-ups.

Invariant: a site counts as *exact* only when its child died there (exit status
``CRASH_EXIT``) and the finishing child's checks all held; a site the child did not
reach (the workload's timing differs a little from run to run: a rate-limited job;
a count from a boundary that the restored run does not reach alike) is reported
apart, never counted.

    python tests/durability.py --seed 1 --sites 200            # make torture's crash part
    python tests/durability.py --sites 8 --points meta:commit_epoch,rename:stage
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)

import durability_driver as dd  # noqa: E402
import durability_points as dp  # noqa: E402
from helpers import subprocess_env  # noqa: E402

DRIVER = os.path.join(TESTS_DIR, "durability_driver.py")
#: a child that takes longer than this is stuck
CHILD_TIMEOUT = 900.0


@dataclass
class Outcome:
    site: str
    status: str  # exact | failed | unreached
    recovery_crash: int | None = None
    #: the boundary whose copy the run started from (None: an empty warehouse)
    start: int | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


class Harness:
    def __init__(self, root: str, remote: str, log=print, finish: int | None = None) -> None:
        self.root = root
        #: a bounded finish (``durability_driver.FINISH_ENV``): the checking child runs
        #: this many steps past the crashed one (None: to the workload's end)
        self.finish = finish
        self.remote = remote
        self.log = log
        self.reference = os.path.join(root, "reference")
        #: where every run of the workload happens (the same absolute path for the
        #: reference and every site: the meta store records the sinks' paths)
        self.site_dir = os.path.join(root, "site")
        #: the reference run's copies of the site folder, one per boundary
        self.saves = os.path.join(root, "saves")
        #: per boundary n, the occurrences of each point before it (empty: no copies,
        #: every site replays the workload from an empty warehouse)
        self.before: list[collections.Counter[str]] = []

    def _env(self, **extra: str) -> dict[str, str]:
        env = subprocess_env()
        env["SPARK_REMOTE"] = self.remote
        for key in (dp.CRASH_ENV, dp.FAULT_ENV, dp.LOG_ENV):
            env.pop(key, None)
        env.update(extra)
        return env

    def child(self, mode: str, base: str, **env: str) -> tuple[int, list[str], str]:
        """Run the driver in ``mode`` over ``base``'s warehouse; (exit status, stdout
        lines, the tail of its stderr)."""
        err_path = os.path.join(base, f"{mode}-{len(os.listdir(base))}.err")
        with open(err_path, "wb") as err:
            proc = subprocess.run(
                [sys.executable, DRIVER, mode, os.path.join(base, "wh"),
                 os.path.join(base, "journal.jsonl"),
                 os.path.join(self.reference, "reference.json")],
                stdout=subprocess.PIPE, stderr=err, env=self._env(**env),
                timeout=CHILD_TIMEOUT, cwd=base)
        with open(err_path, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        return proc.returncode, proc.stdout.decode(errors="replace").splitlines(), tail

    def record(self) -> collections.Counter[str]:
        """The reference run: every site the workload reaches, by point, and a copy of
        the site folder at every boundary with the occurrences before it."""
        for d in (self.reference, self.site_dir, self.saves):
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(self.reference)
        os.makedirs(self.site_dir)
        os.makedirs(self.saves)
        points = os.path.join(self.reference, "points.log")
        code, out, tail = self.child("reference", self.site_dir,
                                     **{dp.LOG_ENV: points, dd.SAVES_ENV: self.saves})
        shutil.rmtree(self.site_dir, ignore_errors=True)
        if code != 0:
            raise RuntimeError(f"the reference run failed ({code}):\n{tail}\n{out[-5:]}")
        return self.load()

    def load(self) -> collections.Counter[str]:
        """The reference run of an earlier harness in the same root (``--reuse``)."""
        reached: collections.Counter[str] = collections.Counter()
        self.before = []
        with open(os.path.join(self.reference, "points.log")) as f:
            for line in f:
                line = line.strip()
                if line.startswith(dp.BOUNDARY):
                    assert int(line[len(dp.BOUNDARY):]) == len(self.before)
                    self.before.append(collections.Counter(reached))
                elif line:
                    reached[line] += 1
        return reached

    def start_of(self, point: str, k: int) -> tuple[int | None, int]:
        """Where a run crashing at site ``(point, k)`` starts: the last boundary before
        the site (None: an empty warehouse) and the site's occurrence counted from
        there."""
        start = None
        for n, counts in enumerate(self.before):
            if counts[point] < k:
                start = n
        return start, k - (self.before[start][point] if start is not None else 0)

    def crash_site(self, point: str, k: int, recovery_crash: int | None = None) -> Outcome:
        site = f"{point}#{k}"
        started = time.time()
        outcome = Outcome(site, "exact", recovery_crash)
        start, local_k = self.start_of(point, k)
        if start is None and not self.before:  # no copies: a folder of its own
            base = tempfile.mkdtemp(prefix="site-", dir=self.root)
        else:
            base = self.site_dir
            shutil.rmtree(base, ignore_errors=True)
            if start is None:
                os.makedirs(base)
            else:  # restored: the copy saved at the boundary before the site
                shutil.copytree(os.path.join(self.saves, str(start)), base)
                outcome.start = start
        code, out, tail = self.child("run", base, **{dp.CRASH_ENV: f"{point}#{local_k}"})
        if code != dp.CRASH_EXIT:
            outcome.status = "unreached" if code == 0 else "failed"
            if code != 0:
                outcome.problems.append(f"the crashing run failed ({code}) before the "
                                        f"site:\n{tail}")
        elif recovery_crash is not None:
            code, out, tail = self.child("run", base, **{dp.CRASH_ENV: f"*#{recovery_crash}"})
            if code not in (dp.CRASH_EXIT, 0):
                outcome.status = "failed"
                outcome.problems.append(f"the recovering run failed ({code}):\n{tail}")
        if outcome.status == "exact":
            bounded = {} if self.finish is None else {dd.FINISH_ENV: str(self.finish)}
            code, out, tail = self.child("check", base, **bounded)
            if code != 0:
                outcome.status = "failed"
                outcome.problems += [ln[len("PROBLEM "):] for ln in out
                                     if ln.startswith("PROBLEM ")] or [f"({code})\n{tail}"]
        outcome.seconds = time.time() - started
        if outcome.status == "failed":
            kept = base
            if base == self.site_dir:  # the next site reuses the folder
                kept = tempfile.mkdtemp(prefix=f"failed-{point.replace(':', '-')}-{k}-",
                                        dir=self.root)
                os.rmdir(kept)
                os.rename(base, kept)
            outcome.problems.append(f"(kept in {kept}; its absolute paths say {base})")
        else:
            shutil.rmtree(base, ignore_errors=True)
        return outcome


def choose_sites(reached: collections.Counter[str], n: int, seed: int,
                 points: list[str] | None = None,
                 latest: Harness | None = None) -> list[tuple[str, int]]:
    """``n`` sites (all when ``n`` is 0) in rounds: every point's 1st occurrence (in a
    seeded random order of the points), then every point's 2nd, then 3rd, then last, so
    that a run cut short covers every point as evenly as it can; then seeded random
    others."""
    rng = random.Random(seed)
    names = sorted(p for p in reached if points is None or p in points)
    every: list[tuple[str, int]] = []
    picks = [lambda p: 1, lambda p: 2, lambda p: 3, lambda p: reached[p]]
    if latest is not None:  # the last three (the cheapest to restore), latest first
        picks = [lambda p: reached[p], lambda p: reached[p] - 1, lambda p: reached[p] - 2]
    for pick in picks:
        round_ = [(p, pick(p)) for p in names
                  if 1 <= pick(p) <= reached[p] and (p, pick(p)) not in every]
        rng.shuffle(round_)
        if latest is not None:
            round_.sort(key=lambda s: -1 if (b := latest.start_of(*s)[0]) is None else b,
                        reverse=True)
        every += round_
    rest = [(p, k) for p in names for k in range(1, reached[p] + 1) if (p, k) not in every]
    rng.shuffle(rest)
    every += rest
    return every if n <= 0 else every[:n]


def run(args: argparse.Namespace, log=print) -> int:
    from connect_server import ConnectServer
    from session_conf import TEST_SPARK_CONF

    root = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="sparkfill-durability-"))
    os.makedirs(root, exist_ok=True)
    started = time.time()
    server = None
    remote = args.remote
    if remote is None:
        from pathlib import Path

        server = ConnectServer(Path(root), extra_conf=TEST_SPARK_CONF).__enter__()
        remote = server.url
    try:
        harness = Harness(root, remote, log, args.finish or None)
        reached = harness.load() if args.reuse else harness.record()
        log(f"durability: reference run{' (reused)' if args.reuse else ''} reached "
            f"{len(reached)} points, {sum(reached.values())} sites, "
            f"{len(harness.before)} boundaries, in {time.time() - started:.0f} s")
        sites = choose_sites(reached, args.sites, args.seed,
                             args.points.split(",") if args.points else None,
                             harness if args.latest else None)[args.skip:]
        rng = random.Random(args.seed)
        outcomes: list[Outcome] = []
        for i, (point, k) in enumerate(sites):
            if args.budget and time.time() - started > args.budget:
                log(f"durability: time budget of {args.budget:.0f} s spent: "
                    f"{len(sites) - i} sites left untried")
                break
            # every ``recovery_every``-th site also crashes the reopening's recovery
            rc = rng.randint(1, 6) if args.recovery_every and i % args.recovery_every == 0 \
                else None
            o = harness.crash_site(point, k, rc)
            outcomes.append(o)
            log(f"durability: [{i + 1}/{len(sites)}] {o.site}"
                f"{f' +recovery *#{rc}' if rc else ''} from boundary {o.start}: "
                f"{o.status} ({o.seconds:.0f} s)")
            for p in o.problems:
                log(f"    {p}")
        return report(outcomes, reached, time.time() - started, log)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


def report(outcomes: list[Outcome], reached: collections.Counter[str], seconds: float,
           log=print) -> int:
    exact = [o for o in outcomes if o.status == "exact"]
    failed = [o for o in outcomes if o.status == "failed"]
    unreached = [o for o in outcomes if o.status == "unreached"]
    per_point = collections.Counter(o.site.rpartition("#")[0] for o in exact)
    recovery = sum(1 for o in exact if o.recovery_crash)
    log("")
    log(f"durability: {len(outcomes)} crash sites tried of {sum(reached.values())} reached "
        f"({len(reached)} points), {seconds:.0f} s")
    log(f"durability: exact {len(exact)} (of which {recovery} with a crash of the "
        f"recovery too), failed {len(failed)} (must be 0), unreached {len(unreached)}")
    if outcomes:
        log(f"durability: seconds per site median "
            f"{statistics.median(o.seconds for o in outcomes):.0f}, "
            f"range {min(o.seconds for o in outcomes):.0f}-"
            f"{max(o.seconds for o in outcomes):.0f}")
    log(f"durability: points exercised {len(per_point)} of {len(reached)}; occurrences "
        f"per point min {min(per_point.values(), default=0)}")
    for p in sorted(reached):
        log(f"durability:   {p}: {per_point.get(p, 0)} of {reached[p]} exact")
    for o in failed:
        log(f"durability: FAILED {o.site}: " + "\n  ".join(o.problems))
    return 1 if failed or not exact else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sites", type=int, default=200, help="crash sites (0: every one)")
    ap.add_argument("--points", default=None, help="only these points (comma-separated)")
    ap.add_argument("--recovery-every", type=int, default=5,
                    help="every n-th site also crashes the recovery (0: never)")
    ap.add_argument("--remote", default=None,
                    help="a Spark Connect server's URL (default: start one)")
    ap.add_argument("--dir", default=None, help="where warehouses go (kept)")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the reference run (and its copies) kept in --dir")
    ap.add_argument("--latest", action="store_true",
                    help="each point's last three occurrences first, the cheapest "
                         "(latest boundary) first")
    ap.add_argument("--finish", type=int, default=2,
                    help="the checking child runs this many steps past the crashed one, "
                         "then settles and checks (0: to the workload's end)")
    ap.add_argument("--skip", type=int, default=0,
                    help="leave out the first n sites of the order (run by an earlier "
                         "run over the same reference)")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds after which no new site starts (0: none)")
    args = ap.parse_args(argv)
    return run(args, log=lambda m: print(m, flush=True))


if __name__ == "__main__":
    sys.exit(main())
