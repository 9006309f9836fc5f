"""The filter-wide retry's dry run says what it retries and what follows
(workflows/admin/bulk.py `bulk_outlook`, `filter_names`; docs/console.md
"Everything matching a filter"): the errors grouped, the fresh budget, the
queue ahead and each client's share — and the filter by names, not ids."""

from __future__ import annotations

import re

import pytest

from tests.factories import make_task
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

BULK = "/admin/workflows/task/bulk/"


def failed(owner, key: str, error: str, workflow: str = "demo.echo"):
    task = make_task(owner, state=S.FAILED, key=key, workflow=workflow)
    Task.objects.filter(pk=task.pk).update(error=error)
    return task


def test_the_retry_dry_run_shows_errors_budget_queue_and_caps(operator_client, owner,
                                                             settings):
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 1
    for i in range(3):
        failed(owner, f"inc-m{i}", "RetryableError: merchant API said 502")
    failed(owner, "inc-t", "TimeoutError: upstream took 30 s")
    make_task(owner, state=S.CANCELLED, key="inc-c")
    make_task(owner, state=S.RUNNING, key="busy")          # holds client-a's one slot
    make_task(owner, key="queued-1")                       # ahead in the queue
    html = operator_client.get(f"{BULK}retry/", {"q": "inc", "owner": str(owner.pk)}
                               ).content.decode()
    errors = re.findall(
        r'data-count="(\d+)">\d+</td><td class="pilot-wrap pilot-warn">([^<]+)<', html)
    assert errors == [("3", "RetryableError: merchant API said 502"),
                      ("1", "TimeoutError: upstream took 30 s")]
    assert "1 without an error (cancelled, not failed)" in html
    budgets = html.split('id="pilot-bulk-budgets"')[1].split("</ul>")[0]
    assert "5 × <code>demo.echo</code>" in budgets and 'data-budget="3"' in budgets
    when = html.split('id="pilot-bulk-when"')[1].split("</ul>")[0]
    assert 'data-ahead="1"' in when
    assert "<strong>client-a</strong>'s: <span class=\"pilot-warn\">at its cap of 1" in when
    # The filter by names: the owner's username, not its id.
    assert '<code data-filter="owner">owner=client-a</code>' in html
    assert f"owner={owner.pk}<" not in html
    assert Task.objects.filter(state=S.FAILED).count() == 4  # a dry run changes nothing


def test_more_errors_than_shown_are_counted_and_a_cancel_has_no_outlook(operator_client,
                                                                        owner):
    for i in range(7):
        failed(owner, f"e{i}", f"ValueError: bad row {i}")
    html = operator_client.get(f"{BULK}retry/").content.decode()
    assert html.count('class="pilot-wrap pilot-warn"') == 5
    assert "2 more with other errors." in html
    assert "No client-wide cap" in html
    make_task(owner, key="p1")
    cancel = operator_client.get(f"{BULK}cancel/").content.decode()
    assert 'id="pilot-bulk-outlook"' not in cancel


def test_an_unknown_owner_id_is_shown_as_given(operator_client, owner):
    failed(owner, "x", "E: x")
    html = operator_client.get(f"{BULK}retry/", {"owner": "999999"}).content.decode()
    assert '<code data-filter="owner">owner=999999</code>' in html
