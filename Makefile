# Two entry points: `make demo` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# setup.py and the C source of the Spark source's read loop are built by the install too
BUILT := pyproject.toml setup.py spark_bridge/_native_reader.c
STAMP := $(VENV)/.installed-$(shell cat $(BUILT) | cksum | cut -d' ' -f1)

.PHONY: demo test test-unit lint install clean bench

$(STAMP): $(BUILT)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

demo: install
	$(BIN)/pulsar-autoscale demo $(DEMO_ARGS)

test: install lint
	$(BIN)/python -m pytest -q --durations=20 $(PYTEST_ARGS)

# The unit tier alone: no broker, no subprocess, no Spark; about a minute.
test-unit: install
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
