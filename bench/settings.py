"""Settings for every PILOT process the benchmark starts: production settings
(DEBUG off, INFO logging, persistent connections) plus the test app that
registers `test.noop3`, the 3-step no-op workflow the end-to-end workload runs.
The environment (bench/common.py: pilot_env) picks the database and broker."""

from pilot.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405

# The load generators speak plain HTTP to gunicorn on loopback, as the health
# probes and scrapers of a real deployment do; a TLS proxy is not part of what
# is measured.
SECURE_SSL_REDIRECT = False
