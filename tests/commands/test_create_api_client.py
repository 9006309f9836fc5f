"""create_api_client refuses to hang a token on a person's staff or superuser
account unless told so, and says what the token it prints can do."""

from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from workflows.accounts.vault import secret_open
from workflows.models import ApiToken

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("create_api_client", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["superuser", "staff"])
def test_an_existing_staff_or_superuser_account_is_refused(django_user_model, kind):
    user = django_user_model.objects.create_user(
        "root", password="pw-root-123", is_staff=True, is_superuser=kind == "superuser")
    with pytest.raises(CommandError, match="--allow-staff"):
        run("root")
    assert not ApiToken.objects.filter(user=user).exists()
    assert not user.user_permissions.exists()  # nothing granted either


def test_allow_staff_attaches_the_token_and_says_it_sees_everything(django_user_model):
    django_user_model.objects.create_superuser("root", "root@x", "pw-root-123")
    out = run("root", "--allow-staff")
    assert "client root: token " in out
    assert "EVERYTHING ELSE TOO: it is a superuser" in out


def test_a_new_client_is_told_it_sees_only_its_own_tasks():
    out = run("billing-service")
    assert "trigger workflows (workflows.add_task)" in out
    assert "read, cancel and retry the tasks it triggered itself" in out
    assert "EVERY" not in out


def test_a_client_that_may_read_everything_is_told_so(django_user_model):
    run("auditor")
    auditor = django_user_model.objects.get(username="auditor")
    auditor.user_permissions.add(Permission.objects.get(codename="view_all_tasks"))
    out = run("auditor")
    assert "already has a token" in out
    assert "read EVERY client's tasks, payloads and results" in out


# --- the webhook signing secret and the default endpoint (docs/webhooks.md) -------------------

def _secret_of(out: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith("webhook signing secret: ")]
    return line.removeprefix("webhook signing secret: ")


def test_a_new_client_gets_its_signing_secret_printed_once_beside_the_token():
    from workflows.models import ClientWebhook

    first = run("billing-service")
    secret = _secret_of(first)
    assert secret.startswith("whsec_")
    assert secret_open(ClientWebhook.objects.get(owner__username="billing-service").secret) \
        == secret
    again = run("billing-service")
    assert _secret_of(again).startswith("kept") and "whsec_" not in again
    assert "default webhook endpoint: (none)" in again


def test_webhook_sets_the_default_endpoint_and_rotate_replaces_the_secret(settings):
    from workflows.models import ClientWebhook

    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    secret = _secret_of(run("billing-service"))
    out = run("billing-service", "--webhook", "http://127.0.0.1:9/hooks")
    assert "default webhook endpoint: http://127.0.0.1:9/hooks" in out
    assert ClientWebhook.objects.get().url == "http://127.0.0.1:9/hooks"
    rotated = _secret_of(run("billing-service", "--rotate-webhook-secret"))
    assert rotated.startswith("whsec_") and rotated != secret
    assert secret_open(ClientWebhook.objects.get().secret) == rotated
    run("billing-service", "--webhook", "")
    assert ClientWebhook.objects.get().url == ""


@pytest.mark.parametrize("url, message", [("ftp://x.example.com/", "http:// or https://"),
                                          ("http://127.0.0.1:9/", "not a public address")])
def test_a_bad_default_endpoint_is_refused_before_anything_is_created(url, message, settings):
    from workflows.models import ClientWebhook

    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(CommandError, match=message):
        run("newcomer", "--webhook", url)
    assert not ApiToken.objects.exists() and not ClientWebhook.objects.exists()
