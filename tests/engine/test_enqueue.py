"""With Redis, a trigger whose after-commit push fails (Redis down) still
succeeds — its task is committed — and the dispatcher enqueues it later."""

from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from tests.helpers import queued_task_ids
from workflows.engine import enqueue
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.triggers import task_trigger
from workflows.models import Task

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


class DeadRedisBroker:
    """The real broker's queue name, on a port where no Redis listens."""

    def __init__(self, real):
        self.list_key = real.list_key
        self.connection = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)


def test_a_trigger_survives_a_redis_outage_and_the_dispatcher_enqueues_it_later(
        owner, settings, caplog):
    real = enqueue.broker()
    enqueue._broker = DeadRedisBroker(real)
    try:
        with caplog.at_level("WARNING", logger="pilot.events"):
            outcome = task_trigger(owner=owner, key="while-down", workflow="demo.echo",
                                   payload={})
    finally:
        enqueue._broker = real
    assert outcome.outcome == "created"
    assert Task.objects.filter(pk=outcome.task.pk).exists()
    assert "enqueue_failed" in caplog.text
    assert queued_task_ids() == []
    long_ago = timezone.now() - timedelta(seconds=settings.PILOT_REENQUEUE_SECONDS + 1)
    Task.objects.filter(pk=outcome.task.pk).update(enqueued_at=long_ago,
                                                   next_attempt_at=long_ago)
    assert dispatch_once().reenqueued == 1
    assert queued_task_ids() == [str(outcome.task.pk)]
