"""Settings for the test run: production settings plus test-only defaults.

Tests run with DEBUG off, like production; only the secret key and the queue
name get defaults here (the queue name keeps the suite's messages apart from a
local `make run` on the same broker). Everything else comes from the
environment exactly as in production, so DATABASE_URL and REDIS_URL decide
which servers the suite talks to.
"""

import os

os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-secret-key-not-for-production-0123456789")
# `make test` runs the suite on pytest-xdist workers (docs/testing.md): each worker
# gets its own queue, as it gets its own test database, so one worker's processes never
# take another's messages. The processes a test starts inherit the name.
# (The workers inherit the environment of pytest's main process, which read these
# settings first: the suffix is added here, once, not by a default.)
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_QUEUE = os.environ.get("PILOT_Q_CLUSTER_NAME", "pilot-test")
if _XDIST_WORKER and not _QUEUE.endswith(f"-{_XDIST_WORKER}"):
    _QUEUE = f"{_QUEUE}-{_XDIST_WORKER}"
os.environ["PILOT_Q_CLUSTER_NAME"] = _QUEUE
# In-process tests drive one delivery at a time (run_task runs the task it names, then
# returns); the worker processes the suite starts drain the queue as in production.
os.environ.setdefault("PILOT_TEST_DRAIN_SECONDS", "0")
# The demo workflows are the suite's fixtures (and those of the processes it starts).
os.environ.setdefault("PILOT_DEMO_WORKFLOWS", "true")
# The suite scrapes /metrics without a token (in-process and from the processes it
# starts); tests/observability/test_metrics.py proves the closed default.
os.environ.setdefault("PILOT_METRICS_PUBLIC", "true")
# Fair shares: most tests run several tasks of one client at once on purpose (races,
# recoveries, kills), so the suite runs without the per-client cap unless a test asks
# for it: tests/engine/test_caps.py sets caps per test, and the real-process proof
# (tests/acceptance/test_fairness.py) runs its processes with PILOT_TEST_CAPS=default,
# i.e. with the production default of pilot/settings.py.
_DEFAULT_CAPS = os.environ.get("PILOT_TEST_CAPS") == "default"
if not _DEFAULT_CAPS:
    os.environ.setdefault("PILOT_MAX_RUNNING_PER_CLIENT", "0")

from pilot.settings import *  # noqa: E402,F403

PILOT_DRAIN_SECONDS = float(os.environ["PILOT_TEST_DRAIN_SECONDS"])

# Test users are created by the hundred; production-strength hashing would make
# each one cost ~0.2 s of CPU and prove nothing.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Quiet by default; tests that check log lines raise the level with caplog.
LOGGING["root"]["level"] = "WARNING"  # noqa: F405

# Test-only workflows (test.poison, ...) registered in every process the tests start.
INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405

# A shared Redis cache outlives the test database: give every run its own key
# space, or a throttle counter from an earlier run would leak into this one.
# PILOT_TEST_CACHE_PREFIX gives every process of one test's fleet the same one
# (gunicorn workers must count rate limits and lockouts together).
CACHES["default"]["KEY_PREFIX"] = (  # noqa: F405
    os.environ.get("PILOT_TEST_CACHE_PREFIX") or f"pilot-test-{os.getpid()}-{os.urandom(4).hex()}")

# The suite speaks plain HTTP to the test client and to the processes it starts;
# production redirects to HTTPS (settings.py), tests/settings_deploy checks that.
SECURE_SSL_REDIRECT = False
# No collectstatic before tests: plain storage instead of the hashed manifest.
STORAGES = {**STORAGES, "staticfiles": {  # noqa: F405
    "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
# Serve static files from the apps (no collectstatic, no STATIC_ROOT to warn about).
WHITENOISE_AUTOREFRESH = True
WHITENOISE_USE_FINDERS = True

# On SQLite the suite runs on a database file, as `make run` does (WAL, one
# writer, the busy timeout), not on Django's default in-memory shared-cache
# database, whose table locks behave differently (no busy timeout).
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    import tempfile

    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": os.path.join(tempfile.gettempdir(), f"pilot-test-{os.getpid()}.sqlite3")}
