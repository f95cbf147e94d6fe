# `make run` and `make test` install everything they need on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP_DEPS    := $(VENV)/.stamp-deps
STAMP_BROWSER := $(VENV)/.stamp-browser
STAMP_AXE     := tests/js/node_modules/.stamp-axe
# The suite runs on this many pytest-xdist workers (docs/decisions/020-test-suite-in-parallel.md);
# on one shared server (DATABASE_URL set), one: tests that hold a transaction open on purpose
# would hold back the others' event reads, PostgreSQL's snapshot horizon being the server's.
TEST_WORKERS  ?= $(if $(DATABASE_URL),1,3)

# Every Python process of the suite reads its modules from bytecode caches (about 1.7 s of
# CPU to start instead of 5); some machines turn their writing off for the whole environment.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-faults test-fast lint typecheck bench install clean

run: install
	$(VENV)/bin/pressroom serve

# The suite but the fault injection (tests/faults/), which `make test-faults` runs; CI runs both.
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1 -m "not faults"

# kill -9, SIGSTOP fencing, cut and slow lines between hosts, PostgreSQL restarts and failover.
test-faults: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1 -m faults

test-fast: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1 -m "not slow and not browser"

install: $(STAMP_DEPS) $(STAMP_BROWSER) $(STAMP_AXE)

# uv installs in seconds what pip takes minutes for; pip remains when uv cannot be had.
$(STAMP_DEPS): pyproject.toml
	@echo "make: installing Pressroom and its dependencies into $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install -q uv && $(PY) -m uv pip install -q --python $(PY) -e '.[test,dev,bench,otlp-grpc]'; } || \
	  { $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e '.[test,dev,bench,otlp-grpc]'; }
	@touch $@
	@echo "make: the pressroom command is in $(VENV)/bin; to have it on your PATH in a new terminal, run: . $(VENV)/bin/activate"

# Beside Chromium: Debian's qpdf, whose command line checks the PDFs the PDF-operation tests
# and bench/pdfops.py make (qpdf --check), installed with apt-get where it can be.
$(STAMP_BROWSER): $(STAMP_DEPS) scripts/install-browser.sh
	@scripts/install-browser.sh $(PY)
	@command -v qpdf >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n") && $$sudo apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends qpdf >/dev/null; } || \
	  echo "make: could not install qpdf; tests/integration/test_pdf_operations.py needs its qpdf --check"
	@touch $@

# axe-core, pinned by tests/js/package-lock.json, which the accessibility tests load into pages.
$(STAMP_AXE): tests/js/package.json tests/js/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is needed for tests/js (axe-core); install Node.js"; exit 1; }
	@cd tests/js && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	@touch $@

lint: install
	$(VENV)/bin/ruff check server clients/python tests bench
	$(VENV)/bin/ruff format --check server clients/python tests bench

typecheck: install
	$(VENV)/bin/mypy

# Every benchmark in turn, printing its figures (docs/performance.md); BENCH_QUICK=1 reduces sizes.
bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pressroom
