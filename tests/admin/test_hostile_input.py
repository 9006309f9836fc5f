"""Nothing typed into the console reaches a 500 (issue 11, item 9): list
filters, search, the live endpoint, the filter-wide actions, the trigger form
and the reason box. The reported instances first, then hypothesis over each
surface so the class is closed, not only the instances. PostgreSQL is where
it matters (its text cannot hold NUL, its time zones stop at ±15:59); the
suite runs these on SQLite and PostgreSQL alike.

The test client raises any exception a view lets escape, so "no 500" is
"no exception" plus the status checks below."""

from __future__ import annotations

import json
import uuid
from urllib.parse import quote, unquote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.admin.conftest import LIST_URL, task_url
from tests.factories import make_task
from workflows.admin.list_params import NAMES
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# What a browser (or anyone) can put in a query string: any text but unpaired
# surrogates, which no URL can carry (their bytes arrive as U+FFFD).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
NASTY = st.sampled_from(["\x00", "%00", "\x00abc", "-1", "0", "1e999", "99999999999999999999",
                         "9999", "10000", "2026-02-30", "0007-02-11T15:36:03-19:35",
                         "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "true",
                         "running", "RUNNING", "’", "\u202e", " ", "a" * 300, "[]", "{}",
                         # the shape of a bulk job's cursor, with impossible times
                         "0007-02-11T15:36:03-19:35|00000000-0000-0000-0000-000000000000",
                         "0001-01-01T00:00:00+05:00|00000000-0000-0000-0000-000000000000",
                         "2026-02-30T00:00:00+00:00|00000000-0000-0000-0000-000000000000"])
VALUE = st.one_of(NASTY, TEXT)
NAME = st.one_of(st.sampled_from([*sorted(NAMES), "idempotency_key", "payload__has_key",
                                                  "owner__username", "state__isnull",
                                                  "created_at__isnull", "_to_field",
                                                  "attempts__gt", "pk__in"]), TEXT)
PARAMS = st.dictionaries(NAME, VALUE, max_size=4)


def assert_list_answers(client, query: str) -> None:
    """The list answers 200, or 302 back to itself without what it refused,
    with a message that says what was dropped."""
    response = client.get(f"{LIST_URL}?{query}")
    assert response.status_code in (200, 302), response.status_code
    if response.status_code == 302:
        assert response["Location"].startswith(LIST_URL)
        again = client.get(response["Location"])
        assert again.status_code == 200
        messages = [str(m) for m in again.context["messages"]]
        assert any(m.startswith("Filter ignored — ") for m in messages), messages


@pytest.mark.parametrize("query, named", [
    ("workflow=%00", "workflow contains a NUL character"),
    ("state__exact=%00", "state__exact contains a NUL character"),
    ("idempotency_key=%00", "idempotency_key contains a NUL character"),
    ("idempotency_key=abc", "idempotency_key is not a filter of this list"),
    ("q=%00", "q contains a NUL character"),
    ("owner=99999999999999999999", "owner must be a whole number"),
    ("owner=%C2%B2", "owner must be a whole number"),  # '²'.isdigit(), but int('²') fails
    ("created_at__gte=0007-02-11T15:36:03-19:35", "offset beyond ±15:59"),
    ("created_at__lt=2026-02-30", "created_at__lt is not a valid date-time"),
    ("created_at__lt=yesterday", "must be an ISO 8601 date or date-time"),
    ("created_at__year=9999&created_at__month=12", "created_at__year must be a whole number"),
    ("created_at__year=2026&created_at__month=2&created_at__day=30",
     "created_at__day is not part of a real date"),
    ("payload__has_key=x", "payload__has_key is not a filter of this list"),
    ("parent=42", "parent is not a task id"),
    ("version=0", "version must be a whole number"),
    ("waiting_for=person", "waiting_for is not signal, timer or children"),
])
def test_the_reported_list_filters_are_refused_by_name(operator_client, owner, query, named):
    make_task(owner, key="present")
    response = operator_client.get(f"{LIST_URL}?{query}", follow=True)
    assert response.status_code == 200
    messages = " ".join(str(m) for m in response.context["messages"])
    assert named in messages
    assert "present" in response.content.decode()  # the rest of the list still shows


def test_good_filters_survive_next_to_a_bad_one(operator_client, owner):
    make_task(owner, state=S.FAILED, key="kept")
    make_task(owner, state=S.PENDING, key="dropped")
    response = operator_client.get(f"{LIST_URL}?state__exact=failed&workflow=%00")
    assert response["Location"] == f"{LIST_URL}?state__exact=failed"


@FUZZ
@given(params=PARAMS)
def test_any_list_query_answers_without_a_500(operator_client, owner, params):
    assert_list_answers(operator_client, urlencode(params))


@FUZZ
@given(raw=st.binary(max_size=30), name=st.sampled_from(["workflow", "q", "state__exact",
                                                          "owner", "created_at__gte"]))
def test_any_bytes_in_a_filter_answer_without_a_500(operator_client, name, raw):
    """Bytes that are not UTF-8 (a lone surrogate's %ED%A0%80 among them)."""
    assert_list_answers(operator_client, f"{name}={quote(raw)}")


@FUZZ
@given(params=PARAMS)
def test_the_live_list_and_the_filter_wide_action_refuse_bad_filters_cleanly(
        operator_client, params):
    query = urlencode(params)
    live = operator_client.get("/admin/workflows/task/live/", {"view": "list", "params": query})
    assert live.status_code in (200, 400)
    assert set(live.json()) >= ({"fragments"} if live.status_code == 200 else {"error"})
    confirm = operator_client.get(f"/admin/workflows/task/bulk/cancel/?{query}")
    assert confirm.status_code in (200, 400)


TRIGGER_URL = "/admin/workflows/task/trigger/"


def trigger(client, payload: str, *, workflow: str = "demo.echo", key: str = "k-1"):
    return client.post(TRIGGER_URL, {"workflow": workflow, "idempotency_key": key,
                                     "payload": payload})


@pytest.mark.parametrize("payload, problem", [
    ('{"n": ' + "9" * 5000 + "}", "Not valid JSON: a number has too many digits."),
    ("[" * 100_000 + "]" * 100_000, "Not readable: the JSON is nested too deeply."),
    ('{"x": "\\ud800"}', "a string contains an unpaired surrogate"),
    ('{"\\udfff": 1}', "a string contains an unpaired surrogate"),
    ('{"x": "\\u0000"}', "Strings may not contain \\u0000."),
    ('{"x": ' + "[" * 40 + "]" * 40 + "}", "Nesting deeper than 32 levels."),
])
def test_the_reported_trigger_payloads_are_form_errors(operator_client, payload, problem):
    response = trigger(operator_client, payload)
    assert response.status_code == 200
    errors = " ".join(response.context["form"].errors["payload"])
    assert problem in errors
    assert not Task.objects.exists()


def json_values():
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                        st.text(max_size=20))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
        max_leaves=12)


PAYLOAD_TEXT = st.one_of(
    json_values().map(json.dumps),            # JSON, NaN included
    json_values().map(lambda v: json.dumps({"v": v})),     # objects, surrogates escaped
    st.integers(min_value=0, max_value=6000).map(lambda n: '{"n": ' + "7" * max(n, 1) + "}"),
    st.integers(min_value=0, max_value=3000).map(lambda n: "[" * n + "]" * n),
    TEXT,
)


@FUZZ
@given(payload=PAYLOAD_TEXT, workflow=st.one_of(st.sampled_from(
    ["demo.echo", "demo.slow", "demo.saga", "demo.sync_orders"]), TEXT), key=VALUE)
def test_any_trigger_form_input_is_a_task_or_a_form_error(operator_client, payload, workflow,
                                                         key):
    before = Task.objects.count()
    response = trigger(operator_client, payload, workflow=workflow, key=key)
    assert response.status_code in (200, 302)
    if response.status_code == 200:
        assert response.context["form"].errors
        assert Task.objects.count() == before
    else:
        assert response["Location"].startswith(LIST_URL)


@FUZZ
@given(reason=st.one_of(NASTY, st.text(max_size=600)))
def test_any_reason_is_recorded_or_refused_as_a_form_error(operator_client, owner, reason):
    task = make_task(owner, state=S.PENDING)
    response = operator_client.post(task_url(task, "transition/cancel/"), {"reason": reason})
    assert response.status_code in (200, 302)
    task.refresh_from_db()
    if response.status_code == 200:
        assert response.context["form"].errors and task.state == S.PENDING
    else:
        assert task.state == S.CANCELLED
        assert task.transitions.get(transition="cancel").reason == reason.strip()


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(["cursor", "handled", "changed", "refused"]),
                              VALUE, max_size=4))
def test_any_progress_fields_of_a_filter_wide_job_answer_without_a_500(
        operator_client, owner, fields):
    """The progress page's hidden fields come back from the browser: a forged
    cursor or counter is ignored, never a 500 (and never a skipped task: the
    engine decides each one)."""
    key = f"job-{uuid.uuid4().hex}"
    make_task(owner, key=key)
    start = operator_client.post(f"/admin/workflows/task/bulk/cancel/?q={key}",
                                 {"reason": "fuzz"})
    assert start.status_code == 302
    token = unquote(start["Location"].split("job=")[1])
    response = operator_client.post("/admin/workflows/task/bulk/cancel/run/",
                                    {"job": token, **fields}, HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response.json()["done"] in (True, False)
    done = operator_client.get("/admin/workflows/task/bulk/cancel/done/", {"job": token, **fields})
    assert done.status_code == 200


@FUZZ
@given(object_id=st.one_of(NASTY, TEXT.filter(lambda t: t.strip("/") == t and t)))
def test_any_task_id_in_a_url_is_not_found_not_a_500(operator_client, object_id):
    quoted = quote(object_id, safe="")
    for suffix in ("change/", "history/", "transition/cancel/"):
        response = operator_client.get(f"{LIST_URL}{quoted}/{suffix}")
        assert response.status_code in (302, 404), (suffix, response.status_code)
    live = operator_client.get("/admin/workflows/task/live/", {"view": "task", "id": object_id})
    assert live.status_code == 404
