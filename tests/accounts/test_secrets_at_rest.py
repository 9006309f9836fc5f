"""Client webhook secrets at rest and their rotation (issue 31, N1/N9;
workflows/accounts/vault.py): what the database holds signs nothing; a
rotation keeps the old secret signing beside the new one until the overlap
ends, so a receiver verifies with either; keys rotate like SECRET_KEY's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.helpers import drain
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_signing_secrets, client_webhook_ensure
from workflows.accounts.vault import SEALED_PREFIX, secret_open, secret_reseal
from workflows.engine.triggers import task_trigger
from workflows.models import ClientWebhook, WebhookDelivery
from workflows.webhooks.signing import webhook_headers

BODY = b'{"id": "t1", "state": "succeeded"}'


def _raw_row(owner) -> list[str]:
    """Every column of the client's webhook row as SQL reads it: what a backup,
    a replica or a read-only session sees."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {ClientWebhook._meta.db_table} WHERE owner_id = %s",
                       [owner.pk])
        return [str(value) for value in cursor.fetchone()]


def _verifies(secret: str, headers: dict, body: bytes = BODY) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def _signature_from(candidate: str) -> dict:
    """What a database reader could sign with a stored value taken as a secret."""
    as_secret = candidate if candidate.startswith("whsec_") else "whsec_" + (
        candidate.removeprefix(SEALED_PREFIX)[:43] + "=")
    try:
        return webhook_headers(as_secret, "t1:succeeded:0", int(timezone.now().timestamp()),
                               BODY)
    except ValueError:  # not base64 at all: it signs nothing
        return {}


@pytest.mark.django_db
def test_a_database_reader_cannot_sign_a_webhook_that_verifies(owner):
    _, secret = client_webhook_ensure(owner)
    row = _raw_row(owner)
    assert all(secret not in value and secret.removeprefix("whsec_") not in value
               for value in row)
    stored = ClientWebhook.objects.get(owner=owner).secret
    assert stored.startswith(SEALED_PREFIX) and secret_open(stored) == secret
    for value in row:
        forged = _signature_from(value)
        assert not forged or not _verifies(secret, forged)


@pytest.mark.django_db
def test_the_keys_seal_and_a_new_key_first_still_opens_the_old_rows(owner, settings):
    settings.PILOT_SECRETS_KEYS = "key-one-" + "x" * 40
    _, secret = client_webhook_ensure(owner)
    sealed = ClientWebhook.objects.get(owner=owner).secret
    settings.PILOT_SECRETS_KEYS = "key-two-" + "y" * 40  # the old key gone: unreadable
    assert client_signing_secrets(owner.pk, timezone.now()) == ()
    settings.PILOT_SECRETS_KEYS = f"key-two-{'y' * 40},key-one-{'x' * 40}"
    assert client_signing_secrets(owner.pk, timezone.now()) == (secret,)
    resealed = secret_reseal(sealed)
    settings.PILOT_SECRETS_KEYS = "key-two-" + "y" * 40
    assert secret_open(resealed) == secret


@pytest.mark.django_db(transaction=True)
def test_without_the_key_nothing_is_sent_and_the_attempt_says_why(owner, settings):
    client_webhook_ensure(owner)
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_SECRETS_KEYS = "a-key-that-never-sealed-it-" + "z" * 30
    with Receiver() as receiver:
        task = task_trigger(owner=owner, key="k", workflow="demo.echo", payload={},
                            callback_url=receiver.url).task
        drain(lambda: WebhookDelivery.objects.filter(task_id=task.pk, attempts__gt=0).exists())
    assert receiver.received == []
    assert "no signing secret that can be read" in WebhookDelivery.objects.get().last_error


@pytest.mark.django_db(transaction=True)
def test_during_the_overlap_deliveries_carry_both_signatures_then_only_the_new(
        owner, settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 0.05
    settings.PILOT_ROTATION_OVERLAP_SECONDS = 3600
    _, old = client_webhook_ensure(owner)
    _, new = client_webhook_ensure(owner, rotate_secret=True)
    assert new != old
    with Receiver() as receiver:
        first = task_trigger(owner=owner, key="during", workflow="demo.echo", payload={},
                             callback_url=receiver.url).task
        drain(lambda: WebhookDelivery.objects.filter(task_id=first.pk,
                                                     state="delivered").exists())
        ClientWebhook.objects.filter(owner=owner).update(
            previous_until=timezone.now() - timedelta(seconds=1))  # the overlap ends
        second = task_trigger(owner=owner, key="after", workflow="demo.echo", payload={},
                              callback_url=receiver.url).task
        drain(lambda: WebhookDelivery.objects.filter(task_id=second.pk,
                                                     state="delivered").exists())
    during, after = receiver.received
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert _verifies(old, during.headers, during.body)  # a receiver not yet switched
    assert _verifies(new, during.headers, during.body)  # a receiver already switched
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    assert _verifies(new, after.headers, after.body)
    assert not _verifies(old, after.headers, after.body)


@pytest.mark.django_db
def test_a_rotation_without_overlap_drops_the_old_secret_at_once(owner):
    _, old = client_webhook_ensure(owner)
    _, new = client_webhook_ensure(owner, rotate_secret=True, overlap=False)
    assert client_signing_secrets(owner.pk, timezone.now()) == (new,) != (old,)
    hook = ClientWebhook.objects.get(owner=owner)
    assert hook.previous_secret == "" and hook.previous_until is None


@pytest.mark.django_db(transaction=True)
def test_the_migration_seals_plain_secrets_which_keep_signing(owner):
    executor = MigrationExecutor(connection)
    executor.migrate([("workflows", "0018_caps_count_undo_work")])
    plain = "whsec_" + "A" * 43 + "="
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO workflows_clientwebhook (owner_id, url, secret, created_at, "
                       "updated_at) VALUES (%s, '', %s, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
                       [owner.pk, plain])
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    stored = ClientWebhook.objects.get(owner=owner).secret
    assert stored.startswith(SEALED_PREFIX) and plain not in " ".join(_raw_row(owner))
    assert client_signing_secrets(owner.pk, timezone.now()) == (plain,)


@pytest.mark.django_db
def test_seal_secrets_moves_every_row_to_the_first_key_and_refuses_an_unknown_one(
        owner, other_owner, settings):
    import io

    from django.core.management import CommandError, call_command

    settings.PILOT_SECRETS_KEYS = "old-key-" + "o" * 40
    secrets = {user.pk: client_webhook_ensure(user)[1] for user in (owner, other_owner)}
    settings.PILOT_SECRETS_KEYS = f"new-key-{'n' * 40},old-key-{'o' * 40}"
    out = io.StringIO()
    call_command("seal_secrets", stdout=out)
    assert "sealed 2 client webhook secret(s)" in out.getvalue()
    settings.PILOT_SECRETS_KEYS = "new-key-" + "n" * 40  # the old key retired
    for pk, secret in secrets.items():
        assert client_signing_secrets(pk, timezone.now()) == (secret,)
    settings.PILOT_SECRETS_KEYS = "another-key-" + "a" * 40
    with pytest.raises(CommandError, match="cannot be opened"):
        call_command("seal_secrets", stdout=io.StringIO())
