"""The hand-built representation and the documented TaskSerializer agree."""

import json

import pytest

from tests.factories import make_task
from tests.support.helpers import drain
from workflows.api.serializers import TaskSerializer
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.representation import task_data
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


def same(task):
    documented = json.loads(json.dumps(TaskSerializer(task).data))
    assert json.loads(json.dumps(task_data(task))) == documented
    assert list(task_data(task)) == list(documented)  # same keys, same order


def test_the_fast_representation_matches_the_serializer_in_every_shape(owner):
    for state in S:
        same(make_task(owner, state=state))
    ran = [task_trigger(owner=owner, key=workflow, workflow=workflow, payload=payload).task.pk
           for workflow, payload in [("demo.echo", {"x": [1, {"y": None}]}),
                                     ("demo.saga", {"fail": True}),
                                     ("demo.sync_orders", {"batch": "rep", "count": 2})]]
    drain(lambda: all(t.is_finished for t in Task.objects.filter(pk__in=ran)))
    for task in Task.objects.filter(pk__in=ran):
        assert task.steps.exists()
        same(task)


def test_a_webhook_body_leaves_the_steps_failures_out(owner):
    from workflows.models import StepCheckpoint
    from workflows.representation import webhook_body

    task = make_task(owner, state=S.FAILED)
    StepCheckpoint.objects.create(task=task, index=0, name="charge", state="failed",
                                  failures=[{"attempt": 1, "type": "ValueError",
                                             "message": "m", "traceback": "T" * 8000}])
    steps = list(StepCheckpoint.objects.filter(task_id=task.pk))
    assert task_data(task, steps=steps)["steps"][0]["failures"][0]["type"] == "ValueError"
    body = json.loads(webhook_body(task, steps))
    assert "failures" not in body["steps"][0] and "TTTT" not in json.dumps(body)
