"""POST /api/v1/tasks: the idempotency contract of SPEC §6 over HTTP."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.api.conftest import assert_problem, trigger
from tests.factories import make_task
from tests.support.helpers import queued_task_ids
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = {"msg": "hi"}


def test_a_new_key_is_202_with_location_and_the_task(api):
    r = trigger(api)
    assert r.status_code == 202
    body = r.json()
    assert r["Location"] == f"/api/v1/tasks/{body['id']}"
    assert r["Idempotent-Replayed"] == "false"
    assert (body["state"], body["workflow"], body["payload"], body["idempotency_key"]) == (
        "pending", "demo.echo", ECHO, "k-1")
    assert body["steps"] == [] and body["result"] is None
    assert queued_task_ids() == [body["id"]]


@pytest.mark.parametrize("state", [S.PENDING, S.RUNNING, S.RETRYING, S.SUCCEEDED])
def test_a_replay_is_200_with_the_same_task(api, state):
    task = make_task(api.user, state=state, key="k-1", payload=ECHO)
    r = trigger(api)
    assert r.status_code == 200
    assert r["Idempotent-Replayed"] == "true"
    assert "Location" not in r
    assert r.json()["id"] == str(task.pk) and r.json()["replays"] == 1
    assert r.json()["state"] == state


def test_a_replay_of_a_succeeded_task_carries_its_result(api):
    make_task(api.user, state=S.SUCCEEDED, key="k-1", payload=ECHO)
    assert trigger(api).json()["result"] == {"ok": True}


def test_a_failed_task_is_restarted_with_202(api):
    task = make_task(api.user, state=S.FAILED, key="k-1", payload=ECHO)
    r = trigger(api)
    assert r.status_code == 202
    assert r["Idempotent-Replayed"] == "false"
    assert r["Location"] == f"/api/v1/tasks/{task.pk}"
    assert r.json()["state"] == "pending"
    assert queued_task_ids() == [str(task.pk)]


@pytest.mark.parametrize("state", [S.CANCELLING, S.CANCELLED])
def test_a_cancelled_task_is_409(api, state):
    make_task(api.user, state=state, key="k-1", payload=ECHO)
    assert_problem(trigger(api), 409, "task_cancelled")


def test_a_reused_key_with_another_request_is_422(api):
    trigger(api)
    assert_problem(trigger(api, payload={"msg": "other"}), 422, "idempotency_key_reused")
    assert_problem(trigger(api, workflow="demo.flaky", payload={"fail_times": 0}), 422,
                   "idempotency_key_reused")
    assert Task.objects.count() == 1


def test_an_expired_key_starts_a_new_task(api):
    old = make_task(api.user, state=S.SUCCEEDED, key="k-1", payload=ECHO)
    Task.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    r = trigger(api)
    assert r.status_code == 202 and r.json()["id"] != str(old.pk)


def test_quoted_and_bare_keys_are_the_same(api):
    first = trigger(api, key='"abc-123"')
    again = trigger(api, key="abc-123")
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert first.json()["idempotency_key"] == "abc-123"


def test_the_key_may_come_in_the_body_as_task_id(api):
    body = {"workflow": "demo.echo", "payload": ECHO, "task_id": "body-key"}
    first = api.post("/api/v1/tasks", body, format="json")
    assert first.status_code == 202 and first.json()["idempotency_key"] == "body-key"
    again = api.post("/api/v1/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY="body-key")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


def test_header_and_body_keys_that_differ_are_refused(api):
    body = {"workflow": "demo.echo", "payload": ECHO, "task_id": "one"}
    r = api.post("/api/v1/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY="two")
    assert_problem(r, 400, "idempotency_key_mismatch")
    assert Task.objects.count() == 0


@pytest.mark.parametrize("key, code", [
    (None, "idempotency_key_missing"),
    ("", "idempotency_key_invalid"),
    ("x" * 256, "idempotency_key_invalid"),
    ("has space", "idempotency_key_invalid"),
    ('"unterminated', "idempotency_key_invalid"),
])
def test_missing_and_invalid_keys_are_400(api, key, code):
    assert_problem(trigger(api, key=key), 400, code)
    assert Task.objects.count() == 0


# Keys the doors once judged by rules of their own (a pattern on task_id, 300
# characters for a batch item): every door now hands the key to the engine.
@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "x" * 301, "x" * 600,
                                 '"unterminated', '"' + "k" * 256 + '"'])
def test_an_invalid_key_is_refused_alike_by_the_header_the_body_and_a_batch(api, key):
    assert_problem(trigger(api, key=key), 400, "idempotency_key_invalid")
    body = {"workflow": "demo.echo", "payload": ECHO, "task_id": key}
    assert_problem(api.post("/api/v1/tasks", body, format="json"), 400,
                   "idempotency_key_invalid")
    item = {"idempotency_key": key, "workflow": "demo.echo", "payload": ECHO}
    r = api.post("/api/v1/tasks/batch", {"tasks": [item]}, format="json")
    assert [(x["status"], x.get("code")) for x in r.json()["results"]] == [
        (400, "idempotency_key_invalid")]
    assert Task.objects.count() == 0


def test_the_longest_keys_are_accepted_by_the_header_the_body_and_a_batch(api):
    quotes = '"' + '\\"' * 255 + '"'  # the key: 255 quotes, each escaped
    backslashes = '"' + "\\\\" * 255 + '"'  # 255 backslashes, each escaped
    assert len(quotes) == len(backslashes) == 512
    assert trigger(api, key=quotes).status_code == 202
    body = {"workflow": "demo.echo", "payload": ECHO, "task_id": backslashes}
    assert api.post("/api/v1/tasks", body, format="json").status_code == 202
    item = {"idempotency_key": "k" * 255, "workflow": "demo.echo", "payload": ECHO}
    r = api.post("/api/v1/tasks/batch", {"tasks": [item]}, format="json")
    assert [x["status"] for x in r.json()["results"]] == [202]
    assert sorted(len(k) for k in Task.objects.values_list("idempotency_key", flat=True)) == [
        255, 255, 255]


def test_an_unknown_workflow_is_400(api):
    assert_problem(trigger(api, workflow="nope.nothing"), 400, "unknown_workflow")


@pytest.mark.parametrize("body, field", [
    ({"payload": {}}, "workflow"),
    ({"workflow": "demo.echo", "payload": [1, 2]}, "payload"),
    ({"workflow": "demo.echo", "payload": {}, "state": "succeeded"}, "state"),
    ({"workflow": "demo.echo", "payload": {}, "id": "00000000-0000-0000-0000-000000000000"},
     "id"),
    ({"workflow": "demo.echo", "payload": {}, "result": {"forged": True}}, "result"),
])
def test_bad_bodies_and_read_only_fields_are_400_with_field_errors(api, body, field):
    r = api.post("/api/v1/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY="k")
    problem = assert_problem(r, 400, "validation_error")
    assert field in problem["errors"]
    assert Task.objects.count() == 0


def test_a_payload_invalid_for_the_workflow_is_400_per_field(api):
    r = trigger(api, workflow="demo.sync_orders", payload={"batch": "", "count": 0})
    problem = assert_problem(r, 400, "validation_error")
    assert set(problem["errors"]["payload"]) == {"batch", "count"}


def test_a_body_that_is_not_an_object_is_400(api):
    r = api.post("/api/v1/tasks", [1, 2], format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert_problem(r, 400, "validation_error")


def test_payload_over_the_limit_is_413(api, settings):
    settings.PILOT_MAX_PAYLOAD_BYTES = 1000
    assert_problem(trigger(api, payload={"blob": "x" * 2000}), 413, "payload_too_large")
    r = api.post("/api/v1/tasks", b'{"workflow": "demo.echo", "payload": {"b": "' + b"x" * 70000
                 + b'"}}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="k2")
    assert_problem(r, 413, "payload_too_large")
    assert Task.objects.count() == 0


@pytest.mark.parametrize("raw", [
    b"{not json", b'{"workflow": "demo.echo", "payload": {"x": NaN}}', b"[" * 100000,
    b'{"workflow": "demo.echo", "payload": {"x": 1e999999}}'.replace(b"1e999999", b"Infinity"),
    "{\"workflow\": \"demo.echo\"}".encode("utf-16"),
])
def test_malformed_json_is_a_400_parse_error(api, raw):
    r = api.post("/api/v1/tasks", raw, content_type="application/json",
                 HTTP_IDEMPOTENCY_KEY="k")
    assert_problem(r, 400, "parse_error")


def test_deep_nesting_below_the_parser_limit_is_a_validation_error(api):
    deep = current = {}
    for _ in range(50):
        current["x"] = {}
        current = current["x"]
    assert_problem(trigger(api, payload=deep), 400, "validation_error")


def test_trace_ids_come_from_traceparent_or_x_request_id_or_are_generated(api):
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = trigger(api, key="t1", HTTP_TRACEPARENT=f"00-{trace}-00f067aa0ba902b7-01")
    assert r["X-Request-ID"] == trace and r.json()["trace_id"] == trace
    r = trigger(api, key="t2", HTTP_X_REQUEST_ID="req-42")
    assert r["X-Request-ID"] == "req-42" and r.json()["trace_id"] == "req-42"
    r = trigger(api, key="t3", HTTP_X_REQUEST_ID="bad id with spaces")
    generated = r["X-Request-ID"]
    assert len(generated) == 32 and r.json()["trace_id"] == generated
    assert Task.objects.get(idempotency_key="t1").trace_id == trace


def test_a_quoted_key_whose_content_starts_with_a_quote_is_unquoted_once(api):
    r = trigger(api, key=r'"\"x"')
    assert r.status_code == 202 and r.json()["idempotency_key"] == '"x'
    assert trigger(api, key=r'"\"x"').status_code == 200


@pytest.mark.parametrize("payload", [{"x": "nul\u0000"}, {"nul\u0000key": 1}, {"a": ["\u0000"]}])
def test_nul_characters_in_a_payload_are_refused_on_every_database(api, payload):
    problem = assert_problem(trigger(api, payload=payload), 400, "validation_error")
    assert "payload" in problem["errors"]


def test_nul_characters_in_other_strings_are_refused(api):
    r = api.post("/api/v1/tasks", {"workflow": "demo\u0000echo", "payload": {}}, format="json",
                 HTTP_IDEMPOTENCY_KEY="k")
    assert_problem(r, 400, "validation_error")
    assert_problem(api.get("/api/v1/tasks", {"workflow": "x\u0000"}), 400, "validation_error")
