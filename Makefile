# taskgate — `make run` starts everything, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The job-queue peers of the comparison benchmark live in their own environment, never in .venv.
PEERS_VENV := var/bench-peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed
BENCH_ARGS ?=

.PHONY: run test chaos fuzz bench bench-peers proto proto-check lint clean bytecode hold

# The project's own modules compiled once (incremental: ~0.3 s when nothing changed). Every
# service, CLI call and worker of a run starts a fresh Python; where PYTHONDONTWRITEBYTECODE is
# set (as on this machine) each of them compiled ~300 modules again, ~0.5 s of CPU per start.
SOURCES := libs services gateway_http examples protos/taskgate scripts tests bench
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j0 $(SOURCES) > /dev/null

# The compiled worker hold (services/scheduler/hold/taskgate-hold.c: no C library, x86-64
# Linux). Without a C compiler, or elsewhere, the scheduler holds workers with /bin/sh.
HOLD := services/scheduler/hold/taskgate-hold
HOLD_CFLAGS := -Os -static -nostdlib -ffreestanding -fno-builtin -fno-stack-protector \
	-fno-asynchronous-unwind-tables -fno-pie -no-pie -s -Wall -Wextra -Werror
hold: $(HOLD)
$(HOLD): $(HOLD).c
	@if [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ] && command -v $(CC) >/dev/null 2>&1; then \
		echo "$(CC) $(HOLD_CFLAGS) -o $@ $<"; \
		$(CC) $(HOLD_CFLAGS) -o $@.tmp $< && chmod 755 $@.tmp && mv -f $@.tmp $@; \
	else \
		echo "note: no C compiler for x86-64 Linux here: workers are held by /bin/sh ([tasks] worker_hold)"; \
	fi

# The spawn helper (services/scheduler/hold/taskgate-spawn.c, Linux): starts held workers as
# the scheduler's children. Without it the scheduler spawns them itself ([tasks] worker_spawn).
SPAWN := services/scheduler/hold/taskgate-spawn
SPAWN_CFLAGS := -O2 -Wall -Wextra -Werror
$(SPAWN): $(SPAWN).c
	@if [ "$$(uname -s)" = Linux ] && command -v $(CC) >/dev/null 2>&1; then \
		echo "$(CC) $(SPAWN_CFLAGS) -o $@ $<"; \
		$(CC) $(SPAWN_CFLAGS) -o $@.tmp $< && chmod 755 $@.tmp && mv -f $@.tmp $@; \
	else \
		echo "note: no C compiler here: the scheduler spawns workers itself ([tasks] worker_spawn)"; \
	fi
hold: $(SPAWN)

# (Re)create the environment when the lock or the project metadata changes.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

run: $(STAMP) bytecode $(HOLD) $(SPAWN)
	$(PY) scripts/devrun.py

# Two worker processes, each test file on one of them (its module fixtures start once);
# TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2
test: $(STAMP) bytecode $(HOLD) $(SPAWN)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Kills every service in turn, SIGTERMs the stack, fills the disk (SQLite and PostgreSQL);
# prints its figures. Not part of `make test` (the `chaos` marker is deselected there).
chaos: $(STAMP) bytecode $(HOLD) $(SPAWN)
	$(PY) -m pytest -q -s -m chaos tests/chaos

# The schemathesis fuzz of the REST API, deeper than in `make test` (FUZZ_EXAMPLES per operation
# in its fuzzing phase; the suite uses 12).
FUZZ_EXAMPLES ?= 100
fuzz: $(STAMP) bytecode $(HOLD) $(SPAWN)
	TASKGATE_FUZZ_MAX_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q tests/e2e/test_openapi_fuzz.py

$(PEERS_STAMP): bench/peers/requirements.txt
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	@touch $(PEERS_STAMP)

# Every benchmark, then taskgate next to Huey, procrastinate, Celery and the spawn floor.
bench: $(STAMP) $(PEERS_STAMP) $(HOLD) $(SPAWN)
	$(PY) bench/run_all.py --peers-python $(PEERS_VENV)/bin/python $(BENCH_ARGS)

# The comparison alone (BENCH_ARGS="--quick" for a smoke run, "--only huey,celery" for a subset).
bench-peers: $(STAMP) $(PEERS_STAMP) $(HOLD) $(SPAWN)
	$(PY) bench/compare_peers.py --peers-python $(PEERS_VENV)/bin/python $(BENCH_ARGS)

proto: $(STAMP)
	PYTHON=$(PY) scripts/gen_protos.sh

# Fails when the committed stubs differ from what the .proto files generate.
proto-check: $(STAMP)
	$(PY) -m pytest -q tests/contract/test_generated_code.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy libs services gateway_http bench tests

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache $(HOLD) $(SPAWN)
