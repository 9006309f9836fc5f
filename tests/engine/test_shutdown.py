"""The workers are stopping (engine/shutdown.py): a step that returns then is
recorded with its task's `release` — the next step does not start, no lease
holds the task — and the next run resumes at that next step, in the same
attempt's budget. A stopping worker claims nothing new."""

import uuid

import pytest

from tests.support.helpers import pop_queued
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.shutdown import STOP_FLAG_ENV, stop_announce, stop_requested
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def flag(tmp_path, monkeypatch):
    path = tmp_path / "stopping"
    monkeypatch.setenv(STOP_FLAG_ENV, str(path))
    return path


@pytest.fixture
def three_steps(temp_workflow, flag):
    """test.stopping: a, b, c; `a` raises the stop flag while it runs, as
    run_workers does when it is told to stop in the middle of a step."""
    ran = []
    wf = temp_workflow("test.stopping", max_attempts=3)

    @wf.step
    def a(ctx):
        ran.append("a")
        if ctx.attempt == 1:
            stop_announce(flag)
        return {"a": 1}

    @wf.step
    def b(ctx):
        ran.append("b")
        return {"b": ctx.outputs["a"]["a"] + 1}

    @wf.step
    def c(ctx):
        ran.append("c")
        return {"c": ctx.outputs["b"]["b"] + 1}

    return ran


def history(task):
    return list(TaskTransition.objects.filter(task_id=task.pk).order_by("id")
                .values_list("transition", "reason"))


def test_no_flag_no_stop(monkeypatch, tmp_path):
    monkeypatch.delenv(STOP_FLAG_ENV, raising=False)
    assert not stop_requested()  # a cluster started without run_workers never stops early
    monkeypatch.setenv(STOP_FLAG_ENV, str(tmp_path / "stopping"))
    assert not stop_requested()
    stop_announce(tmp_path / "stopping")
    assert stop_requested()


def test_a_step_done_while_stopping_releases_the_task_and_the_next_run_resumes_after_it(
        owner, three_steps, flag):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="test.stopping",
                        payload={}).task
    assert pop_queued() == [str(task.pk)]
    assert run_task(str(task.pk)) == "released"
    task.refresh_from_db()
    # `a` is recorded, `b` never started: the task is pending, due, held by no lease.
    assert three_steps == ["a"]
    assert list(StepCheckpoint.objects.filter(task_id=task.pk).values_list("name", "state")) \
        == [("a", "succeeded")]
    assert (task.state, task.lease_owner, task.lease_expires_at) == (S.PENDING, "", None)
    assert (task.attempts, task.max_attempts, task.enqueued_at) == (1, 4, None)
    assert history(task)[-1] == (
        "release", "the workers are stopping: step a done, b starts on their next start")

    # Still stopping: a message (and a drain) claims nothing.
    assert run_task(str(task.pk)) == "skipped"
    assert Task.objects.get(pk=task.pk).state == S.PENDING

    # The next start: the dispatcher sends it its message at once (no lease to wait
    # out) and it resumes at b, a's output kept, the budget unspent.
    flag.unlink()
    dispatch_once()
    assert pop_queued() == [str(task.pk)]
    assert run_task(str(task.pk)) == "succeeded"
    task.refresh_from_db()
    assert (task.state, task.result, task.attempts, task.max_attempts) == (
        S.SUCCEEDED, {"c": 3}, 2, 4)
    assert three_steps == ["a", "b", "c"]
    assert [name for name, _ in history(task)] == ["claim", "release", "claim", "succeed"]
