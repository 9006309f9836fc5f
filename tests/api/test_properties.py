"""Nothing a client sends reaches a 500 (property tests).

Schemathesis (test_schemathesis.py) walks every operation with what the schema
can describe; these close the classes it cannot reach: any query string on the
list (date-times with any ISO 8601 offset, impossible dates, raw bytes), any
header on a trigger, and any JSON body — including lone surrogates
(`"\\ud800"`) in values and keys — on every write. Every answer must be a
success or a problem+json with a stable code, never a 5xx or an HTML page.
"""

import json
from datetime import datetime, timedelta, timezone
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from tests.api.conftest import client_for
from tests.factories import make_task
from workflows.rules.states import TaskState
from workflows.selectors import LIST_CONTROLS, LIST_FILTERS

pytestmark = pytest.mark.django_db

PROPERTY = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture
def api():
    client = client_for("prop-client")
    client.raise_request_exception = False  # a 500 is an answer to check, not a crash
    return client


def assert_answered(response, *, ok=(200, 202)):
    """A success, or a problem+json 4xx with a code: never a 5xx, never HTML."""
    assert response.status_code < 500, (response.status_code, response.content[:300])
    if response.status_code in ok:
        json.loads(response.content)
        return
    assert response["Content-Type"] == "application/problem+json", response.content[:300]
    body = json.loads(response.content)
    assert body["code"] and body["status"] == response.status_code


# --- query filters -------------------------------------------------------------------------

def _iso(moment: datetime, minutes: int, style: str) -> str:
    text = moment.isoformat()
    if style == "naive":
        return text
    if style == "Z":
        return text + "Z"
    sign = "-" if minutes < 0 else "+"
    hours, mins = divmod(abs(minutes), 60)
    return f"{text}{sign}{hours:02d}:{mins:02d}" if style == "colon" else \
        f"{text}{sign}{hours:02d}{mins:02d}"


# Every offset ISO 8601 can write (±23:59; PostgreSQL takes only ±15:59) on
# every date Python can hold, including the first and last days.
iso_datetimes = st.builds(_iso, st.datetimes(min_value=datetime(1, 1, 1),
                                             max_value=datetime(9999, 12, 31, 23, 59, 59)),
                          st.integers(-(24 * 60 - 1), 24 * 60 - 1),
                          st.sampled_from(["naive", "Z", "colon", "compact"]))
impossible_dates = st.builds("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:00Z".format,
                             st.integers(0, 9999), st.integers(0, 19), st.integers(0, 39),
                             st.integers(0, 30), st.integers(0, 70))
query_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
filter_values = st.one_of(iso_datetimes, impossible_dates, query_text,
                          st.sampled_from([*TaskState.values, "", ",", "pending,bogus"]))
query_names = st.one_of(st.sampled_from(LIST_FILTERS + LIST_CONTROLS), query_text)


@PROPERTY
@given(params=st.dictionaries(query_names, filter_values, max_size=4))
@example(params={"created_before": "0007-02-11T15:36:03-19:35"})
@example(params={"created_after": "2026-02-30T10:00:00Z"})
@example(params={"created_after": "0001-01-01T00:00:00+05:00"})
@example(params={"created_before": "9999-12-31T23:59:59-23:59"})
@example(params={"created_after": "2026-01-01T10:00:00+99:00"})
def test_any_list_query_is_answered(api, params):
    assert_answered(api.get("/api/v1/tasks?" + urlencode(params)))


@PROPERTY
@given(raw=st.binary(max_size=60))
def test_any_raw_query_string_is_answered(api, raw):
    assert_answered(api.get("/api/v1/tasks?" + quote(raw, safe="=&")))


def test_an_offset_beyond_postgresqls_range_still_filters_correctly(api):
    task = make_task(api.user)
    created = task.created_at.astimezone(timezone(timedelta(hours=-19, minutes=-35)))
    just_after = (created + timedelta(seconds=1)).isoformat()
    listed = api.get("/api/v1/tasks?" + urlencode({"created_before": just_after})).json()
    assert [t["id"] for t in listed["results"]] == [str(task.pk)]
    r = api.get("/api/v1/tasks?" + urlencode({"created_after": "2026-02-30T10:00:00Z"}))
    assert r.status_code == 400 and r.json()["errors"]["created_after"]


# --- headers --------------------------------------------------------------------------------

# What a WSGI server can hand over: header values are latin-1 decoded bytes.
header_text = st.text(st.characters(max_codepoint=0xFF, exclude_characters="\r\n"),
                      max_size=80)


@PROPERTY
@given(key=header_text, trace=header_text, request_id=header_text, accept=header_text,
       content_type=st.one_of(st.just("application/json"), header_text))
def test_any_trigger_headers_are_answered(api, key, trace, request_id, accept, content_type):
    body = json.dumps({"workflow": "demo.echo", "payload": {}}).encode()
    r = api.generic("POST", "/api/v1/tasks", body, content_type=content_type,
                    HTTP_IDEMPOTENCY_KEY=key, HTTP_TRACEPARENT=trace,
                    HTTP_X_REQUEST_ID=request_id, HTTP_ACCEPT=accept)
    assert_answered(r)


# --- bodies ---------------------------------------------------------------------------------

# Every code point, lone surrogates included (they arrive as "\ud800" escapes).
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF,
                                 exclude_categories=()), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12)
trigger_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"workflow": st.one_of(st.just("demo.echo"), any_text),
                           "payload": json_values},
                          optional={"task_id": any_text, "extra": json_values}),
    st.dictionaries(any_text, json_values, max_size=3))


def post_json(client, path, value, **headers):
    # ensure_ascii: a lone surrogate travels as a "\ud800" escape, as a client sends it.
    return client.generic("POST", path, json.dumps(value).encode(),
                          content_type="application/json", **headers)


@PROPERTY
@given(body=trigger_bodies, key=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                                        min_size=1, max_size=20))
@example(body={"workflow": "demo.echo", "payload": {"a": "\ud800"}}, key="k")
@example(body={"workflow": "demo.echo", "payload": {"\ud800": 1}}, key="k")
@example(body={"workflow": "demo.echo", "payload": {}, "\ud800": 1}, key="k")
@example(body={"workflow": "\ud800", "payload": {}}, key="k")
def test_any_trigger_body_is_answered(api, body, key):
    assert_answered(post_json(api, "/api/v1/tasks", body, HTTP_IDEMPOTENCY_KEY=key))


@PROPERTY
@given(items=st.lists(st.one_of(trigger_bodies, st.fixed_dictionaries(
    {"idempotency_key": any_text, "workflow": st.just("demo.echo"), "payload": json_values})),
    min_size=1, max_size=4), extra=st.one_of(st.none(), st.tuples(any_text, json_values)))
def test_any_batch_is_answered(api, items, extra):
    body = {"tasks": items}
    if extra:
        body[extra[0]] = extra[1]
    r = post_json(api, "/api/v1/tasks/batch", body)
    assert_answered(r)
    if r.status_code == 200:
        results = r.json()["results"]
        assert len(results) == len(items)
        assert all(item["status"] < 500 for item in results)


@PROPERTY
@given(action=st.sampled_from(["cancel", "retry"]), body=json_values)
@example(action="cancel", body={"reason": "\ud800"})
@example(action="retry", body={"\ud800": True})
def test_any_cancel_or_retry_body_is_answered(api, action, body):
    task = make_task(api.user, state=TaskState.FAILED)
    assert_answered(post_json(api, f"/api/v1/tasks/{task.pk}/{action}", body))


def test_a_lone_surrogate_fails_its_own_batch_item_only(api):
    r = post_json(api, "/api/v1/tasks/batch", {"tasks": [
        {"idempotency_key": "bad-value", "workflow": "demo.echo", "payload": {"a": "\ud800"}},
        {"idempotency_key": "bad-key", "workflow": "demo.echo", "payload": {"\udfff": 1}},
        {"idempotency_key": "good", "workflow": "demo.echo", "payload": {"a": "ok"}}]})
    assert r.status_code == 200
    bad_value, bad_key, good = r.json()["results"]
    for bad in (bad_value, bad_key):
        assert (bad["status"], bad["code"]) == (400, "validation_error")
        assert "surrogate" in bad["errors"]["payload"][0]
    assert good["status"] == 202


def test_a_lone_surrogate_in_an_unknown_field_name_is_a_problem_not_an_html_500(api):
    r = post_json(api, "/api/v1/tasks", {"workflow": "demo.echo", "\ud800x": 1},
                  HTTP_IDEMPOTENCY_KEY="k")
    assert r.status_code == 400 and r["Content-Type"] == "application/problem+json"
    assert r.json()["errors"] == {"\\ud800x": ["Unknown field; it cannot be set."]}


def test_the_renderer_escapes_what_utf8_cannot_carry():
    from workflows.api.renderers import SafeJSONRenderer

    assert json.loads(SafeJSONRenderer().render({"k\ud800": "v\udfff", "é": 1})) == \
        {"k\ud800": "v\udfff", "é": 1}
    assert SafeJSONRenderer().render({"é": 1}) == '{"é":1}'.encode()  # UTF-8 when it can


def test_an_anonymous_client_is_answered_too():
    anon = APIClient(raise_request_exception=False)
    assert_answered(post_json(anon, "/api/v1/tasks", {"\ud800": 1}), ok=())
