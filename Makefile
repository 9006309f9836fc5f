# PILOT — the two commands: `make run` and `make test` (and `make bench`).
VENV   ?= .venv
BENCH_VENV := bench/.venv
PY     := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: run credentials test test-sqlite test-django6 test-min-versions test-model test-main test-pg-orm-broker mutate mutate-ci lint check audit bench bench-cleanup bench-admin bench-tracing clean chromium promtool ha-packages lock

# Installs come from the lock files: every pin of requirements*.txt with the hash of
# every file PyPI has for it, checked by pip (--require-hashes). `make lock` renews
# them after requirements*.txt changed (tests/deploy/test_lock.py keeps them in step).
$(VENV)/.installed: requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q --require-hashes -r requirements.lock
	touch $@

# The Python client (clients/python) is installed editable, for tests/client; its one
# dependency, httpx, is in the lock.
$(VENV)/.installed-dev: requirements-dev.lock clients/python/pyproject.toml $(VENV)/.installed
	$(VENV)/bin/pip install --disable-pip-version-check -q --require-hashes -r requirements-dev.lock
	$(VENV)/bin/pip install --disable-pip-version-check -q --no-deps -e ./clients/python
	touch $@

# The Django 6 pass's virtualenv (make test-django6), on a Python >= 3.12 that
# bin/python-for-django6 finds (or PYTHON_DJ6); and the minimum-versions one
# (make test-min-versions), on $(PYTHON). Both from their hashed locks, like .venv.
DJ6_VENV := .venv-django6
MIN_VENV := .venv-min
$(DJ6_VENV)/.installed: requirements-django6.lock clients/python/pyproject.toml bin/python-for-django6
	rm -rf $(DJ6_VENV)
	py=$$(PYTHON_DJ6="$(PYTHON_DJ6)" bin/python-for-django6) && $$py -m venv $(DJ6_VENV)
	$(DJ6_VENV)/bin/pip install --disable-pip-version-check -q --require-hashes -r requirements-django6.lock
	$(DJ6_VENV)/bin/pip install --disable-pip-version-check -q --no-deps -e ./clients/python
	touch $@

$(MIN_VENV)/.installed: requirements-min.lock clients/python/pyproject.toml
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/pip install --disable-pip-version-check -q --require-hashes -r requirements-min.lock
	$(MIN_VENV)/bin/pip install --disable-pip-version-check -q --no-deps -e ./clients/python
	touch $@

## lock: requirements.lock and requirements-dev.lock from requirements*.txt, with hashes
## (pip-tools, from a throwaway virtualenv: a tool, not a dependency); then
## requirements-django6.lock (on a Python >= 3.12, bin/python-for-django6) and
## requirements-min.lock: the dev set with the pins of requirements-django6.txt or
## requirements-min.txt in place of theirs (OVERLAY below).
LOCK_COMPILE = pip-compile -q --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links
# OVERLAY: the pins of the first file, then those of requirements.txt and
# requirements-dev.txt whose package the first file does not pin (-r and -e lines
# dropped). Names compare as pip does: lower case, runs of -_. as one -.
OVERLAY = awk 'function name(s) { s = tolower(s); sub(/[=<>~!\[ ].*/, "", s); \
	  gsub(/[-_.]+/, "-", s); return s } \
	NR == FNR { if ($$0 ~ /^[A-Za-z]/) over[name($$0)] = 1; print; next } \
	/^-[re] / { next } !($$0 ~ /^[A-Za-z]/ && (name($$0) in over))'
lock:
	rm -rf .lock-venv .lock-venv-dj6 .lock-work && $(PYTHON) -m venv .lock-venv && mkdir .lock-work
	py=$$(PYTHON_DJ6="$(PYTHON_DJ6)" bin/python-for-django6) && $$py -m venv .lock-venv-dj6
	for v in .lock-venv .lock-venv-dj6; do \
	  $$v/bin/pip install --disable-pip-version-check -q pip-tools==7.6.2 || exit 1; done
	cp requirements.txt .lock-work/ && grep -v '^-e ' requirements-dev.txt > .lock-work/requirements-dev.txt
	for f in django6 min; do \
	  $(OVERLAY) requirements-$$f.txt requirements.txt requirements-dev.txt \
	    > .lock-work/requirements-$$f.txt || exit 1; done
	cd .lock-work && for f in requirements requirements-dev requirements-min; do \
	  ../.lock-venv/bin/$(LOCK_COMPILE) --output-file $$f.lock $$f.txt || exit 1; \
	done
	cd .lock-work && ../.lock-venv-dj6/bin/$(LOCK_COMPILE) \
	  --output-file requirements-django6.lock requirements-django6.txt
	cd .lock-work && mv requirements.lock requirements-dev.lock requirements-django6.lock \
	  requirements-min.lock ..
	rm -rf .lock-venv .lock-venv-dj6 .lock-work

## run: web server, workers and dispatcher on SQLite with the ORM broker, on
## 127.0.0.1, port PILOT_PORT (default 8000). Ctrl-C, or SIGINT/SIGTERM to this make,
## stops all within 7 s: make passes SIGINT on to no one, so run-local watches
## make (PILOT_STOP_WITH) and stops when make is signalled (docs/operations.md).
run: $(VENV)/.installed
	PILOT_STOP_WITH=$$PPID exec bin/run-local

## credentials: print again the admin password and API token `make run` keeps
## (next to db.sqlite3, 0600; docs/operations.md).
credentials: $(VENV)/.installed
	DJANGO_DEBUG=true $(VENV)/bin/python manage.py local_credentials

## test: the whole suite. Always on SQLite; then, when DATABASE_URL points at
## PostgreSQL (and REDIS_URL at Redis), everything again there, including the
## races and real-process tests that only PostgreSQL can prove.
test: $(VENV)/.installed-dev chromium promtool ha-packages lint check test-sqlite test-django6 \
	test-min-versions test-main mutate-ci

## chromium: Debian's browser, which the admin's browser test drives through Playwright
## (Playwright's own browser download cannot work here), installed when missing.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  sudo=$$( [ "$$(id -u)" -ne 0 ] && echo sudo ); \
	  echo "installing chromium with apt-get"; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium >/dev/null; \
	fi

## ha-packages: Debian's patroni and etcd-server, with which tests/ha runs a real
## three-node PostgreSQL cluster and fails it over (docs/operations.md, "High
## availability"); installed when missing. If apt cannot, tests/ha fails and says so.
ha-packages:
	@if ! command -v patroni >/dev/null || ! command -v etcd >/dev/null; then \
	  sudo=$$( [ "$$(id -u)" -ne 0 ] && echo sudo ); \
	  echo "installing patroni and etcd-server with apt-get (for tests/ha)"; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $$sudo apt-get install -y -qq --no-install-recommends patroni etcd-server >/dev/null \
	  || echo "patroni/etcd-server could not be installed: tests/ha will fail"; \
	fi

## promtool: Debian's Prometheus tools, with which tests/deploy checks and unit-tests the
## alert rules (deploy/prometheus); installed when missing. If apt cannot, the test
## falls back to its structural checks and says so.
promtool:
	@if ! command -v promtool >/dev/null; then \
	  sudo=$$( [ "$$(id -u)" -ne 0 ] && echo sudo ); \
	  echo "installing promtool (Debian package prometheus) with apt-get"; \
	  ( $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $$sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null ) \
	  || echo "promtool could not be installed: tests/deploy checks the rules structurally only"; \
	fi

## TEST_WORKERS: pytest-xdist processes per pass (default 2; 0 runs in this process).
## A test file (or test class) stays on one worker (--dist loadscope: its fixtures and the processes it
## starts are set up once); each worker has its own test database and queue
## (tests/settings.py). docs/testing.md, "Where the time goes", says what it buys.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope,)
## PG_TEST_WORKERS: the PostgreSQL pass's workers (default 3: its tests wait on real
## processes, leases and sockets more than they compute, so a third worker on two cores
## still shortens it; .ci/run allows the connections that takes).
PG_TEST_WORKERS ?= $(if $(filter 0,$(TEST_WORKERS)),0,3)
PG_XDIST = $(if $(filter-out 0,$(PG_TEST_WORKERS)),-n $(PG_TEST_WORKERS) --dist loadscope,)
## The host project installs the wheel into a new virtualenv; the Django 6 pass runs it
## on SQLite and the PostgreSQL pass on PostgreSQL, so the SQLite pass leaves it out.
SQLITE_SKIP = --ignore=tests/host_project

test-sqlite: $(VENV)/.installed-dev
	env -u DATABASE_URL -u REDIS_URL -u PILOT_REQUIRE_POSTGRES \
		$(PY) -m pytest -m "not postgres and not redis" -q $(XDIST) --durations=25 $(SQLITE_SKIP)

CHECK_KEY = DJANGO_SECRET_KEY=check-only-secret-key-not-for-production-0123456789abcdef
CHECK_ENV = env -u DATABASE_URL $(CHECK_KEY)

## test-django6: what differs between Django versions, again on the newest Django 6.x
## (requirements-django6.txt, on the Python >= 3.12 that bin/python-for-django6 finds;
## PYTHON_DJ6=... to choose): `check` and `makemigrations --check` with warnings as
## errors, every migration applied to an empty SQLite database and unapplied to zero,
## then on SQLite the tests of what Django draws or routes -- settings checks, models,
## commands, the admin (its pages and the browser), the API's doors and schema, the task
## backend on django.tasks (tests/django_tasks, docs/django-tasks.md's examples) -- and the
## host project, which installs the wheel with Django 6. docs/testing.md, "Where the time goes", has its time.
DJ6_PY := $(DJ6_VENV)/bin/python
DJ6_TESTS := tests/unit tests/models tests/commands tests/host_project \
	tests/admin/test_tasks.py tests/admin/test_task_page.py tests/admin/test_dashboard.py \
	tests/admin/test_console_pages.py tests/admin/test_actions.py tests/admin/test_guard.py \
	tests/admin/test_browser.py \
	tests/api/test_trigger.py tests/api/test_tasks.py tests/api/test_schema.py \
	tests/api/test_embedding.py tests/api/test_access.py tests/api/test_tokens.py \
	tests/django_tasks tests/docs/test_django_tasks_page.py
test-django6: $(DJ6_VENV)/.installed chromium
	@$(DJ6_PY) -c 'import django, sys; print("Django", django.__version__, "on Python", sys.version.split()[0])'
	$(CHECK_ENV) $(DJ6_PY) -W error manage.py check
	$(CHECK_ENV) $(DJ6_PY) -W error manage.py makemigrations --check --dry-run
	db=$$(mktemp -d) && trap 'rm -rf "$$db"' EXIT && \
	  env DATABASE_URL=sqlite:///$$db/db.sqlite3 $(CHECK_KEY) \
	    $(DJ6_PY) -W error manage.py migrate -v0 && \
	  env DATABASE_URL=sqlite:///$$db/db.sqlite3 $(CHECK_KEY) \
	    $(DJ6_PY) -W error manage.py migrate workflows zero -v0
	env -u DATABASE_URL -u REDIS_URL -u PILOT_REQUIRE_POSTGRES \
		$(DJ6_PY) -m pytest -m "not postgres and not redis" -q $(XDIST) --durations=10 $(DJ6_TESTS)

## test-min-versions: the engine and the API's smoke tests on SQLite with every
## dependency at the lower bound pyproject.toml declares (requirements-min.txt: Django
## 5.2.0, DRF 3.15.0, croniter 6.0.0, django-q2 1.10.0, ...), on $(PYTHON). ~1 minute.
MIN_TESTS := tests/engine/test_triggers.py tests/engine/test_runner.py \
	tests/engine/test_enqueue.py tests/engine/test_schedules.py tests/engine/test_leases.py \
	tests/api/test_trigger.py tests/api/test_tasks.py tests/api/test_schema.py \
	tests/unit/test_cron.py
test-min-versions: $(MIN_VENV)/.installed
	@$(MIN_VENV)/bin/python -c 'import django, rest_framework, django_q, croniter, sys; \
	  print("Django", django.__version__, "DRF", rest_framework.VERSION, "on Python", sys.version.split()[0])'
	env -u DATABASE_URL -u REDIS_URL -u PILOT_REQUIRE_POSTGRES \
		$(MIN_VENV)/bin/python -m pytest -m "not postgres and not redis" -q $(XDIST) --durations=10 \
		$(MIN_TESTS)

MODEL_TEST := tests/faults/test_engine_model.py

## test-model: the engine model alone on PostgreSQL (PILOT_MODEL_EXAMPLES, 1 200 by
## default, in four parts on TEST_WORKERS workers; make test runs it inside the
## PostgreSQL pass). docs/testing.md, "Where the time goes", has the suite's split.
test-model: $(VENV)/.installed-dev
	@case "$$DATABASE_URL" in \
	  postgres*) $(PY) -m pytest -q $(XDIST) $(MODEL_TEST) ;; \
	  *) echo "DATABASE_URL is not PostgreSQL: the engine model runs in the SQLite pass only";; \
	esac

## test-main: everything on PostgreSQL (and Redis). Without a PostgreSQL DATABASE_URL
## it says so and succeeds -- unless PILOT_REQUIRE_POSTGRES=1 (CI, .ci/run), where not
## running the PostgreSQL tests is a failure, not a pass.
test-main: $(VENV)/.installed-dev chromium ha-packages
	@case "$$DATABASE_URL" in \
	  postgres*) $(PY) -m pytest -q $(PG_XDIST) --durations=40 ;; \
	  *) if [ "$${PILOT_REQUIRE_POSTGRES:-}" = 1 ]; then \
	       echo "PILOT_REQUIRE_POSTGRES=1 but DATABASE_URL is not PostgreSQL: PostgreSQL/Redis tests cannot run" >&2; \
	       exit 1; \
	     fi; \
	     echo "DATABASE_URL is not PostgreSQL: PostgreSQL/Redis tests not run (CI runs them)";; \
	esac

## test-pg-orm-broker: the engine, windows and concurrency tests on PostgreSQL with the ORM
## broker (REDIS_URL unset: messages are rows in the same database, written in the
## trigger's transaction) -- the combination `make test` does not run (it runs
## SQLite+ORM and PostgreSQL+Redis). ~4 minutes; not part of `make test`.
test-pg-orm-broker: $(VENV)/.installed-dev
	@case "$$DATABASE_URL" in postgres*) ;; \
	  *) echo "test-pg-orm-broker needs DATABASE_URL=postgres://..." >&2; exit 1;; esac
	env -u REDIS_URL -u PILOT_REQUIRE_POSTGRES \
		$(PY) -m pytest -q -m "not redis and not slow" tests/engine tests/windows tests/concurrency

## mutate: the mutation check (docs/testing.md): every deliberate engine bug of
## tests/mutations/run.py, one at a time, each in a `git archive HEAD` copy (the
## working tree is never written), each against its named tests on PostgreSQL and
## Redis (DATABASE_URL, REDIS_URL), two at a time; prints mutant -> killed? ->
## caught by, and fails if any survives. ~4 minutes.
## mutate-ci: its CI subset (a mutant or more per promise, ~2 minutes), part of
## `make test` when DATABASE_URL is PostgreSQL (and required with PILOT_REQUIRE_POSTGRES=1).
mutate: $(VENV)/.installed-dev
	$(PY) -m tests.mutations.run

mutate-ci: $(VENV)/.installed-dev
	@case "$$DATABASE_URL" in \
	  postgres*) $(PY) -m tests.mutations.run --ci ;; \
	  *) if [ "$${PILOT_REQUIRE_POSTGRES:-}" = 1 ]; then \
	       echo "PILOT_REQUIRE_POSTGRES=1 but DATABASE_URL is not PostgreSQL: the mutation check cannot run" >&2; \
	       exit 1; \
	     fi; \
	     echo "DATABASE_URL is not PostgreSQL: the mutation check is not run (CI runs it)";; \
	esac

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	env -u DATABASE_URL DJANGO_DEBUG=true $(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
## (lint: ruff, mypy -- strict on workflows/engine and workflows/models -- and the
## layers contract, lint-imports; all configured in pyproject.toml. mypy's Django
## plugin imports the settings: DJANGO_DEBUG=true stands in for a secret key.)

check: $(VENV)/.installed-dev
	env -u DATABASE_URL DJANGO_SECRET_KEY=check-only-secret-key-not-for-production-0123456789abcdef \
		$(PY) manage.py makemigrations --check --dry-run
	env -u DATABASE_URL DJANGO_SECRET_KEY=check-only-secret-key-not-for-production-0123456789abcdef \
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

## bench-scale: the console, /metrics, triggers, claims and cleanup with a day of retained
## history at each SIZE (comma-separated: 0.1M,1M,10M; 10 M fills for ~15 min and needs
## ~25 GB); its own database, pilot_bench_scale, dropped after each size. Section 12 of
## bench/results.md.
SIZE ?= 0.1M,1M
.PHONY: bench-scale
bench-scale: $(VENV)/.installed-dev
	$(PY) -m bench.scale $(SIZE)

## bench-admin: the operator console's pages on 100 000 tasks (also part of `make bench`);
## its own database, pilot_bench_admin, on the local PostgreSQL.
bench-admin: $(VENV)/.installed
	DJANGO_SETTINGS_MODULE=bench.settings PILOT_Q_CLUSTER_NAME=pilot-bench-admin \
	DJANGO_SECRET_KEY=bench-only-secret-key-not-for-production-0123456789 \
		$(PY) -m bench.workloads.admin_pages

## bench-recovery: seconds from a SIGKILL of the whole worker group, tasks running, to
## the dispatcher's `recover` and to the next claim, on the database's clock (audit rows'
## `at`); real qcluster and run_dispatcher processes (bench/kill_recovery.py). Needs
## DATABASE_URL (PostgreSQL; migrated, its tasks left for inspection), REDIS_URL if
## Redis. ~1 minute. The fault test asserts the behaviour; this measures the time.
.PHONY: bench-recovery
bench-recovery: $(VENV)/.installed-dev
	$(PY) bench/kill_recovery.py

## bench-failover: time to resume after a PostgreSQL failover, p50 and max over KILLS
## (default 5) kills of the primary's machine in a real Patroni cluster of its own
## (tests/support/patroni.py; free loopback ports, a temporary directory) under trigger
## load through gunicorn, on BROKER (orm, default, or redis: needs REDIS_URL)
## (bench/failover.py). ~3 minutes. tests/ha asserts the behaviour; this measures the time.
.PHONY: bench-failover
KILLS ?= 5
BROKER ?= orm
bench-failover: $(VENV)/.installed-dev ha-packages
	$(PY) bench/failover.py --kills $(KILLS) --broker $(BROKER)

## bench-fold: the dispatcher folding a backlog of 200 000 replay rows, in one statement a
## batch (PostgreSQL store) against a transaction a group (the portable store, as before);
## its own database, pilot_bench_fold, on the local PostgreSQL. ~3 minutes.
.PHONY: bench-fold
bench-fold: $(VENV)/.installed-dev
	DATABASE_URL=$${BENCH_FOLD_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/pilot_bench_fold} \
		$(PY) bench/fold_backlog.py

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
## to PostgreSQL), ~25 minutes; prints the table and writes bench/results.md.
## BENCH_QUICK=1: short runs, to check the harness. BENCH_ONLY=embedded (or
## BENCH_ONLY=metrics: /metrics after 10 000 worker recycles, ~1.5 min; or
## BENCH_ONLY=waiting: parked tasks, signals, timers, ~4 min): that section
## alone, updated in bench/results.md in place.
bench: $(VENV)/.installed $(BENCH_VENV)/.installed
	@command -v wrk >/dev/null || (apt-get update -q && apt-get install -y -q wrk)
	BENCH_QUICK=$(BENCH_QUICK) $(PY) -m bench.run

clean:
	rm -rf $(VENV) $(DJ6_VENV) $(MIN_VENV) db.sqlite3 db.sqlite3-wal db.sqlite3-shm staticfiles
