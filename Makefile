# bulk-recorder: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
UV := $(BIN)/uv

# Python writes the bytecode of what it imports (__pycache__, ignored by git) whatever the shell
# says: with PYTHONDONTWRITEBYTECODE=1 (set on these machines) every process compiled the
# project and the tests again, every pytest worker, role and mutant (tests/unit/test_start_cost.py).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: release install system-tools node-clients lock lint rules test test-random test-image test-compose test-unit mutants demo demo-api run bench soak soak-cluster soak-partitions clean

install: $(STAMP)

# What the service and the demos run on: exact versions with hashes from requirements.lock,
# then the project itself (no deps). The demos need nothing more. pip installs uv (pinned with
# hashes in requirements-uv.lock), uv the lock (hashes required): on a fresh clone pip spent
# ~25 s of a ~45 s install reading index pages, uv takes ~2 s for the same wheels
# (benchmarks/bench_demo.py measures both). The project's install compiles the record rules
# (setup.py's COMPILED, with mypyc; BULK_RECORDER_COMPILE=0 skips it): an edit to one of them
# builds them again here, since the compiled module, not the edited source, is what Python imports.
# uv compiles the dependencies' bytecode as pip does (it does not by default): each role then
# starts without compiling aio-pika, asyncpg or pydantic.
COMPILED := setup.py $(shell sed -n 's/^    "\(bulk_recorder\/.*\.py\)",$$/\1/p' setup.py)
$(RUNTIME): pyproject.toml requirements.lock requirements-uv.lock $(COMPILED)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements-uv.lock
	$(UV) pip install --quiet --python $(BIN)/python --compile-bytecode --require-hashes -r requirements.lock
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	touch $(RUNTIME)

# Development adds the dev lock (ruff, mypy, pytest, hypothesis, testcontainers).
$(STAMP): $(RUNTIME) requirements-dev.lock
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	touch $(STAMP)

# The Debian tools the test suite runs (promtool, prometheus, docker-compose, chromium; ip and
# nft for the partition rig, tests/partitions; gcc, which the install compiles the record rules
# with and tests/unit/test_compiled.py requires; erl_call, with which the rigs ask their RabbitMQ
# nodes, from erlang-base, which RabbitMQ needs anyway): installed if missing where we are root, else
# one line naming them. `make test` runs this before the install.
system-tools:
	@bash tests/system_tools.sh 'make test' prometheus=promtool prometheus=prometheus \
	  docker-compose=docker-compose chromium=chromium nftables=nft iproute2=ip gcc=gcc \
	  erlang-base=/usr/lib/erlang/bin/erl_call

# The Node publisher of tests/integration/test_other_clients.py (amqplib from the npm registry),
# installed exactly as tests/clients/node/package-lock.json pins it.
NODE_CLIENT := tests/clients/node
node-clients: $(NODE_CLIENT)/node_modules/.package-lock.json
$(NODE_CLIENT)/node_modules/.package-lock.json: $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	npm ci --prefix $(NODE_CLIENT) --no-audit --no-fund --loglevel=error

# After a change to pyproject.toml's dependencies: resolve again, with hashes (uv does it fast).
# UV_VERSION is the installer's own pin: change it here, then make lock.
UV_VERSION := 0.13.8
LOCK_ARGS := --generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu --no-header -q
LOCK_HEADER := \# Exact versions with hashes: make install and the Dockerfile install from these. Regenerate with make lock.
UV_LOCK_HEADER := \# The installer that make demo and make install run (pip installs it with these hashes). Regenerate with make lock.
lock: $(STAMP)
	$(UV) pip compile pyproject.toml $(LOCK_ARGS) -o requirements.lock
	$(UV) pip compile pyproject.toml --extra dev $(LOCK_ARGS) -o requirements-dev.lock
	echo 'uv==$(UV_VERSION)' | $(UV) pip compile - $(LOCK_ARGS) -o requirements-uv.lock
	sed -i '1i $(LOCK_HEADER)' requirements.lock requirements-dev.lock
	sed -i '1i $(UV_LOCK_HEADER)' requirements-uv.lock

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The prometheus-operator component's PrometheusRule, from deploy/prometheus/alerts.yml.
rules: $(STAMP)
	$(BIN)/python -m tests.ops.gen_rules

# Cut the release bulk_recorder.__version__ (docs/compatibility.md): checks the tree is clean and
# the version new, builds the sdist and the wheel into dist/, installs the wheel in a fresh venv
# (compiled, `--version` checked), builds the image and tags v<version>. RELEASE_ARGS=--dry-run
# stops before the tag (tests/integration/test_release.py runs that).
release: $(STAMP)
	bash scripts/release.sh $(RELEASE_ARGS)

# Unit, integration (real RabbitMQ + PostgreSQL) and fault suites in two phases: every test on
# TEST_JOBS workers side by side (pytest-xdist; most tests only wait on the services, each with
# its own database and queues; each rig's tests share one worker), then the tests marked
# `exclusive` (they fault something every test shares or time themselves; a fixed port is a
# `fixed_ports` lock of its own) with no other test beside them: in two lanes, the cluster
# rig's tests on one and every other exclusive test on the other, one at a time each
# (tests/suite_lock.py). Then two fast mutants (a
# different pair each day) that the tests named for their promise must still kill.
# JUNIT=/tmp/suite writes /tmp/suite-side-by-side.xml and /tmp/suite-alone.xml
# (python -m tests.durations reads both).
TEST_JOBS ?= 4
JUNIT ?=
PYTEST := $(BIN)/pytest -q -p no:cacheprovider
SIDE_BY_SIDE = -n $(TEST_JOBS) --dist loadgroup -m "not exclusive" $(if $(JUNIT),--junitxml=$(JUNIT)-side-by-side.xml)
ALONE = -n 2 --dist loadgroup -m exclusive $(if $(JUNIT),--junitxml=$(JUNIT)-alone.xml)
test: system-tools node-clients lint
	$(PYTEST) $(SIDE_BY_SIDE)
	$(PYTEST) $(ALONE)
	$(BIN)/python -m tests.mutants.run --subset 2

# The same two phases with the tests in a shuffled order (pytest-randomly: modules, then the
# tests in each), to find a test that passes only after another. The seed is printed first;
# RANDOM_SEED=N runs that order again.
ifeq ($(RANDOM_SEED),)
RANDOM_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
RANDOMLY = -o addopts=--strict-markers -p no:schemathesis -p randomly --randomly-seed=$(RANDOM_SEED)
test-random: system-tools node-clients lint
	@echo "test-random: RANDOM_SEED=$(RANDOM_SEED)"
	$(PYTEST) $(RANDOMLY) $(SIDE_BY_SIDE)
	$(PYTEST) $(RANDOMLY) $(ALONE)

# The image, built from the Dockerfile and run with podman (tests/image, skipped by plain pytest):
# installs podman, runc and debootstrap if missing, builds the stand-in base image once (no
# registry here: Debian 12 with its Python 3.11, tagged as the Dockerfile's ARG PYTHON_IMAGE),
# builds the image (VERSION from bulk_recorder.__version__) and runs every role from it against
# the local services.
test-image: $(STAMP)
	@bash tests/image/run.sh

# docker-compose.yml up with podman-compose on podman's bridge network (tests/compose): RabbitMQ,
# PostgreSQL and Prometheus from stand-ins built from Debian's packages, Grafana not run.
test-compose: $(STAMP)
	@bash tests/compose/run.sh

# Every mutant in tests/mutants/mutants.py, each on a scratch copy against its promise's tests,
# and those tests unmutated (the baseline, in the same lanes). Ends with "mutants: N killed,
# 0 survived".
# MUTANT_JOBS side by side (their tests mostly wait on the services): the rigs' mutants one at a
# time on one lane, the slow ones first, those with a test marked exclusive after the others
# (tests/mutants/run.py).
MUTANT_JOBS ?= 4
mutants: $(STAMP)
	$(BIN)/python -m tests.mutants.run --baseline --jobs $(MUTANT_JOBS)

test-unit: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

# The main job end to end on the local services: 300,000 records, then a checked summary.
DEMO_COUNT ?= 300000
demo: $(RUNTIME)
	$(BIN)/bulk-recorder demo --count $(DEMO_COUNT)

# The same job through the producer side: API -> outbox -> relay -> queue -> recorder.
demo-api: $(RUNTIME)
	$(BIN)/bulk-recorder demo --via api --count 300000

# Run the recorder in the foreground (Ctrl-C stops it cleanly).
run: $(RUNTIME)
	$(BIN)/bulk-recorder consume

# The standard benchmark set (~10-15 min); tables, raw figures and charts in benchmarks/results.
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.run_all

# The fault suite and the DLQ arrivals with about ten times the records and faults, the decoder's
# differential test on more drawn bodies, and the growth benchmark's quick run (not in make test:
# it proves the benchmark still runs, no promise of the service).
soak: $(STAMP)
	SOAK=1 $(BIN)/pytest -q -p no:cacheprovider tests/faults tests/integration/test_dlq_arrivals.py \
	  tests/unit/test_decode_differential.py tests/integration/test_bench_growth.py

# Every fault in one run, long (tests/cluster/test_all_faults.py; `make test` runs a short one):
# SOAK_SECONDS (240) of traffic for each of SOAK_CLUSTER_RUNS (3) random seeds, or SEED=N
# (or SEED=N,M) to run exactly those. Prints each seed and its schedule first, its report last.
# SHARDS=N (1) runs every role with RABBITMQ_QUEUE_SHARDS=N (the soak's SOAK_SHARDS).
SEED ?=
SHARDS ?= 1
soak-cluster: $(STAMP)
	SOAK_CLUSTER=1 SOAK_SEED=$(SEED) SOAK_SHARDS=$(SHARDS) $(BIN)/pytest -q -s -p no:cacheprovider tests/cluster/test_all_faults.py

# Partitions for real (tests/partitions, root: hosts in network namespaces, nft drops), long:
# the broker-minority scenario under pause_minority and autoheal, the recorder cut from the
# database and from the brokers each way (30-40 s cuts), and the nemesis run for SOAK_SECONDS
# (180) with four faults a minute, for SOAK_PARTITION_RUNS (2) random seeds or SEED=N (or
# SEED=N,M). `make test` runs the short ones (pause_minority, one way of each recorder cut).
# SHARDS=N (1): the nemesis run's roles with RABBITMQ_QUEUE_SHARDS=N.
soak-partitions: $(STAMP) system-tools
	SOAK_PARTITIONS=1 SOAK_SEED=$(SEED) SOAK_SHARDS=$(SHARDS) $(BIN)/pytest -q -s -p no:cacheprovider tests/partitions

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
