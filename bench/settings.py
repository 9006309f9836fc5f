"""Settings for every PILOT process the benchmark starts: production settings
(DEBUG off, INFO logging, persistent connections) plus the test app that
registers `test.noop3`, the 3-step no-op workflow the end-to-end workload runs,
and the baselines PILOT is measured against (bench/ceiling: a bare DRF insert
endpoint under /bench/, bench/urls.py; the raw django-q2 task). The standalone
project (pilot/settings.py, pilot/urls.py) knows nothing of them.
The environment (bench/common.py: pilot_env) picks the database and broker."""

from pilot.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405
# The baseline tree (bench/baseline.py) runs this file on an older pilot/settings.py,
# which installs the ceiling itself when PILOT_BENCH_ENDPOINTS is set.
if "bench.ceiling" not in INSTALLED_APPS:
    INSTALLED_APPS.append("bench.ceiling")
ROOT_URLCONF = "bench.urls"

# The load generators speak plain HTTP to gunicorn on loopback, as the health
# probes and scrapers of a real deployment do; a TLS proxy is not part of what
# is measured.
SECURE_SSL_REDIRECT = False

# The benchmark scrapes /metrics itself (bench/workloads/metrics_churn.py), on
# loopback: open, as `make run` has it, instead of behind PILOT_METRICS_TOKEN.
PILOT_METRICS_PUBLIC = True
