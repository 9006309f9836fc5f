"""PILOT_CACHE_ALIAS: the rate limits, login lockouts and metrics counts live in
the cache the project names for PILOT, and its default cache is left alone
(docs/embedding.md, "A shared cache")."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

from workflows.accounts.login_guard import login_failure_record, login_lockout_remaining
from workflows.api.throttling import TRIGGER, rate_consume
from workflows.checks import pilot_cache_shared
from workflows.observability import metrics

# Two database caches on the same table, told apart by their key prefixes.
TWO_CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                "LOCATION": "pilot_cache", "KEY_PREFIX": "the-hosts-own"},
    "pilot": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
              "LOCATION": "pilot_cache", "KEY_PREFIX": "pilots"},
}


def _entries(prefix: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM pilot_cache WHERE cache_key LIKE %s",
                       [f"{prefix}:%"])
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_throttles_lockouts_and_metrics_use_the_alias_pilot_is_given(django_user_model):
    user = django_user_model.objects.create_user("alias-client")
    with override_settings(CACHES=TWO_CACHES, PILOT_CACHE_ALIAS="pilot",
                           PILOT_LOGIN_MAX_FAILURES=1):
        rate_consume(TRIGGER, user)
        assert _entries("pilots") == 1
        login_failure_record(username="someone", ip="192.0.2.1")
        assert login_lockout_remaining(username="someone", ip="192.0.2.1") > 0
        counted = _entries("pilots")
        assert counted > 1
        metrics.exposition()  # caches the task counts for PILOT_METRICS_TASKS_TTL
        assert _entries("pilots") > counted
        assert _entries("the-hosts-own") == 0


def test_the_check_names_the_alias_it_judges():
    local = {"default": TWO_CACHES["default"],
             "pilot": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=local, PILOT_CACHE_ALIAS="pilot"):
        [error] = pilot_cache_shared(None)
        assert error.id == "pilot.E010" and "CACHES['pilot'] (PILOT_CACHE_ALIAS)" in error.msg
    with override_settings(CACHES=local, PILOT_CACHE_ALIAS="nowhere"):
        [error] = pilot_cache_shared(None)
        assert error.id == "pilot.E010" and "'nowhere'" in error.msg
    # The host's default may be per-process when PILOT has a shared alias of its own.
    per_process_default = {"default": local["pilot"], "pilot": TWO_CACHES["pilot"]}
    with override_settings(CACHES=per_process_default, PILOT_CACHE_ALIAS="pilot"):
        assert pilot_cache_shared(None) == []
