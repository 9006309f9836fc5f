"""The task list and the read-only task page (workflows/admin/tasks.py)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from html import unescape as html_unescape
from urllib.parse import parse_qsl

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.admin.conftest import LIST_URL, task_url
from tests.factories import make_task
from workflows.models import Task, TaskTransition
from workflows.rules.fingerprint import fingerprint
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

# What an operator (cancel + retry) is offered on the task page, per state.
BUTTONS = {
    S.PENDING: ["cancel"],
    S.RUNNING: ["cancel"],
    S.RETRYING: ["cancel"],
    S.WAITING: ["cancel"],
    S.CANCELLING: [],
    S.COMPENSATING: [],  # already undoing its work: neither cancellable nor retryable
    S.SUCCEEDED: [],
    S.FAILED: ["retry", "retry_from_start"],
    S.CANCELLED: ["retry", "retry_from_start"],
}


def buttons(response) -> list[str]:
    return re.findall(r'data-action="([a-z_]+)"', response.content.decode())


def bulk_tasks(django_user_model, n: int, *, prefix: str) -> list[Task]:
    """n tasks, each with its own owner, spread over states and the last days:
    an N+1 on owner, state or dates would show as extra queries per row."""
    owners = django_user_model.objects.bulk_create(
        [django_user_model(username=f"{prefix}-{i}") for i in range(n)])
    states = list(S.values)
    now = timezone.now()
    return Task.objects.bulk_create([
        Task(owner=owner, idempotency_key=f"{prefix}-{i}", workflow="demo.echo",
             payload={"i": i}, fingerprint=fingerprint("demo.echo", {"i": i}),
             state=states[i % len(states)], max_attempts=3, attempts=i % 3,
             created_at=now - timedelta(hours=i), updated_at=now)
        for i, owner in enumerate(owners)])


@pytest.mark.parametrize("state", list(S.values))
def test_the_task_page_renders_every_state_with_the_right_buttons(state, operator_client,
                                                                 viewer_client, owner):
    task = make_task(owner, state=state)
    response = operator_client.get(task_url(task))
    assert response.status_code == 200
    assert buttons(response) == BUTTONS[state]
    html = response.content.decode()
    assert f'pilot-state-{state}' in html
    assert "Timeline" in html and "<svg" in html
    # The viewer sees the same page without a single action.
    response = viewer_client.get(task_url(task))
    assert response.status_code == 200 and buttons(response) == []


def test_the_task_page_is_read_only_and_pretty_prints_json(operator_client, owner):
    task = make_task(owner, state=S.FAILED, payload={"b": [1, 2], "a": "<script>"})
    html = operator_client.get(task_url(task)).content.decode()
    # Pretty, key-sorted, escaped JSON.
    assert '<pre class="pilot-json">{\n  &quot;a&quot;: &quot;&lt;script&gt;&quot;,' in html
    assert '"<script>"' not in html
    # No editable field anywhere: no input named after a task field, no save button.
    for field in ("state", "payload", "result", "idempotency_key", "workflow"):
        assert f'name="{field}"' not in html
    assert 'name="_save"' not in html
    # Steps and history: who, when, from → to, why.
    assert "history (transitions)" in html.lower() and "steps (checkpoints)" in html.lower()
    history = html.lower().split("history (transitions)")[1]
    for expected in ("claim", "fail", "pilot-state-running", "pilot-state-failed", ">test<"):
        assert expected in history, expected
    # ISO 8601 times to the millisecond, in UTC: events a few ms apart stay in order.
    when = task.transitions.order_by("at").first().at
    assert when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3].lower() + "z" in history


def test_nobody_can_save_the_change_form_not_even_a_superuser(django_user_model, owner):
    root = django_user_model.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(root)
    task = make_task(owner, state=S.PENDING)
    for data in ({"state": "succeeded"}, {"_fsm_transition_to": "cancel"},
                 {"_fsm_transition_to": "claim"}):
        response = client.post(task_url(task), data)
        assert response.status_code == 403
    task.refresh_from_db()
    assert task.state == S.PENDING and not TaskTransition.objects.filter(
        task_id=task.pk).exists()
    assert client.post(f"{LIST_URL}add/", {}).status_code == 403
    assert client.post(task_url(task, "delete/"), {"post": "yes"}).status_code == 403
    assert Task.objects.filter(pk=task.pk).exists()


def test_the_list_shows_badges_attempts_replays_age_and_duration(operator_client, owner):
    make_task(owner, state=S.SUCCEEDED, key="visible-key")
    html = operator_client.get(LIST_URL).content.decode()
    assert "pilot-state-succeeded" in html and "visible-key" in html
    assert "1/3" in html  # attempts/max
    for column in ("replays", "age", "duration", "owner", "workflow"):
        assert f"column-{column}" in html


def test_search_finds_by_full_id_id_prefix_and_key_prefix(operator_client, owner):
    one = make_task(owner, key="order-2024-001")
    two = make_task(owner, key="invoice-7")

    def found(term):
        html = operator_client.get(LIST_URL, {"q": term}).content.decode()
        return {t.idempotency_key for t in (one, two) if t.idempotency_key in html}

    assert found(str(one.pk)) == {"order-2024-001"}
    assert found(str(two.pk)[:8]) == {"invoice-7"}
    assert found(str(two.pk).upper()[:13]) == {"invoice-7"}
    assert found("order-2024") == {"order-2024-001"}
    assert found("nothing-like-it") == set()


def test_filters_by_state_workflow_owner_and_date(operator_client, owner, other_owner):
    make_task(owner, state=S.FAILED, key="failed-echo")
    make_task(other_owner, state=S.PENDING, key="pending-saga", workflow="demo.saga",
              payload={"fail": False})

    def keys(**params):
        html = operator_client.get(LIST_URL, params).content.decode()
        return {k for k in ("failed-echo", "pending-saga") if k in html}

    assert keys(state__exact="failed") == {"failed-echo"}
    assert keys(workflow="demo.saga") == {"pending-saga"}
    assert keys(owner=str(other_owner.pk)) == {"pending-saga"}
    html = operator_client.get(LIST_URL).content.decode()
    assert "By owner" in html and "client-b" in html  # owner filter lists owners
    # The date filter's own "Today" link, and the date hierarchy's year.
    today_link = re.search(r'href="\?(created_at__gte=[^"]+)"[^>]*>Today<', html).group(1)
    assert keys(**dict(parse_qsl(html_unescape(today_link)))) == {"failed-echo", "pending-saga"}
    year = timezone.now().year
    assert keys(created_at__year=str(year)) == {"failed-echo", "pending-saga"}
    assert keys(created_at__year=str(year - 1)) == set()


def test_a_user_without_view_all_tasks_sees_only_their_own(django_user_model, owner):
    from tests.admin.conftest import _staff

    mine = _staff(django_user_model, "self-viewer", perms=("view_task",))
    own = make_task(mine, key="my-own-task")
    theirs = make_task(owner, key="someone-elses")
    client = Client()
    client.force_login(mine)
    html = client.get(LIST_URL).content.decode()
    assert own.idempotency_key in html and theirs.idempotency_key not in html
    assert client.get(task_url(theirs)).status_code == 302  # "does not exist" redirect


def test_the_list_costs_the_same_queries_for_10_and_150_tasks(operator_client,
                                                             django_user_model):
    bulk_tasks(django_user_model, 10, prefix="few")
    operator_client.get(LIST_URL)  # warm the session and content types
    with CaptureQueriesContext(connection) as few:
        assert operator_client.get(LIST_URL).status_code == 200
    bulk_tasks(django_user_model, 140, prefix="many")
    with CaptureQueriesContext(connection) as many:
        response = operator_client.get(LIST_URL)
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 50
    assert len(many) == len(few), [q["sql"][:120] for q in many.captured_queries]
    # session, user, groups' permissions, owner-filter choices, date hierarchy,
    # paginator count, the page of tasks joined with owners — and nothing per row.
    assert len(many) <= 10, [q["sql"][:120] for q in many.captured_queries]


# transaction=True: with the Redis broker an enqueue happens on commit.
@pytest.mark.django_db(transaction=True)
def test_the_task_page_costs_the_same_queries_for_3_and_50_steps(operator_client, owner):
    from tests.support.helpers import drain
    from workflows.engine.triggers import task_trigger

    counts = []
    for steps in (3, 50):
        task = task_trigger(owner=owner, key=f"slow-{steps}", workflow="demo.slow",
                            payload={"steps": steps, "seconds": 0}).task
        drain(lambda t=task: Task.objects.get(pk=t.pk).is_finished)
        operator_client.get(task_url(task))  # warm the session and content-type caches
        with CaptureQueriesContext(connection) as queries:
            assert operator_client.get(task_url(task)).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 12, counts


def test_pages_refuse_framing_and_anonymous_users(operator_client, owner):
    task = make_task(owner)
    for url in (LIST_URL, task_url(task)):
        assert operator_client.get(url)["X-Frame-Options"] == "DENY"
        assert Client().get(url).status_code == 302  # to the login page


def test_an_unknown_or_malformed_id_is_a_clean_not_found(operator_client):
    for object_id in (uuid.uuid4(), "not-a-uuid"):
        response = operator_client.get(f"{LIST_URL}{object_id}/change/")
        assert response.status_code == 302  # admin's "does not exist" redirect, never a 500


def insert_many_tasks(owners: list, n: int) -> None:
    """n tasks spread over owners, states, workflows and 60 days, in one INSERT …
    SELECT (PostgreSQL): the shape of a busy installation, in a second or two."""
    states = "ARRAY[" + ",".join(f"'{s}'" for s in S.values) + "]"
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO workflows_task (id, owner_id, idempotency_key, workflow, payload,
                fingerprint, state, error, error_type, attempts, max_attempts, lease_token,
                lease_owner, source, trace_id, created_at, updated_at)
            SELECT gen_random_uuid(), (%s::bigint[])[1 + i %% %s], 'bulk-' || i,
                   (ARRAY['demo.echo','demo.slow','demo.saga'])[1 + i %% 3], '{{}}'::jsonb,
                   md5(i::text), ({states})[1 + i %% {len(S.values)}], '', '', 1, 3, 1, '',
                   'api', '', now() - (i || ' minutes')::interval, now()
            FROM generate_series(1, %s) AS i""", [[o.pk for o in owners], len(owners), n])
        cursor.execute("ANALYZE workflows_task")


@pytest.mark.postgres
@pytest.mark.slow
def test_the_list_stays_flat_on_100_000_tasks(operator_client, django_user_model):
    """A fixed handful of queries per page whatever the filter, on a table of
    100 000 tasks. How fast each page renders is measured by the benchmark
    (bench/workloads/admin_pages.py, `make bench`), not here."""
    owners = django_user_model.objects.bulk_create(
        [django_user_model(username=f"client-{i}") for i in range(20)])
    insert_many_tasks(owners, 100_000)
    operator_client.get(LIST_URL)
    pages = {
        "newest first": {},
        "failed": {"state__exact": "failed"},
        "one workflow": {"workflow": "demo.saga"},
        "one owner": {"owner": str(owners[3].pk)},
        "key prefix": {"q": "bulk-4242"},
        "one day": {"created_at__year": str(timezone.now().year),
                    "created_at__month": str(timezone.now().month),
                    "created_at__day": str(timezone.now().day)},
    }
    for name, params in pages.items():
        with CaptureQueriesContext(connection) as queries:
            response = operator_client.get(LIST_URL, params)
        assert response.status_code == 200
        assert len(queries) <= 10, (name, [q["sql"][:120] for q in queries.captured_queries])
        assert response.context["cl"].result_list, name
