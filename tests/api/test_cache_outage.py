"""The shared cache is advisory: with it unreachable (a Redis where none
listens) triggers still go through, logins still work and /metrics answers."""

import pytest
from django.test import override_settings

from tests.api.conftest import trigger

pytestmark = pytest.mark.django_db

DEAD_REDIS = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                          "LOCATION": "redis://127.0.0.1:1/0",
                          "OPTIONS": {"socket_connect_timeout": 0.2}}}


@override_settings(CACHES=DEAD_REDIS)
def test_triggers_logins_and_metrics_survive_a_cache_outage(api, client, django_user_model,
                                                            caplog):
    with caplog.at_level("WARNING", logger="pilot.events"):
        assert trigger(api).status_code == 202
        assert trigger(api).status_code == 200
        django_user_model.objects.create_user("op", password="a-long-password-123",
                                              is_staff=True)
        assert client.post("/admin/login/", {"username": "op",
                                             "password": "a-long-password-123"}).status_code == 302
        assert client.get("/metrics").status_code == 200
    assert "cache_unavailable" in caplog.text
