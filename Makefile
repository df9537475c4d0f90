# The README's two commands are the contract: `make serve` and `make test`.
# Everything builds on .venv/, created from the Python 3 on PATH (3.10+).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
SERVE_ARGS ?=

# Two installs, a stamp each, both older than pyproject.toml once it changes: `make
# serve` needs only the daemon's dependencies; the other targets also need the dev tools
# and the spark extra (pyspark, matplotlib). The full install covers the lean one, so it
# renews both stamps; after a lean one, the full one still runs.
CORE_STAMP := $(VENV)/.installed-core
DEV_STAMP  := $(VENV)/.installed-dev

.PHONY: venv serve test lint openapi bench reliability clean kafka-peer compiled pure

venv: $(DEV_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(CORE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	@touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	@touch $@ $(CORE_STAMP)

# The embedded default: data in ./data, 50 state partitions, 127.0.0.1:9095.
serve: $(CORE_STAMP)
	$(BIN)/sharecoord serve $(SERVE_ARGS)

# Apache Kafka's broker (kafka_peer/pom.xml), which the differential tests and the bench
# run beside sharecoord: its jars are copied into kafka_peer/cache once (Java 17 and
# Maven needed; one line and exit 1 when either, or the repository, is missing).
kafka-peer: $(DEV_STAMP)
	@$(BIN)/python -m kafka_peer fetch

# pytest exits 5 when it collected nothing; a suite that ran nothing is not green.
# The PostgreSQL store's tests need PostgreSQL's server binaries (.ci/run installs them).
# Then the compiled pass (tests/compiled.py): the conformance and model tests and the
# daemon over both transports again, with the request path built by mypyc in a copy of
# the tree (skipped, saying so, where there is no C compiler).
test: $(DEV_STAMP) kafka-peer
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	echo "make test: no PostgreSQL found, so its tests will fail: apt-get install postgresql (Debian), as .ci/run does" >&2
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5); treating that as a failure" >&2; exit 1; fi; \
	$(BIN)/python -m tests.compiled; crc=$$?; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	exit $$crc

# The optional compiled mode (server/native.py): the request path's modules built by
# mypyc beside their source, which Python then imports instead; `make pure` removes
# them. `serve` refuses a build older than its source.
compiled: $(DEV_STAMP)
	$(BIN)/python -m server.native build

pure: | $(BIN)/python
	$(BIN)/python -m server.native remove

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check protocol persistence client spark_jobs kafka_peer
	$(BIN)/mypy

# openapi.yaml is generated from the schema declarations and the route table; a test
# fails while it is stale. Written aside first, so a failed run leaves the file whole.
openapi: $(DEV_STAMP)
	$(BIN)/python -m server.http.openapi > openapi.yaml.tmp || { rm -f openapi.yaml.tmp; exit 1; }
	mv openapi.yaml.tmp openapi.yaml

# The compiled mode's figures (bench/compiled.py builds it for the run and removes it
# after; pure Python where there is no C compiler). BENCH_ARGS: `python -m bench`'s.
BENCH_ARGS ?=
bench: $(DEV_STAMP) kafka-peer
	$(BIN)/python -m bench.compiled $(BENCH_ARGS)

reliability: $(DEV_STAMP) kafka-peer
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The settings tables of the Markdown files (between <!-- settings:NAME:begin --> and
# <!-- settings:NAME:end -->) are generated from the declarations in server/config/; a
# test fails while one is stale. Each file is written aside first, like openapi.yaml.
SETTINGS_DOCS = $(shell grep -l -- '<!-- settings:.*:begin -->' README.md docs/*.md)

.PHONY: docs
docs: $(CORE_STAMP)
	@for doc in $(SETTINGS_DOCS); do \
		$(BIN)/python -m server.config $$doc > $$doc.tmp || { rm -f $$doc.tmp; exit 1; }; \
		mv $$doc.tmp $$doc; echo "regenerated the settings tables of $$doc"; \
	done
