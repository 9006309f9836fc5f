"""workflows/django_tasks.py: Django's task framework on PILOT, in
process — enqueue through the idempotent trigger, run by the real worker entry
point (drain), read back with get_result/refresh."""

import sys
import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.utils import timezone

from tests.support.helpers import drain, queued_task_ids
from workflows.demo.tasks import add, charge
from workflows.django_tasks import PilotTaskBackend, TaskWorkflow, task
from workflows.engine import task_trigger
from workflows.models import Task
from workflows.registry import registry
from workflows.rules.errors import IdempotencyKeyReused, RetryableError, ValidationFailed
from workflows.rules.states import Source, TaskState

try:
    from django.tasks import TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
except ImportError:
    from django_tasks import TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist

# The worker entry point manages its connection as in production: transactional tests.
pytestmark = pytest.mark.django_db(transaction=True)

PILOT_BACKEND = "workflows.django_tasks.PilotTaskBackend"


def test_an_enqueued_task_is_a_pilot_task_of_its_module_path_run_by_a_worker():
    result = add.enqueue(2, 3)
    row = Task.objects.get(pk=result.id)
    assert (row.workflow, row.source, row.owner.get_username()) == \
        ("workflows.demo.tasks.add", Source.TASKS, "tasks")
    assert row.payload == {"args": [], "kwargs": {"a": 2, "b": 3}}
    assert result.status == TaskResultStatus.READY and result.backend == "default"
    assert (result.args, result.kwargs) == ([], {"a": 2, "b": 3})
    assert queued_task_ids() == [result.id]
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018 - the property raises
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert len(result.worker_ids) == 1 and result.worker_ids[0]
    assert result.started_at <= result.last_attempted_at <= result.finished_at
    assert result.errors == []
    assert add.get_result(result.id).return_value == 5


def test_the_same_key_and_arguments_return_the_same_result_however_they_are_passed():
    first = charge.enqueue(7, 5)
    again = charge.enqueue(order_id=7, amount=5)
    mixed = charge.enqueue(7, amount=5)
    assert first.id == again.id == mixed.id
    assert Task.objects.count() == 1 and Task.objects.get().replays == 2
    assert queued_task_ids() == [first.id]  # one run
    drain()
    assert charge.get_result(first.id).return_value == {"order": 7, "charged": 5}
    assert charge.enqueue(7, 5).id == first.id  # a finished task replays too
    assert charge.enqueue(8, 5).id != first.id  # another order, another key


def test_the_same_key_with_other_arguments_is_refused():
    charge.enqueue(order_id=1, amount=5)
    with pytest.raises(IdempotencyKeyReused):
        charge.enqueue(order_id=1, amount=6)
    assert Task.objects.count() == 1


def test_a_task_without_key_fields_gets_a_fresh_key_every_time():
    ids = {add.enqueue(1, 1).id for _ in range(3)}
    assert len(ids) == 3 and Task.objects.count() == 3


def test_a_failed_task_enqueued_again_with_the_same_key_runs_again():
    from tests.testapp.tasks import always_fails

    keyed = always_fails.using()  # the same task: no key fields, so a fresh key each time
    result = keyed.enqueue("boom")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "boom" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018 - the property raises
    row = Task.objects.get(pk=result.id)
    outcome = task_trigger(owner=row.owner, workflow=row.workflow, payload=row.payload,
                           key=row.idempotency_key)
    assert outcome.outcome == "restarted"
    assert always_fails.get_result(result.id).status == TaskResultStatus.READY


def test_retries_are_pilots_and_every_attempt_is_reported():
    from tests.testapp.tasks import fails_once

    result = fails_once.enqueue(4)
    drain(lambda: Task.objects.get(pk=result.id).is_finished)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 4
    assert len(result.worker_ids) == 2 and result.attempts == 2
    [error] = result.errors
    assert error.exception_class is RetryableError
    assert Task.objects.get(pk=result.id).attempts == 2


def test_a_task_that_takes_context_sees_its_result_and_attempt():
    from tests.testapp.tasks import whoami

    result = whoami.enqueue("me")
    assert result.kwargs == {"label": "me"}
    drain()
    assert whoami.get_result(result.id).return_value == {"label": "me", "attempt": 1,
                                                          "id": result.id}


def test_an_async_task_runs():
    from tests.testapp.tasks import doubled

    assert PilotTaskBackend.supports_async_task
    result = doubled.enqueue(21)
    drain()
    assert doubled.get_result(result.id).return_value == 42


def test_aenqueue_and_aget_result_are_the_same_calls_from_async_code():
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    async def enqueue_and_read():
        try:
            result = await charge.aenqueue(11, 3)
            again = await charge.aget_result(result.id)
        finally:  # the framework's calls ran in asgiref's thread: close its connection
            await sync_to_async(connections.close_all, thread_sensitive=True)()
        return result, again

    result, again = asyncio.run(enqueue_and_read())
    assert result.id == again.id and again.status == TaskResultStatus.READY
    assert charge.enqueue(11, 3).id == result.id


def test_arguments_are_bound_by_name_and_extra_positionals_kept_in_order():
    from tests.testapp.tasks import greet, spread

    assert greet.enqueue("ann", punctuation="?").kwargs == {"name": "ann", "punctuation": "?"}
    result = spread.enqueue(1, 2, 3, colour="red")
    assert (result.args, result.kwargs) == ([1, 2, 3], {"colour": "red"})
    drain()
    assert spread.get_result(result.id).return_value == {"first": 1, "rest": [2, 3],
                                                          "extra": {"colour": "red"}}


def test_arguments_the_function_refuses_or_that_are_not_json_are_refused_at_enqueue():
    with pytest.raises(TypeError, match=r"workflows\.demo\.tasks\.add: .*argument"):
        add.enqueue(1, 2, 3)
    with pytest.raises(TypeError, match="must be JSON"):
        add.enqueue(1, object())
    with pytest.raises(ValidationFailed):
        add.enqueue(1, float("nan"))
    assert Task.objects.count() == 0


def test_a_return_value_that_is_not_json_fails_the_task():
    from tests.testapp.tasks import returns_a_set

    result = returns_a_set.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError


def test_heartbeat_renews_the_lease_inside_a_task_and_refuses_outside_one():
    from tests.testapp.tasks import beats
    from workflows.django_tasks import heartbeat

    result = beats.enqueue(3)
    drain()
    assert beats.get_result(result.id).return_value == 3
    with pytest.raises(RuntimeError, match="not running as one"):
        heartbeat()


def test_priority_and_run_after_are_the_triggers():
    later = timezone.now() + timedelta(hours=1)
    result = charge.using(priority=7, run_after=later).enqueue(order_id=3, amount=1)
    row = Task.objects.get(pk=result.id)
    assert (row.priority, row.run_after, row.next_attempt_at) == (7, later, later)
    assert (result.task.priority, result.task.run_after) == (7, later)
    assert result.status == TaskResultStatus.READY
    assert queued_task_ids() == []  # not before its time
    with pytest.raises(ValidationFailed, match="days ahead"):
        charge.using(run_after=timezone.now() + timedelta(days=400)).enqueue(4, 1)
    with pytest.raises(InvalidTask, match="priority"):
        charge.using(priority=101)


def test_an_unknown_id_has_no_result(owner):
    backend = add.get_backend()
    for unknown in (str(uuid.uuid4()), "not-a-uuid", ""):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(unknown)
    plain = task_trigger(owner=owner, workflow="demo.echo", payload={}, key="k")
    with pytest.raises(TaskResultDoesNotExist):  # a PILOT task, but no Django task
        backend.get_result(str(plain.task.pk))


def test_statuses_map_pilots_states():
    from workflows.django_tasks import STATUS

    assert set(STATUS) == set(TaskState.values)
    assert {STATUS[s] for s in ("pending", "retrying", "waiting")} == {TaskResultStatus.READY}
    assert {STATUS[s] for s in ("running", "compensating", "cancelling")} == \
        {TaskResultStatus.RUNNING}
    assert STATUS["succeeded"] == TaskResultStatus.SUCCESSFUL
    assert {STATUS[s] for s in ("failed", "cancelled")} == {TaskResultStatus.FAILED}


def test_the_framework_signals_come_from_pilots_events():
    try:
        from django.tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:
        from django_tasks.signals import task_enqueued, task_finished, task_started
    heard = []

    def listen(signal):
        def receiver(sender, task_result, **kwargs):
            heard.append((signal, sender, task_result.id, task_result.status))
        return receiver

    receivers = {name: listen(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    try:
        ok = add.enqueue(1, 2)
        add.enqueue(1, 2)  # another key: another task; a replay would send nothing
        charge.enqueue(1, 1)
        charge.enqueue(1, 1)  # a replay: nothing enqueued
        drain()
    finally:
        task_enqueued.disconnect(receivers["enqueued"])
        task_started.disconnect(receivers["started"])
        task_finished.disconnect(receivers["finished"])
    mine = [h for h in heard if h[2] == ok.id]
    assert mine == [("enqueued", PilotTaskBackend, ok.id, TaskResultStatus.READY),
                    ("started", PilotTaskBackend, ok.id, TaskResultStatus.RUNNING),
                    ("finished", PilotTaskBackend, ok.id, TaskResultStatus.SUCCESSFUL)]
    assert [h[0] for h in heard].count("enqueued") == 3
    assert [h[0] for h in heard].count("finished") == 3


def test_a_task_shows_in_the_api_and_the_console_like_any_workflow(client, django_user_model):
    result = charge.enqueue(9, 2)
    drain()
    admin = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    body = client.get(f"/api/v1/tasks/{result.id}").json()
    assert (body["workflow"], body["state"], body["result"]) == \
        ("workflows.demo.tasks.charge", "succeeded", {"order": 9, "charged": 2})
    assert [s["name"] for s in body["steps"]] == ["charge"]
    names = [w["name"] for w in client.get("/api/v1/workflows").json()]
    assert "workflows.demo.tasks.charge" in names
    page = client.get(f"/admin/workflows/task/{result.id}/change/")
    assert page.status_code == 200
    assert b"workflows.demo.tasks.charge" in page.content
    listing = client.get("/admin/workflows/task/", {"workflow": "workflows.demo.tasks.charge"})
    assert result.id.encode() in listing.content


def test_a_worker_that_never_imported_the_module_finds_the_task_by_name():
    name = "tests.testapp.tasks.greet"
    registry.unregister(name)
    assert registry.registered(name) is None
    found = registry.find(name)
    assert isinstance(found, TaskWorkflow) and found.task.module_path == name
    assert [s.name for s in found.steps] == ["greet"]


def test_threads_loading_one_name_at_once_register_it_once():
    import threading

    name = "tests.testapp.tasks.greet"
    registry.unregister(name)
    barrier, found = threading.Barrier(8), []

    def load():
        barrier.wait(timeout=10)
        try:
            found.append(registry.find(name))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion
            found.append(exc)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(found) == 8 and len({id(w) for w in found}) == 1
    assert isinstance(found[0], TaskWorkflow)


def test_names_outside_installed_apps_import_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "tests.support.slow_dns", raising=False)
    assert registry.find("tests.support.slow_dns.anything") is None
    assert "tests.support.slow_dns" not in sys.modules
    assert registry.find("workflows.demo.tasks.missing") is None
    assert registry.find("workflows.demo.workflows.echo") is None  # a workflow, not a task


def test_an_api_trigger_of_a_task_workflow_runs_it(owner):
    outcome = task_trigger(owner=owner, workflow="workflows.demo.tasks.add",
                           payload={"args": [2], "kwargs": {"b": 2}}, key="api-1")
    drain()
    assert add.get_result(str(outcome.task.pk)).return_value == 4
    with pytest.raises(ValidationFailed) as refused:
        task_trigger(owner=owner, workflow="workflows.demo.tasks.add",
                     payload={"args": {"a": 1}, "kwargs": [1]}, key="api-2")
    assert set(refused.value.errors["payload"]) == {"args", "kwargs"}


def test_the_backend_refuses_what_it_cannot_do():
    def shouting():
        return 1

    shouting.__qualname__ = "Shouting"
    with pytest.raises(InvalidTask, match="dotted lowercase"):
        task(shouting)
    with pytest.raises(InvalidTask, match="key_fields"):
        task(key_fields=("nope",))(add.func)
    with pytest.raises(ImproperlyConfigured, match="OPTIONS"):
        PilotTaskBackend("x", {"OPTIONS": {"OWNERS": "a"}})
    with pytest.raises(ImproperlyConfigured, match="QUEUES"):
        PilotTaskBackend("x", {"QUEUES": ["default", "emails"]})


def test_the_owner_is_the_tasks_user_or_the_one_options_name(django_user_model):
    shop = django_user_model.objects.create_user("shop")
    with override_settings(TASKS={"default": {"BACKEND": PILOT_BACKEND,
                                              "OPTIONS": {"OWNER": "shop"}}}):
        result = add.enqueue(1, 1)
        assert Task.objects.get(pk=result.id).owner == shop
    with override_settings(TASKS={"default": {"BACKEND": PILOT_BACKEND,
                                              "OPTIONS": {"OWNER": "nobody"}}}):
        with pytest.raises(ImproperlyConfigured, match="no user named 'nobody'"):
            add.enqueue(1, 1)
    assert Task.objects.count() == 1
    from workflows.accounts import ApiClientRefused, api_client_create

    with pytest.raises(ApiClientRefused):  # the `tasks` owner never gets a token
        api_client_create("tasks")
