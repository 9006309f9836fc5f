"""With Redis, a trigger whose after-commit push fails (Redis down) still
succeeds — its task is committed — and the dispatcher enqueues it later.

The outage is real: django-q2's own Redis broker, connected to a private
redis-server of this test's, which is then stopped."""

import subprocess
import time
from datetime import timedelta

import pytest
import redis
from django.utils import timezone
from django_q.conf import Conf

from tests.support.helpers import queued_task_ids
from tests.support.procs import free_port
from workflows.engine import enqueue
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.triggers import task_trigger
from workflows.models import Task

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


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
