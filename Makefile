# Two entry points: `make demo` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# setup.py and the C source of the Spark source's read loop are built by the install too
BUILT := pyproject.toml setup.py spark_bridge/_native_reader.c
STAMP := $(VENV)/.installed-$(shell cat $(BUILT) | cksum | cut -d' ' -f1)

.PHONY: demo test test-unit lint typecheck install clean bench

$(STAMP): $(BUILT)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark,apache]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

demo: install
	$(BIN)/pulsar-autoscale demo $(DEMO_ARGS)

# Everything on the embedded pulsar-lite, its modules spread over TEST_WORKERS processes (pytest-xdist; each
# has its own session broker; on 2 cores 2 keep both cores busy: with 3, a slower day's machine took 22-26 min and
# failed 2-3 tests in each of two runs, all of them timing under that load: a cluster not formed in 60 s, pulsar-lite's
# stall under CPU load (docs/dev/pulsar-lite-defects.md, B12), a live testbed run 1.7% short), the fuzz tests alone
# (pyproject.toml, marker `fuzz`); then the broker-sensitive tests again on Apache Pulsar standalone (fetched
# through Maven on first use; tests/conftest.py ON_APACHE lists what runs there), over APACHE_TEST_WORKERS
# processes, each with a standalone of its own (a JVM of about 1 GB; a third made that pass slower, 15 min for 12-13).
TEST_WORKERS ?= 2
APACHE_TEST_WORKERS ?= 2
test: install lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not fuzz" --durations=20 $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -m fuzz $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -n $(APACHE_TEST_WORKERS) --dist loadfile --durations=10 --broker apache $(PYTEST_ARGS)

# The unit tier alone: no broker, no subprocess, no Spark; about 20 s.
test-unit: install
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

lint: install typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy over the installed layout: functions/, policies/ and spark_bridge/ are pulsar_autoscale.* sub-packages
# (pyproject's package-dir), so the checker reads them through a tree of links that has that layout.
TYPECHECK_TREE := build/typecheck/pulsar_autoscale
typecheck: install
	rm -rf build/typecheck && mkdir -p $(TYPECHECK_TREE)
	for f in pulsar_autoscale/*; do ln -s "$(CURDIR)/$$f" $(TYPECHECK_TREE)/; done
	ln -s "$(CURDIR)/functions" $(TYPECHECK_TREE)/functions
	ln -s "$(CURDIR)/policies" $(TYPECHECK_TREE)/policies
	ln -s "$(CURDIR)/spark_bridge" $(TYPECHECK_TREE)/spark_bridge
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml pulsar_autoscale

clean:
	rm -rf $(VENV) build *.egg-info

# Headline benchmarks (BENCHMARKS.md, "Make targets"): each runs the command its section names.
BENCH_TARGETS := bench-overhead bench-scale bench-controller bench-policies bench-wake bench-failover \
	bench-migration bench-spark bench-burst bench-cluster bench-updates bench-brokers
.PHONY: $(BENCH_TARGETS)

bench-overhead: install
	$(BIN)/python bench/runtime_overhead.py --messages 20000

bench-scale: install
	$(BIN)/python bench/scale_latency.py --repeats 3 --pool 4

bench-controller: install
	$(BIN)/python bench/controller_scale.py

bench-policies: install
	$(BIN)/python bench/fast_path.py

bench-wake: install
	$(BIN)/python bench/wake_latency.py --rounds 10 --runtime process --warm-pool 2

bench-failover: install
	$(BIN)/python bench/state_failover.py --state-mb 50 --kill 1

bench-migration: install
	TMPDIR=/dev/shm $(BIN)/python bench/state_migration.py --workers 3 --state-mb 500 --cycles 2 --steady-s 20 --modes live,restart

bench-spark: install
	$(BIN)/python bench/spark_bridge.py --messages 500000 --repeat 5

bench-burst: install
	$(BIN)/python bench/spark_burst.py

bench-cluster: install
	$(BIN)/python bench/cluster_scale.py --messages 1500

bench-updates: install
	$(BIN)/python bench/update_downtime.py

bench-brokers: install
	$(BIN)/python bench/runtime_overhead.py --messages 20000 --broker both
	$(BIN)/python bench/scale_latency.py --repeats 3 --pool 4 --broker both
	$(BIN)/python bench/state_failover.py --state-mb 50 --kill 1 --broker both
	$(BIN)/python bench/spark_bridge.py --messages 500000 --repeat 5 --broker both
