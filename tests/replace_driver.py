"""Steps a warehouse that ``test_replace`` prepared (``t``, ``m``, ``m2`` over ``m``, and
a replacement of ``m`` being built) with seeded random DML, until ``m`` has switched to
the query in ``argv[4]`` and one epoch more; prints ``READY``, then ``STEP epoch
switched`` per epoch. The test SIGKILLs it (``python replace_driver.py WAREHOUSE
UNUSED SEED QUERY``; Spark master from ``$SPARKFILL_MASTER``)."""

from __future__ import annotations

import random
import sys

from workload import Workload

from sparkfill import Engine

MAX_EPOCHS = 40


def main() -> int:
    warehouse, _, seed, query = sys.argv[1:5]
    eng = Engine(warehouse)
    print("READY", flush=True)
    work = Workload(eng, eng.spark, "t", random.Random(int(seed)), key_space=300)
    after = None
    for _ in range(MAX_EPOCHS):
        work.random_epoch_dml()
        epoch = eng.step().epoch
        switched = eng.relation("m").sql == query
        print(f"STEP {epoch} {int(switched)}", flush=True)
        if switched and after is not None:
            break
        if switched:
            after = epoch
    eng.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
