"""Completion webhooks with real processes on PostgreSQL (docs/webhooks.md):
a receiver that fails the first 3 attempts of every delivery and then answers
204 gets exactly one accepted delivery per terminal state — succeeded, failed,
succeeded again after a restart, cancelled — across a SIGKILL of the whole
worker group while a delivery is in flight; every request it got is signed so
that the documented recipe and the `standardwebhooks` package accept it.
(Its receiver fails on purpose, twelve times in all: the circuit breaker is
off here — it would pause the endpoint, as tests/engine/test_webhook_slots.py
proves it does — while the caps keep their production defaults.)"""

import threading

import pytest
from pilot_client import verify_webhook
from standardwebhooks import Webhook

from tests.support.procs import Fleet, wait_until
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.engine.operations import task_cancel, task_retry
from workflows.engine.triggers import task_trigger
from workflows.models import Task, WebhookDelivery
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TIMEOUT = 3.0  # one attempt; a killed attempt's claim lasts this + 5 s


@pytest.fixture
def fleet():
    fleet = Fleet(PILOT_WEBHOOK_ALLOW_PRIVATE="true", PILOT_WEBHOOK_TIMEOUT_SECONDS=TIMEOUT,
                  PILOT_WEBHOOK_FIRST_RETRY_SECONDS=0.3, PILOT_WEBHOOK_BREAKER_FAILURES=0,
                  PILOT_LOG_LEVEL="warning")
    yield fleet
    fleet.stop_all()


def test_one_accepted_delivery_per_terminal_state_across_a_worker_sigkill(owner, fleet,
                                                                          settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    _, secret = client_webhook_ensure(owner)
    in_flight = threading.Event()
    killed_one = []

    def script(message_id, n):
        if n == 2 and not killed_one:  # the first second attempt: kept in flight, and killed
            killed_one.append(message_id)
            in_flight.set()
            return 500, 20.0
        return (500, 0.0) if n <= 3 else (204, 0.0)

    with Receiver(script) as receiver:
        fleet.dispatcher()
        workers = fleet.workers()
        trigger = {"owner": owner, "callback_url": receiver.url}
        echo = task_trigger(key="echo", workflow="demo.echo", payload={"n": 1}, **trigger).task
        flaky = task_trigger(key="flaky", workflow="demo.flaky", payload={"fail_times": 5},
                             **trigger).task
        slow = task_trigger(key="slow", workflow="demo.slow",
                            payload={"steps": 40, "seconds": 0.25}, **trigger).task
        wait_until(lambda: Task.objects.get(pk=slow.pk).state == S.RUNNING, 30,
                   what="demo.slow to run")
        task_cancel(task_id=slow.pk, user=owner)

        assert in_flight.wait(60), "no delivery reached its second attempt"
        workers.kill()  # the whole qcluster group, mid-delivery
        [doomed] = killed_one
        row = WebhookDelivery.objects.get(task_id=doomed.split(":")[0])
        assert (row.state, row.attempts) == ("pending", 2)
        assert row.claimed_until is not None  # claimed by a sender that no longer exists
        fleet.workers()

        wait_until(lambda: Task.objects.get(pk=flaky.pk).state == S.FAILED, 60,
                   what="demo.flaky to fail for good")
        task_retry(task_id=flaky.pk, user=owner)  # attempt 6 succeeds: a second ending
        expected = {f"{echo.pk}:succeeded:0", f"{flaky.pk}:failed:0",
                    f"{flaky.pk}:succeeded:1", f"{slow.pk}:cancelled:0"}
        wait_until(lambda: {d.message_id for d in WebhookDelivery.objects.filter(
                       state="delivered")} == expected
                   and all(r.finished for r in receiver.received if r.status == 204),
                   120, interval=0.2, what="every ending to be delivered")

    assert set(receiver.ids()) == expected
    for message_id in expected:
        got = receiver.of(message_id)
        assert [r.status for r in got] == [500, 500, 500, 204], (message_id, got)
        for r in got:
            assert verify_webhook(secret, r.headers, r.body)["id"] == message_id.split(":")[0]
            assert Webhook(secret).verify(r.body, r.headers)["state"] == message_id.split(":")[1]
            task = Task.objects.get(pk=message_id.split(":")[0])
            assert r.headers["traceparent"].split("-")[1] == task.trace_id
        assert len({r.body for r in got}) == 1  # the same bytes on every attempt
    assert WebhookDelivery.objects.count() == 4
    for d in WebhookDelivery.objects.all():
        assert (d.state, d.last_status) == ("delivered", 204), d.message_id
        # An attempt is counted when claimed: the SIGKILL may also take a claim
        # whose request had not left yet (no request, no log entry).
        unsent = d.attempts - len(receiver.of(d.message_id))
        assert unsent in (0, 1), (d.message_id, d.attempts, d.attempt_log)
        assert d.attempt_log[-1]["n"] == d.attempts
    lost = WebhookDelivery.objects.get(task_id=doomed.split(":")[0],
                                       task_state=doomed.split(":")[1])
    assert [e["n"] for e in lost.attempt_log] == [1, 3, 4]  # attempt 2 died with its worker
    states = dict(Task.objects.values_list("idempotency_key", "state"))
    assert states == {"echo": S.SUCCEEDED, "flaky": S.SUCCEEDED, "slow": S.CANCELLED}
