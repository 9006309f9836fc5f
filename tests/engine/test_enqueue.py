"""workflows/engine/enqueue.py: the messages PILOT puts on django-q2's queue.

It writes django-q2 messages itself (batch enqueue, the transactional outbox)
instead of calling `django_q.tasks.async_task`. That leans on django-q2's
private message format: the first tests pin it, so a django-q2 release that
changes the format fails here instead of losing messages.

- the hand-built message has the fields `async_task` writes, with the same
  values and types, and lands on the same queue (PILOT's cluster);
- a real `qcluster` (PILOT's cluster) runs a task from a hand-built message and
  one from `async_task` alike;
- with Redis, a trigger whose after-commit push fails (Redis down) still
  succeeds — its task is committed — and the dispatcher enqueues it later. The
  outage is real: django-q2's own Redis broker, connected to a private
  redis-server of this test's, which is then stopped.
"""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta

import pytest
import redis
from django.utils import timezone
from django_q.conf import Conf
from django_q.signals import pre_enqueue
from django_q.signing import SignedPackage
from django_q.tasks import async_task

from tests.factories import make_task
from tests.support.helpers import _raw_packages, purge_queue, queued_task_ids
from tests.support.procs import Fleet, free_port, wait_until
from workflows.cluster import cluster_name
from workflows.engine import enqueue
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.rules.states import TaskState


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


@pytest.mark.skipif(not enqueue.uses_orm_broker(), reason="the ORM broker's visibility rule")
@pytest.mark.django_db
@pytest.mark.parametrize("sender_ahead", [60, -60])
def test_an_orm_broker_message_is_visible_at_once_whatever_the_machines_clocks(
        owner, monkeypatch, sender_ahead):
    """Review turn 3, F10: django-q2 dequeues rows whose `lock` is before the
    worker's clock; stamped with the sender's, a web node a minute ahead hid
    its messages from correct workers for a minute."""
    from django_q.models import OrmQ

    purge_queue()
    task = make_task(owner)
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=sender_ahead))
    enqueue.enqueue_rollback_unsafe([task.pk])  # sent from the skewed node
    monkeypatch.setattr(timezone, "now", lambda: real() - timedelta(seconds=sender_ahead))
    worker = enqueue.broker()
    assert worker.queue_size() == 1  # a worker on the other side of the skew sees it
    [(_, package)] = worker.dequeue()
    assert SignedPackage.loads(package)["args"] == (str(task.pk),)
    assert OrmQ.objects.using(Conf.ORM).get().lock > real()  # now held: in flight
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


# --- a Redis outage -------------------------------------------------------------------

@pytest.fixture
def private_redis():
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield server, f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_trigger_survives_a_redis_outage_and_the_dispatcher_enqueues_it_later(
        owner, settings, caplog, monkeypatch, private_redis):
    server, url = private_redis
    real = enqueue.broker()
    monkeypatch.setattr(Conf, "REDIS", url)
    enqueue._broker = None  # this process's broker, built again: on the private server
    try:
        up = task_trigger(owner=owner, key="while-up", workflow="demo.echo", payload={})
        assert queued_task_ids() == [str(up.task.pk)]  # it is the real queue there
        server.terminate()
        server.wait(10)
        with caplog.at_level("WARNING", logger="pilot.events"):
            outcome = task_trigger(owner=owner, key="while-down", workflow="demo.echo",
                                   payload={})
    finally:
        enqueue._broker = real
    assert outcome.outcome == "created"
    assert Task.objects.filter(pk=outcome.task.pk).exists()
    assert "enqueue_failed" in caplog.text
    assert queued_task_ids() == []  # the suite's own Redis got nothing either
    long_ago = timezone.now() - timedelta(seconds=settings.PILOT_REENQUEUE_SECONDS + 1)
    Task.objects.filter(pk=outcome.task.pk).update(enqueued_at=long_ago,
                                                   next_attempt_at=long_ago)
    assert dispatch_once().reenqueued == 1
    assert queued_task_ids() == [str(outcome.task.pk)]
