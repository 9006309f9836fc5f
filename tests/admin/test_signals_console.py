"""Approvals in the console (workflows/admin/signals.py): Approve / Reject /
any payload through a confirmation page, as the operator, audited; refused
without workflows.signal_task; the dashboard's "waiting for a person" and the
list's "waiting for" filter."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from tests.admin.conftest import LIST_URL, task_url
from tests.support.helpers import pop_queued
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskSignal, TaskTransition
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_task(owner, workflow="demo.approval", payload=None):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                        payload=payload or {}).task
    for message in pop_queued():
        run_task(message)
    task.refresh_from_db()
    assert task.state == S.WAITING
    return task


def signal_url(task, **query):
    url = reverse("admin:workflows_task_signal", args=[task.pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def test_approve_goes_through_a_confirmation_then_wakes_the_task_as_the_operator(
        operator_client, operator, owner):
    task = waiting_task(owner)
    page = operator_client.get(task_url(task)).content.decode()
    assert 'id="pilot-approve"' in page and "Waiting for signal <code>decision</code>" in page
    form = operator_client.get(signal_url(task, preset="approve"))
    assert form.status_code == 200
    initial = form.context["form"].initial
    assert json.loads(initial["payload"]) == {"approved": True, "by": "operator"}
    key = form.context["form"]["key"].value()
    fields = {"name": "decision", "payload": initial["payload"], "key": key}
    review = operator_client.post(signal_url(task), fields)
    assert review.status_code == 200 and review.context["confirm"]
    assert TaskSignal.objects.count() == 0  # nothing sent before the confirmation
    sent = operator_client.post(signal_url(task), {**fields, "confirmed": "yes"})
    assert sent.status_code == 302 and sent["Location"] == task_url(task)
    assert Task.objects.get(pk=task.pk).state == S.PENDING
    wake = TaskTransition.objects.get(task_id=task.pk, transition="wake")
    assert wake.actor == "user:operator"
    assert LogEntry.objects.filter(object_id=str(task.pk),
                                   change_message__contains="decision").count() == 1
    again = operator_client.post(signal_url(task), {**fields, "confirmed": "yes"})
    assert again.status_code == 302 and TaskSignal.objects.count() == 1  # a replay
    for message in pop_queued():
        run_task(message)
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"approved": True, "by": "operator"}


def test_reject_and_a_bad_payload_are_shown_back_and_change_nothing(operator_client, owner):
    task = waiting_task(owner)
    form = operator_client.get(signal_url(task, preset="reject"))
    assert json.loads(form.context["form"].initial["payload"]) == {"approved": False,
                                                                    "by": "operator"}
    for bad in ({"name": "decision", "payload": "[1]", "key": "k"},
                {"name": "decision", "payload": "{", "key": "k"},
                {"name": "bad name", "payload": "{}", "key": "k", "confirmed": "yes"}):
        response = operator_client.post(signal_url(task), bad)
        assert response.status_code == 200 and response.context["form"].errors, bad
    assert TaskSignal.objects.count() == 0
    assert Task.objects.get(pk=task.pk).state == S.WAITING


def test_without_the_signal_permission_the_page_is_refused_and_no_buttons_show(
        viewer_client, owner):
    task = waiting_task(owner)
    assert 'id="pilot-approve"' not in viewer_client.get(task_url(task)).content.decode()
    assert viewer_client.get(signal_url(task)).status_code == 403
    refused = viewer_client.post(signal_url(task), {"name": "decision", "payload": "{}",
                                                    "key": "k", "confirmed": "yes"})
    assert refused.status_code == 403 and TaskSignal.objects.count() == 0


def test_the_dashboard_lists_who_waits_for_a_person_and_the_list_filters_them(
        operator_client, owner):
    person = waiting_task(owner)
    timer = waiting_task(owner, "demo.timer", {"seconds": 600})
    dashboard = operator_client.get(reverse("admin:workflows_task_dashboard")).content.decode()
    assert 'id="pilot-waiting-for-a-person"' in dashboard
    assert str(person.pk)[:8] in dashboard and str(timer.pk)[:8] not in dashboard.split(
        'id="pilot-waiting-for-a-person"')[1].split("</table>")[0]
    listed = operator_client.get(LIST_URL + "?waiting_for=signal")
    assert [t.pk for t in listed.context["cl"].result_list] == [person.pk]
    timers = operator_client.get(LIST_URL + "?waiting_for=timer")
    assert [t.pk for t in timers.context["cl"].result_list] == [timer.pk]
    assert operator_client.get(LIST_URL + "?waiting_for=bogus").status_code in (200, 302)
