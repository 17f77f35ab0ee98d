# The two commands a new user needs: `make demo` and `make test`; `make check` is the
# quick one to run while changing code.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PG_TEST_DSN ?= postgresql://root@127.0.0.1:5432/test
# axe-core (the accessibility checker the browser tests inject), from the npm registry.
# One directory per version, so a new pin installs on the next `make test`.
AXE_VERSION := 4.14.1
AXE := $(VENV)/axe-$(AXE_VERSION)/node_modules/axe-core/axe.min.js

.PHONY: venv demo test check lint bench bench-gap bench-reconcile bench-daemon bench-console bench-volume bench-mcp soak clean check-python

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' || { \
	  echo "OpenOnce needs Python 3.12 or newer; '$(PYTHON)' is $$($(PYTHON) --version 2>&1)."; \
	  echo "With pyenv, the project's .python-version selects 3.12; or run: make PYTHON=python3.12 ..."; \
	  exit 1; }

$(VENV)/.installed: pyproject.toml | check-python
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m examples.demo

# The browser tests drive Debian's Chromium; nothing downloads a browser.
/usr/bin/chromium:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
	  echo "The browser tests need Debian's Chromium: sudo apt-get install chromium"; exit 1; \
	fi

# The deployment test (tests/deploy/test_stack.py) puts Debian's Caddy in front of
# gunicorn, as docker-compose.yml does; nothing downloads a binary of its own.
/usr/bin/caddy:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq caddy; \
	else \
	  echo "The deployment tests need Debian's Caddy: sudo apt-get install caddy"; exit 1; \
	fi

# The pgbouncer tests (tests/core/test_pgbouncer.py) start Debian's pgbouncer, in
# transaction pool mode, in front of the test Postgres; they never use the system service.
/usr/sbin/pgbouncer:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer; \
	else \
	  echo "The pgbouncer tests need Debian's pgbouncer: sudo apt-get install pgbouncer"; exit 1; \
	fi

# The alert rules' unit tests (tests/deploy/test_ops_defaults_alerts.py) run Debian's promtool.
/usr/bin/promtool:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; \
	else \
	  echo "The alert rule tests need Debian's promtool: sudo apt-get install prometheus"; exit 1; \
	fi

$(AXE):
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; \
	  else echo "The accessibility tests need npm: sudo apt-get install npm"; exit 1; fi; }
	npm install --silent --no-save --no-package-lock --no-audit --no-fund \
	  --prefix $(VENV)/axe-$(AXE_VERSION) axe-core@$(AXE_VERSION)

test: venv /usr/bin/chromium /usr/bin/caddy /usr/sbin/pgbouncer /usr/bin/promtool $(AXE)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	OPENONCE_TEST_PG=$(PG_TEST_DSN) OPENONCE_DATABASE=$(PG_TEST_DSN) $(PY) -m pytest -q

# Feedback in under a minute, on a machine with nothing but Python: ruff, mypy and the tests
# that need no Postgres, browser, Celery/Redis stack, Caddy, pgbouncer or promtool, start
# no child processes and are not slow (tests/conftest.py marks them). The database variables name a port where
# nothing listens, so a test that reaches for Postgres anyway fails instead of passing
# on a server that happens to run here. pytest's last lines say how many it left out.
# The tests run in CHECK_WORKERS processes (pytest-xdist; most of their time is spent
# waiting on sockets and timeouts, not computing): `make check CHECK_WORKERS=4` on a
# bigger machine, CHECK_WORKERS=0 for one process. PYTHONDONTWRITEBYTECODE is emptied for
# pytest: without the bytecode caches (in __pycache__, git-ignored) each worker rewrites
# and compiles every test module again, about 15 s of a core per run.
CHECK_MARKERS := not slow and not postgres and not browser and not stack and not process
CHECK_WORKERS ?= 2
NO_PG := postgresql://make-check@127.0.0.1:9/make-check-uses-no-postgres
check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	OPENONCE_TEST_PG=$(NO_PG) OPENONCE_DATABASE=$(NO_PG) PYTHONDONTWRITEBYTECODE= \
	  $(PY) -m pytest -q -n $(CHECK_WORKERS) -m "$(CHECK_MARKERS)"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: venv
	OPENONCE_BENCH_PG=$(PG_TEST_DSN) $(PY) bench/hotpath.py

bench-gap: venv
	OPENONCE_BENCH_PG=$(PG_TEST_DSN) $(PY) bench/ledger_gap.py

bench-reconcile: venv
	OPENONCE_BENCH_PG=$(PG_TEST_DSN) $(PY) bench/reconcile.py

bench-daemon: venv
	OPENONCE_BENCH_PG=$(PG_TEST_DSN) $(PY) bench/daemon.py

bench-console: venv
	OPENONCE_BENCH_PG=$(PG_TEST_DSN) $(PY) bench/console.py

bench-volume: venv
	OPENONCE_BENCH_PG=$(PG_TEST_DSN) $(PY) bench/volume.py

# The MCP gateway's added latency per call against the upstream called directly (issue 22).
bench-mcp: venv
	OPENONCE_BENCH_PG=$(PG_TEST_DSN) $(PY) bench/mcp.py

# The nemesis soak (bench/soak.py, bench/README.md): agents, the reconciler and a person
# under seeded faults, then the provider's record checked against the ledger. Exit 1 on any
# violation. `make soak DURATION=3600` soaks an hour; FAULTS=all|kill,stop,... picks faults.
DURATION ?= 120
SEED ?= 1
STORE ?= both
FAULTS ?= default
soak: venv
	OPENONCE_TEST_PG=$(PG_TEST_DSN) $(PY) bench/soak.py --duration $(DURATION) --seed $(SEED) \
	  --store $(STORE) --faults $(FAULTS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
