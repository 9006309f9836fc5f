"""Reading, listing, cancelling and retrying tasks; workflows; method and
media-type errors."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.api.conftest import assert_problem, trigger
from tests.factories import make_task
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db


def test_a_task_reads_with_its_steps(api):
    task = make_task(api.user, state=S.SUCCEEDED)
    r = api.get(f"/api/v1/tasks/{task.pk}")
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "idempotency_key", "workflow", "state", "payload", "result",
                         "error", "error_type", "attempts", "max_attempts", "replays",
                         "next_attempt_at", "waiting_for", "run_after", "priority", "source",
                         "version", "parent", "children_count", "trace_id", "created_at",
                         "started_at", "finished_at", "expires_at", "steps", "callback_url",
                         "deliveries", "signals"}
    assert body["state"] == "succeeded" and body["steps"] == []


def test_the_list_is_paginated_by_cursor_newest_first(api):
    for i in range(7):
        make_task(api.user, key=f"k{i}")
    first = api.get("/api/v1/tasks", {"page_size": 3}).json()
    assert [t["idempotency_key"] for t in first["results"]] == ["k6", "k5", "k4"]
    second = api.get(first["next"]).json()
    assert [t["idempotency_key"] for t in second["results"]] == ["k3", "k2", "k1"]
    third = api.get(second["next"]).json()
    assert [t["idempotency_key"] for t in third["results"]] == ["k0"]
    assert third["next"] is None


def test_list_filters(api):
    make_task(api.user, key="a", state=S.SUCCEEDED)
    make_task(api.user, key="b", state=S.FAILED, workflow="demo.flaky", payload={})
    make_task(api.user, key="c")
    Task.objects.filter(idempotency_key="c").update(created_at=timezone.now() - timedelta(days=2))

    def keys(**params):
        r = api.get("/api/v1/tasks", params)
        assert r.status_code == 200, r.content
        return sorted(t["idempotency_key"] for t in r.json()["results"])

    assert keys(state="failed") == ["b"]
    assert keys(state="failed,succeeded") == ["a", "b"]
    assert keys(workflow="demo.flaky") == ["b"]
    assert keys(idempotency_key='"a"') == ["a"]
    since = (timezone.now() - timedelta(days=1)).isoformat()
    assert keys(created_after=since) == ["a", "b"]
    assert keys(created_before=since) == ["c"]


@pytest.mark.parametrize("params", [
    {"state": "done"}, {"created_after": "yesterday"}, {"page_size": "0"},
    {"page_size": "5000"}, {"cursor": "garbage"}, {"status": "failed"},
    {"idempotency_key": "has space"},
])
def test_bad_list_parameters_are_400(api, params):
    assert_problem(api.get("/api/v1/tasks", params), 400, "validation_error")


def test_cancel_and_retry_over_http(api):
    task = trigger(api).json()
    r = api.post(f"/api/v1/tasks/{task['id']}/cancel", {"reason": "no longer needed"},
                 format="json")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert_problem(api.post(f"/api/v1/tasks/{task['id']}/cancel"), 409, "invalid_transition")
    r = api.post(f"/api/v1/tasks/{task['id']}/retry", {"from_start": True}, format="json")
    assert r.status_code == 202 and r.json()["state"] == "pending"
    assert_problem(api.post(f"/api/v1/tasks/{task['id']}/retry"), 409, "invalid_transition")
    assert_problem(api.post(f"/api/v1/tasks/{task['id']}/retry", {"from_start": "maybe"},
                            format="json"), 400, "validation_error")


def test_retry_from_a_step_over_http(api):
    task = trigger(api, workflow="demo.sync_orders",
                   payload={"batch": "b1", "count": 2}).json()
    api.post(f"/api/v1/tasks/{task['id']}/cancel", format="json")
    retry = f"/api/v1/tasks/{task['id']}/retry"
    assert_problem(api.post(retry, {"from_step": "nope"}, format="json"), 400,
                   "validation_error")
    assert_problem(api.post(retry, {"from_step": "write", "from_start": True}, format="json"),
                   400, "validation_error")
    assert_problem(api.post(retry, {"from_step": 7}, format="json"), 400, "validation_error")
    assert Task.objects.get(pk=task["id"]).state == S.CANCELLED  # nothing changed
    r = api.post(retry, {"from_step": "transform"}, format="json")
    assert r.status_code == 202 and r.json()["state"] == "pending"


def test_workflows_are_listed_with_steps_and_policy(api):
    workflows = {w["name"]: w for w in api.get("/api/v1/workflows").json()}
    assert {"demo.echo", "demo.sync_orders", "demo.flaky", "demo.slow", "demo.saga"} <= set(
        workflows)
    sync = workflows["demo.sync_orders"]
    assert [s["name"] for s in sync["steps"]] == ["fetch", "transform", "write"]
    assert sync["steps"][2]["atomic"] is True
    assert sync["idempotency_ttl_seconds"] == 86400


def test_wrong_methods_and_media_types_are_problems(api):
    assert_problem(api.delete("/api/v1/tasks"), 405, "method_not_allowed")
    assert_problem(api.put("/api/v1/workflows", {}, format="json"), 405, "method_not_allowed")
    r = api.post("/api/v1/tasks", "workflow=demo.echo",
                 content_type="application/x-www-form-urlencoded", HTTP_IDEMPOTENCY_KEY="k")
    assert_problem(r, 415, "unsupported_media_type")
    assert_problem(api.get("/api/v1/tasks", HTTP_ACCEPT="application/xml"), 406,
                   "not_acceptable")


def test_health_and_readiness_need_no_authentication(anon):
    assert anon.get("/healthz").json() == {"status": "ok"}
    ready = anon.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok",
                            "checks": {"database": True, "broker": True, "cache": True}}


@pytest.mark.django_db(transaction=True)
def test_a_parents_children_are_listed_with_parent_and_the_parent_counts_them(api):
    """GET /tasks?parent= lists a parent's children; `parent` and
    `children_count` in the representation (docs/api.md)."""
    from tests.support.helpers import pop_queued
    from workflows.worker import run_task

    created = api.post("/api/v1/tasks", {"workflow": "demo.fanout", "payload": {"children": 2}},
                       format="json", HTTP_IDEMPOTENCY_KEY="fan-1").json()
    run_task(pop_queued()[0])
    body = api.get(f"/api/v1/tasks?parent={created['id']}").json()
    assert len(body["results"]) == 2
    assert {t["parent"] for t in body["results"]} == {created["id"]}
    assert {t["source"] for t in body["results"]} == {"child"}
    shown = api.get(f"/api/v1/tasks/{created['id']}").json()
    assert shown["children_count"] == 2 and shown["parent"] is None and shown["version"] == 1
    assert shown["waiting_for"] == {"kind": "children"}
    bad = api.get("/api/v1/tasks?parent=nope")
    assert bad.status_code == 400 and bad.json()["code"] == "validation_error"
    assert api.get(f"/api/v1/tasks?parent={uuid.uuid4()}").json()["results"] == []


def test_each_step_lists_its_failed_attempts_with_their_tracebacks(api):
    from workflows.models import StepCheckpoint

    task = make_task(api.user, state=S.FAILED)
    log = [{"attempt": n, "at": "2026-01-02T03:04:05+00:00", "type": "ValueError",
            "message": f"no such merchant (attempt {n})",
            "traceback": f"Traceback (most recent call last):\nValueError: attempt {n}\n"}
           for n in (1, 2)]
    StepCheckpoint.objects.create(task=task, index=0, name="charge", state="failed",
                                  attempts=2, error="ValueError: no such merchant",
                                  failures=log)
    StepCheckpoint.objects.create(task=task, index=1, name="ship", state="pending",
                                  failures=None)  # as the raw upsert leaves a fresh row
    steps = api.get(f"/api/v1/tasks/{task.pk}").json()["steps"]
    assert steps[0]["failures"] == log
    assert steps[1]["failures"] == []


def test_the_schema_documents_a_steps_failures(api):
    import yaml

    schema = yaml.safe_load(api.get("/api/v1/schema").content)["components"]["schemas"]
    assert "failures" in schema["Step"]["properties"]
    assert set(schema["StepFailure"]["properties"]) == {"attempt", "at", "type", "message",
                                                        "traceback"}
