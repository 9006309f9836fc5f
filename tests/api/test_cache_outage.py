"""What a failing shared cache does (workflows/observability/shared_cache.py).

- Unreachable (a Redis where none listens: transient): triggers go through
  unthrottled, /metrics answers, /readyz says "degraded" with a 200 — and
  password logins are refused until it is back (fail closed).
- Misconfigured (a REDIS_URL with a wrong scheme, a missing cache table:
  permanent): every rate-limited request is a 503 `unavailable`, never served
  without its limit, and /readyz is a 503 naming the cache.
"""

import logging

import pytest
from django.test import Client, override_settings

from tests.api.conftest import assert_problem, trigger
from tests.factories import make_task
from workflows.rules.states import TaskState

pytestmark = pytest.mark.django_db

DEAD_REDIS = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                          "LOCATION": "redis://127.0.0.1:1/0",
                          "OPTIONS": {"socket_connect_timeout": 0.2}}}
# A typo'd scheme: redis-py refuses the URL on first use, every time.
MISCONFIGURED_REDIS = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": "redis+typo://127.0.0.1:6379/0"}}
MISSING_TABLE = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                             "LOCATION": "pilot_cache_that_was_never_created"}}

PASSWORD = "a-long-password-123"


@override_settings(CACHES=DEAD_REDIS)
def test_an_unreachable_cache_degrades_the_throttle_but_refuses_logins(api, django_user_model,
                                                                        caplog):
    django_user_model.objects.create_user("op", password=PASSWORD, is_staff=True)
    browser = Client()
    with caplog.at_level("WARNING", logger="pilot.events"):
        assert trigger(api).status_code == 202
        assert trigger(api).status_code == 200
        page = browser.post("/admin/login/", {"username": "op", "password": PASSWORD})
        assert browser.get("/metrics").status_code == 200
        ready = browser.get("/readyz")
    # The right password, and still no session: the lockout store cannot vouch.
    assert page.status_code == 200 and "_auth_user_id" not in browser.session
    assert "Logins are paused" in page.content.decode()
    assert ready.status_code == 200
    assert ready.json()["status"] == "degraded"
    assert ready.json()["checks"]["cache"] is False
    assert ready.json()["degraded"] == {"cache": "unreachable"}
    assert "cache_unavailable" in caplog.text and "login_refused_unavailable" in caplog.text


@pytest.mark.parametrize("caches", [MISCONFIGURED_REDIS], ids=["bad-redis-url"])
def test_a_misconfigured_cache_fails_every_rate_limited_request_closed(api, caches, caplog):
    failed = make_task(owner=api.user, state=TaskState.FAILED)
    with override_settings(CACHES=caches), caplog.at_level("ERROR", logger="pilot.events"):
        assert_problem(trigger(api), 503, "unavailable")
        batch = api.post("/api/v1/tasks/batch",
                         {"tasks": [{"idempotency_key": "b1", "workflow": "demo.echo"}]},
                         format="json")
        assert_problem(batch, 503, "unavailable")
        assert_problem(api.post(f"/api/v1/tasks/{failed.pk}/retry"), 503, "unavailable")
        assert_problem(api.post(f"/api/v1/tasks/{failed.pk}/cancel"), 503, "unavailable")
        assert api.get("/api/v1/tasks").status_code == 200  # reads are not rate limited
        ready = Client().get("/readyz")
    body = assert_problem(ready, 503, "unavailable")
    assert "cache misconfigured" in body["detail"]
    assert body["checks"]["database"] is True and body["checks"]["cache"] is False
    assert "cache_misconfigured" in caplog.text
    failed.refresh_from_db()
    assert failed.state == TaskState.FAILED  # nothing happened
    assert not api.user.pilot_tasks.exclude(pk=failed.pk).exists()


@pytest.mark.django_db(transaction=True)  # a failed query must not poison a test transaction
@override_settings(CACHES=MISSING_TABLE)
def test_a_missing_cache_table_is_a_misconfiguration_not_a_pass(api, caplog):
    with caplog.at_level(logging.ERROR, logger="pilot.events"):
        assert_problem(trigger(api), 503, "unavailable")
        ready = Client().get("/readyz")
    assert_problem(ready, 503, "unavailable")
    assert "cache_misconfigured" in caplog.text
