"""Production settings: with DJANGO_DEBUG=false and the documented environment,
`manage.py check --deploy --fail-level WARNING` passes; the secure defaults are
on unless turned down explicitly. Each run is a fresh process with exactly
that environment (settings are read once, at start-up)."""

import json
import os
import subprocess
import sys

import pytest
from django.core.management.utils import get_random_secret_key

from tests.support.procs import ROOT


def production_env(**overrides) -> dict:
    """The environment docs/operations.md "Deploying" documents, for one machine behind a
    TLS-terminating proxy."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "PILOT_", "PROMETHEUS_"))}
    env.update({
        "DJANGO_SETTINGS_MODULE": "pilot.settings",
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": get_random_secret_key() + get_random_secret_key(),
        "DJANGO_ALLOWED_HOSTS": "pilot.example.com",
        "DATABASE_URL": "postgres://pilot@db.internal:5432/pilot",
        "REDIS_URL": "redis://redis.internal:6379/0",
        "PILOT_TRUSTED_PROXIES": "1",
    })
    env.update(overrides)
    return env


def manage(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT,
                          env=production_env(**env), capture_output=True, text=True, timeout=120)


def effective(*names, **env) -> dict:
    code = ("import json, django; django.setup(); from django.conf import settings; "
            f"print(json.dumps({{n: getattr(settings, n, None) for n in {list(names)!r}}}, "
            "default=str))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=production_env(**env),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_check_deploy_passes_with_the_documented_production_environment():
    done = manage("check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (2 silenced)." in done.stdout


@pytest.mark.parametrize("override, check_id", [
    ({"DJANGO_SECURE_SSL_REDIRECT": "false"}, "security.W008"),
    ({"DJANGO_SECURE_COOKIES": "false"}, "security.W012"),
    ({"DJANGO_SECURE_HSTS_SECONDS": "0"}, "security.W004"),
    # Long enough to start (tests/settings_deploy/test_env_example.py), too uniform to pass.
    ({"DJANGO_SECRET_KEY": "x" * 50}, "security.W009"),
])
def test_check_deploy_fails_when_a_safeguard_is_turned_down(override, check_id):
    done = manage("check", "--deploy", "--fail-level", "WARNING", **override)
    assert done.returncode != 0
    assert check_id in done.stderr + done.stdout


def test_production_defaults_are_secure_and_proxy_aware():
    values = effective("DEBUG", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE",
                       "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_PROXY_SSL_HEADER",
                       "SECURE_REDIRECT_EXEMPT", "DATABASES", "MIDDLEWARE", "STORAGES")
    assert values["DEBUG"] is False
    assert values["SECURE_SSL_REDIRECT"] and values["SESSION_COOKIE_SECURE"]
    assert values["CSRF_COOKIE_SECURE"] and values["SECURE_HSTS_SECONDS"] == 31536000
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert values["SECURE_REDIRECT_EXEMPT"] == ["^healthz$", "^readyz$", "^metrics$"]
    db = values["DATABASES"]["default"]
    assert (db["CONN_MAX_AGE"], db["CONN_HEALTH_CHECKS"]) == (60, True)
    # Probes answered before the host check; then security headers and static files.
    assert values["MIDDLEWARE"][1:4] == ["workflows.observability.probes.ProbeMiddleware",
                                         "django.middleware.security.SecurityMiddleware",
                                         "whitenoise.middleware.WhiteNoiseMiddleware"]
    assert values["STORAGES"]["staticfiles"]["BACKEND"] == \
        "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_without_trusted_proxies_forwarded_headers_are_ignored():
    assert effective("SECURE_PROXY_SSL_HEADER", PILOT_TRUSTED_PROXIES="0") == \
        {"SECURE_PROXY_SSL_HEADER": None}


def test_a_local_debug_run_is_plain_http():
    values = effective("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "SECURE_HSTS_SECONDS",
                       DJANGO_DEBUG="true", DJANGO_SECRET_KEY="")
    assert values == {"SECURE_SSL_REDIRECT": False, "SESSION_COOKIE_SECURE": False,
                      "SECURE_HSTS_SECONDS": 0}


def test_a_missing_secret_key_stops_a_production_start():
    done = manage("check", DJANGO_SECRET_KEY="")
    assert done.returncode != 0 and "DJANGO_SECRET_KEY must be set" in done.stderr
