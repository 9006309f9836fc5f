"""Real processes on PostgreSQL: a poison task that kills the worker running
it, every time, while other tasks go on. (Repeated SIGKILLs of the whole worker
group are tests/faults/test_worker_faults.py.)"""

import pytest

from tests.support.procs import Fleet, wait_until
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE, POLL = 3.0, 0.2


@pytest.fixture
def fleet():
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_DISPATCHER_POLL_SECONDS=POLL)
    yield fleet
    fleet.stop_all()


def test_a_poison_task_ends_failed_while_others_complete(owner, fleet):
    fleet.dispatcher()
    fleet.workers()
    poison = task_trigger(owner=owner, key="poison", workflow="test.poison", payload={}).task
    healthy = [task_trigger(owner=owner, key=f"ok-{i}", workflow="demo.echo",
                            payload={"i": i}).task for i in range(10)]
    wait_until(lambda: Task.objects.get(pk=poison.pk).is_finished, 90, interval=0.2,
               what="the poison task to end")
    poison.refresh_from_db()
    assert (poison.state, poison.attempts, poison.max_attempts) == (S.FAILED, 3, 3)
    assert poison.error_type == "LeaseExpired"
    wait_until(lambda: all(Task.objects.get(pk=t.pk).state == S.SUCCEEDED for t in healthy),
               60, what="the healthy tasks")
