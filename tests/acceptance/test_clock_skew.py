"""Clock skew between machines, with real processes on PostgreSQL
(docs/design.md, "Time"): a worker group whose clock runs 2 s ahead and a
dispatcher whose clock runs 2 s behind (each process's `timezone.now` is
shifted), as on three machines whose clocks disagree. Retries still run
within the dispatcher's poll interval of being due, and a dead worker's lease
is recovered when it expires — by the database's clock, which is the only one
that decides."""

import itertools
import uuid

import pytest

from tests.support.procs import Fleet, group_pids, wait_until
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE, POLL, SKEW = 3.0, 0.2, 2.0
# The bound every delay below is held to: one poll interval, plus the time a
# loaded 2-core machine takes to wake a process and run a query. The bug this
# guards against cost PILOT_REENQUEUE_SECONDS (10 s) per retry, or the skew (2 s).
SLACK = 1.0


@pytest.fixture
def fleet():
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_HEARTBEAT_SECONDS=0.5,
                  PILOT_DISPATCHER_POLL_SECONDS=POLL, PILOT_REENQUEUE_SECONDS=10)
    yield fleet
    fleet.stop_all()


def _history(task_id):
    return list(TaskTransition.objects.filter(task_id=task_id).order_by("id"))


def test_retries_run_on_time_though_the_worker_and_dispatcher_clocks_disagree(owner, fleet):
    fleet.env["PILOT_TEST_CLOCK_SKEW_SECONDS"] = str(-SKEW)
    fleet.dispatcher()
    fleet.env["PILOT_TEST_CLOCK_SKEW_SECONDS"] = str(SKEW)
    fleet.workers()
    ids = [task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.flaky",
                        payload={"fail_times": 2}).task.pk for _ in range(5)]
    wait_until(lambda: Task.objects.filter(pk__in=ids, state=S.SUCCEEDED).count() == 5, 60,
               interval=0.2, what="the flaky tasks to succeed")
    lateness = []
    for task_id in ids:
        history = _history(task_id)
        for scheduled, claimed in itertools.pairwise(history):
            if scheduled.transition == "schedule_retry":
                assert claimed.transition == "claim"
                due = scheduled.at + _delay(scheduled.reason)
                lateness.append((claimed.at - due).total_seconds())
    assert len(lateness) == 10
    # Never early. Read back from the audit, `claimed.at - due` is exact only to a few
    # milliseconds: the reason gives the delay to the millisecond (half a millisecond),
    # and a claim's audit row carries its statement's start while the claim tests the
    # due time by the clock after it has locked the row (engine/store/sql.py, `claim`),
    # so a claim that waited for the lock reads up to that wait early — 1.1 ms seen on
    # a loaded machine. An early claim this test guards against would be early by the
    # skew, 2 s.
    assert min(lateness) >= -0.005, lateness
    assert max(lateness) <= POLL + SLACK, lateness  # never a skew (or 10 s) late


def _delay(reason):
    from workflows.admin.phases import retry_delay

    return retry_delay(reason)


def test_a_dead_workers_lease_is_recovered_when_it_expires_by_the_databases_clock(
        owner, fleet):
    fleet.env["PILOT_TEST_CLOCK_SKEW_SECONDS"] = str(-SKEW)  # a dispatcher 2 s behind
    fleet.dispatcher()
    fleet.env["PILOT_TEST_CLOCK_SKEW_SECONDS"] = str(SKEW)  # workers 2 s ahead
    group = fleet.workers()
    task = task_trigger(owner=owner, key="skewed-lease", workflow="demo.slow",
                        payload={"steps": 1, "seconds": 60}).task
    wait_until(lambda: Task.objects.get(pk=task.pk).state == S.RUNNING, 30, interval=0.1,
               what="the task to start")
    wait_until(lambda: len(group_pids(group.popen.pid)) > 0, 5)
    group.kill()  # the worker dies mid-step; its lease (renewed by heartbeats) runs out
    wait_until(lambda: TaskTransition.objects.filter(task_id=task.pk,
                                                     transition="recover").exists(),
               30, interval=0.1, what="the lease to be recovered")
    recover = TaskTransition.objects.get(task_id=task.pk, transition="recover")
    task.refresh_from_db()
    # The lease the dead worker last renewed, as the recover's reason records it.
    expired_at = _lease_end(recover.reason)
    late = (recover.at - expired_at).total_seconds()
    assert 0 <= late <= POLL + SLACK, (late, recover.reason)


def _lease_end(reason):
    from datetime import datetime

    text = reason.split("expired at ", 1)[1].split(";", 1)[0]
    return datetime.fromisoformat(text)
