"""API tokens at rest: only a SHA-256 and a visible prefix are stored; the
secret is shown once; DRF's plain-text tokens are converted by the migration
and keep working."""

import hashlib
import io
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from tests.api.conftest import assert_problem
from workflows.accounts import api_client_create
from workflows.models import ApiToken
from workflows.models.token import token_digest


def client(key: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return c


@pytest.mark.django_db
def test_only_a_hash_and_a_prefix_are_stored_and_the_secret_authenticates():
    user, key = api_client_create("billing")
    row = ApiToken.objects.get(user=user)
    assert key.startswith(row.prefix + "_") and row.prefix.startswith("pilot_")
    assert row.digest == hashlib.sha256(key.encode()).hexdigest()
    stored = " ".join(str(v) for v in ApiToken.objects.values_list().get())
    assert key not in stored and key.split("_")[-1] not in stored
    assert client(key).get("/api/v1/workflows").status_code == 200


@pytest.mark.django_db
def test_a_wrong_secret_behind_a_real_prefix_is_refused():
    _, key = api_client_create("billing")
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    assert_problem(client(forged).get("/api/v1/workflows"), 401, "not_authenticated")
    assert_problem(client("Token x y").get("/api/v1/workflows"), 401, "not_authenticated")


@pytest.mark.django_db
def test_rotation_without_overlap_revokes_at_once_and_an_inactive_user_is_refused():
    user, old = api_client_create("billing")
    _, new = api_client_create("billing", rotate=True, overlap=False)
    assert_problem(client(old).get("/api/v1/workflows"), 401, "not_authenticated")
    assert client(new).get("/api/v1/workflows").status_code == 200
    assert api_client_create("billing") == (user, None)  # kept, and never shown again
    user.is_active = False
    user.save()
    assert_problem(client(new).get("/api/v1/workflows"), 401, "not_authenticated")


@pytest.mark.django_db
def test_after_a_rotation_both_tokens_work_until_the_overlap_ends(settings):
    settings.PILOT_ROTATION_OVERLAP_SECONDS = 3600
    user, old = api_client_create("billing")
    _, new = api_client_create("billing", rotate=True)
    assert client(old).get("/api/v1/workflows").status_code == 200
    assert client(new).get("/api/v1/workflows").status_code == 200
    replaced = ApiToken.objects.get(digest=token_digest(old))
    assert replaced.expires_at is not None
    assert 3590 < (replaced.expires_at - timezone.now()).total_seconds() <= 3600
    assert ApiToken.objects.get(digest=token_digest(new)).expires_at is None
    # A second rotation within the overlap: the newest replaced token overlaps, the oldest goes.
    _, newest = api_client_create("billing", rotate=True)
    assert_problem(client(old).get("/api/v1/workflows"), 401, "not_authenticated")
    assert client(new).get("/api/v1/workflows").status_code == 200
    assert ApiToken.objects.filter(user=user).count() == 2
    # The overlap ends: only the newest authenticates, and says why the other does not.
    ApiToken.objects.filter(digest=token_digest(new)).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    r = client(new).get("/api/v1/workflows")
    assert assert_problem(r, 401, "not_authenticated")["detail"] == "Token expired."
    assert client(newest).get("/api/v1/workflows").status_code == 200


@pytest.mark.django_db
def test_a_token_issued_with_an_expiry_stops_working_then(settings):
    from django.core.management import call_command

    call_command("create_api_client", "billing", "--token-expires-days", "2", stdout=io.StringIO())
    token = ApiToken.objects.get()
    assert 2 * 86400 - 10 < (token.expires_at - timezone.now()).total_seconds() <= 2 * 86400
    user, key = api_client_create("billing", rotate=True, overlap=False,
                                  expires_in=timedelta(seconds=30))
    assert client(key).get("/api/v1/workflows").status_code == 200
    ApiToken.objects.filter(user=user).update(expires_at=timezone.now())
    assert_problem(client(key).get("/api/v1/workflows"), 401, "not_authenticated")


@pytest.mark.django_db(transaction=True)
def test_the_migration_converts_drf_tokens_which_keep_working(django_user_model):
    """A database from before: DRF's authtoken_token with a plain-text key."""
    executor = MigrationExecutor(connection)
    executor.migrate([("workflows", "0013_webhooks_and_trace_context")])
    user = django_user_model.objects.create_user("legacy-client")
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="add_task",
                                                     content_type__app_label="workflows"))
    legacy_key = "0123456789abcdef0123456789abcdef01234567"  # DRF's 40 hex digits
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
                       "created timestamp with time zone NOT NULL, user_id integer NOT NULL)"
                       if connection.vendor == "postgresql" else
                       "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
                       "created datetime NOT NULL, user_id integer NOT NULL)")
        cursor.execute("INSERT INTO authtoken_token (key, created, user_id) "
                       "VALUES (%s, CURRENT_TIMESTAMP, %s)", [legacy_key, user.pk])
    try:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
        token = ApiToken.objects.get(user=user)
        assert token.digest == token_digest(legacy_key) and token.prefix == legacy_key[:8]
        with connection.cursor() as cursor:  # rest_framework.authtoken is not installed
            cursor.execute("SELECT COUNT(*) FROM authtoken_token")
            assert cursor.fetchone() == (0,)
        r = client(legacy_key).post("/api/v1/tasks", {"workflow": "demo.echo", "payload": {}},
                                    format="json", HTTP_IDEMPOTENCY_KEY="legacy")
        assert r.status_code == 202, r.content
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS authtoken_token")
