# `make run` and `make test` install everything they need on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP_DEPS    := $(VENV)/.stamp-deps
STAMP_BROWSER := $(VENV)/.stamp-browser

.PHONY: run test test-fast lint typecheck bench install clean

run: install
	$(VENV)/bin/pressroom serve

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow and not browser"

install: $(STAMP_DEPS) $(STAMP_BROWSER)

$(STAMP_DEPS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev,bench]'
	touch $@

$(STAMP_BROWSER): $(STAMP_DEPS) scripts/install-browser.sh
	scripts/install-browser.sh $(PY)
	touch $@

lint: install
	$(VENV)/bin/ruff check server tests bench
	$(VENV)/bin/ruff format --check server tests bench

typecheck: install
	$(VENV)/bin/mypy

# Full sizes write docs/performance.md; BENCH_QUICK=1 runs reduced sizes into a temp folder.
bench: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pressroom
