"""Webhooks across every task (workflows/admin/fleet_webhooks.py): the
dashboard counts the deliveries failing and names their endpoints, the
deliveries list filters by health, endpoint and client, newest first, each row
linking to its task, a bulk Re-send shows what it would do before it does it
(the single Re-send's engine call, logged the same way), and Client webhooks
shows each endpoint's health. Real deliveries to a real receiver."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from tests.admin.conftest import _staff, task_url
from tests.support.helpers import drain, purge_queue, queued_webhooks
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.engine.triggers import task_trigger
from workflows.models import WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)

LIST_URL = "/admin/workflows/webhookdelivery/"


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 30  # one failed attempt, then it waits


def attempted(owner, url, key, n_attempts=1):
    """A task whose delivery to `url` was attempted `n_attempts` time(s)."""
    task = task_trigger(owner=owner, key=key, workflow="demo.echo", payload={},
                        callback_url=url).task
    drain(lambda: WebhookDelivery.objects.filter(task_id=task.pk,
                                                 attempts__gte=n_attempts).exists())
    return task


@pytest.fixture
def fleet(owner, other_owner):
    """A failing receiver (client-a, two tasks) and a healthy one (client-b)."""
    client_webhook_ensure(owner)
    client_webhook_ensure(other_owner)
    with Receiver(lambda mid, n: (500, 0)) as bad, Receiver() as good:
        failing = [attempted(owner, bad.url, f"bad-{i}") for i in range(2)]
        healthy = attempted(other_owner, good.url, "good")
        purge_queue()
        yield {"bad": bad, "good": good, "failing": failing, "healthy": healthy}


def test_the_dashboard_counts_the_failing_deliveries_and_names_their_endpoint(looker, fleet):
    html = looker.get("/admin/workflows/task/dashboard/").content.decode()
    card = html.split('id="pilot-webhooks-failing"')[1].split('<div class="module"')[0]
    assert 'data-retrying="2" data-failed="0"' in html
    endpoint = WebhookDelivery.objects.get(task_id=fleet["failing"][0].pk).endpoint
    assert f'data-endpoint="{endpoint}"' in card and "<td>2</td>" in card
    assert f"?endpoint={endpoint.replace(':', '%3A')}&amp;health=failing" in card
    # Given up counts too; delivered ones never.
    WebhookDelivery.objects.filter(task_id=fleet["failing"][0].pk).update(state="failed")
    html = looker.get("/admin/workflows/task/dashboard/").content.decode()
    assert 'data-retrying="1" data-failed="1"' in html


def test_the_list_filters_by_health_endpoint_and_client_newest_first(looker, fleet, owner):
    failing_ids = [str(t.pk)[:8] for t in fleet["failing"]]
    page = looker.get(LIST_URL, {"health": "failing"}).content.decode()
    rows = page.split("<tbody>")[1].split("</tbody>")[0]
    assert [rows.index(i) for i in reversed(failing_ids)] == sorted(
        rows.index(i) for i in failing_ids)  # newest first
    assert str(fleet["healthy"].pk)[:8] not in rows
    assert task_url(fleet["failing"][0]) + "#pilot-webhooks" in rows and "HTTP 500" in rows
    delivered = looker.get(LIST_URL, {"health": "delivered"}).content.decode()
    assert str(fleet["healthy"].pk)[:8] in delivered and failing_ids[0] not in delivered
    endpoint = WebhookDelivery.objects.get(task_id=fleet["healthy"].pk).endpoint
    by_endpoint = looker.get(LIST_URL, {"endpoint": endpoint}).content.decode()
    assert str(fleet["healthy"].pk)[:8] in by_endpoint and failing_ids[0] not in by_endpoint
    by_client = looker.get(LIST_URL, {"owner": str(owner.pk)}).content.decode()
    assert failing_ids[0] in by_client and str(fleet["healthy"].pk)[:8] not in by_client


def test_the_list_pages_by_keyset_newest_first(looker, fleet, monkeypatch):
    from workflows.admin.fleet_webhooks import WebhookDeliveryAdmin

    monkeypatch.setattr(WebhookDeliveryAdmin, "list_per_page", 2)
    ids = list(WebhookDelivery.objects.order_by("-id").values_list("pk", "task_id"))
    first = looker.get(LIST_URL).content.decode()
    assert f"?before={ids[1][0]}" in first and "« newest" not in first
    assert str(ids[0][1])[:8] in first and str(ids[2][1])[:8] not in first
    older = looker.get(LIST_URL, {"before": str(ids[1][0])}).content.decode()
    assert str(ids[2][1])[:8] in older and str(ids[0][1])[:8] not in older
    assert "« newest" in older and "older »" not in older  # the last page


@pytest.mark.parametrize("query", ["health=%00", "owner=abc", "owner=" + "9" * 30,
                                   "endpoint=" + "x" * 300, "state__regex=.", "secret=1",
                                   "before=abc", "before=" + "9" * 30, "before=%00"])
def test_a_hostile_filter_is_refused_with_a_message_never_a_500(looker, query):
    response = looker.get(f"{LIST_URL}?{query}", follow=True)
    assert response.status_code == 200
    assert "Filter ignored" in response.content.decode() or "0 webhook" in \
        response.content.decode()


def test_a_delivery_has_no_page_of_its_own_it_opens_its_task(looker, fleet):
    d = WebhookDelivery.objects.get(task_id=fleet["healthy"].pk)
    response = looker.get(f"{LIST_URL}{d.pk}/change/")
    assert response.status_code == 302 and response.url == task_url(fleet["healthy"])
    for bad in ("0", "abc", "9" * 30):
        assert looker.get(f"{LIST_URL}{bad}/change/").status_code == 404


def test_a_bulk_resend_shows_a_dry_run_then_resends_through_the_single_path(resender, fleet):
    ids = [str(d.pk) for d in WebhookDelivery.objects.filter(
        task_id__in=[t.pk for t in fleet["failing"]])]
    before = {d.pk: (d.claim_token, d.next_attempt_at) for d in WebhookDelivery.objects.all()}
    post = {"action": "resend_selected", "_selected_action": ids, "index": "0"}
    dry = resender.post(f"{LIST_URL}?health=failing", post)
    page = dry.content.decode()
    assert dry.status_code == 200 and "Nothing has been sent yet" in page
    assert 'id="pilot-resend-count">2<' in page
    endpoint = WebhookDelivery.objects.get(pk=ids[0]).endpoint
    assert f'data-endpoint="{endpoint}"' in page and "Re-send 2 webhook(s)" in page
    assert {d.pk: (d.claim_token, d.next_attempt_at)
            for d in WebhookDelivery.objects.all()} == before  # the dry run changed nothing
    assert queued_webhooks() == []
    done = resender.post(f"{LIST_URL}?health=failing",
                         {**post, "confirmed": "yes", "reason": "receiver fixed"}, follow=True)
    assert "2 webhook(s) will be sent again now." in done.content.decode()
    assert sorted(queued_webhooks()) == sorted(
        WebhookDelivery.objects.get(pk=i).message_id for i in ids)
    for i in ids:
        d = WebhookDelivery.objects.get(pk=i)
        assert d.claim_token > before[d.pk][0] and d.resend_owed
    logged = LogEntry.objects.filter(change_message__contains="Re-send webhook through the "
                                     "console (selected deliveries): receiver fixed")
    assert sorted(e.object_id for e in logged) == sorted(str(t.pk) for t in fleet["failing"])
    healthy = WebhookDelivery.objects.get(task_id=fleet["healthy"].pk)
    assert healthy.claim_token == before[healthy.pk][0]  # not selected, not touched


def test_without_the_resend_permission_there_is_no_bulk_resend(looker, fleet):
    page = looker.get(LIST_URL).content.decode()
    assert "resend_selected" not in page
    d = WebhookDelivery.objects.get(task_id=fleet["failing"][0].pk)
    looker.post(LIST_URL, {"action": "resend_selected", "_selected_action": [str(d.pk)],
                           "index": "0", "confirmed": "yes", "reason": "x"})
    assert WebhookDelivery.objects.get(pk=d.pk).claim_token == d.claim_token


def test_client_webhooks_show_each_endpoints_health(django_user_model, owner, other_owner,
                                                   fleet):
    client_webhook_ensure(owner, url=fleet["bad"].url)
    client_webhook_ensure(other_owner, url=fleet["good"].url)
    viewer = Client()
    viewer.force_login(_staff(django_user_model, "hooks", perms=("view_clientwebhook",)))
    page = viewer.get("/admin/workflows/clientwebhook/").content.decode()
    rows = {r.split("</th>")[0]: r for r in page.split('<th class="field-owner')[1:]}
    bad = next(r for k, r in rows.items() if "client-a" in k)
    good = next(r for k, r in rows.items() if owner.username not in k)
    assert f"?owner={owner.pk}&amp;health=failing" in bad and 'class="pilot-failing">2<' in bad
    assert 'class="field-last_success_at">–' in bad
    delivered = WebhookDelivery.objects.get(task_id=fleet["healthy"].pk).delivered_at
    assert delivered.strftime("%Y-%m-%dT%H:%M:%SZ") in good
    assert 'class="field-failing_count">0<' in good and "p.m." not in page and "a.m." not in page
