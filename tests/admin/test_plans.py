"""No console page and no /metrics scrape reads history by a sequential scan
(issue 34): every SELECT a page issues is EXPLAINed on a database holding a
day of history from the scale study's generator (tests/support/history.py),
its statistics fresh, and no plan may hold a `Seq Scan` of the task, step or
audit (transition) table. At 10 M retained tasks each such scan costs seconds;
here the table is small enough to fill in seconds and large enough that the
planner's choice is the one it makes at scale (a scan it picks over 40 000
tasks it picks over 10 M too)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.admin.conftest import LIST_URL, task_url
from tests.support.history import history_fill
from workflows.admin.paging import cursor_text
from workflows.models import Task

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

TASKS = 40_000
HISTORY = re.compile(r"Seq Scan on (workflows_task|workflows_stepcheckpoint"
                     r"|workflows_tasktransition)\b")


@pytest.fixture
def history(django_user_model):
    history_fill(TASKS, timezone.now(), rebuild_indexes=False)
    return django_user_model.objects.get(username="scale-client-03")


def scans_of_history(run) -> list[tuple[str, str]]:
    """(query, plan) of each SELECT `run` issues whose plan scans a history
    table from end to end."""
    with CaptureQueriesContext(connection) as queries:
        run()
    found = []
    with connection.cursor() as cursor:
        # The scrape's SET LOCAL statement_timeout outlives its savepoint in the
        # test's one transaction; the EXPLAINs are not what it limits.
        cursor.execute("SET LOCAL statement_timeout = 0")
        for query in queries.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            if HISTORY.search(plan):
                found.append((sql[:300], plan))
    return found


def pages(history, client):
    """Every page an operator opens, by name: the list by default, with each
    filter and search, a keyset page deep in the list, a task page, the
    dashboard, its live refresh, Workers & queue, and the scrape."""
    failed = Task.objects.filter(state="failed").order_by("-created_at").first()
    deep = Task.objects.order_by("-created_at", "-pk")[TASKS // 2]
    hour_ago = (timezone.now() - timedelta(hours=1)).isoformat()
    lists = {
        "list default": {},
        "list failed": {"state__exact": "failed"},
        "list running": {"state__exact": "running"},
        "list workflow": {"workflow": "demo.saga"},
        "list failed + workflow": {"state__exact": "failed", "workflow": "demo.saga"},
        "list owner": {"owner": str(history.pk)},
        "list waiting for a signal": {"waiting_for": "signal"},
        "list created in the last hour": {"created_at__gte": hour_ago},
        "list finished in the last hour": {"finished_at__gte": hour_ago},
        "payload search": {"q": "payload.oref=4242"},
        "payload search, text": {"q": "payload.user=cust-17"},
        "key search": {"q": "ord-000004242"},
        "key prefix search": {"q": "ord-00000"},
        "id search": {"q": str(failed.pk)},
        "id prefix search": {"q": str(failed.pk)[:8]},
        "list deep page (keyset)": {"before": cursor_text(deep)},
    }
    return {
        **{name: (lambda p=params: client.get(LIST_URL, p)) for name, params in lists.items()},
        "live list": lambda: client.get(f"{LIST_URL}live/", {"view": "list",
                                                              "params": "state__exact=failed"}),
        "task page": lambda: client.get(task_url(failed)),
        "dashboard": lambda: client.get(f"{LIST_URL}dashboard/"),
        "dashboard live": lambda: client.get(f"{LIST_URL}live/", {"view": "dashboard"}),
        "workers & queue": lambda: client.get(f"{LIST_URL}workers/"),
        "metrics": lambda: client.get("/metrics"),
    }


DASHBOARD = ("dashboard", "dashboard live")


def assert_no_scans(history, client, names) -> None:
    every = pages(history, client)
    found = {}
    for name in names:
        run = every[name]
        run()  # warm: session, content types
        assert run().status_code == 200, name
        found.update({f"{name}: {sql}": plan for sql, plan in scans_of_history(run)})
    assert not found, "\n\n".join(f"{where}\n{plan}" for where, plan in found.items())


def test_no_list_search_task_page_workers_or_scrape_scans_history(history, operator_client,
                                                                  settings):
    """And the payload search's containment is served by its GIN index."""
    settings.PILOT_METRICS_TASKS_TTL = 0  # every scrape reads the database
    names = [n for n in pages(history, operator_client) if n not in DASHBOARD]
    assert len(names) == 20
    assert_no_scans(history, operator_client, names)
    assert_payload_search_uses_its_index()


def test_the_dashboard_does_not_scan_history_once_its_activity_is_folded(history,
                                                                      operator_client):
    """As a running dispatcher leaves it: the day's minutes folded
    (workflows/engine/activity.py) up to the current one."""
    from workflows.engine.activity import ActivityFolding, folded_until, minute_of

    fold = ActivityFolding(every=0)
    while folded_until() is None or folded_until() < minute_of(timezone.now()):
        fold(timezone.now())
    assert_no_scans(history, operator_client, DASHBOARD)


def assert_payload_search_uses_its_index() -> None:
    """`payload.oref=4242` (a number, so the text "4242" too): two containments,
    each a bitmap scan of pilot_task_payload_gin_idx (migration 0030). Called by
    the test above, to share its history (filling one costs seconds)."""
    from workflows.admin.search import search_tasks

    query = search_tasks(Task.objects.all(), "payload.oref=4242").values_list("pk")
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "pilot_task_payload_gin_idx" in plan and "Seq Scan" not in plan, plan
    assert [str(pk) for pk, in query] == [str(Task.objects.get(idempotency_key="ord-000004242").pk)]


def test_the_check_sees_a_scan_of_history():
    """The EXPLAIN check itself: a query no index serves is reported."""
    found = scans_of_history(lambda: list(Task.objects.filter(error__contains="no to order 7")
                                          .values_list("pk")[:5]))
    assert found and "Seq Scan on workflows_task" in found[0][1]
