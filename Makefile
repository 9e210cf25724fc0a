# taskgate — `make run` starts everything, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test chaos test-fast bench proto proto-check lint clean

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

bench: $(STAMP)
	$(PY) bench/run_all.py

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
