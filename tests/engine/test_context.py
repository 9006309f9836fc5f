"""A step's view of its run (engine/context.py): its heartbeat and saved
progress are fenced writes of the held attempt, on a real claim."""

from datetime import timedelta

import pytest

from tests.factories import make_task
from workflows.engine.context import StepContext
from workflows.engine.operations import task_cancel
from workflows.engine.run.held import Held
from workflows.engine.store import store
from workflows.models import StepCheckpoint, Task
from workflows.registry import registry
from workflows.rules.errors import CancelRequested
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


def holding(owner, *, atomic=False):
    claimed = store().claim(make_task(owner).pk, worker="w", lease=timedelta(seconds=30))
    held = Held(claimed, store())
    step = registry.get("demo.echo").steps[0]
    StepCheckpoint.objects.create(task_id=held.task.pk, index=0, name=step.name,
                                  state="running", attempts=1)
    return held, held.context(0, step, outputs={}, progress=None, atomic=atomic)


def test_a_heartbeat_extends_the_lease(owner):
    held, ctx = holding(owner)
    before = Task.objects.get(pk=held.task.pk).lease_expires_at
    ctx.heartbeat(force=True)
    assert Task.objects.get(pk=held.task.pk).lease_expires_at > before


def test_saved_progress_is_written_to_the_step(owner):
    held, ctx = holding(owner)
    ctx.save_progress({"page": 3})
    assert StepCheckpoint.objects.get(task_id=held.task.pk, index=0).progress == {"page": 3}
    assert ctx.progress == {"page": 3}


def test_an_atomic_step_has_no_progress_to_save(owner):
    held, ctx = holding(owner, atomic=True)
    with pytest.raises(RuntimeError, match="all or nothing"):
        ctx.save_progress(1)
    assert StepCheckpoint.objects.get(task_id=held.task.pk, index=0).progress is None


def test_a_heartbeat_after_a_cancel_stops_the_step(owner):
    held, ctx = holding(owner)
    task_cancel(task_id=held.task.pk, user=owner)
    assert Task.objects.get(pk=held.task.pk).state == S.CANCELLING
    with pytest.raises(CancelRequested):
        ctx.heartbeat(force=True)


def test_a_steps_key_names_its_task_and_step_and_whether_it_undoes(owner):
    held, ctx = holding(owner)
    assert ctx.step_key == f"{held.task.pk}:{ctx.step_name}"


def test_a_steps_context_runs_under_its_attempts_lease(owner):
    held, _ = holding(owner)
    ctx = StepContext(held=held, task_id=str(held.task.pk), workflow=held.task.workflow,
                      payload=held.task.payload, outputs={}, attempt=held.task.attempts,
                      step_index=0, step_name="echo", compensating=True)
    assert ctx._lease == held.lease and ctx._lease.token == held.task.lease_token
    assert ctx.step_key.endswith(":echo:compensate")
