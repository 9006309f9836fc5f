"""workflows/engine/enqueue.py writes django-q2 messages itself (batch enqueue,
the transactional outbox) instead of calling `django_q.tasks.async_task`. That
leans on django-q2's private message format: these tests pin it, so a django-q2
release that changes the format fails here instead of losing messages.

- the hand-built message has the fields `async_task` writes, with the same
  values and types, and lands on the same queue (PILOT's cluster);
- a real `qcluster` (PILOT's cluster) runs a task from a hand-built message and
  one from `async_task` alike.
"""

from __future__ import annotations

import pytest
from django_q.signals import pre_enqueue
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from tests.factories import make_task
from tests.support.helpers import _raw_packages, purge_queue, queued_task_ids
from tests.support.procs import Fleet, wait_until
from workflows.cluster import cluster_name
from workflows.engine import enqueue
from workflows.models import Task
from workflows.states import TaskState


def _async_task_message(task_id: str) -> dict:
    """What django-q2's own API puts on PILOT's queue for this task."""
    seen = []

    def capture(sender, task, **kwargs):
        seen.append(dict(task))

    pre_enqueue.connect(capture)
    try:
        async_task(enqueue.RUN_TASK, task_id, task_name=f"pilot-{task_id}", ack_failure=True,
                   cluster=cluster_name())
    finally:
        pre_enqueue.disconnect(capture)
    [message] = seen
    return message


@pytest.mark.django_db
def test_a_hand_built_message_is_what_async_task_writes(owner):
    purge_queue()
    task = make_task(owner)
    _async_task_message(str(task.pk))
    [their_raw] = _raw_packages()
    purge_queue()
    enqueue.enqueue_rollback_unsafe([task.pk])
    [our_raw] = _raw_packages()
    ours = SignedPackage.loads(our_raw)
    decoded_theirs = SignedPackage.loads(their_raw)
    assert set(ours) == set(decoded_theirs) - {"cluster"}
    for field in ("func", "args", "kwargs", "name", "ack_failure"):
        assert ours[field] == decoded_theirs[field], field
        assert type(ours[field]) is type(decoded_theirs[field]), field
    assert type(ours["id"]) is type(decoded_theirs["id"]) and len(ours["id"]) == 32
    assert type(ours["started"]) is type(decoded_theirs["started"])
    assert queued_task_ids() == [str(task.pk)]
    purge_queue()


@pytest.mark.django_db
def test_both_land_on_pilots_queue_of_the_same_broker():
    from django_q.brokers import get_broker

    assert enqueue.broker().list_key == get_broker(cluster_name()).list_key


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_real_qcluster_runs_a_hand_built_message_and_an_async_task_one(owner):
    purge_queue()
    ours, theirs = make_task(owner, payload={"n": 1}), make_task(owner, payload={"n": 2})
    enqueue.enqueue_rollback_unsafe([ours.pk])
    async_task(enqueue.RUN_TASK, str(theirs.pk), task_name=f"pilot-{theirs.pk}",
               ack_failure=True, cluster=cluster_name())
    fleet = Fleet()
    try:
        fleet.start("run_workers")
        wait_until(lambda: Task.objects.filter(pk__in=[ours.pk, theirs.pk],
                                               state=TaskState.SUCCEEDED).count() == 2,
                   60, interval=0.2, what="both tasks to succeed")
    finally:
        fleet.stop_all()
    assert queued_task_ids() == []
