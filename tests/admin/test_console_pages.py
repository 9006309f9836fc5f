"""What the console says around its pages: list columns, links, times, the
403 page, the owner filter's scope, the trigger form's example payloads,
the workflows page's counts (issue 12 items 5-10; issue 11 item 13)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.admin.conftest import LIST_URL, _staff, task_url
from tests.factories import make_task
from workflows.admin.text import duration_text, seconds_text, timestamp, ttl_text
from workflows.engine.store import store
from workflows.models import StepCheckpoint, Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db


def test_durations_say_milliseconds_and_times_are_iso_with_seconds():
    assert seconds_text(0.0123) == "12 ms" and seconds_text(0) == "0 ms"
    assert seconds_text(1.25) == "1.2 s" and seconds_text(42) == "42 s"
    assert seconds_text(185) == "3 min 5 s" and seconds_text(7500) == "2 h 5 min"
    assert seconds_text(3 * 86400 + 7200) == "3 d 2 h"
    assert ttl_text(timedelta(hours=24)) == "24 h" and ttl_text(timedelta(days=7)) == "7 d"
    assert ttl_text(900) == "15 min" and ttl_text(0) == "0 ms"
    moment = timezone.now().replace(microsecond=123456)
    assert timestamp(moment) == moment.strftime("%Y-%m-%dT%H:%M:%S.123Z")
    assert timestamp(moment, ms=False) == moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert duration_text(None, moment) == "–"


def test_the_list_shows_the_running_step_and_the_failed_error_with_times_on_hover(
        operator_client, owner):
    running = make_task(owner, state=S.RUNNING, key="runs")
    StepCheckpoint.objects.create(task=running, index=0, name="crunch", state="running",
                                  started_at=timezone.now())
    make_task(owner, state=S.FAILED, key="broke")  # error "boom" (the factory's)
    long_error = make_task(owner, state=S.RUNNING, key="long-error")
    store().transition(long_error, "fail", at=timezone.now(), actor="test", error="E" * 500,
                       error_type="X", now=timezone.now())
    html = operator_client.get(LIST_URL).content.decode()
    for column in ("state_badge", "workflow_link", "key_short", "age", "duration",
                   "step_or_error"):
        assert f"column-{column}" in html
    rows = dict(re.findall(
        r'<span title="([\w-]+)">[\w-]+</span>(.*?)</tr>', html, re.S))
    assert '<span class="pilot-step-now">▶ crunch</span>' in rows["runs"]
    assert 'class="pilot-error-head" title="boom">boom</span>' in rows["broke"]
    # The head of the error, cut with an ellipsis; never the whole 500 characters.
    assert "E" * 119 + "…" in rows["long-error"] and "E" * 122 not in rows["long-error"]
    created = timestamp(Task.objects.get(idempotency_key="runs").created_at)
    assert f'<span title="created {created}">' in rows["runs"]
    assert '<a href="?workflow=demo.echo" title="tasks of this workflow">' in html


def test_the_owner_filter_lists_owners_only_to_who_may_see_every_task(
        operator_client, django_user_model, owner, other_owner):
    """Issue 11, item 13: no list of other clients' usernames for a user who
    may see only their own tasks."""
    make_task(owner)
    make_task(other_owner)
    html = operator_client.get(LIST_URL).content.decode()
    assert "By owner" in html and "client-a" in html and "client-b" in html
    mine_only = _staff(django_user_model, "self-viewer", perms=("view_task",))
    make_task(mine_only)
    client = Client()
    client.force_login(mine_only)
    html = client.get(LIST_URL).content.decode()
    assert "By owner" not in html and "client-a" not in html and "client-b" not in html
    # Asking for another owner's tasks shows nothing of theirs either.
    html = client.get(LIST_URL, {"owner": str(other_owner.pk)}).content.decode()
    assert "client-b" not in html and "1 task" in html


def test_view_site_api_docs_and_favicon(operator_client):
    html = operator_client.get(LIST_URL).content.decode()
    assert '<a href="/admin/">View site</a>' in html
    assert operator_client.get("/admin/").status_code == 200  # where it goes: no 404
    assert Client().get("/").url == "/admin/"  # nor the bare host
    assert '<a href="/api/v1/docs">API docs</a>' in html
    assert '<link rel="icon" type="image/svg+xml" href="/static/pilot/favicon.svg">' in html
    index = operator_client.get("/admin/").content.decode()
    assert 'href="/api/v1/docs"' in index and 'href="/static/pilot/favicon.svg"' in index
    login = Client().get("/admin/login/").content.decode()
    assert 'href="/static/pilot/favicon.svg"' in login
    response = Client().get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/pilot/favicon.svg"


def test_the_403_page_names_the_missing_permission(viewer_client, owner):
    task = make_task(owner, state=S.PENDING)
    response = viewer_client.get(task_url(task, "transition/cancel/"))
    assert response.status_code == 403
    html = response.content.decode()
    assert "Permission denied (403)" in html
    assert "Cancel needs the permission workflows.cancel_task" in html
    assert "Signed in as <strong>viewer</strong>" in html
    trigger = viewer_client.get("/admin/workflows/task/trigger/").content.decode()
    assert "Triggering needs the permission workflows.add_task" in trigger


def test_the_trigger_form_starts_from_each_workflows_example_payload(operator_client):
    html = operator_client.get("/admin/workflows/task/trigger/").content.decode()
    examples = json.loads(re.search(
        r'<script id="pilot-payload-examples" type="application/json">(.*?)</script>', html,
        re.S).group(1))
    assert examples["demo.slow"] == {"steps": 1, "seconds": 0}
    assert examples["demo.sync_orders"] == {"batch": "", "count": 1, "step_seconds": 0}
    assert examples["demo.saga"]["fail"] is False and examples["demo.echo"] == {}
    chosen = operator_client.get("/admin/workflows/task/trigger/", {"workflow": "demo.slow"})
    form = chosen.context["form"]
    assert form["workflow"].value() == "demo.slow"
    assert json.loads(form["payload"].value()) == {"steps": 1, "seconds": 0}


def test_the_workflows_page_counts_tasks_and_failure_rate_and_links_them(operator_client,
                                                                        owner):
    for state in (S.FAILED, S.SUCCEEDED, S.SUCCEEDED, S.SUCCEEDED, S.PENDING):
        make_task(owner, state=state, workflow="demo.saga", payload={"fail": False})
    html = operator_client.get("/admin/workflows/task/workflows/").content.decode()
    saga = html.split('data-workflow="demo.saga"')[1].split("data-workflow=")[0]
    counts = dict(re.findall(r'data-count-state="(\w+)">(?:<a [^>]+>)?(\d+)', saga))
    assert counts["failed"] == "1" and counts["succeeded"] == "3" and counts["pending"] == "1"
    assert "25.0 %" in saga and "(1 failed of 4 finished)" in saga
    assert 'href="/admin/workflows/task/?workflow=demo.saga&amp;state__exact=failed"' in saga
    assert 'href="/admin/workflows/task/trigger/?workflow=demo.saga"' in saga
