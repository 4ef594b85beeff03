# gpuobs: `make up` brings the stack up, `make test` runs the tests. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
GPUOBS := $(VENV)/bin/gpuobs
RUN_DIR ?= .run
PYTEST_ARGS ?=

.PHONY: help venv binaries up down status test test-unit test-live lint rules drill-xid clean

help:
	@echo "make up | down | status | test | lint | drill-xid | rules | clean"

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpuobs needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

binaries:
	@scripts/ensure-binaries.sh

up: venv binaries
	@if docker info >/dev/null 2>&1; then \
	  echo "Docker engine found, but the compose stack is not implemented yet: starting the native stack."; \
	else \
	  echo "No Docker engine answers: starting the native stack (prometheus + alertmanager from PATH)."; \
	fi
	$(GPUOBS) stack up --run-dir $(RUN_DIR)

down: venv
	$(GPUOBS) stack down --run-dir $(RUN_DIR)

status: venv
	$(GPUOBS) stack status --run-dir $(RUN_DIR)

drill-xid: venv
	$(GPUOBS) drill xid --run-dir $(RUN_DIR)

lint: venv binaries
	promtool check config prometheus/prometheus.yml
	promtool check rules prometheus/rules/*.yml
	cd prometheus/tests && promtool test rules *.test.yml
	amtool check-config alertmanager/alertmanager.yml
	$(GPUOBS) rules xid --check prometheus/rules/gpu-xid.yml

rules: venv
	$(GPUOBS) rules xid > prometheus/rules/gpu-xid.yml

test: venv binaries
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(RUN_DIR) .pytest_cache
