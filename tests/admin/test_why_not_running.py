"""Why a task that is not running is not running (engine/why.py): on the task
page's "Now", in the list's "why not running" column and in Workers & queue's
client shares — the cap (with its count), a workflow's max_running or
concurrency, a delayed start, a backoff, a wait, no live worker, or queued.

The caps are the engine's own (engine/caps.py `Slots.refusal`), so a case here
is also what a claim would decide."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.admin.conftest import task_url
from tests.admin.test_workers import cluster  # noqa: F401 - a live cluster's status record
from tests.factories import make_task
from tests.support.procs import wait_until
from workflows.admin.workers import cluster_stats
from workflows.engine import why_not_running
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

LIST_URL = "/admin/workflows/task/"
WORKERS_URL = "/admin/workflows/task/workers/"


def test_a_client_at_its_cap_is_said_with_its_count_on_page_list_and_workers(
        settings, cluster, owner, operator_client):  # noqa: F811
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 1
    running = make_task(owner, state=S.RUNNING, key="slow-one")
    Task.objects.filter(pk=running.pk).update(lease_owner="node-a:111")
    held = make_task(owner, key="held-back")

    page = operator_client.get(task_url(held)).content.decode()
    now = page.split('id="pilot-now"')[1].split('id="steps-group"')[0]
    assert 'data-why="client_cap"' in now
    assert "1 of 1 of its tasks hold a worker" in now
    assert "PILOT_MAX_RUNNING_PER_CLIENT</code>=1" in now

    listing = operator_client.get(LIST_URL).content.decode()
    cell = listing.split('data-why="client_cap"')[1].split("</span>")[0]
    assert "at its client&#x27;s cap: 1 of 1 running" in cell

    workers = operator_client.get(WORKERS_URL).content.decode()
    share = workers.split(f'data-client="{owner.username}"')[1].split("</tr>")[0]
    assert 'data-at-cap="true"' in share and "1 / 1" in share
    assert "1 task(s) wait for its share, not for a worker" in share

    # Its running task ends: the same task is now merely queued for a worker.
    Task.objects.filter(pk=running.pk).update(state=S.SUCCEEDED, lease_owner="")
    page = operator_client.get(task_url(held)).content.decode()
    assert 'data-why="queued"' in page
    assert f'data-client="{owner.username}"' not in operator_client.get(
        WORKERS_URL).content.decode()


def test_the_workflow_caps_delays_backoffs_and_waits_each_say_which(
        settings, owner, temp_workflow):
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 0
    temp_workflow("t.own", max_running=1).step(lambda ctx: None, name="a")
    temp_workflow("t.total", concurrency=1).step(lambda ctx: None, name="a")
    make_task(owner, state=S.RUNNING, workflow="t.own")
    make_task(owner, state=S.RUNNING, workflow="t.total")
    own = make_task(owner, workflow="t.own")
    total = make_task(owner, workflow="t.total")
    later = make_task(owner, key="later")
    Task.objects.filter(pk=later.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    retrying = make_task(owner, state=S.RETRYING, key="retrying")
    Task.objects.filter(pk=retrying.pk).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5))
    make_task(owner, state=S.WAITING, key="parked")
    ready = make_task(owner, key="ready")
    tasks = list(Task.objects.all())
    answers = why_not_running(tasks, now=timezone.now(), workers=lambda: 0)
    kinds = {t.idempotency_key: answers[t.pk].kind for t in tasks if t.pk in answers}
    assert kinds[own.idempotency_key] == "workflow_cap"
    assert kinds[total.idempotency_key] == "concurrency"
    assert kinds["later"] == "delayed" and kinds["retrying"] == "backoff"
    assert kinds["parked"] == "waiting"
    assert kinds["ready"] == "no_worker"  # no live worker reports
    assert not any(t.state == S.RUNNING and t.pk in answers for t in tasks)
    assert answers[own.pk].text == "at its workflow's max_running: 1 of 1 of this client's running"
    assert answers[later.pk].until is not None
    # With workers alive, the ready one is queued; and the workers are asked once.
    asked = []
    answers = why_not_running(tasks, now=timezone.now(),
                              workers=lambda: asked.append(1) or 2)
    assert answers[ready.pk].kind == "queued" and asked == [1]


def test_no_live_worker_is_said_on_the_task_page(settings, owner, operator_client):
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 1
    wait_until(lambda: not cluster_stats()[0], 10, what="earlier clusters' records to expire")
    task = make_task(owner)
    now = operator_client.get(task_url(task)).content.decode().split('id="pilot-now"')[1]
    assert 'data-why="no_worker"' in now and "no live worker reports" in now


def test_the_why_column_costs_the_same_queries_for_a_few_and_many_waiting(
        settings, cluster, owner, operator_client):  # noqa: F811
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 1
    make_task(owner, state=S.RUNNING, key="holder")
    for i in range(3):
        make_task(owner, key=f"few-{i}")
    operator_client.get(LIST_URL)  # warm the session and content types
    with CaptureQueriesContext(connection) as few:
        assert operator_client.get(LIST_URL).status_code == 200
    for i in range(30):
        make_task(owner, key=f"many-{i}")
    with CaptureQueriesContext(connection) as many:
        html = operator_client.get(LIST_URL).content.decode()
    assert html.count('data-why="client_cap"') == 33
    assert len(many) == len(few), [q["sql"][:120] for q in many.captured_queries]
