# The README's two commands are the contract: `make serve` and `make test`.
# Everything builds on .venv/, created from the Python 3 on PATH (3.10+).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv serve test lint bench reliability clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The embedded default: data in ./data, 50 state partitions, 127.0.0.1:9095.
serve: venv
	$(BIN)/sharecoord serve

# pytest exits 5 when it collected nothing; a suite that ran nothing is not green.
test: venv
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5); treating that as a failure" >&2; exit 1; fi; \
	exit $$rc

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check protocol persistence client spark_jobs
	$(BIN)/mypy

bench: venv
	$(BIN)/python -m bench

reliability: venv
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
