"""Console actions where Django users look (workflows/admin/audit.py): admin
LogEntry rows for triggers, cancels and retries, shown in "Recent actions"
and on the task's History page, which also shows the transition history."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry

from tests.admin.conftest import LIST_URL, task_url
from tests.factories import make_task
from workflows.models import Task
from workflows.rules.states import TaskState as S

# transaction=True: with the Redis broker an enqueue happens on commit.
pytestmark = pytest.mark.django_db(transaction=True)


def entries(task) -> list[tuple[int, str]]:
    return list(LogEntry.objects.filter(object_id=str(task.pk)).order_by("action_time", "id")
                .values_list("action_flag", "change_message"))


def test_trigger_cancel_and_retry_from_the_console_are_logged(operator_client, operator):
    operator_client.post("/admin/workflows/task/trigger/", {
        "workflow": "demo.echo", "idempotency_key": "logged", "payload": "{}"})
    task = Task.objects.get()
    operator_client.post("/admin/workflows/task/trigger/", {
        "workflow": "demo.echo", "idempotency_key": "logged", "payload": "{}"})
    operator_client.post(task_url(task, "transition/cancel/"), {"reason": "wrong input"})
    operator_client.post(task_url(task, "transition/retry/"), {"reason": "fixed"})
    assert entries(task) == [
        (ADDITION, "Triggered through the console: created"),
        (CHANGE, "Triggered through the console: replayed (nothing new was started)"),
        (CHANGE, "Cancel through the console: wrong input"),
        (CHANGE, "Retry through the console: fixed"),
    ]
    assert set(LogEntry.objects.values_list("user_id", flat=True)) == {operator.pk}


def test_a_refused_action_logs_nothing(operator_client, owner):
    task = make_task(owner, state=S.SUCCEEDED)
    operator_client.post(task_url(task, "transition/cancel/"), {"reason": "too late"})
    assert entries(task) == []


def test_bulk_actions_log_each_changed_task_once(operator_client, owner):
    pending = [make_task(owner) for _ in range(3)]
    done = make_task(owner, state=S.SUCCEEDED)
    operator_client.post(LIST_URL, {"action": "cancel_selected", "confirmed": "yes",
                                    "reason": "bulk",
                                    ACTION_CHECKBOX_NAME: [str(t.pk) for t in
                                                           [*pending, done]]})
    for task in pending:
        assert entries(task) == [(CHANGE, "Cancel through the console (selected tasks): bulk")]
    assert entries(done) == []


def test_recent_actions_and_the_history_page_show_them(operator_client, owner):
    task = make_task(owner, state=S.RUNNING)
    operator_client.post(task_url(task, "transition/cancel/"), {"reason": "incident"})
    index = operator_client.get("/admin/").content.decode()
    recent = index.split("Recent actions")[1]
    assert task_url(task) in recent and "demo.echo" in recent
    history = operator_client.get(task_url(task, "history/")).content.decode()
    logged = history.split('id="change-history"')[1].split('id="pilot-transitions"')[0]
    assert "Cancel through the console: incident" in logged and "operator" in logged
    transitions = history.split('id="pilot-transitions"')[1]
    assert transitions.count("data-transition=") == 2
    assert 'data-transition="claim"' in transitions and 'data-transition="cancel"' in transitions
    assert "incident" in transitions
    # ISO time with seconds, not Django's "Nov. 30, 2026, 2:04 p.m.".
    when = LogEntry.objects.get().action_time
    assert when.strftime("%Y-%m-%dT%H:%M:%SZ") in logged


def test_the_history_of_a_task_without_console_actions_still_shows_transitions(
        operator_client, owner):
    task = make_task(owner, state=S.FAILED)
    history = operator_client.get(task_url(task, "history/")).content.decode()
    assert "No console action on this task yet" in history
    assert 'data-transition="fail"' in history
