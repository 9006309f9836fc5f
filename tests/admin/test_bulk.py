"""Cancel / retry everything matching a filter (workflows/admin/bulk.py,
bulk_views.py): a summary dry run, then chunks through the engine with a
progress page, Django admin log entries, the filter kept on the way back."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.core import signing
from django.test import Client

from tests.admin.conftest import LIST_URL, _staff
from tests.factories import make_task
from workflows.admin import bulk
from workflows.models import Task, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

BULK = "/admin/workflows/task/bulk/"


def pending_tasks(owner, n: int, *, prefix: str = "inc") -> list:
    return [make_task(owner, key=f"{prefix}-{i}") for i in range(n)]


def start(client, action: str, filters: dict, reason: str = "incident 42"):
    """Confirm the dry run; returns the job token from the redirect."""
    response = client.post(f"{BULK}{action}/?{urlencode(filters)}", {"reason": reason})
    assert response.status_code == 302, response.content.decode()[:500]
    return parse_qs(urlparse(response["Location"]).query)["job"][0]


def run_chunks(client, action: str, token: str) -> dict:
    """Post chunks as the progress page's script does, until done."""
    state = {"job": token, "cursor": "", "handled": "0", "changed": "0", "refused": "0"}
    rounds = 0
    while True:
        data = client.post(f"{BULK}{action}/run/", state,
                           HTTP_ACCEPT="application/json").json()
        rounds += 1
        state.update({k: str(data[k]) for k in ("cursor", "handled", "changed", "refused")})
        if data["done"]:
            return {**data, "rounds": rounds}


def test_the_dry_run_summarises_by_state_and_changes_nothing(operator_client, owner):
    pending_tasks(owner, 3)
    make_task(owner, state=S.RUNNING, key="inc-run")
    make_task(owner, state=S.SUCCEEDED, key="inc-done")
    make_task(owner, state=S.PENDING, key="other-1")  # outside the filter
    response = operator_client.get(f"{BULK}cancel/?q=inc")
    html = response.content.decode()
    summary = dict(re.findall(r'data-summary-state="(\w+)">.*?data-count="(\d+)"', html, re.S))
    assert summary == {"pending": "3", "running": "1", "succeeded": "1"}
    assert "4</strong> task(s) would change" in html
    assert "no change: a succeeded task cannot be cancelled" in html
    assert html.index('id="pilot-bulk-summary"') < html.index('id="pilot-plan"')
    assert 'value="Cancel 4 task(s)"' in html
    assert f'href="{LIST_URL}?q=inc" class="button cancel-link" id="pilot-back"' in html
    assert set(Task.objects.values_list("state", flat=True)) == {"pending", "running",
                                                                 "succeeded"}
    assert not TaskTransition.objects.filter(transition="cancel").exists()


def test_confirm_is_not_offered_when_nothing_would_change(operator_client, owner):
    make_task(owner, state=S.SUCCEEDED, key="done-1")
    html = operator_client.get(f"{BULK}cancel/?state__exact=succeeded").content.decode()
    assert 'id="pilot-nothing"' in html and 'id="pilot-confirm"' not in html
    assert f'href="{LIST_URL}?state__exact=succeeded"' in html
    # Posting anyway starts nothing.
    response = operator_client.post(f"{BULK}cancel/?state__exact=succeeded", {"reason": "x"})
    assert response.status_code == 200 and 'id="pilot-nothing"' in response.content.decode()


def test_a_filter_wide_cancel_runs_in_chunks_through_the_engine_and_is_logged(
        operator_client, operator, owner, monkeypatch):
    monkeypatch.setattr(bulk, "CHUNK", 4)
    tasks = pending_tasks(owner, 10)
    running = make_task(owner, state=S.RUNNING, key="inc-running")
    make_task(owner, key="spared")
    token = start(operator_client, "cancel", {"q": "inc"})
    progress = operator_client.get(f"{BULK}cancel/run/?job={token}").content.decode()
    assert 'id="pilot-bulk-form"' in progress and "of 11 task(s)" in progress
    late = make_task(owner, key="inc-late")  # created after confirming: left alone
    result = run_chunks(operator_client, "cancel", token)
    assert (result["handled"], result["changed"], result["refused"]) == (11, 11, 0)
    assert result["rounds"] == 3
    assert {t.state for t in Task.objects.filter(pk__in=[t.pk for t in tasks])} == {
        S.CANCELLED}
    assert Task.objects.get(pk=running.pk).state == S.CANCELLING
    assert Task.objects.get(pk=late.pk).state == S.PENDING
    assert Task.objects.get(idempotency_key="spared").state == S.PENDING
    audits = TaskTransition.objects.filter(transition="cancel", actor="user:operator",
                                           reason="incident 42")
    assert audits.count() == 11
    logged = LogEntry.objects.filter(user=operator, action_flag=CHANGE)
    assert logged.count() == 11
    assert logged.first().get_change_message() == \
        "Cancel through the console (filter-wide): incident 42"
    # The outcome: counts, and where the tasks are now, each a link to the filtered list.
    done = operator_client.get(result["done_url"]).content.decode()
    assert "<strong>11</strong> of 11 task(s) changed" in done
    now = dict(re.findall(r'data-now-state="(\w+)">.*?data-count="(\d+)"', done, re.S))
    assert now == {"cancelling": "1", "cancelled": "10"}
    assert f'href="{LIST_URL}?q=inc&amp;state__exact=cancelled"' in done
    assert f'href="{LIST_URL}?q=inc" id="pilot-back"' in done


def test_tasks_changed_meanwhile_are_skipped_and_engine_refusals_reported(
        operator_client, owner, operator):
    from workflows.engine.operations import task_cancel

    tasks = pending_tasks(owner, 3)
    token = start(operator_client, "cancel", {"q": "inc"})
    task_cancel(task_id=tasks[0].pk, user=operator)  # someone else got there first
    result = run_chunks(operator_client, "cancel", token)
    assert (result["handled"], result["changed"], result["refused"]) == (2, 2, 0)
    # The engine refuses to retry a task whose workflow is gone; the job goes on.
    gone = make_task(owner, state=S.FAILED, workflow="retired.workflow", key="inc-gone")
    token = start(operator_client, "retry", {"q": "inc"})
    result = run_chunks(operator_client, "retry", token)
    assert (result["handled"], result["changed"], result["refused"]) == (4, 3, 1)
    assert result["refusals"] == [[str(gone.pk), "invalid_transition: Workflow "
                                   "'retired.workflow' is no longer registered; the task "
                                   "cannot run"]]
    assert Task.objects.get(pk=gone.pk).state == S.FAILED


def test_without_script_the_progress_page_continues_chunk_by_chunk(operator_client, owner,
                                                                  monkeypatch):
    monkeypatch.setattr(bulk, "CHUNK", 2)
    pending_tasks(owner, 3)
    token = start(operator_client, "cancel", {"q": "inc"})
    first = operator_client.post(f"{BULK}cancel/run/", {"job": token, "cursor": ""})
    html = first.content.decode()
    assert first.status_code == 200 and 'id="pilot-continue"' in html
    cursor = re.search(r'name="cursor" value="([^"]+)"', html).group(1)
    assert re.search(r'id="pilot-handled">2<', html)
    last = operator_client.post(f"{BULK}cancel/run/", {"job": token, "cursor": cursor,
                                                       "handled": "2", "changed": "2"})
    assert last.status_code == 302 and "/bulk/cancel/done/" in last["Location"]
    assert Task.objects.filter(state=S.CANCELLED).count() == 3


def test_select_all_across_the_filter_goes_to_the_filter_wide_action(operator_client, owner):
    pending_tasks(owner, 3)
    response = operator_client.post(f"{LIST_URL}?q=inc", {
        "action": "cancel_selected", "select_across": "1", "index": "0",
        ACTION_CHECKBOX_NAME: [str(Task.objects.first().pk)]})
    assert response.status_code == 302
    assert response["Location"] == f"{BULK}cancel/?q=inc"
    assert not Task.objects.filter(state=S.CANCELLED).exists()


def test_jobs_are_signed_per_user_and_action(operator_client, owner, django_user_model):
    pending_tasks(owner, 2)
    token = start(operator_client, "cancel", {"q": "inc"})
    other = Client()
    other.force_login(_staff(django_user_model, "op2", operators=True))
    assert other.post(f"{BULK}cancel/run/", {"job": token}).status_code == 403
    assert operator_client.post(f"{BULK}cancel/run/", {"job": token + "x"}).status_code == 403
    forged = signing.dumps({"a": "cancel", "f": "", "r": "", "c": "2000-01-01T00:00:00+00:00",
                            "u": 1, "n": 1}, salt="wrong", compress=True)
    assert operator_client.post(f"{BULK}cancel/run/", {"job": forged}).status_code == 403
    assert operator_client.post(f"{BULK}retry/run/", {"job": token}).status_code == 404
    assert Task.objects.filter(state=S.PENDING).count() == 2


def test_the_filter_wide_action_needs_the_transitions_permission(viewer_client, owner):
    pending_tasks(owner, 2)
    response = viewer_client.get(f"{BULK}cancel/?q=inc")
    assert response.status_code == 403
    assert "workflows.cancel_task" in response.content.decode()
    assert viewer_client.post(f"{BULK}cancel/?q=inc", {"reason": "x"}).status_code == 403
    assert 'data-filter-action' not in viewer_client.get(LIST_URL).content.decode()
    assert Task.objects.filter(state=S.PENDING).count() == 2


def test_a_bad_filter_is_a_clear_400_not_a_500(operator_client):
    response = operator_client.get(f"{BULK}cancel/?workflow=%00")
    assert response.status_code == 400
    assert "workflow contains a NUL character" in response.content.decode()


def test_a_filter_wide_action_only_reaches_tasks_the_user_may_see(django_user_model, owner):
    mine_only = _staff(django_user_model, "own-canceller",
                       perms=("view_task", "cancel_task"))
    client = Client()
    client.force_login(mine_only)
    own = make_task(mine_only, key="inc-own")
    theirs = make_task(owner, key="inc-theirs")
    token = start(client, "cancel", {"q": "inc"})
    result = run_chunks(client, "cancel", token)
    assert result["changed"] == 1
    assert Task.objects.get(pk=own.pk).state == S.CANCELLED
    assert Task.objects.get(pk=theirs.pk).state == S.PENDING
