"""Completion webhooks in the console: the task page lists each delivery
attempt by attempt (an attempt whose sender was lost says so) and what a
pending one waits for (its endpoint paused, a free slot), operators re-send
through a confirmation (a viewer may not), and a client's default endpoint is
edited without its secret ever reaching a page."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db.models import F
from django.db.models.functions import Now
from django.test import Client

from tests.admin.conftest import task_url
from tests.factories import make_task
from tests.support.helpers import drain, purge_queue, queued_webhooks
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.accounts.vault import secret_open
from workflows.engine.triggers import task_trigger
from workflows.models import ClientWebhook, WebhookDelivery, WebhookEndpoint
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 0.05


def delivered_task(owner, receiver):
    client_webhook_ensure(owner)
    task = task_trigger(owner=owner, key="k", workflow="demo.echo", payload={},
                        callback_url=receiver.url).task
    drain(lambda: WebhookDelivery.objects.filter(task_id=task.pk, state="delivered").exists())
    return task


def test_the_task_page_lists_each_delivery_attempt_by_attempt(owner, resender):
    with Receiver(lambda mid, n: (500, 0) if n == 1 else (204, 0)) as receiver:
        task = delivered_task(owner, receiver)
    # An attempt counted before the two that were recorded, whose sender died.
    WebhookDelivery.objects.filter(task_id=task.pk).update(attempts=F("attempts") + 1)
    d = WebhookDelivery.objects.get(task_id=task.pk)
    d.attempt_log = [{**e, "n": e["n"] + 1} for e in d.attempt_log]
    WebhookDelivery.objects.filter(pk=d.pk).update(attempt_log=d.attempt_log)
    html = resender.get(task_url(task)).content.decode()
    section = html.split('id="pilot-webhooks"')[1].split('id="transitions-group"')[0]
    assert receiver.url in section
    assert f'data-delivery="{task.pk}:succeeded:0"' in section
    assert 'data-delivery-state="delivered"' in section and "3 attempt(s)" in section
    rows = section.split("<tbody>")[1].split("</tbody>")[0].split("<tr ")[1:]
    assert "its sender was lost" in rows[0]
    assert "HTTP 500" in rows[1] and "HTTP 500: ok" in rows[1]
    assert "HTTP 204" in rows[2]
    assert "Re-send" in section


def test_a_task_without_an_endpoint_shows_no_webhook_section(owner, resender):
    task = make_task(owner, state=S.SUCCEEDED)
    assert 'id="pilot-webhooks"' not in resender.get(task_url(task)).content.decode()


def test_an_operator_resends_through_a_confirmation(owner, resender):
    with Receiver() as receiver:
        task = delivered_task(owner, receiver)
        d = WebhookDelivery.objects.get(task_id=task.pk)
        url = task_url(task, f"webhook/{d.pk}/resend/")
        confirm = resender.get(url)
        assert confirm.status_code == 200
        page = confirm.content.decode()
        assert "Nothing has changed yet" in page and d.message_id in page
        assert WebhookDelivery.objects.get(pk=d.pk).state == "delivered"
        purge_queue()
        done = resender.post(url, {"reason": "their database was restored"})
        assert done.status_code == 302 and done["Location"] == task_url(task)
        assert WebhookDelivery.objects.get(pk=d.pk).state == "pending"
        assert queued_webhooks() == [d.message_id]
        drain(lambda: len(receiver.received) == 2)
    assert LogEntry.objects.filter(object_id=str(task.pk),
                                   change_message__contains="Re-send webhook").exists()
    assert WebhookDelivery.objects.get(pk=d.pk).attempts == 2


def test_someone_without_the_permission_sees_no_button_and_gets_403(owner, looker):
    with Receiver() as receiver:
        task = delivered_task(owner, receiver)
    d = WebhookDelivery.objects.get(task_id=task.pk)
    page = looker.get(task_url(task)).content.decode()
    assert 'id="pilot-webhooks"' in page and "Re-send" not in page
    url = task_url(task, f"webhook/{d.pk}/resend/")
    assert looker.get(url).status_code == 403
    assert looker.post(url, {"reason": "x"}).status_code == 403
    assert WebhookDelivery.objects.get(pk=d.pk).state == "delivered"


def test_a_delivery_of_another_task_is_a_404(owner, resender):
    with Receiver() as receiver:
        task = delivered_task(owner, receiver)
    other = make_task(owner, state=S.SUCCEEDED)
    d = WebhookDelivery.objects.get(task_id=task.pk)
    assert resender.get(task_url(other, f"webhook/{d.pk}/resend/")).status_code == 404
    assert resender.get(task_url(task, "webhook/999999/resend/")).status_code == 404


def test_a_clients_default_endpoint_is_edited_and_its_secret_never_shown(owner,
                                                                         django_user_model):
    _, secret = client_webhook_ensure(owner, url="http://127.0.0.1:9/a")
    admin = django_user_model.objects.create_superuser("root", "r@x", "pw-root-123456")
    client = Client()
    client.force_login(admin)
    url = f"/admin/workflows/clientwebhook/{owner.pk}/change/"
    page = client.get(url).content.decode()
    assert "http://127.0.0.1:9/a" in page and secret not in page
    assert "shown only once" in page
    assert client.get("/admin/workflows/clientwebhook/").status_code == 200
    assert secret not in client.get("/admin/workflows/clientwebhook/").content.decode()
    assert client.post(url, {"url": "http://127.0.0.1:9/b"}).status_code == 302
    hook = ClientWebhook.objects.get(owner=owner)
    assert (hook.url, secret_open(hook.secret)) == ("http://127.0.0.1:9/b", secret)
    refused = client.post(url, {"url": "ftp://x.example.com/"})
    assert refused.status_code == 200 and "http:// or https://" in refused.content.decode()
    assert ClientWebhook.objects.get(owner=owner).url == "http://127.0.0.1:9/b"
    assert client.get("/admin/workflows/clientwebhook/add/").status_code == 403


@pytest.mark.parametrize("delivery_id", ["0", "99999999999999999999999999", "9223372036854775808"])
def test_a_hostile_delivery_id_is_a_404_never_a_500(owner, resender, delivery_id):
    with Receiver() as receiver:
        task = delivered_task(owner, receiver)
    assert resender.get(task_url(task, f"webhook/{delivery_id}/resend/")).status_code == 404
    assert resender.post(task_url(task, f"webhook/{delivery_id}/resend/"),
                         {"reason": "x"}).status_code == 404


def webhook_section(client, task) -> str:
    html = client.get(task_url(task)).content.decode()
    return html.split('id="pilot-webhooks"')[1].split('id="transitions-group"')[0]


def test_a_delivery_to_a_paused_endpoint_says_until_when_and_one_over_a_cap_that_it_waits(
        owner, looker, settings):
    """What a pending delivery waits for, where the operator looks: its
    endpoint paused by the circuit breaker (until when, after how many
    failures) — or, the pause over and the slot taken, a free slot."""
    settings.PILOT_WEBHOOK_BREAKER_FAILURES = 2
    client_webhook_ensure(owner)
    with Receiver(lambda mid, n: (500, 0)) as receiver:
        tasks = [task_trigger(owner=owner, key=f"k{i}", workflow="demo.echo", payload={},
                              callback_url=receiver.url).task for i in range(2)]
        drain(lambda: WebhookDelivery.objects.filter(attempts=1, claimed_until=None).count()
              == 2, dispatch=False)
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.paused_until is not None and endpoint.failures == 2
    section = webhook_section(looker, tasks[0])
    assert f"endpoint <code>{endpoint.key}</code> paused until" in section
    assert "after 2 failed attempt(s) in a row" in section and "a re-send goes anyway" in section

    WebhookEndpoint.objects.update(paused_until=Now() - timedelta(seconds=1))  # pause over
    WebhookDelivery.objects.update(next_attempt_at=Now(), enqueued_at=None)  # due, owed
    WebhookDelivery.objects.filter(task_id=tasks[1].pk).update(  # the probe, in flight
        claimed_until=Now() + timedelta(seconds=30))
    section = webhook_section(looker, tasks[0])
    assert "paused until" not in section
    assert "waiting for a free slot" in section
