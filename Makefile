# Entry points (see README Quick start): `make audit` and `make test`.
# Both set up a virtual environment in .venv with every extra, at the versions the suite is known to
# pass with (constraints.txt), and fetch the pinned corpus into the cache first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints.txt
# mypy's targets. The goal is the whole package (`make lint MYPY_TARGETS=`, configured in pyproject.toml);
# until it is clean, the modules that are, listed (imports followed silently). Add a module once clean.
MYPY_TARGETS ?= --follow-imports=silent tmplkit/__init__.py tmplkit/__main__.py tmplkit/analysis/__init__.py \
	tmplkit/analysis/_analyzer.py tmplkit/atomic.py tmplkit/auditing.py tmplkit/cli/__init__.py \
	tmplkit/cli/__main__.py tmplkit/cli/_audit.py tmplkit/cli/_common.py tmplkit/cli/_corpus.py \
	tmplkit/cli/_replay.py tmplkit/cli/_serve.py tmplkit/cli/_session.py tmplkit/cli/_show.py \
	tmplkit/cli/_spans.py tmplkit/cli/_turns.py tmplkit/compile_cache.py tmplkit/config.py \
	tmplkit/conversation.py tmplkit/corpus.py tmplkit/delimiters.py tmplkit/engine_parity.py tmplkit/errors.py \
	tmplkit/gguf_meta.py tmplkit/isolate.py tmplkit/jsonio.py tmplkit/llama_server.py tmplkit/prefill/__init__.py \
	tmplkit/prefill/checkpoints.py tmplkit/prefill/models.py tmplkit/prefill/prompt.py tmplkit/prefill/replay.py \
	tmplkit/prefill/report.py tmplkit/prefill/session.py tmplkit/prefill/tinymodel.py tmplkit/sources.py \
	tmplkit/spans.py tmplkit/static_scan.py tmplkit/token_delims.py tmplkit/tokenize.py tmplkit/turns/__init__.py \
	tmplkit/turns/cost.py tmplkit/turns/formats.py tmplkit/turns/simulation.py tmplkit/turns/summary.py

.PHONY: setup audit test lint llama-server test-latest constraints install-check clean

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[all]'
	touch $@

setup: $(BIN)/.installed
	$(BIN)/tmplkit corpus fetch

# The two corpus templates that cannot pass (reasons in the file) are carried as expected failures,
# as a CI gate would carry them.
audit: setup
	$(BIN)/tmplkit audit fixtures/templates corpus:llama.cpp --tokenizer auto \
		--expected-failures tests/corpus_expected_failures.json
	$(BIN)/tmplkit table fixtures/templates corpus:llama.cpp

test: setup
	$(BIN)/python -m pytest -q -ra

lint: $(BIN)/.installed
	$(BIN)/ruff check
	$(BIN)/mypy $(MYPY_TARGETS)

# llama-server from the same pinned llama.cpp, for the end-to-end tests and the prefill benchmark;
# built once into the cache (minutes on 2 cores), instant when already built.
llama-server: $(BIN)/.installed
	PYTHON=$(BIN)/python bash scripts/build_llama_server.sh

# The suite against the newest release of every dependency (not pinned): run before raising
# constraints.txt, or to see what an upstream release breaks. A separate venv: .venv-latest.
test-latest:
	$(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade pip
	.venv-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[all]'
	.venv-latest/bin/tmplkit corpus fetch
	.venv-latest/bin/python -m pytest -q -ra

# Rewrite constraints.txt from what .venv has installed (after a passing test run).
constraints: $(BIN)/.installed
	$(BIN)/python .ci/freeze_constraints.py > $(CONSTRAINTS)

# What a user gets from `pip install .`: the core, Python-only wheels, nothing compiled.
install-check:
	rm -rf .venv-install-check
	$(PYTHON) -m venv .venv-install-check
	.venv-install-check/bin/python -m pip install -q .
	.venv-install-check/bin/tmplkit audit fixtures/templates

clean:
	rm -rf $(VENV) .venv-latest .venv-install-check .pytest_cache .hypothesis
