# gpuobs: `make up` brings the stack up, `make test` runs the tests. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
GPUOBS := $(VENV)/bin/gpuobs
RUN_DIR ?= .run
PYTEST_ARGS ?=
# `make test` runs test files in parallel worker processes (pytest-xdist; one file's tests stay in one
# worker, so a module's live stack starts once). Most of the suite's time is live stacks waiting on
# scrapes and rule evaluations, not CPU. 2 workers: with 4 on 2 cores (8 minutes instead of 22) the
# CPU-bound canary looks of `canary serve` passed their 15 s per-look deadline (504) in two tests.
# 0 = serial.
PYTEST_WORKERS ?= 2

# What the simulated exporters serve (stock | helm | recommended; docs/metrics.md), for `make up` and `make drills`.
EXPORTER_PROFILE ?= $(or $(GPUOBS_EXPORTER_PROFILE),stock)

DRILL_RUN_DIR ?= .run-drills
DRILL_PORTS ?= --prometheus-port 19090 --alertmanager-port 19093 --pager-port 19097 --remediate-port 19098 --base-port 19400 --engine-base-port 18000

.PHONY: help venv binaries up up-mixed up-ha up-compose-ha down status images test-compose test test-faults lint rules drills drills-ha drills-remediation bench bench-canary bench-latency bench-scale clean

help:
	@echo "make up | up-mixed | up-ha | up-compose-ha | down | status | images | test | test-compose | test-faults | lint | drill-<name> |"
	@echo "     drills | drills-ha | rollout-good | rollout-bad | rollout-incompatible | flag-good | flag-bad | upgrade-good |"
	@echo "     drill-driver-regression | bench | bench-canary | bench-upgrade | bench-latency | bench-scale | rules | clean"

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpuobs needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

binaries:
	@scripts/ensure-binaries.sh

COMPOSE_PY := $(GPUOBS) compose

# Compose mode when the Docker engine, the Compose plugin and every image are there (`make images`
# builds the images, air-gapped), else one line saying why and the native stack. The choice is
# recorded in $(RUN_DIR)/mode so down/status act on the same one.
# A stack already running from $(RUN_DIR), or a bad GPUOBS_* value, is refused first (`stack up --check`),
# before anything is said about starting or written to the run directory.
# GPU models of the serving nodes for `make up` (docs/topology.md "Mixed fleet"), e.g. H100:3,L40S:1; empty:
# every node H100. A mixed fleet runs natively (the compose stack has no per-node model).
GPU_MODELS ?= $(GPUOBS_GPU_MODELS)
STACK_UP := $(GPUOBS) stack up --stop-hint "make down" --run-dir $(RUN_DIR) --exporter-profile $(EXPORTER_PROFILE) \
	$(if $(GPU_MODELS),--gpu-models "$(GPU_MODELS)")
up: venv binaries
	@$(STACK_UP) --check >/dev/null
	@mkdir -p $(RUN_DIR)
	@if [ -n "$(GPU_MODELS)" ]; then why="GPU_MODELS is set (a mixed fleet runs natively)"; \
	elif why=$$($(COMPOSE_PY) check 2>&1); then \
	  echo compose > $(RUN_DIR)/mode; $(COMPOSE_PY) up --run-dir $(RUN_DIR); exit 0; \
	fi; \
	echo "$$why; starting the native stack (prometheus + alertmanager from PATH)."; \
	echo native > $(RUN_DIR)/mode; $(STACK_UP)

# A mixed fleet (docs/topology.md "Mixed fleet"): 20 serving nodes (19 H100 + 1 L40S) and 1 training
# node, natively, for the driver-upgrade demos. `make down` stops it.
up-mixed: venv binaries
	@GPUOBS_NODES=21 GPUOBS_TRAINING_NODES=1 $(MAKE) --no-print-directory up GPU_MODELS=H100:19,L40S:1

# The HA topology (docs/ha.md): 2 Prometheus shards x 2 replicas, a 3-member Alertmanager cluster,
# VictoriaMetrics (global store, replica dedup) and vmalert (fleet-wide rules), natively. `make down`
# and `make status` act on it like on `make up`'s stack. HA_FLAGS: e.g. --shards 3 --ha-base-port 9100.
HA_FLAGS ?=
up-ha: venv binaries
	@$(STACK_UP) --topology ha $(HA_FLAGS) --check >/dev/null
	@mkdir -p $(RUN_DIR)
	@echo native > $(RUN_DIR)/mode
	$(STACK_UP) --topology ha $(HA_FLAGS)

# The same HA topology as Docker Compose services (the Compose profile `ha`, docs/compose.md): needs the
# engine, the Compose plugin and the images (`make images`); no native fallback. `make down`/`status` act on it.
up-compose-ha: venv
	@$(STACK_UP) --check >/dev/null
	@mkdir -p $(RUN_DIR)
	@why=$$($(COMPOSE_PY) check --topology ha 2>&1) || { echo "$$why (make up-ha runs the HA topology natively)"; exit 1; }
	@echo compose > $(RUN_DIR)/mode
	$(COMPOSE_PY) up --topology ha --run-dir $(RUN_DIR)

down: venv
	@if [ "$$(cat $(RUN_DIR)/mode 2>/dev/null)" = compose ]; then $(COMPOSE_PY) down --run-dir $(RUN_DIR); \
	else $(GPUOBS) stack down --run-dir $(RUN_DIR); fi

status: venv
	@if [ "$$(cat $(RUN_DIR)/mode 2>/dev/null)" = compose ]; then $(COMPOSE_PY) status --run-dir $(RUN_DIR); \
	else $(GPUOBS) stack status --run-dir $(RUN_DIR); fi

# The compose stack's images, with no container registry: Debian root filesystems (mmdebstrap) and the
# gpuobs image from a local wheelhouse (scripts/build-images.sh). Installs and starts the Docker engine
# and the Compose plugin first if needed (as root; scripts/ensure-docker.sh).
images: venv
	@scripts/ensure-docker.sh
	@scripts/build-images.sh

# The compose stack for real (tests/live/test_compose.py): engine (started if needed, stopped again if
# started here), images, stack up, Xid and node-down drills across containers, network checks, teardown.
test-compose: venv
	@scripts/test-compose.sh $(PYTEST_ARGS)

# One drill against the stack `make up` started (realistic rule timings: some drills take minutes;
# drill-slo-burn about 29, its deadline derived from the 30d SLO's burn-rate windows, docs/drills.md). The
# report is written only when the drill ran (exit 0 pass, 1 fail); a usage error (exit 2: an unknown
# drill, no running stack) stops at its one error line.
drill-%: venv
	@rc=0; $(GPUOBS) drill $* --run-dir $(RUN_DIR) $(DRILL_FLAGS) || rc=$$?; \
	  if [ $$rc -le 1 ]; then echo "report: $$($(GPUOBS) report drill $* --run-dir $(RUN_DIR) | tail -n 1)"; fi; \
	  exit $$rc

# Every drill on a fresh stack of its own with the drill profile (shortened `for:`/windows, 1d SLO
# period; see gpuobs/mixin/profile.py), lanes in parallel, then one table. Stops its stack afterwards.
drills: venv binaries
	@$(GPUOBS) stack down --run-dir $(DRILL_RUN_DIR) >/dev/null 2>&1 || true
	rm -rf $(DRILL_RUN_DIR)
	$(GPUOBS) stack up --run-dir $(DRILL_RUN_DIR) --profile drill --nodes 4 --training-nodes 1 $(DRILL_PORTS) \
	  --exporter-profile $(EXPORTER_PROFILE)
	@rc=0; $(GPUOBS) drill all --run-dir $(DRILL_RUN_DIR) || rc=$$?; \
	  $(GPUOBS) stack down --run-dir $(DRILL_RUN_DIR); exit $$rc

# The remediation drills (docs/remediation.md) on a fresh stack of their own whose controller enforces:
# 8 nodes (7 serving), so the storm can hit 5 of them. Stops its stack afterwards.
drills-remediation: venv binaries
	@$(GPUOBS) stack down --run-dir $(DRILL_RUN_DIR)-rem >/dev/null 2>&1 || true
	rm -rf $(DRILL_RUN_DIR)-rem
	$(GPUOBS) stack up --run-dir $(DRILL_RUN_DIR)-rem --profile drill --nodes 8 --training-nodes 1 $(DRILL_PORTS) \
	  --remediate enforce
	@rc=0; $(GPUOBS) drill remediation --run-dir $(DRILL_RUN_DIR)-rem || rc=$$?; \
	  $(GPUOBS) stack down --run-dir $(DRILL_RUN_DIR)-rem; exit $$rc

# The same drills on the HA topology (docs/ha.md): alerts are read from every Prometheus replica and
# vmalert, pages from the pager behind the 3-member Alertmanager cluster.
drills-ha: venv binaries
	@$(GPUOBS) stack down --run-dir $(DRILL_RUN_DIR)-ha >/dev/null 2>&1 || true
	rm -rf $(DRILL_RUN_DIR)-ha
	$(GPUOBS) stack up --topology ha --run-dir $(DRILL_RUN_DIR)-ha --profile drill --nodes 4 --training-nodes 1 \
	  $(DRILL_PORTS) --exporter-profile $(EXPORTER_PROFILE)
	@# vmalert's SLO burn rules run on MetricsQL, which counts a counter from zero when its first sample is in
	@# the window and small (errors) but not when it is large (requests): until the drill profile's paging
	@# windows (2m/30s, 12m/1m) hold no first sample the error ratio is inflated (docs/ha.md). Wait them out.
	@echo "waiting 150 s for the SLO windows to pass the series' first samples (docs/ha.md, MetricsQL)"; sleep 150
	@rc=0; $(GPUOBS) drill all --run-dir $(DRILL_RUN_DIR)-ha || rc=$$?; \
	  $(GPUOBS) stack down --run-dir $(DRILL_RUN_DIR)-ha; exit $$rc

bench: venv binaries
	$(PY) bench/bench_exporter.py
	$(PY) bench/bench_logwatch.py

bench-canary: venv
	$(PY) bench/bench_canary.py

bench-latency: venv binaries
	$(PY) bench/bench_xid_latency.py

# The HA topology at scale (bench/bench_scale.py; about 10 minutes, not part of `make test`): ingest per
# replica and VictoriaMetrics, head series per shard, CPU/memory per component, canary look and Xid
# fault-to-page latency via a shard vs vmalert, against the single stack. Table in bench/README.md.
bench-scale: venv binaries
	$(PY) bench/bench_scale.py

lint: venv binaries
	promtool check config prometheus/prometheus.yml
	promtool check rules prometheus/rules/*.yml
	cd prometheus/tests && promtool test rules *.test.yml
	amtool check-config alertmanager/alertmanager.yml
	$(GPUOBS) rules render --check
	$(GPUOBS) rules kubernetes --check

# Every rule file, alertmanager/alertmanager.yml and grafana/dashboards/*.json from prometheus/fleet.yaml.
rules: venv
	$(GPUOBS) rules render
	$(GPUOBS) rules kubernetes

test: venv binaries
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The fault suite (docs/alert-delivery.md): 1500 hostile requests per HTTP surface with slow clients,
# and three live incidents (pager stopped 60 s, Alertmanager kill -9 + restart, Prometheus killed
# 90 s), each on a stack of its own, at once. About 7 minutes; prints the table of what held.
# `make test` runs the fuzzing part with 500 requests per surface and skips the live incidents.
test-faults: venv binaries
	GPUOBS_FAULT_SUITE=1 GPUOBS_FUZZ_CASES=1500 GPUOBS_FAULT_TABLE=fault-table.txt $(PY) -m pytest -q -rs tests/faults

clean:
	rm -rf $(VENV) $(RUN_DIR) $(DRILL_RUN_DIR) .pytest_cache

# Rollout demos against the stack `make up` started (RUN_DIR): rollout-good (1.5.0 -> Succeeded),
# rollout-bad (1.6.0, +20% TTFT -> RolledBack, fleet back on 1.4.0), rollout-incompatible (2.0.0, CUDA 13
# on driver 550 -> Rejected by the compatibility gate, nothing deployed). Each prints a progress line per
# stage and look, then the stage table and the deciding verdict table, and checks the end state.
# Looks every 15 s; a healthy stage of 1 node of 3 (and of 2 against 1) PROMOTEs after a median ~4 min
# of traffic, but its spread is wide: a 6 min deadline promoted 88% of stage-1s, 10 min 98% (stage 2:
# 96%), 15 min (= the analysis horizon) 98.8% and 99.6% (bench/README.md, "dev 1+2 / 2+1 nodes"; a stack
# started with GPUOBS_RATE=6 decides faster).
# A longer deadline does not slow a healthy stage: the controller promotes at the first PROMOTE.
ROLLOUT_FLAGS ?= --stages 1,50%,100% --interval 15s --stage-timeout 15m --settle 10s
define rollout_demo
	@rc=0; $(GPUOBS) --log-level warning rollout start --run-dir $(RUN_DIR) --version $(1) $(ROLLOUT_FLAGS) || rc=$$?; \
	$(GPUOBS) rollout status --run-dir $(RUN_DIR) --json > $(RUN_DIR)/rollout-last.json; \
	state=$$($(PY) -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' $(RUN_DIR)/rollout-last.json); \
	echo "report: $$($(GPUOBS) report rollout --file $(RUN_DIR)/rollout-last.json --run-dir $(RUN_DIR) | tail -n 1)"; \
	if [ "$$state" = "$(2)" ]; then echo "demo OK: $(1) ended $$state (exit $$rc), as expected"; \
	else echo "demo FAILED: $(1) ended $${state:-nowhere} (exit $$rc), expected $(2)"; exit 1; fi
endef

.PHONY: rollout-good rollout-bad rollout-incompatible
rollout-good: venv
	$(call rollout_demo,1.5.0,Succeeded)

rollout-bad: venv
	$(call rollout_demo,1.6.0,RolledBack)

rollout-incompatible: venv
	$(call rollout_demo,2.0.0,Rejected)

# Feature-flag demos against the stack `make up` started (RUN_DIR), same timing as the rollout demos:
# flag-good (kv_policy_v2, no visible change -> Succeeded, on for every serving node), flag-bad
# (spec_decode: TPOT -15% but +2% errors on prompts over 512 tokens -> the canary's error_ratio is
# harmful -> RolledBack, the kill switch turns it off on every node). Each prints the progress, the
# report's path, and checks both the end state and where the flag file has the flag on.
# Run flag-good first (or on a fresh stack): flag-bad's errors spend the availability budget (docs/rollout.md).
FLAG_DEMO_FLAGS ?= --stages 1,50%,100% --interval 15s --stage-timeout 8m --settle 10s
define flag_demo
	@rc=0; $(GPUOBS) --log-level warning flag rollout $(1) --run-dir $(RUN_DIR) $(FLAG_DEMO_FLAGS) || rc=$$?; \
	$(GPUOBS) flag status --run-dir $(RUN_DIR) --json > $(RUN_DIR)/flag-last.json; \
	state=$$($(PY) -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' $(RUN_DIR)/flag-last.json); \
	where=$$($(PY) -c 'import sys; from pathlib import Path; from gpuobs.flags.flagd import FlagFile; \
	  from gpuobs.stack.supervisor import load_state; run = Path(sys.argv[1]); \
	  hosts = set(load_state(run).serving_hosts); on = set(FlagFile(run / "flags.json").hosts(sys.argv[2])) & hosts; \
	  print("everywhere" if on == hosts else "nowhere" if not on else "on " + ",".join(sorted(on)))' $(RUN_DIR) $(1)); \
	echo "report: $$($(GPUOBS) report rollout --file $(RUN_DIR)/flag-last.json --run-dir $(RUN_DIR) | tail -n 1)"; \
	if [ "$$state" = "$(2)" ] && [ "$$where" = "$(3)" ]; then \
	  echo "demo OK: flag $(1) ended $$state (exit $$rc), on $$where, as expected"; \
	else echo "demo FAILED: flag $(1) ended $${state:-nowhere} (exit $$rc), on $$where; expected $(2), on $(3)"; exit 1; fi
endef

.PHONY: flag-good flag-bad
flag-good: venv
	$(call flag_demo,kv_policy_v2,Succeeded,everywhere)

flag-bad: venv
	$(call flag_demo,spec_decode,RolledBack,nowhere)

# Driver upgrade demos (docs/upgrade.md) against the mixed fleet `make up-mixed` started (19 H100 + 1 L40S
# serving nodes): upgrade-good (570.172.08, a clean driver -> Succeeded on every node, median time per
# batch printed), drill-driver-regression (570.195.03: +8% TTFT/ITL on L40S only -> the L40S canary batch
# is judged ROLLBACK, that node returns to the old driver, the H100 nodes keep theirs -> RolledBack).
# Each prints the progress, checks the end state and every node's driver (scripts/upgrade_demo.py).
UPGRADE_FLAGS ?= --batches canary,25%,50%,100% --interval 15s --batch-timeout 15m --settle 15s
define upgrade_demo
	@$(PY) scripts/upgrade_demo.py --wait-history $(RUN_DIR)
	@rc=0; $(GPUOBS) --log-level warning upgrade run --run-dir $(RUN_DIR) --driver $(1) $(UPGRADE_FLAGS) || rc=$$?; \
	$(GPUOBS) upgrade status --run-dir $(RUN_DIR) --json > $(RUN_DIR)/upgrade-last.json; \
	echo "report: $$($(GPUOBS) report rollout --file $(RUN_DIR)/upgrade-last.json --run-dir $(RUN_DIR) | tail -n 1)"; \
	$(PY) scripts/upgrade_demo.py $(RUN_DIR) $(2) $(3)
endef

.PHONY: upgrade-good drill-driver-regression bench-upgrade
upgrade-good: venv
	$(call upgrade_demo,570.172.08,Succeeded)

drill-driver-regression: venv
	$(call upgrade_demo,570.195.03,RolledBack,L40S)

# Seeded first batches of a driver upgrade on 19 H100 + 1 L40S through the per-model judge (about 3 min).
bench-upgrade: venv
	$(PY) bench/bench_upgrade.py

# Which alert families work on the running stack's Prometheus (or GPUOBS_PROMETHEUS_URL): docs/doctor.md.
.PHONY: doctor
doctor: venv
	$(GPUOBS) doctor --prometheus $${GPUOBS_PROMETHEUS_URL:-http://127.0.0.1:$${GPUOBS_PROMETHEUS_PORT:-9090}}
