# Two entry points (see README Quick start): `make audit` and `make test`.
# Both set up a virtual environment in .venv and fetch the pinned corpus into the cache first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup audit test clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[all]'
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

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
