"""PilotClient against a live PILOT (gunicorn + qcluster + dispatcher on
PostgreSQL; no mocks): triggers and replays, wait, get, list, cancel, retry,
batch, and the typed errors the server answers with."""

from __future__ import annotations

import time
import uuid

import pilot_client
import pytest
from pilot_client import PilotClient

from workflows.models import Task

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_trigger_without_a_key_gets_one_runs_once_and_replays_with_it(pilot, api_client):
    first = pilot.trigger("demo.echo", {"n": 1})
    assert (first.status, first.replayed, first.created, first.attempts) == (202, False, True, 1)
    assert str(uuid.UUID(first.key)) == first.key == first.task.idempotency_key
    done = pilot.wait(first.task_id, timeout=60)
    assert (done.state, done.succeeded, done.result) == ("succeeded", True, {"echo": {"n": 1}})
    assert [s.name for s in done.steps] == ["echo"] and done.finished_at is not None
    again = pilot.trigger("demo.echo", {"n": 1}, key=first.key)
    assert (again.status, again.replayed, again.task_id) == (200, True, first.task_id)
    assert again.task.result == {"echo": {"n": 1}}
    assert Task.objects.filter(owner=api_client[0]).count() == 1


def test_a_workflow_with_key_fields_derives_its_key_on_the_server(pilot):
    from workflows.registry import registry

    assert registry.get("demo.echo").key_fields == ()
    with pytest.raises(pilot_client.IdempotencyKeyMissing) as caught:
        pilot.trigger("demo.echo", {"n": 1}, derive_key=True)
    assert caught.value.status == 400


def test_wait_gives_up_with_the_last_state_seen(pilot):
    run = pilot.trigger("demo.slow", {"steps": 1, "seconds": 3})
    started = time.monotonic()
    with pytest.raises(pilot_client.WaitTimeout) as caught:
        pilot.wait(run.task_id, timeout=0.5)
    assert time.monotonic() - started < 3
    assert caught.value.task.id == run.task_id and not caught.value.task.finished
    pilot.cancel(run.task_id)


def test_cancel_then_retry_from_the_start(pilot):
    run = pilot.trigger("demo.slow", {"steps": 3, "seconds": 1})
    cancelled = pilot.cancel(run.task_id, reason="not needed after all")
    assert cancelled.state in ("cancelling", "cancelled")
    assert pilot.wait(run.task_id, timeout=60).state == "cancelled"
    with pytest.raises(pilot_client.TaskCancelled):
        pilot.trigger("demo.slow", {"steps": 3, "seconds": 1}, key=run.key)
    restarted = pilot.retry(run.task_id, from_start=True)
    assert restarted.state == "pending"
    pilot.cancel(run.task_id)
    assert pilot.wait(run.task_id, timeout=60).state == "cancelled"
    with pytest.raises(pilot_client.InvalidTransition) as caught:
        pilot.cancel(run.task_id)
    assert (caught.value.status, caught.value.code) == (409, "invalid_transition")


def test_a_failed_run_is_retried_from_its_checkpoints(pilot):
    run = pilot.trigger("demo.saga", {"fail": True})
    failed = pilot.wait(run.task_id, timeout=60)
    assert failed.state == "failed" and failed.error
    assert pilot.retry(run.task_id).state == "pending"
    assert pilot.wait(run.task_id, timeout=60).state == "failed"
    with pytest.raises(pilot_client.InvalidTransition):
        pilot.retry(pilot.wait(pilot.trigger("demo.echo", {}).task_id, 60).id)


def test_a_cancelled_run_is_retried_from_a_chosen_step(pilot):
    run = pilot.trigger("demo.slow", {"steps": 3, "seconds": 0.5})
    pilot.cancel(run.task_id)
    assert pilot.wait(run.task_id, timeout=60).state == "cancelled"
    with pytest.raises(pilot_client.ValidationError) as caught:
        pilot.retry(run.task_id, from_step="no-such-step")
    assert caught.value.status == 400 and "no-such-step" in caught.value.detail
    with pytest.raises(pilot_client.ValidationError):
        pilot.retry(run.task_id, from_step="s0", from_start=True)
    assert pilot.retry(run.task_id, from_step="s1").state == "pending"
    assert pilot.wait(run.task_id, timeout=60).state == "succeeded"


def test_a_fanout_gathers_its_children_and_lists_them_by_parent(pilot):
    run = pilot.trigger("demo.fanout", {"children": 3})
    done = pilot.wait(run.task_id, timeout=60)
    assert done.state == "succeeded", done.error
    assert done.result == {"children": 3, "results": [{"completed_steps": 1}] * 3}
    assert done.children_count == 3 and done.parent is None and done.version == 1
    children = list(pilot.list(parent=run.task_id))
    assert len(children) == 3 and {c.parent for c in children} == {run.task_id}
    assert {c.state for c in children} == {"succeeded"}
    failing = pilot.wait(pilot.trigger("demo.fanout", {"children": 2, "fail_child": 0}).task_id,
                         timeout=60)
    assert (failing.state, failing.error_type) == ("failed", "ChildFailed")


def test_a_versioned_run_records_its_version_and_the_steps_it_ran(pilot):
    run = pilot.trigger("demo.versioned", {})
    pilot.signal(run.task_id, "go")  # kept until the gate waits for it
    done = pilot.wait(run.task_id, timeout=60)
    assert (done.state, done.version) == ("succeeded", 1)
    assert done.result == {"version": 1, "ran": ["a", "gate", "b"]}


def test_get_and_list_follow_the_cursor_pages(pilot):
    keys = [pilot.trigger("demo.echo", {"i": i}).key for i in range(5)]
    listed = list(pilot.list(workflow="demo.echo", page_size=2))
    assert [t.idempotency_key for t in listed] == keys[::-1]  # newest first, over 3 pages
    one = pilot.get(listed[0].id)
    assert (one.id, one.payload) == (listed[0].id, {"i": 4})
    assert [t.idempotency_key for t in pilot.list(idempotency_key=keys[2])] == [keys[2]]
    assert list(pilot.list(state=["failed", "cancelled"])) == []


def test_batch_returns_one_result_per_item_and_replays_on_a_second_send(pilot):
    items = [{"workflow": "demo.echo", "payload": {"a": 1}, "key": "batch-a"},
             {"workflow": "demo.echo", "payload": {"b": 2}},
             {"workflow": "acme.nope", "payload": {}}]
    results = pilot.batch(items)
    assert [(r.ok, r.status, r.replayed) for r in results] == [
        (True, 202, False), (True, 202, False), (False, 400, False)]
    assert results[0].key == "batch-a" and results[0].task.idempotency_key == "batch-a"
    assert isinstance(results[2].error, pilot_client.UnknownWorkflow)
    again = pilot.batch([{**items[0]}, {**items[1], "key": results[1].key}])
    assert [(r.status, r.replayed, r.task.id) for r in again] == [
        (200, True, results[0].task.id), (200, True, results[1].task.id)]


def test_refusals_raise_the_class_of_their_code(pilot, live_pilot):
    cases = [
        (lambda: pilot.trigger("acme.nope", {}), pilot_client.UnknownWorkflow, 400),
        (lambda: pilot.trigger("demo.sync_orders", {"batch": "b"}), pilot_client.ValidationError,
         400),
        (lambda: pilot.trigger("demo.echo", [1, 2]), pilot_client.ValidationError, 400),
        (lambda: pilot.trigger("demo.echo", {"x": "y" * 300_000}), pilot_client.PayloadTooLarge,
         413),
        (lambda: pilot.trigger("demo.echo", {}, key="k" * 256),
         pilot_client.IdempotencyKeyInvalid, 400),
        (lambda: pilot.get(str(uuid.uuid4())), pilot_client.NotFound, 404),
    ]
    for call, cls, status in cases:
        with pytest.raises(cls) as caught:
            call()
        error = caught.value
        assert (error.status, error.problem["code"], error.problem["status"]) == (
            status, cls.code, status), error
        assert error.detail and error.problem["type"].endswith(cls.code)
    with pytest.raises(pilot_client.ValidationError) as caught:
        pilot.trigger("demo.sync_orders", {"batch": "b"})
    assert "count" in caught.value.errors["payload"]
    pilot.trigger("demo.echo", {"v": 1}, key="reused")
    with pytest.raises(pilot_client.IdempotencyKeyReused) as caught:
        pilot.trigger("demo.echo", {"v": 2}, key="reused")
    assert caught.value.status == 422


def test_a_wrong_token_or_a_missing_permission_is_typed_too(live_pilot, django_user_model):
    from workflows.accounts import api_token_issue

    _, url = live_pilot
    with PilotClient(url, "not-a-token") as stranger:
        with pytest.raises(pilot_client.NotAuthenticated) as caught:
            stranger.trigger("demo.echo", {})
        assert caught.value.status == 401
    reader = django_user_model.objects.create_user("reader")
    with PilotClient(url, api_token_issue(reader)) as limited:
        with pytest.raises(pilot_client.PermissionDenied):
            limited.trigger("demo.echo", {})
        assert list(limited.list()) == []


def test_an_approval_waits_without_a_worker_takes_a_signal_and_finishes(pilot):
    run = pilot.trigger("demo.approval", {"timeout_seconds": 600}, priority=10)
    assert run.task.priority == 10

    def parked():
        task = pilot.get(run.task_id)
        return task if task.state == "waiting" else None

    deadline = time.monotonic() + 60
    while (task := parked()) is None:
        assert time.monotonic() < deadline, "the approval never parked"
        time.sleep(0.2)
    assert task.waiting_for["kind"] == "signal" and task.waiting_for["name"] == "decision"
    sent = pilot.signal(run.task_id, "decision", {"approved": True, "by": "client"})
    assert (sent.status, sent.replayed, sent.signal.name) == (202, False, "decision")
    again = pilot.signal(run.task_id, "decision", {"approved": True, "by": "client"},
                         key=sent.key)
    assert (again.status, again.replayed) == (200, True)
    done = pilot.wait(run.task_id, timeout=60)
    assert done.result == {"approved": True, "by": "client"}
    assert [s.consumed_at is not None for s in done.signals] == [True]
    with pytest.raises(pilot_client.TaskFinished):
        pilot.signal(run.task_id, "decision", {"approved": False})


def test_a_delayed_start_shows_its_run_after_and_waits_for_it(pilot):
    from datetime import UTC, datetime, timedelta

    later = datetime.now(UTC) + timedelta(hours=1)
    run = pilot.trigger("demo.echo", {"n": 2}, run_after=later)
    assert run.task.state == "pending" and run.task.run_after is not None
    assert abs((run.task.run_after - later).total_seconds()) < 1
    time.sleep(1)
    assert pilot.get(run.task_id).state == "pending"  # not claimed before its time
    pilot.cancel(run.task_id)
