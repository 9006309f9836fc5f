"""PostgreSQL with django-q2's ORM broker: the combination the rest of `make test`
does not run (its SQLite pass uses the ORM broker, its PostgreSQL pass Redis).
With the ORM broker a message is a row in the task's own database, written inside
the trigger's transaction (docs/design.md, "The one door to django-q2"). These
tests prove that on PostgreSQL — visible only with the commit, gone with a
rollback — and that a real `qcluster` and `run_dispatcher`, started with
REDIS_URL unset, consume those rows, survive a SIGKILL of the worker group, and
finish the interrupted task from its checkpoint through a message the dispatcher
wrote. (`make test-pg-orm-broker` runs the whole engine and concurrency suites
this way, ~4 minutes, outside `make test`.)

This process is put on the ORM broker by django-q2's own setting (`Conf.ORM`),
whatever REDIS_URL says, so the triggers below write real OrmQ rows."""

import uuid

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from tests.faults.invariants import violations
from tests.support.helpers import in_thread, queued_task_ids
from tests.support.procs import Fleet, wait_until
from workflows.engine import enqueue
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.rules.states import FINISHED_STATES
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASE, POLL = 3.0, 0.2


@pytest.fixture
def orm_broker(monkeypatch):
    """This process on django-q2's ORM broker, in the test database; PILOT's cached
    broker (workflows.engine.enqueue.broker) is dropped so the next call builds the
    ORM one. Both are restored afterwards."""
    monkeypatch.setattr(Conf, "ORM", "default")
    monkeypatch.setattr(enqueue, "_broker", None)
    assert enqueue.uses_orm_broker()
    yield


def redis_queue_length() -> int:
    """What PILOT's queue holds in Redis (0 when this run has no Redis): nothing
    here may go there."""
    if not settings.REDIS_URL:
        return 0
    return redis.Redis.from_url(settings.REDIS_URL).llen(enqueue.broker().list_key)


def trigger(owner, workflow, payload, key=None):
    return task_trigger(owner=owner, key=key or uuid.uuid4().hex, workflow=workflow,
                        payload=payload).task


def test_the_message_row_commits_and_rolls_back_with_the_trigger(owner, orm_broker):
    with transaction.atomic():
        task = trigger(owner, "demo.echo", {"i": 1})
        # Inside the trigger's transaction: its message is there, for it alone.
        assert queued_task_ids() == [str(task.pk)]
        assert in_thread(lambda: (Task.objects.count(), OrmQ.objects.count())) == (0, 0)
    assert in_thread(queued_task_ids) == [str(task.pk)]

    with pytest.raises(RuntimeError), transaction.atomic():
        trigger(owner, "demo.echo", {"i": 2}, key="rolled-back")
        raise RuntimeError("the caller's transaction fails after the trigger")
    assert not Task.objects.filter(idempotency_key="rolled-back").exists()
    assert queued_task_ids() == [str(task.pk)]  # no message for the rolled-back one
    assert redis_queue_length() == 0


def test_a_real_cluster_on_the_orm_broker_consumes_and_recovers_a_crash(owner, orm_broker):
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_DISPATCHER_POLL_SECONDS=POLL)
    fleet.env.pop("REDIS_URL", None)  # the processes choose the ORM broker themselves
    try:
        long = trigger(owner, "demo.slow", {"steps": 3, "seconds": 1})
        short = [trigger(owner, "demo.echo", {"i": i}) for i in range(5)]
        ids = [long.pk, *(t.pk for t in short)]
        # The messages are rows in PostgreSQL before any process runs.
        assert sorted(queued_task_ids()) == sorted(map(str, ids))
        assert redis_queue_length() == 0
        fleet.dispatcher()
        workers = fleet.workers()
        # Kill the group when the long run has a step checkpointed and the next running.
        wait_until(lambda: StepCheckpoint.objects.filter(
            task_id=long.pk, name="s1", state="running").exists(), 60, interval=0.02,
            what="the long run to be in its second step")
        workers.kill()
        fleet.workers()
        wait_until(lambda: not Task.objects.filter(pk__in=ids).exclude(
            state__in=FINISHED_STATES).exists(), 60, interval=0.2, what="every task to end")

        assert set(Task.objects.filter(pk__in=ids).values_list("state", flat=True)) == {
            S.SUCCEEDED}
        long.refresh_from_db()
        # Recovered as a lost worker, the attempt counted, the checkpointed step not redone.
        assert long.attempts == 2
        assert TaskTransition.objects.filter(task_id=long.pk, transition="recover").count() == 1
        assert dict(StepCheckpoint.objects.filter(task_id=long.pk).values_list(
            "name", "attempts")) == {"s0": 1, "s1": 2, "s2": 1}
        assert violations(tasks=Task.objects.filter(pk__in=ids)) == []
        # The clusters took the rows (django-q2 locks a row it hands a worker and deletes
        # it once done): only the killed group's deliveries can be left, still locked;
        # none is waiting, and Redis never saw a message. (Which rows the killed group
        # held is timing: a worker may have claimed the long run from the table while
        # draining, before its own message arrived.)
        left = list(OrmQ.objects.values_list("payload", "lock"))
        assert all(lock > timezone.now() for _, lock in left)
        assert redis_queue_length() == 0
    finally:
        fleet.stop_all()
