# PILOT — the two commands: `make run` and `make test` (and `make bench`).
VENV   ?= .venv
BENCH_VENV := bench/.venv
PY     := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: run test test-sqlite test-main lint check audit bench bench-cleanup bench-admin bench-tracing clean chromium

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

# requirements-dev.txt installs the Python client (clients/python) editable, for tests/client.
$(VENV)/.installed-dev: requirements.txt requirements-dev.txt clients/python/pyproject.toml $(VENV)/.installed
	$(VENV)/bin/pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

## run: web server, workers and dispatcher on SQLite with the ORM broker, on
## 127.0.0.1, port PILOT_PORT (default 8000). Ctrl-C, or SIGINT/SIGTERM to this make,
## stops all within ~10 s: make passes SIGINT on to no one, so run-local watches
## make (PILOT_STOP_WITH) and stops when make is signalled (docs/operations.md).
run: $(VENV)/.installed
	PILOT_STOP_WITH=$$PPID exec bin/run-local

## test: the whole suite. Always on SQLite; then, when DATABASE_URL points at
## PostgreSQL (and REDIS_URL at Redis), everything again there, including the
## races and real-process tests that only PostgreSQL can prove.
test: $(VENV)/.installed-dev chromium lint check test-sqlite test-main

## chromium: Debian's browser, which the admin's browser test drives through Playwright
## (Playwright's own browser download cannot work here), installed when missing.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  sudo=$$( [ "$$(id -u)" -ne 0 ] && echo sudo ); \
	  echo "installing chromium with apt-get"; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium >/dev/null; \
	fi

test-sqlite: $(VENV)/.installed-dev
	env -u DATABASE_URL -u REDIS_URL -u PILOT_REQUIRE_POSTGRES \
		$(PY) -m pytest -m "not postgres and not redis" -q

test-main: $(VENV)/.installed-dev chromium
	@case "$$DATABASE_URL" in \
	  postgres*) $(PY) -m pytest -q ;; \
	  *) echo "DATABASE_URL is not PostgreSQL: PostgreSQL/Redis tests not run (CI runs them)";; \
	esac

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .

check: $(VENV)/.installed-dev
	env -u DATABASE_URL DJANGO_SECRET_KEY=check-only-secret-key-0123456789abcdef \
		$(PY) manage.py makemigrations --check --dry-run
	env -u DATABASE_URL DJANGO_SECRET_KEY=check-only-secret-key-0123456789abcdef \
		$(PY) manage.py check

## audit: pip-audit of the pinned requirements, from a throwaway virtualenv (pip-audit is
## a tool, not a dependency). Needs PyPI's or OSV's vulnerability service.
audit:
	rm -rf .audit-venv && $(PYTHON) -m venv .audit-venv
	.audit-venv/bin/pip install --disable-pip-version-check -q pip-audit
	.audit-venv/bin/pip-audit --strict -r requirements-dev.txt; status=$$?; rm -rf .audit-venv; exit $$status

## bench-cleanup: cleanup_tasks on 100 000 expired tasks and its effect on trigger
## latency (DATABASE_URL must name a PostgreSQL database containing "bench").
bench-cleanup: $(VENV)/.installed-dev
	$(PY) bench/cleanup_latency.py

## bench-admin: the operator console's pages on 100 000 tasks (also part of `make bench`);
## its own database, pilot_bench_admin, on the local PostgreSQL.
bench-admin: $(VENV)/.installed
	DJANGO_SETTINGS_MODULE=bench.settings PILOT_Q_CLUSTER_NAME=pilot-bench-admin \
	DJANGO_SECRET_KEY=bench-only-secret-key-not-for-production-0123456789 \
		$(PY) -m bench.workloads.admin_pages

## bench-tracing: what trace context costs the runner per step, with OpenTelemetry absent,
## unconfigured and recording (docs/tracing.md); in-process, no database.
bench-tracing: $(VENV)/.installed-dev
	$(PY) bench/tracing_overhead.py

$(BENCH_VENV)/.installed: bench/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --disable-pip-version-check -q -r bench/requirements.txt
	touch $@

## bench: PILOT against its baselines (raw django-q2, a bare DRF insert, DBOS,
## Procrastinate) on the local PostgreSQL and Redis, and embedded mode (SQLite next
## to PostgreSQL), ~15 minutes; prints the table and writes bench/results.md.
## BENCH_QUICK=1: short runs, to check the harness. BENCH_ONLY=embedded: that
## section alone, updated in bench/results.md in place.
bench: $(VENV)/.installed $(BENCH_VENV)/.installed
	@command -v wrk >/dev/null || (apt-get update -q && apt-get install -y -q wrk)
	BENCH_QUICK=$(BENCH_QUICK) $(PY) -m bench.run

clean:
	rm -rf $(VENV) db.sqlite3 db.sqlite3-wal db.sqlite3-shm staticfiles
