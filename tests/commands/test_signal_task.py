"""manage.py signal_task: the same engine call as the API's signal."""

import io
import uuid

import pytest
from django.core.management import CommandError, call_command

from tests.support.helpers import pop_queued
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskSignal, TaskTransition
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting(owner):
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.approval",
                        payload={}).task
    for message in pop_queued():
        run_task(message)
    task.refresh_from_db()
    assert task.state == S.WAITING
    return task


def _call(*args):
    out = io.StringIO()
    call_command("signal_task", *args, stdout=out)
    return out.getvalue()


def test_it_stores_the_signal_wakes_the_task_and_replays_by_key(owner, tmp_path):
    task = _waiting(owner)
    reply = tmp_path / "decision.json"
    reply.write_text('{"approved": true, "by": "night-ops"}')
    out = _call(str(task.pk), "decision", "--payload", f"@{reply}", "--key", "d-1")
    assert out.startswith("stored:") and "woken" in out
    assert Task.objects.get(pk=task.pk).state == S.PENDING
    wake = TaskTransition.objects.filter(task_id=task.pk, transition="wake").get()
    assert wake.actor.startswith("cli")
    assert _call(str(task.pk), "decision", "--payload", f"@{reply}",
                 "--key", "d-1").startswith("replayed:")
    assert TaskSignal.objects.filter(task=task).count() == 1


@pytest.mark.parametrize(("args", "message"), [
    (["not-a-uuid", "decision"], "is not a task id"),
    ([str(uuid.uuid4()), "decision"], "refused (not_found)"),
    (["{task}", "bad name"], "refused (validation_error)"),
    (["{task}", "decision", "--payload", "[1]"], "must be a JSON object"),
    (["{task}", "decision", "--payload", "{"], "not valid JSON"),
])
def test_bad_arguments_are_clear_errors_and_store_nothing(owner, args, message):
    task = _waiting(owner)
    args = [a.replace("{task}", str(task.pk)) for a in args]
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _call(*args)
    assert TaskSignal.objects.count() == 0
