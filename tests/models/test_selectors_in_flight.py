"""selectors.tasks_in_flight: what a stopping worker cluster is busy with."""

import pytest

from tests.factories import make_task
from workflows.models import StepCheckpoint
from workflows.rules.states import StepState
from workflows.rules.states import TaskState as S
from workflows.selectors import tasks_in_flight

pytestmark = pytest.mark.django_db


def test_names_the_leased_tasks_of_the_given_workers_with_their_running_step(owner):
    mine = make_task(owner, state=S.RUNNING)  # claimed by "test-worker"
    StepCheckpoint.objects.create(task=mine, index=0, name="fetch", state=StepState.SUCCEEDED)
    StepCheckpoint.objects.create(task=mine, index=1, name="write", state=StepState.RUNNING)
    between_steps = make_task(owner, state=S.CANCELLING)
    make_task(owner, state=S.PENDING)
    make_task(owner, state=S.SUCCEEDED)

    found = {task.pk: task.current_step for task in tasks_in_flight(worker_ids=["test-worker"])}

    assert found == {mine.pk: "write", between_steps.pk: None}
    assert list(tasks_in_flight(worker_ids=["host:1", "host:2"])) == []
