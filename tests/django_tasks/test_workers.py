"""Django tasks run by PILOT's real workers: a qcluster and a dispatcher under
subprocess, which import none of the tasks' modules until a task names one."""

import pytest

from tests.support.procs import Fleet, wait_until
from tests.testapp.tasks import fails_once, greet
from workflows.demo.tasks import charge

try:
    from django.tasks import TaskResultStatus
except ImportError:
    from django_tasks import TaskResultStatus

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet():
    fleet = Fleet()
    fleet.workers()
    fleet.dispatcher()
    yield fleet
    fleet.stop_all()


def test_workers_run_enqueued_tasks_and_their_retries(fleet):
    hello = greet.enqueue("world")
    again = fails_once.enqueue(7)
    order = charge.enqueue(5, 12)

    def finished():
        for result in (hello, again, order):
            result.refresh()
        return all(r.is_finished for r in (hello, again, order))

    wait_until(finished, 60, what="the workers to run the tasks")
    assert hello.status == TaskResultStatus.SUCCESSFUL and hello.return_value == "hello world!"
    assert order.return_value == {"order": 5, "charged": 12}
    assert again.return_value == 7 and again.attempts == 2
    assert len(again.worker_ids) == 2 and all(again.worker_ids)
    assert charge.enqueue(order_id=5, amount=12).id == order.id  # replayed, not run again
