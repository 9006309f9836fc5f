"""With DJANGO_DEBUG=true (what `make run` sets) a debug page is still a page
anyone reaching the port can read: the technical 500 page masks credentials
in URLs wherever they appear, and a 404 does not list the site's routes."""

import pytest
from django.test import Client, override_settings

from workflows.debug import MASK, mask_url_credentials

pytestmark = pytest.mark.django_db

SECRETS = ("s3cret-db-pw", "s3cret-redis-pw", "frame-secret-pw", "env-secret-pw", "q-secret")


@override_settings(
    DEBUG=True, ROOT_URLCONF="tests.security.boom_urls",
    DATABASE_URL="postgres://pilot:s3cret-db-pw@db.internal:5432/pilot",
    REDIS_URL="rediss://default:s3cret-redis-pw@cache.internal:6380/0",
    CACHES={"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                        "LOCATION": "pilot_cache"},
            "other": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                      "LOCATION": "redis://:s3cret-redis-pw@cache.internal:6379/1"}},
    Q_CLUSTER={"name": "pilot", "redis": "redis://:q-secret@cache.internal:6379/2"})
def test_the_technical_500_page_masks_every_url_credential():
    client = Client(raise_request_exception=False)
    # runserver puts the whole environment into request.META
    page = client.get("/boom", DATABASE_URL="postgres://u:env-secret-pw@db/x")
    assert page.status_code == 500
    html = page.content.decode()
    assert "RuntimeError" in html and "DATABASE_URL" in html  # still a useful page
    for secret in SECRETS:
        assert secret not in html, secret
    assert "postgres://pilot:********@db.internal:5432/pilot" in html  # DATABASE_URL
    assert "redis://:********@cache.internal/0" in html  # a frame's local variable
    assert "redis://:********@cache.internal:6379/2" in html  # Q_CLUSTER


@override_settings(DEBUG=True)
def test_a_debug_404_does_not_list_the_routes(admin_client):
    for path in ("/no-such-page", "/api-v2/", "/admin/no/such/page/"):
        page = Client().get(path) if not path.startswith("/admin") else admin_client.get(path)
        assert page.status_code == 404, path
        html = page.content.decode()
        assert "URL patterns" not in html and "api/v1/" not in html and "readyz" not in html
    assert Client().get("/admin").status_code == 301  # APPEND_SLASH still redirects


@pytest.mark.parametrize("text, masked", [
    ("postgres://pilot:pw@db:5432/pilot", f"postgres://pilot:{MASK}@db:5432/pilot"),
    ("redis://:pw@redis:6379/0", f"redis://:{MASK}@redis:6379/0"),
    ("rediss://user:p%40ss:w@r.example:6380", f"rediss://user:{MASK}@r.example:6380"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),  # no credentials, no change
    ("sqlite:///db.sqlite3", "sqlite:///db.sqlite3"),
    ("postgres://db/pilot?sslmode=require&password=pw", f"postgres://db/pilot?sslmode=require"
                                                        f"&password={MASK}"),
    ("two: a://u:x@h and b://v:y@k", f"two: a://u:{MASK}@h and b://v:{MASK}@k"),
])
def test_url_credentials_are_masked(text, masked):
    assert mask_url_credentials(text) == masked
