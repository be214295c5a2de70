# Entry points (see README Quick start): `make audit` and `make test`.
# `make audit` sets up .venv with the Python-only parts (no compiler: the core and the tokenizers
# package, which reads the corpus's BPE vocabularies, tmplkit/tokens/gguf_vocab.py), fetches the pinned
# llama.cpp corpus and audits; `make test` adds every extra (llama-cpp-python compiles) and the
# Hub corpus. Both install at the versions the suite is known to pass with (constraints.txt).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS ?= constraints.txt
# mypy's targets: the whole package (clean; configured in pyproject.toml).
MYPY_TARGETS ?= tmplkit

.PHONY: setup setup-core audit test lint docs llama-server test-latest constraints install-check quickstart-check clean

$(BIN)/.installed-core: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c $(CONSTRAINTS) -e '.[vocab]'
	touch $@

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[all]'
	touch $@ $(BIN)/.installed-core

setup-core: $(BIN)/.installed-core
	$(BIN)/tmplkit corpus fetch

setup: $(BIN)/.installed
	$(BIN)/tmplkit corpus fetch
	$(BIN)/tmplkit corpus fetch hub

# The corpus template that cannot pass and the fixtures' deliberate failures (reasons in the
# files) are carried as expected failures, as a CI gate would carry them. Without llama-cpp-python
# the templates whose vocabulary only llama.cpp reads get no token round trip (the audit says which).
# It prints the audit on one screen (what was and was not checked, in counts); the whole report, a
# line per template, goes to build/audit.txt and the delimiter table to build/delimiters.md.
EXPECTED := --expected-failures tests/corpus_expected_failures.json --expected-failures fixtures/expected_failures.json
audit: setup-core
	@mkdir -p build
	$(BIN)/tmplkit audit fixtures/templates corpus:llama.cpp --tokenizer auto $(EXPECTED) \
		--format summary --report text:build/audit.txt
	$(BIN)/tmplkit table fixtures/templates corpus:llama.cpp $(EXPECTED) -q -o build/delimiters.md
	@echo "the whole report: build/audit.txt; the delimiter table: build/delimiters.md"

test: setup
	$(BIN)/python -m pytest -q -ra

lint: $(BIN)/.installed
	$(BIN)/ruff check
	$(BIN)/mypy $(MYPY_TARGETS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict: any warning fails the build, e.g. a
# link to a missing page or anchor.
docs: $(BIN)/.installed
	$(BIN)/mkdocs build --strict -d site

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

# The Quick start's first command timed on a fresh clone of HEAD, from nothing (no venv, an empty
# corpus cache, no pip cache); fails over 120 s. The result: scripts/results/quickstart.json.
quickstart-check:
	$(PYTHON) scripts/quickstart_check.py --json scripts/results/quickstart.json

clean:
	rm -rf $(VENV) .venv-latest .venv-install-check .pytest_cache .hypothesis site
