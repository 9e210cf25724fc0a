# taskgate — `make run` starts everything, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The job-queue peers of the comparison benchmark live in their own environment, never in .venv.
PEERS_VENV := var/bench-peers-venv
PEERS_STAMP := $(PEERS_VENV)/.installed
BENCH_ARGS ?=

.PHONY: run test chaos test-fast bench bench-peers proto proto-check lint clean

# (Re)create the environment when the lock or the project metadata changes.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

run: $(STAMP)
	$(PY) scripts/devrun.py

test: $(STAMP)
	$(PY) -m pytest -q

# Kills every service in turn, SIGTERMs the stack, fills the disk (SQLite and PostgreSQL);
# prints its figures. Not part of `make test` (the `chaos` marker is deselected there).
chaos: $(STAMP)
	$(PY) -m pytest -q -s -m chaos tests/chaos

$(PEERS_STAMP): bench/peers/requirements.txt
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	@touch $(PEERS_STAMP)

# Every benchmark, then taskgate next to Huey, procrastinate, Celery and the spawn floor.
bench: $(STAMP) $(PEERS_STAMP)
	$(PY) bench/run_all.py --peers-python $(PEERS_VENV)/bin/python $(BENCH_ARGS)

# The comparison alone (BENCH_ARGS="--quick" for a smoke run, "--only huey,celery" for a subset).
bench-peers: $(STAMP) $(PEERS_STAMP)
	$(PY) bench/compare_peers.py --peers-python $(PEERS_VENV)/bin/python $(BENCH_ARGS)

proto: $(STAMP)
	PYTHON=$(PY) scripts/gen_protos.sh

# Fails when the committed stubs differ from what the .proto files generate.
proto-check: $(STAMP)
	$(PY) -m pytest -q tests/contract/test_generated_code.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy libs services gateway_http

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
