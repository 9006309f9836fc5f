"""The task list at any retention (workflows/admin/paging.py): keyset pages in
the default order, counts exact up to a cap and estimated beyond."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape as html_unescape
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.admin.conftest import LIST_URL
from workflows.admin.text import count_text
from workflows.models import Task
from workflows.rules.fingerprint import fingerprint
from workflows.rules.states import TaskState as S
from workflows.selectors import counts_or_estimates, task_counts_by_state

pytestmark = pytest.mark.django_db


def tasks_at(owner, n: int, *, ties_every: int = 3, state=S.SUCCEEDED,
             prefix: str = "key") -> list[Task]:
    """n tasks, newest first `key-0`, every `ties_every` tasks sharing one
    created_at (ties a page boundary must not lose or repeat)."""
    now = timezone.now()
    return Task.objects.bulk_create(
        Task(owner=owner, idempotency_key=f"{prefix}-{i}", workflow="demo.echo", payload={},
             fingerprint=fingerprint("demo.echo", {}), state=state, max_attempts=3,
             created_at=now - timedelta(seconds=i // ties_every), updated_at=now)
        for i in range(n))


def shown_keys(html: str) -> list[str]:
    return re.findall(r'<span title="(key-\d+)">', html)


def older_link(html: str) -> dict | None:
    found = re.search(r'<a href="([^"]+)" class="pilot-page-older">', html)
    return dict(parse_qsl(urlsplit(html_unescape(found.group(1))).query)) if found else None


def test_following_older_shows_every_task_once_newest_first(operator_client, owner):
    tasks = tasks_at(owner, 130)
    expected = [t.idempotency_key for t in sorted(tasks, key=lambda t: (t.created_at, t.pk),
                                                  reverse=True)]
    seen, params, pages = [], {}, 0
    while params is not None:
        with CaptureQueriesContext(connection) as queries:
            html = operator_client.get(LIST_URL, params).content.decode()
        pages += 1
        if "before" in params:
            page_sql = [q["sql"] for q in queries.captured_queries
                        if '"workflows_task"."idempotency_key"' in q["sql"]]
            assert page_sql and not any("OFFSET" in sql for sql in page_sql), page_sql
        seen += shown_keys(html)
        assert "130 tasks" in html
        params = older_link(html)
    assert pages == 3 and seen == expected


def test_a_keyset_page_keeps_the_filters(operator_client, owner):
    tasks_at(owner, 60, state=S.FAILED)
    tasks_at(owner, 5, state=S.PENDING, prefix="other")
    html = operator_client.get(LIST_URL, {"state__exact": "failed"}).content.decode()
    link = older_link(html)
    assert link["state__exact"] == "failed"
    rest = operator_client.get(LIST_URL, link).content.decode()
    assert len(shown_keys(html)) == 50 and len(shown_keys(rest)) == 10
    assert older_link(rest) is None and 'class="pilot-page-newest"' in rest


def test_an_old_page_number_link_still_shows_that_page(operator_client, owner):
    tasks = tasks_at(owner, 120)
    newest_first = [t.idempotency_key for t in sorted(
        tasks, key=lambda t: (t.created_at, t.pk), reverse=True)]
    html = operator_client.get(LIST_URL, {"p": "3"}).content.decode()
    assert shown_keys(html) == newest_first[100:]


def test_a_malformed_position_is_dropped_with_a_message(operator_client, owner):
    response = operator_client.get(LIST_URL, {"before": "yesterday,not-an-id"})
    assert response.status_code == 302 and "before" not in response["Location"]


@pytest.mark.parametrize("n, exact, text", [
    (0, True, "0"), (9_999, True, "9999"), (12_345, False, "about 12 000"),
    (987, False, "about 990"), (8_612_345, False, "about 8.6 M"),
])
def test_count_text(n, exact, text):
    assert count_text(n, exact) == text


def test_finished_states_are_counted_exactly_up_to_the_cap(owner):
    tasks_at(owner, 7, state=S.SUCCEEDED)
    counts = task_counts_by_state(exact_up_to=10)
    assert counts[S.SUCCEEDED] == 7 and counts.estimated == frozenset()
    counts = task_counts_by_state(exact_up_to=5)
    if connection.vendor == "postgresql":
        assert counts.estimated == {S.SUCCEEDED} and counts[S.SUCCEEDED] >= 6
    else:  # no planner estimate: counted in full
        assert counts.estimated == frozenset() and counts[S.SUCCEEDED] == 7


@pytest.mark.postgres
def test_past_the_cap_the_list_says_about(operator_client, owner, monkeypatch):
    """Beyond the cap the list prints the planner's estimate as one."""
    from workflows.admin import paging

    tasks_at(owner, 80)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE workflows_task")
    monkeypatch.setattr(paging, "EXACT_COUNT_UP_TO", 20)
    html = operator_client.get(LIST_URL).content.decode()
    paginator = re.search(r'<p class="paginator">(.*?)</p>', html, re.S).group(1)
    assert re.search(r"about \d+ tasks", paginator), paginator


def test_a_queryset_that_can_match_nothing_counts_zero_beside_one_that_counts(owner):
    """`.none()` and `pk__in=[]` compile to no SQL at all (EmptyResultSet): they
    count 0, exactly, in the same call as a queryset that does count."""
    tasks_at(owner, 3)
    with CaptureQueriesContext(connection) as queries:
        answers = counts_or_estimates([Task.objects.none(), Task.objects.filter(pk__in=[]),
                                       Task.objects.filter(owner=owner)])
    assert answers == [(0, True), (0, True), (3, True)]
    assert len(queries) == 1
