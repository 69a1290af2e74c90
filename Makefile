# sparkfill developer entry points.
#   make demo   - set up .venv, ensure Java 17/21, run the demo
#   make test   - set up .venv, ensure Java 17/21, PostgreSQL's server binaries and headless
#                 Chromium with its driver (the UI's browser tests), run pytest
#                 on three workers (PYTEST_ARGS="-k foo" to filter, WORKERS=0 for one process;
#                 tests marked `extended` are left to make torture),
#                 then the tests marked `connect` again against Spark Connect servers (two workers)
#   make lint   - ruff + mypy
#   make bench  - run the backfill and steady-state benchmarks (steady appends to bench/RESULTS.md)
#   make bench-scale - issues 32 and 33 goal by goal at 16,000,000 rows (1,000,000 beside):
#                 a first load and each MV's blocking CREATE against Spark's write and a batch
#                 CTAS, the floor under a placed load, online creation while the table
#                 changes, steady epochs and the Structured Streaming peer, a large change and
#                 a bulk UPDATE against a recompute, an epoch's anatomy; SCALE_ROWS=N for
#                 another size, TPCH_QUERIES="q1 q3" adds TPC-H at scale 1 created online
#                 (about 20 minutes without TPC-H; the tables append to bench/RESULTS.md)
#   make bench-nexmark - every Nexmark query created online and dropped one after another in
#                 one warehouse whose history grows (1,000 events per epoch), each checked by
#                 VERIFY at every epoch once created (appends to bench/RESULTS.md)
#   make bench-tpcds - every TPC-DS statement (Spark's 99 queries) created online and dropped
#                 one after another in one warehouse under refresh rounds, each checked against
#                 the batch query at every epoch once created (appends to bench/RESULTS.md)
#   make torture - the statement fuzzer at scale: N fuzzed statements and API calls from
#                 SEED (default 10,000 from 1; tests/torture.py), printing how many were tried,
#                 accepted, refused with a SparkfillError, internal errors and warehouses a
#                 refused call changed (both must be 0), then the damaged-file cases, every
#                 fault of tests/test_faults.py (ENOSPC, commit conflicts, failed jobs, an
#                 object-store request cut, the meta store restarting; all points), and the
#                 crash harness: SITES crash sites from SEED (tests/durability.py, default 200;
#                 SITES=0: every site the workload reaches), printing its counts, then the
#                 tests marked `extended` (larger variants of tests make test runs)
#   make clean  - remove caches and generated warehouses (distclean also removes .venv)

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?= --durations=25
# pytest-xdist workers of the main run (each its own Spark session; the suite's
# Spark jobs are small and much of a test waits on the driver, on Py4J and on child
# processes starting, so three workers keep two cores busier than two do)
WORKERS ?= 3
# make torture's seed and number of fuzzed statements and API calls
SEED ?= 1
N ?= 10000
SITES ?= 200
# make bench-scale's large table, and the TPC-H queries it creates at scale 1 (none: skipped)
SCALE_ROWS ?= 16000000
TPCH_QUERIES ?=

VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

# Prefix for recipes that need Java: export JAVA_HOME from ensure_java.sh
# (its last stdout line) and put $JAVA_HOME/bin first on PATH.
WITH_JAVA = JAVA_HOME="$$(bash scripts/ensure_java.sh | tail -n 1)"; \
	export JAVA_HOME; export PATH="$$JAVA_HOME/bin:$$PATH";

.PHONY: demo test venv java lint bench bench-scale bench-nexmark bench-tpcds torture clean distclean

demo: venv
	@$(WITH_JAVA) exec $(VPY) -m sparkfill.demo

test: venv
	@bash scripts/ensure_postgres.sh
	@bash scripts/ensure_chromium.sh
	@$(WITH_JAVA) $(VPY) -m pytest -q -n $(WORKERS) --dist worksteal -m "not extended" $(PYTEST_ARGS)
	@$(WITH_JAVA) SPARKFILL_TEST_CONNECT=1 $(VPY) -m pytest -q -n 2 --dist worksteal \
		-m "connect and not extended" $(PYTEST_ARGS) \
		|| test $$? -eq 5  # 5: a -k filter left no test of the subset

venv: $(STAMP)

# Reinstall only when pyproject.toml changes (the install is editable, so code
# changes need no reinstall).
$(STAMP): pyproject.toml constraints.txt
	@if ! "$(VPY)" -m pip --version >/dev/null 2>&1; then \
		echo "Creating $(VENV) with $(PYTHON)"; \
		$(PYTHON) -m venv $(VENV) || { echo "error: '$(PYTHON) -m venv' failed;" \
			"on Debian/Ubuntu try: apt-get install -y python3-venv" >&2; exit 1; }; \
	fi
	$(VPY) -m pip install --upgrade pip
	@# uv resolves and installs the same pins in about half pip's time (measured on a
	@# fresh checkout: 57 s against 103 s); where it cannot be installed, pip does it
	@if $(VPY) -m pip install uv >/dev/null 2>&1 && [ -x $(VENV)/bin/uv ]; then \
		$(VENV)/bin/uv pip install --python $(VPY) -e ".[dev]" -c constraints.txt; \
	else \
		$(VPY) -m pip install -e ".[dev]" -c constraints.txt; \
	fi
	@touch $@

java:
	@bash scripts/ensure_java.sh

lint: venv
	$(VENV)/bin/ruff check sparkfill tests bench
	$(VENV)/bin/mypy sparkfill

bench: venv
	@$(WITH_JAVA) exec $(VPY) bench/backfill_bench.py
	@$(WITH_JAVA) exec $(VPY) bench/steady_bench.py --out bench/RESULTS.md

bench-scale: venv
	@$(WITH_JAVA) $(VPY) bench/bulk_anatomy.py --rows $(SCALE_ROWS) --repeat 3 --create
	@$(WITH_JAVA) $(VPY) bench/load_floor.py --rows $(SCALE_ROWS) --repeat 3
	@$(WITH_JAVA) $(VPY) bench/backfill_bench.py --rows 1000000 --mvs agg proj \
		--strategies blocking default snapshot --out bench/RESULTS.md
	@$(WITH_JAVA) $(VPY) bench/steady_bench.py --rows 1000000 $(SCALE_ROWS) --changes 1000 \
		--epochs 7 --out bench/RESULTS.md
	@$(WITH_JAVA) $(VPY) bench/refresh_bench.py --rows 1000000 --changes 100000 --epochs 2 \
		--out bench/RESULTS.md
	@$(WITH_JAVA) $(VPY) bench/epoch_anatomy.py --rows 1000000 --changes 1000 --epochs 5 --phases
	@if [ -n "$(TPCH_QUERIES)" ]; then $(WITH_JAVA) $(VPY) bench/tpch_bench.py --scale 1 \
		--queries $(TPCH_QUERIES) --epochs 3 --out bench/RESULTS.md; fi

bench-nexmark: venv
	@$(WITH_JAVA) exec $(VPY) bench/nexmark_bench.py --events 1000 --history 5 --epochs 2 \
		--out bench/RESULTS.md

bench-tpcds: venv
	@$(WITH_JAVA) exec $(VPY) bench/tpcds_bench.py

torture: venv
	@bash scripts/ensure_postgres.sh
	@$(WITH_JAVA) $(VPY) tests/torture.py --seed $(SEED) --n $(N)
	@$(WITH_JAVA) $(VPY) -m pytest -q -p no:xdist tests/test_damaged_files.py
	@$(WITH_JAVA) SPARKFILL_TORTURE=1 $(VPY) -m pytest -q -s -p no:xdist tests/test_faults.py \
		tests/test_meta_postgres.py::test_postgres_meta_store_restarting_between_epochs
	@$(WITH_JAVA) $(VPY) tests/durability.py --seed $(SEED) --sites $(SITES)
	@$(WITH_JAVA) $(VPY) -m pytest -q -n $(WORKERS) --dist worksteal -m extended

clean:
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
	rm -rf .pytest_cache .mypy_cache .ruff_cache build spark-warehouse metastore_db \
		derby.log warehouse demo-warehouse test-artifacts
	rm -f $(STAMP)

distclean: clean
	rm -rf $(VENV)
