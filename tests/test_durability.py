"""CI's slice of the crash-at-every-site harness (``durability.py``; ``make torture``
runs hundreds of sites): the workload shortened to its first two steps (tables, a
source, DML, an aggregate backfilled by arrangement, a join by a buffer job), a child
killed right after a fixed site (epoch 3 begun), then its recovery (which restarts
the buffer job on fresh folders) killed too, then finished and checked by the oracle
(``durability_driver.check``). No reference run: the site's run replays the two steps
from an empty warehouse (``make torture`` restores each site's run from the reference
run's copy at the boundary before it instead).

Invariant: a site passes only when the child died there and every check of the
finished warehouse held (DML exactly once, MVs and sinks exact, no file or folder left
behind, no lock leaked)."""

from __future__ import annotations

from pathlib import Path

import durability_driver as dd
import pytest
from durability import Harness

#: (site, crash of the recovery after its n-th act, or None): an epoch in flight whose
#: recovery (a buffer job restarting on fresh folders) is killed too; ``make torture``
#: runs hundreds
SITES = [("meta:begin_epoch", 3, 2)]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    from connect_server import ConnectServer
    from session_conf import TEST_SPARK_CONF

    with ConnectServer(tmp_path_factory.mktemp("durability-connect"),
                       extra_conf=TEST_SPARK_CONF) as server:
        yield server.url


@pytest.mark.parametrize(("point", "k", "recovery"), SITES)
def test_crash_at_a_site_then_recover_exactly(connect_url, tmp_path, monkeypatch, point, k,
                                              recovery):
    monkeypatch.setenv(dd.STEPS_ENV, "2")
    harness = Harness(str(tmp_path), connect_url)
    Path(harness.reference).mkdir()  # no reference run: the source is not compared
    outcome = harness.crash_site(point, k, recovery)
    assert outcome.status == "exact", "\n".join(outcome.problems)
