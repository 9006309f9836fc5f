"""The dashboard page (workflows/admin/dashboard.py)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.factories import make_task
from tests.support.helpers import drain, expire_lease
from workflows.engine.triggers import task_trigger

# transaction=True: with the Redis broker an enqueue happens on commit.
pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/workflows/task/dashboard/"


def test_the_dashboard_shows_counts_chart_stuck_tasks_and_failures(operator_client, owner):
    for i in range(3):
        task_trigger(owner=owner, key=f"e{i}", workflow="demo.echo", payload={})
    task_trigger(owner=owner, key="e0", workflow="demo.echo", payload={})  # replay
    task_trigger(owner=owner, key="bad", workflow="demo.saga", payload={"fail": True})
    drain()
    stuck = make_task(owner, state="running", key="stuck-one")
    expire_lease(stuck.pk)
    waiting = make_task(owner, key="waiting-one")
    response = operator_client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    counts = dict(re.findall(r'data-state="(\w+)".*?pilot-card-n">(\d+)<', html, re.S))
    assert counts == {"pending": "1", "running": "1", "retrying": "0", "waiting": "0",
                      "cancelling": "0",
                      "compensating": "0", "succeeded": "3", "failed": "1", "cancelled": "0"}
    totals = dict(re.findall(r'data-total="(\w+)">(\d+)<', html))
    assert totals == {"triggers": "6", "replays": "1", "successes": "3", "failures": "1",
                      "retries": "0"}
    assert html.count('data-series="') == 5 and "<svg" in html
    # Cards count tasks by state now, totals count events: each says so.
    cards_say = html.split('id="pilot-cards-say">')[1].split("</span>")[0]
    assert "tasks by their state now" in cards_say and "all time" in cards_say
    totals_say = html.split('id="pilot-totals-say">')[1].split("</span>")[0]
    assert "last 24 hours" in totals_say and "every move to failed" in totals_say
    past_lease = html.split('id="pilot-stuck"')[1].split("</table>")[0]
    assert f'data-task="{stuck.pk}"' in past_lease
    oldest = html.split('id="pilot-oldest-pending"')[1].split("</table>")[0]
    assert str(waiting.pk)[:8] in oldest
    failing = html.split('id="pilot-top-failing"')[1].split("</table>")[0]
    assert "demo.saga" in failing and "confirmation refused" in failing
    assert 'src="http' not in html and 'href="http' not in html  # nothing from a CDN


def test_the_dashboard_costs_a_fixed_number_of_queries(operator_client, owner):
    make_task(owner, state="failed")
    operator_client.get(URL)
    with CaptureQueriesContext(connection) as few:
        operator_client.get(URL)
    for _ in range(30):
        expire_lease(make_task(owner, state="running").pk)
        make_task(owner, state="failed")
    with CaptureQueriesContext(connection) as many:
        operator_client.get(URL)
    # session, user, 2 × permissions, 5 × counts (unfinished states; finished ones
    # capped, estimated past 10 000 on PostgreSQL), activity (the folded mark, then
    # the minutes after it from history), the cluster status
    # (1 or 2 reads of the database cache: the list of clusters, then their
    # records), the queue, running tasks, waiting tasks, past lease, oldest
    # pending, waiting for a person, top failing (the folded mark, failures since,
    # the newest failed task of each workflow shown), webhooks failing (by state,
    # by endpoint; the breakers of those endpoints when any fail) — and nothing
    # per task. 24 with the second cache read (a cluster's record left by an
    # earlier test).
    assert len(many) == len(few) <= 24, [q["sql"][:100] for q in many.captured_queries]


def test_the_dashboard_needs_view_all_tasks(django_user_model):
    from django.test import Client

    from tests.admin.conftest import _staff

    own_only = _staff(django_user_model, "own-only", perms=("view_task",))
    client = Client()
    client.force_login(own_only)
    assert client.get(URL).status_code == 403


@pytest.mark.parametrize("skew_seconds", [-3600, 3600])
def test_the_console_measures_time_by_the_database_clock(operator_client, owner, monkeypatch,
                                                         skew_seconds):
    """The web server's clock an hour behind or ahead of the database's (docs/design.md,
    "Time"): the dashboard lists the task whose lease ran out 30 s ago and not the
    one with a minute left, and the task list gives ages by the database's clock."""
    from datetime import timedelta

    from django.db.models.functions import Now
    from django.utils import timezone

    from workflows.models import Task

    stuck = make_task(owner, state="running", key="stuck-one")
    healthy = make_task(owner, state="running", key="healthy-one")
    Task.objects.filter(pk=stuck.pk).update(lease_expires_at=Now() - timedelta(seconds=30))
    Task.objects.filter(pk=healthy.pk).update(lease_expires_at=Now() + timedelta(seconds=60),
                                              created_at=Now() - timedelta(seconds=5))
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=skew_seconds))

    html = operator_client.get(URL).content.decode()
    expired = re.findall(r'data-task="([^"]+)" data-worker-gone="\w+" data-lease-expired="true"',
                         html)
    assert expired == [str(stuck.pk)]  # the healthy one's lease has a minute left

    listed = operator_client.get("/admin/workflows/task/?q=healthy-one").content.decode()
    age = re.search(r'<td class="field-age"><span title="created [^"]+">([^<]+)</span>', listed)
    assert age is not None and age.group(1).endswith(" s"), age and age.group(1)
