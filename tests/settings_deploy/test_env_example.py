"""The deployment example is safe as shipped (issue 31, N10): it carries no
working `change-me` value — a production process refuses to start on it, on
a placeholder or on a short secret —, it trusts a proxy only with gunicorn
bound where only that proxy reaches it, and gunicorn binds loopback unless
told otherwise (the container image tells it)."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import types

import pytest

from tests.settings_deploy.test_check_deploy import production_env
from tests.support.procs import ROOT

EXAMPLE = ROOT / "deploy" / "pilot.env.example"


def example_env() -> dict[str, str]:
    values = {}
    for line in EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def starts(**env) -> subprocess.CompletedProcess:
    """`manage.py check` in a fresh process with the production environment."""
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT,
                          env=production_env(**env), capture_output=True, text=True, timeout=120)


def test_the_example_as_shipped_does_not_start_a_production_process():
    values = example_env()
    assert not any("change-me" in v.lower() for v in values.values())
    assert values["DJANGO_SECRET_KEY"] == "" and values["PILOT_METRICS_TOKEN"] == ""
    done = starts(**values)
    assert done.returncode != 0 and "DJANGO_SECRET_KEY must be set" in done.stderr


@pytest.mark.parametrize("env, message", [
    ({"DJANGO_SECRET_KEY": "change-me"}, "DJANGO_SECRET_KEY is a placeholder"),
    ({"DJANGO_SECRET_KEY": "change-me-" + "x" * 60}, "DJANGO_SECRET_KEY is a placeholder"),
    ({"DJANGO_SECRET_KEY": "django-insecure-" + "q" * 50}, "DJANGO_SECRET_KEY is a placeholder"),
    ({"DJANGO_SECRET_KEY": "a-short-but-not-placeholder-key"},
     "DJANGO_SECRET_KEY must be at least 50"),
    ({"PILOT_METRICS_TOKEN": "change-me-too"}, "PILOT_METRICS_TOKEN is a placeholder"),
    ({"PILOT_METRICS_TOKEN": "short"}, "PILOT_METRICS_TOKEN must be at least 16"),
    ({"PILOT_SECRETS_KEYS": "CHANGE_ME"}, "PILOT_SECRETS_KEYS is a placeholder"),
])
def test_a_placeholder_or_short_secret_stops_a_production_process(env, message):
    done = starts(**env)
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]


def test_a_real_secret_and_a_real_token_start():
    assert starts(PILOT_METRICS_TOKEN="a" * 8 + "-scrape-token").returncode == 0


def test_the_example_trusts_a_proxy_only_with_gunicorn_on_loopback():
    values = example_env()
    assert int(values["PILOT_TRUSTED_PROXIES"]) > 0
    assert values["PILOT_BIND_HOST"] == "127.0.0.1"


def _gunicorn_conf(monkeypatch, **env):
    for name in ("PILOT_BIND_HOST", "PORT", "PILOT_TRUSTED_PROXIES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("pilot_gunicorn_conf",
                                                  ROOT / "deploy" / "gunicorn.conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gunicorn_binds_loopback_unless_told_and_the_image_tells_it(monkeypatch):
    assert _gunicorn_conf(monkeypatch).bind == "127.0.0.1:8000"
    assert _gunicorn_conf(monkeypatch, PILOT_BIND_HOST="10.0.0.5").bind == "10.0.0.5:8000"
    assert "ENV PILOT_BIND_HOST=0.0.0.0" in (ROOT / "Dockerfile").read_text()


def test_gunicorn_warns_when_trusted_proxies_meet_a_wildcard_bind(monkeypatch, caplog):
    server = types.SimpleNamespace(log=logging.getLogger("gunicorn.error"))
    with caplog.at_level(logging.WARNING, logger="gunicorn.error"):
        _gunicorn_conf(monkeypatch, PILOT_TRUSTED_PROXIES="1",
                       PILOT_BIND_HOST="0.0.0.0").on_starting(server)
        _gunicorn_conf(monkeypatch, PILOT_TRUSTED_PROXIES="1").on_starting(server)
        _gunicorn_conf(monkeypatch, PILOT_BIND_HOST="0.0.0.0").on_starting(server)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "PILOT_TRUSTED_PROXIES=1 while gunicorn listens on every interface" in warning
