"""POST /api/v1/tasks/{id}/signals/{name} (docs/waiting.md): stored before the
202, replayed by key, every refusal a problem with a stable code that changes
nothing."""

import uuid

import pytest

from tests.support.helpers import pop_queued
from workflows.accounts import api_client_create
from workflows.models import TaskSignal
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client_a():
    from rest_framework.test import APIClient

    user, token = api_client_create("sig-client")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    api.user = user
    return api


def _trigger(api, workflow="demo.approval", payload=None):
    response = api.post("/api/v1/tasks", {"workflow": workflow, "payload": payload or {}},
                        format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    assert response.status_code == 202, response.content
    return response.json()["id"]


def _signal(api, task_id, name="decision", body=None, key="k-1"):
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return api.post(f"/api/v1/tasks/{task_id}/signals/{name}",
                    {} if body is None else body, format="json", **headers)


def test_a_signal_is_stored_with_202_wakes_the_waiting_task_and_shows_in_the_task(client_a):
    task_id = _trigger(client_a)
    for message in pop_queued():
        run_task(message)
    shown = client_a.get(f"/api/v1/tasks/{task_id}").json()
    assert shown["state"] == S.WAITING
    assert shown["waiting_for"]["kind"] == "signal" and shown["waiting_for"]["name"] == "decision"
    assert "until" in shown["waiting_for"] and shown["signals"] == []
    response = _signal(client_a, task_id, body={"payload": {"approved": True, "by": "ops"}})
    assert response.status_code == 202, response.content
    assert response["Idempotent-Replayed"] == "false"
    assert response.json()["signal"]["name"] == "decision"
    for message in pop_queued():
        run_task(message)
    shown = client_a.get(f"/api/v1/tasks/{task_id}").json()
    assert shown["state"] == S.SUCCEEDED and shown["waiting_for"] is None
    assert shown["result"] == {"approved": True, "by": "ops"}
    [stored] = shown["signals"]
    assert stored["consumed_at"] is not None and stored["payload"] == {"approved": True,
                                                                        "by": "ops"}


def test_the_same_key_replays_with_200_even_after_the_task_finished(client_a):
    task_id = _trigger(client_a)
    body = {"payload": {"approved": False}}
    assert _signal(client_a, task_id, body=body).status_code == 202
    for message in pop_queued():
        run_task(message)
    replay = _signal(client_a, task_id, body=body)
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    late = _signal(client_a, task_id, body=body, key="k-2")
    assert late.status_code == 409 and late.json()["code"] == "task_finished"


@pytest.mark.parametrize(("name", "body", "key", "status", "code"), [
    ("decision", {"payload": {"approved": True}}, None, 400, "idempotency_key_missing"),
    ("decision", {"payload": [1]}, "k", 400, "validation_error"),
    ("decision", {"payload": "yes"}, "k", 400, "validation_error"),
    ("decision", {"extra": 1}, "k", 400, "validation_error"),
    ("bad.name", {}, "k", 400, "validation_error"),
    ("-x", {}, "k", 400, "validation_error"),
    ("decision", {}, "\x01", 400, "idempotency_key_invalid"),
])
def test_bad_requests_are_problems_and_store_nothing(client_a, name, body, key, status, code):
    task_id = _trigger(client_a)
    response = _signal(client_a, task_id, name=name, body=body, key=key)
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["code"] == code
    assert TaskSignal.objects.count() == 0


def test_the_key_with_another_payload_is_422(client_a):
    task_id = _trigger(client_a)
    assert _signal(client_a, task_id, body={"payload": {"a": 1}}).status_code == 202
    reused = _signal(client_a, task_id, body={"payload": {"a": 2}})
    assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
    assert TaskSignal.objects.count() == 1


def test_another_clients_task_and_an_unknown_task_are_404(client_a):
    from rest_framework.test import APIClient

    task_id = _trigger(client_a)
    _, token = api_client_create("sig-other")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert _signal(other, task_id).json()["code"] == "not_found"
    assert _signal(client_a, uuid.uuid4()).status_code == 404
    assert TaskSignal.objects.count() == 0


def test_a_client_without_the_signal_permission_is_403(client_a):
    from django.contrib.auth.models import Permission

    task_id = _trigger(client_a)
    client_a.user.user_permissions.remove(Permission.objects.get(codename="signal_task"))
    response = _signal(client_a, task_id)
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    assert TaskSignal.objects.count() == 0
