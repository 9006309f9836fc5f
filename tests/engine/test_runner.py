"""Running tasks in-process through the real worker entry point and broker:
steps, checkpoints, resume, retries, failure, the demo workflows."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.helpers import drain, expire_lease, pop_queued, task_claim
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.triggers import task_trigger
from workflows.models import DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.errors import NonRetryableError, RetryableError
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start(owner):
    def trigger(workflow, payload, key=None):
        return task_trigger(owner=owner, key=key or uuid.uuid4().hex, workflow=workflow,
                            payload=payload).task

    return trigger


def finished(task):
    return lambda: Task.objects.get(pk=task.pk).is_finished


def history(task):
    return list(TaskTransition.objects.filter(task_id=task.pk).order_by("id")
                .values_list("transition", flat=True))


def steps(task):
    return list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index")
                .values_list("name", "state"))


# --- the demo workflows, end to end --------------------------------------------------------

def test_demo_echo_returns_its_payload(start):
    task = start("demo.echo", {"msg": "hi", "n": [1, 2]})
    drain(finished(task))
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED
    assert task.result == {"echo": {"msg": "hi", "n": [1, 2]}}
    assert (task.attempts, task.lease_owner, task.lease_expires_at) == (1, "", None)
    assert task.finished_at and task.expires_at == task.finished_at + timedelta(hours=24)
    assert steps(task) == [("echo", "succeeded")]
    assert history(task) == ["claim", "succeed"]


def test_demo_sync_orders_writes_count_rows_once(start):
    task = start("demo.sync_orders", {"batch": "b-1", "count": 250})
    drain(finished(task))
    task.refresh_from_db()
    assert (task.state, task.result) == (S.SUCCEEDED, {"written": 250})
    assert DemoOrder.objects.filter(batch="b-1").count() == 250
    assert sorted(DemoOrder.objects.filter(batch="b-1").values_list("n", flat=True)) == list(
        range(250))
    outputs = dict(StepCheckpoint.objects.filter(task_id=task.pk).values_list("name", "output"))
    assert outputs == {"fetch": {"fetched": 250}, "transform": {"transformed": 250},
                       "write": {"written": 250}}


def test_demo_flaky_succeeds_after_its_failures_with_backoff(start):
    task = start("demo.flaky", {"fail_times": 2})
    drain(finished(task))
    task.refresh_from_db()
    assert (task.state, task.result, task.attempts) == (S.SUCCEEDED, {"attempts": 3}, 3)
    assert history(task) == ["claim", "schedule_retry", "claim", "schedule_retry", "claim",
                             "succeed"]
    cp = StepCheckpoint.objects.get(task_id=task.pk)
    assert (cp.state, cp.attempts, cp.error) == ("succeeded", 3, "")
    # The success keeps the log of the attempts that failed before it.
    assert [(f["attempt"], f["type"]) for f in cp.failures] == [(1, "RetryableError"),
                                                                (2, "RetryableError")]


def test_demo_flaky_fails_when_attempts_run_out(start):
    task = start("demo.flaky", {"fail_times": 9})
    drain(finished(task))
    task.refresh_from_db()
    assert (task.state, task.attempts, task.max_attempts) == (S.FAILED, 5, 5)
    assert task.error_type == "RetryableError"
    assert "attempts exhausted (5)" in task.error and "attempt 5" in task.error
    assert history(task)[-1] == "fail"
    cp = StepCheckpoint.objects.get(task_id=task.pk)
    assert [f["attempt"] for f in cp.failures] == [1, 2, 3, 4, 5]
    last = cp.failures[-1]
    assert last["type"] == "RetryableError" and "attempt 5" in last["message"]
    assert last["traceback"].startswith("Traceback (most recent call last)")
    assert "demo/workflows.py" in last["traceback"]  # the frame of the step that raised


def test_demo_slow_runs_exactly_the_requested_steps(start):
    task = start("demo.slow", {"steps": 4, "seconds": 0.01})
    drain(finished(task))
    task.refresh_from_db()
    assert (task.state, task.result) == (S.SUCCEEDED, {"completed_steps": 4})
    assert [name for name, _ in steps(task)] == ["s0", "s1", "s2", "s3"]


def test_demo_saga_compensates_in_reverse_order_when_it_fails(start):
    task = start("demo.saga", {"fail": True})
    drain(finished(task))
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "NonRetryableError")
    assert steps(task) == [("reserve", "compensated"), ("charge", "compensated"),
                           ("confirm", "failed")]
    order = list(StepCheckpoint.objects.filter(task_id=task.pk, state="compensated")
                 .order_by("finished_at").values_list("name", flat=True))
    assert order == ["charge", "reserve"]


def test_demo_saga_succeeds_without_compensation(start):
    task = start("demo.saga", {"fail": False})
    drain(finished(task))
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result["confirmed"] is True
    assert steps(task) == [("reserve", "succeeded"), ("charge", "succeeded"),
                           ("confirm", "succeeded")]


# --- claims --------------------------------------------------------------------------------

def test_a_second_claim_and_a_duplicate_delivery_do_nothing(start):
    task = start("demo.echo", {})
    first = task_claim(task_id=task.pk, worker="w1")
    assert first is not None and first.task.lease_token == 1
    assert task_claim(task_id=task.pk, worker="w2") is None
    assert run_task(str(task.pk)) == "skipped"
    task.refresh_from_db()
    assert (task.state, task.attempts, task.lease_owner) == (S.RUNNING, 1, "w1")


def test_a_message_for_a_finished_or_missing_task_is_a_no_op(start):
    task = start("demo.echo", {})
    drain(finished(task))
    assert run_task(str(task.pk)) == "skipped"
    assert run_task(str(uuid.uuid4())) == "skipped"
    assert history(task) == ["claim", "succeed"]


def test_a_retry_is_not_claimed_before_it_is_due(start, temp_workflow):
    wf = temp_workflow("test.later", backoff_initial=30, backoff_max=30)

    @wf.step
    def once(ctx):
        if ctx.attempt == 1:
            raise RetryableError("first time fails")
        return "ok"

    before = timezone.now()
    task = start("test.later", {})
    drain(lambda: Task.objects.get(pk=task.pk).state == S.RETRYING)
    task.refresh_from_db()
    # Full jitter: the retry is due anywhere in [0, 30] s after the failure.
    assert before - timedelta(seconds=1) < task.next_attempt_at
    assert task.next_attempt_at < timezone.now() + timedelta(seconds=31)
    # Pin it well in the future so "not yet due" does not depend on the jitter drawn.
    Task.objects.filter(pk=task.pk).update(
        next_attempt_at=timezone.now() + timedelta(seconds=60))
    assert task_claim(task_id=task.pk, worker="eager") is None
    assert run_task(str(task.pk)) == "skipped"
    task.refresh_from_db()
    assert (task.state, task.attempts, task.lease_owner) == (S.RETRYING, 1, "")
    # Once due, the same claim goes through: what refused it above was the time alone.
    Task.objects.filter(pk=task.pk).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert task_claim(task_id=task.pk, worker="on-time") is not None
    task.refresh_from_db()
    assert (task.state, task.attempts, task.lease_owner) == (S.RUNNING, 2, "on-time")


# --- resume, fencing, classification --------------------------------------------------------

@pytest.fixture
def counted(temp_workflow):
    """test.counted: three steps that count their runs; `b` fails while told to."""
    calls = {"a": 0, "b": 0, "c": 0}
    behaviour = {"b": None}
    wf = temp_workflow("test.counted", max_attempts=4, backoff_initial=0, backoff_max=0)

    @wf.step
    def a(ctx):
        calls["a"] += 1
        return {"a": 1}

    @wf.step
    def b(ctx):
        calls["b"] += 1
        if behaviour["b"]:
            raise behaviour["b"]
        return {"b": ctx.outputs["a"]["a"] + 1}

    @wf.step
    def c(ctx):
        calls["c"] += 1
        return {"c": ctx.outputs["b"]["b"] + 1}

    return calls, behaviour


def test_a_retry_resumes_from_checkpoints_and_reuses_outputs(start, counted):
    calls, behaviour = counted
    behaviour["b"] = RetryableError("b is down")
    task = start("test.counted", {})
    drain(lambda: Task.objects.get(pk=task.pk).state == S.RETRYING)
    behaviour["b"] = None
    drain(finished(task))
    task.refresh_from_db()
    assert (task.state, task.result) == (S.SUCCEEDED, {"c": 3})
    assert calls == {"a": 1, "b": 2, "c": 1}
    assert StepCheckpoint.objects.get(task_id=task.pk, name="b").attempts == 2


def test_non_retryable_and_unexpected_errors_fail_at_once(start, counted):
    _calls, behaviour = counted
    for exc, error_type in ((NonRetryableError("no"), "NonRetryableError"),
                            (KeyError("bug"), "KeyError")):
        behaviour["b"] = exc
        task = start("test.counted", {})
        drain(finished(task))
        task.refresh_from_db()
        assert (task.state, task.attempts, task.error_type) == (S.FAILED, 1, error_type)
        assert steps(task) == [("a", "succeeded"), ("b", "failed")]
        assert StepCheckpoint.objects.get(task_id=task.pk, name="b").error.startswith(error_type)


def test_a_checkpoint_under_another_name_stops_the_run(start, counted):
    calls, _ = counted
    task = start("test.counted", {})
    pop_queued()
    # An earlier attempt, under an older version of the workflow, checkpointed a
    # step of another name at index 0, then its worker died.
    assert task_claim(task_id=task.pk, worker="old-version") is not None
    StepCheckpoint.objects.update_or_create(task_id=task.pk, index=0, defaults={
        "name": "renamed", "state": "succeeded", "output": {"a": 1}})
    expire_lease(task.pk)
    dispatch_once()
    Task.objects.filter(pk=task.pk).update(next_attempt_at=timezone.now())
    assert run_task(str(task.pk)) == "failed"
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "WorkflowChanged")
    assert "'renamed'" in task.error and "'a'" in task.error
    assert calls == {"a": 0, "b": 0, "c": 0}


def test_an_unregistered_workflow_fails_its_task(start, temp_workflow):
    wf = temp_workflow("test.vanishing")
    wf.add_step("only", lambda ctx: None)
    task = start("test.vanishing", {})
    from workflows.registry import registry

    registry.unregister("test.vanishing")
    drain(finished(task))
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "UnknownWorkflow")


def test_the_step_context_carries_the_stable_step_key_and_progress(start, temp_workflow):
    seen = []
    wf = temp_workflow("test.ctx", max_attempts=3, backoff_initial=0, backoff_max=0)

    @wf.step
    def resumable(ctx):
        seen.append((ctx.step_key, ctx.attempt, ctx.progress))
        cursor = (ctx.progress or {}).get("cursor", 0)
        for position in range(cursor, 10):
            if position == 4 and ctx.attempt == 1:
                raise RetryableError("interrupted at 4")
            ctx.save_progress({"cursor": position + 1})
        return {"done_from": cursor}

    task = start("test.ctx", {})
    drain(finished(task))
    task.refresh_from_db()
    assert task.result == {"done_from": 4}
    assert seen == [(f"{task.pk}:resumable", 1, None),
                    (f"{task.pk}:resumable", 2, {"cursor": 4})]


def test_a_worker_drains_the_due_tasks_after_the_one_its_message_named(start, settings):
    """The database is the queue: one message keeps a worker going while work is
    due, in due order; messages only wake workers up."""
    from workflows.engine.run import tasks_drain

    tasks = [start("demo.echo", {"n": n}) for n in range(5)]
    messages = pop_queued()
    settings.PILOT_DRAIN_SECONDS = 10
    assert run_task(messages[0]) == "succeeded"
    assert [(Task.objects.get(pk=t.pk).state, Task.objects.get(pk=t.pk).result)
            for t in tasks] == [(S.SUCCEEDED, {"echo": {"n": n}}) for n in range(5)]
    claims = TaskTransition.objects.filter(transition="claim").order_by("id")
    assert [c.task_id for c in claims] == [t.pk for t in tasks]  # in trigger order
    assert run_task(messages[1]) == "skipped"  # a message for work already done
    import time

    assert tasks_drain(until=time.monotonic() + 10) == 0
