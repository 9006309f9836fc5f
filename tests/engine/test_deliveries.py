"""Sending the outbox (workflows/engine/deliveries.py) to a real receiver over
real sockets: signed once per ending, retried with backoff until a 2xx,
claimed so that two senders never send one delivery at once, fenced so that a
sender whose claim expired records nothing, re-sent by the dispatcher when a
message or a sender is lost, given up after its window, re-sendable."""

import random
import threading
from datetime import timedelta

import pytest
from django.db.models import F
from django.db.models.functions import Now
from pilot_client import verify_webhook
from standardwebhooks import Webhook

from tests.support.helpers import drain, in_thread, pop_queued, purge_queue, queued_webhooks
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.backoff import backoff_ceiling
from workflows.engine.deliveries import (
    deliveries_enqueue_due,
    delivery_resend,
    delivery_send,
    retry_policy,
)
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_retry
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.errors import InvalidTransition, PermissionDenied, TaskNotFound
from workflows.models import ClientWebhook, Task, WebhookDelivery
from workflows.representation import task_data

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 0.05
    settings.PILOT_WEBHOOK_TIMEOUT_SECONDS = 5.0


@pytest.fixture
def secret(owner):
    return client_webhook_ensure(owner)[1]


def trigger(owner, receiver, key="k", workflow="demo.echo", payload=None):
    return task_trigger(owner=owner, key=key, workflow=workflow, payload=payload or {"n": 1},
                        callback_url=receiver.url).task


def delivery_of(task, state="succeeded", n=0) -> WebhookDelivery:
    return WebhookDelivery.objects.get(task_id=task.pk, task_state=state, restarts=n)


def delivered(task, state="succeeded", n=0):
    return lambda: WebhookDelivery.objects.filter(task_id=task.pk, task_state=state,
                                                  restarts=n, state="delivered").exists()


def test_an_ending_is_delivered_once_signed_with_the_task_representation(owner, secret):
    with Receiver() as receiver:
        task = trigger(owner, receiver)
        drain(delivered(task))
        assert delivery_send(message_id=f"{task.pk}:succeeded:0").outcome == "skipped"
    task = Task.objects.get(pk=task.pk)
    [got] = receiver.received
    headers = got.headers
    assert headers["webhook-id"] == f"{task.pk}:succeeded:0"
    assert verify_webhook(secret, headers, got.body)["state"] == "succeeded"
    body = Webhook(secret).verify(got.body, headers)
    expected = task_data(task, deliveries=[])
    del expected["deliveries"]
    assert body == expected and body["result"] == {"echo": {"n": 1}}
    assert headers["traceparent"] == task.traceparent != ""
    sent_at = int(headers["webhook-timestamp"])
    assert abs(sent_at - store().db_now().timestamp()) < 30
    d = delivery_of(task)
    assert (d.state, d.attempts, d.last_status, d.last_error) == ("delivered", 1, 204, "")
    assert d.delivered_at is not None and d.claimed_until is None
    assert [(e["n"], e["status"]) for e in d.attempt_log] == [(1, 204)]
    assert d.body.encode() == got.body


def test_a_failing_receiver_is_retried_until_it_answers_2xx_with_the_same_id_and_body(
        owner, secret):
    with Receiver(lambda mid, n: (500, 0) if n <= 3 else (200, 0)) as receiver:
        task = trigger(owner, receiver)
        drain(delivered(task))
    attempts = receiver.of(f"{task.pk}:succeeded:0")
    assert [r.status for r in attempts] == [500, 500, 500, 200]
    assert len({r.body for r in attempts}) == 1
    for r in attempts:
        assert verify_webhook(secret, r.headers, r.body)["id"] == str(task.pk)
    d = delivery_of(task)
    assert (d.state, d.attempts, d.last_status) == ("delivered", 4, 200)
    assert [e["status"] for e in d.attempt_log] == [500, 500, 500, 200]
    assert d.attempt_log[0]["error"] == "HTTP 500: ok"


def test_retries_wait_a_jittered_doubling_backoff_capped_at_the_maximum(owner, secret,
                                                                         settings):
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 2.0
    settings.PILOT_WEBHOOK_MAX_DELAY_SECONDS = 5.0
    with Receiver(lambda mid, n: (502, 0)) as receiver:
        task = trigger(owner, receiver)
        drain(lambda: receiver.received, dispatch=False)
        message_id = f"{task.pk}:succeeded:0"
        delays = []
        for attempt in range(1, 6):
            d = delivery_of(task)
            assert d.attempts == attempt and d.state == "pending"
            delays.append((d.next_attempt_at - d.last_attempt_at).total_seconds())
            WebhookDelivery.objects.filter(pk=d.pk).update(next_attempt_at=Now())
            if attempt < 5:
                assert delivery_send(message_id=message_id).outcome == "retrying"
    for attempt, delay in enumerate(delays, 1):
        ceiling = backoff_ceiling(retry_policy(), attempt)
        assert 0 <= delay <= ceiling + 0.05, (attempt, delay, ceiling)
    assert [backoff_ceiling(retry_policy(), n) for n in range(1, 6)] == [2, 4, 5, 5, 5]


def test_a_delivery_whose_next_attempt_would_be_too_late_ends_failed(owner, secret, settings,
                                                                       monkeypatch):
    settings.PILOT_WEBHOOK_GIVE_UP_SECONDS = 1.0
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 5.0
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the jitter at its ceiling
    with Receiver(lambda mid, n: (500, 0)) as receiver:
        task = trigger(owner, receiver)
        drain(lambda: delivery_of(task).state == "failed")
        assert dispatch_once().deliveries_enqueued == 0
        assert delivery_send(message_id=f"{task.pk}:succeeded:0").outcome == "skipped"
    assert len(receiver.received) == 1
    d = delivery_of(task)
    assert (d.state, d.attempts, d.last_status) == ("failed", 1, 500)


def test_a_delivery_still_waiting_when_its_window_closes_ends_failed_unsent(owner, secret):
    with Receiver(lambda mid, n: (500, 0)) as receiver:
        task = trigger(owner, receiver)
        drain(lambda: delivery_of(task).attempts == 1 and delivery_of(task).claimed_until
              is None, dispatch=False)
        WebhookDelivery.objects.filter(task_id=task.pk).update(  # 24 hours later
            give_up_at=Now() - timedelta(seconds=1), next_attempt_at=Now())
        assert delivery_send(message_id=f"{task.pk}:succeeded:0").outcome == "skipped"
    assert len(receiver.received) == 1
    d = delivery_of(task)
    assert (d.state, d.attempts, d.last_error) == ("failed", 1, "HTTP 500: ok")


def test_two_senders_at_once_send_one_attempt(owner, secret):
    with Receiver(lambda mid, n: (204, 0.5)) as receiver:
        task = trigger(owner, receiver)
        drain(lambda: Task.objects.get(pk=task.pk).is_finished)
        pop_queued()
        message_id = f"{task.pk}:succeeded:0"
        barrier = threading.Barrier(2)
        outcomes = []

        def send():
            barrier.wait()
            outcomes.append(delivery_send(message_id=message_id).outcome)

        threads = [threading.Thread(target=lambda: in_thread(send)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sorted(outcomes) == ["delivered", "skipped"]
    assert len(receiver.received) == 1
    assert delivery_of(task).attempts == 1


def test_a_sender_whose_claim_expired_records_nothing(owner, secret):
    """A sender that stalls past its claim (a GC pause, a frozen VM): the
    delivery goes to another sender; the stalled one's late outcome is refused
    by the claim token."""
    slow_started = threading.Event()

    def script(message_id, n):
        if n == 1:
            slow_started.set()
            return 500, 1.5  # the stalled attempt: it would even have failed
        return 204, 0

    with Receiver(script) as receiver:
        task = trigger(owner, receiver)
        drain(lambda: Task.objects.get(pk=task.pk).is_finished)
        pop_queued()
        message_id = f"{task.pk}:succeeded:0"
        stalled = {}
        thread = threading.Thread(target=lambda: stalled.update(
            report=in_thread(lambda: delivery_send(message_id=message_id))))
        thread.start()
        assert slow_started.wait(10)
        WebhookDelivery.objects.filter(task_id=task.pk).update(
            claimed_until=Now() - timedelta(seconds=1))
        assert delivery_send(message_id=message_id).outcome == "delivered"
        thread.join(30)
    assert stalled["report"].outcome == "claim_lost"
    d = delivery_of(task)
    assert (d.state, d.attempts, d.last_status, d.claim_token) == ("delivered", 2, 204, 2)
    assert [e["n"] for e in d.attempt_log] == [2]


def test_a_lost_sender_is_replaced_once_its_claim_expires(owner, secret):
    from workflows.engine.deliveries import _claim

    with Receiver() as receiver:
        task = trigger(owner, receiver)
        drain(lambda: Task.objects.get(pk=task.pk).is_finished)
        pop_queued()
        assert _claim(f"{task.pk}:succeeded:0", "doomed") is not None  # and never records
        assert dispatch_once().deliveries_enqueued == 0  # its claim is live
        WebhookDelivery.objects.filter(task_id=task.pk).update(
            claimed_until=F("claimed_until") - timedelta(seconds=60))
        assert dispatch_once().deliveries_enqueued == 1
        drain(delivered(task))
    d = delivery_of(task)
    assert (d.attempts, [e["n"] for e in d.attempt_log]) == (2, [2])
    assert len(receiver.received) == 1


def test_a_lost_message_is_sent_again_by_the_dispatcher(owner, secret, settings):
    with Receiver() as receiver:
        task = trigger(owner, receiver)
        drain(lambda: Task.objects.get(pk=task.pk).is_finished, dispatch=False)
        assert queued_webhooks() == [f"{task.pk}:succeeded:0"]
        purge_queue()  # the message is lost
        assert dispatch_once().deliveries_enqueued == 0  # it may only be slow
        WebhookDelivery.objects.filter(task_id=task.pk).update(
            enqueued_at=F("enqueued_at") - timedelta(seconds=settings.PILOT_REENQUEUE_SECONDS + 1))
        assert dispatch_once().deliveries_enqueued == 1
        assert dispatch_once().deliveries_enqueued == 0  # once
        drain(delivered(task))
    assert len(receiver.received) == 1


def test_an_idle_scan_is_one_small_query(django_assert_num_queries):
    now = store().db_now()
    with django_assert_num_queries(1):
        assert deliveries_enqueue_due(now) == (0, False)


def test_a_restart_leaves_the_first_ending_announcing_itself(owner, secret):
    """A failed task restarted before its webhook went out: the webhook still
    announces the failure (its body is fixed before the restart), the second
    ending gets its own."""
    with Receiver() as receiver:
        task = trigger(owner, receiver, workflow="demo.flaky", payload={"fail_times": 5})
        drain(lambda: Task.objects.get(pk=task.pk).state == "failed", dispatch=True,
              timeout=30)
        purge_queue()  # the failure's webhook not sent yet
        task_retry(task_id=task.pk, user=owner)
        drain(delivered(task, "succeeded", 1), timeout=30)
        drain(delivered(task, "failed", 0))  # its message was lost: the dispatcher sends it
    bodies = {r.message_id: Webhook(secret).verify(r.body, r.headers)
              for r in receiver.received}
    failed, succeeded = bodies[f"{task.pk}:failed:0"], bodies[f"{task.pk}:succeeded:1"]
    assert (failed["state"], failed["result"], failed["attempts"]) == ("failed", None, 5)
    assert "attempts exhausted" in failed["error"]
    assert (succeeded["state"], succeeded["result"]) == ("succeeded", {"attempts": 6})


def test_an_operator_resends_a_delivered_webhook_with_the_same_id_and_body(
        owner, secret, django_user_model):
    operator = django_user_model.objects.create_superuser("op", "op@x", "pw-op-123456")
    with Receiver() as receiver:
        task = trigger(owner, receiver)
        drain(delivered(task))
        d = delivery_of(task)
        again = delivery_resend(delivery_id=d.pk, user=operator, reason="receiver restored")
        assert (again.state, again.attempts) == ("pending", 1)
        assert again.give_up_at > d.give_up_at
        drain(lambda: len(receiver.received) == 2)
    first, second = receiver.received
    assert first.message_id == second.message_id == f"{task.pk}:succeeded:0"
    assert first.body == second.body
    d = delivery_of(task)
    assert (d.state, d.attempts) == ("delivered", 2)


def test_a_resend_needs_the_permission_and_no_attempt_in_flight(owner, secret, other_owner,
                                                                 django_user_model):
    from django.contrib.auth.models import Permission

    with Receiver() as receiver:
        task = trigger(owner, receiver)
        drain(delivered(task))
    d = delivery_of(task)
    with pytest.raises(TaskNotFound):
        delivery_resend(delivery_id=d.pk, user=other_owner)
    with pytest.raises(TaskNotFound):
        delivery_resend(delivery_id=d.pk, user=owner)  # a client cannot (console only)
    viewer = django_user_model.objects.create_user("viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_all_tasks"))
    viewer = django_user_model.objects.get(pk=viewer.pk)
    with pytest.raises(PermissionDenied):
        delivery_resend(delivery_id=d.pk, user=viewer)
    viewer.user_permissions.add(Permission.objects.get(codename="resend_webhook"))
    viewer = django_user_model.objects.get(pk=viewer.pk)
    WebhookDelivery.objects.filter(pk=d.pk).update(claimed_until=Now() + timedelta(seconds=30))
    with pytest.raises(InvalidTransition, match="in flight"):
        delivery_resend(delivery_id=d.pk, user=viewer)
    assert delivery_of(task).state == "delivered"
    with pytest.raises(TaskNotFound):
        delivery_resend(delivery_id=d.pk + 1000, user=viewer)


def test_a_target_that_turned_private_is_refused_at_send_time(owner, secret, settings):
    with Receiver() as receiver:
        task = trigger(owner, receiver)  # accepted: private targets allowed then
        settings.PILOT_WEBHOOK_ALLOW_PRIVATE = False  # as if DNS now answered 127.0.0.1
        drain(lambda: delivery_of(task).attempts >= 1 and delivery_of(task).claimed_until
              is None, dispatch=False)
    assert receiver.received == []
    d = delivery_of(task)
    assert (d.state, d.last_status) == ("pending", None)
    assert d.last_error.startswith("refused: callback URL host 127.0.0.1 resolves to 127.0.0.1")


def test_a_client_without_its_secret_is_not_sent_unsigned(owner, secret):
    with Receiver() as receiver:
        task = trigger(owner, receiver)
        ClientWebhook.objects.filter(owner=owner).delete()
        drain(lambda: delivery_of(task).attempts >= 1 and delivery_of(task).claimed_until
              is None, dispatch=False)
    assert receiver.received == []
    assert "no signing secret" in delivery_of(task).last_error


def test_cleanup_deletes_a_tasks_deliveries_with_it(owner, secret):
    from workflows.engine.cleanup import tasks_delete

    with Receiver() as receiver:
        task = trigger(owner, receiver)
        drain(delivered(task))
    assert tasks_delete([task.pk]) == 1
    assert not WebhookDelivery.objects.exists()


def test_a_message_for_something_that_is_not_a_delivery_is_skipped():
    for message_id in ("nonsense", "a:b:c", "00000000-0000-0000-0000-000000000000:succeeded:0",
                       "x:running:0", "x:succeeded:-1"):
        assert delivery_send(message_id=message_id).outcome == "skipped"


def _run_statements(owner, callback_url) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workflows.worker import run_task

    task = task_trigger(owner=owner, key=f"count-{callback_url}", workflow="test.noop3",
                        payload={}, callback_url=callback_url or None).task
    pop_queued()
    with CaptureQueriesContext(connection) as captured:
        assert run_task(str(task.pk)) == "succeeded"
    # PREPARE: once per connection and statement (docs/design.md), not per run.
    return sum(not q["sql"].startswith("PREPARE ") for q in captured.captured_queries)


def test_the_worker_hot_path_costs_no_statement_more_without_an_endpoint(owner, secret):
    """Claim, three step boundaries and the ending of test.noop3: the statement
    counts measured before webhooks existed (PostgreSQL 5, SQLite 22) are upper
    bounds for a task without an endpoint; with one, the outbox row rides in
    the ending's statement on PostgreSQL and only the queue message (ORM broker)
    costs statements of its own."""
    from django.db import connection

    from workflows.engine.enqueue import uses_orm_broker

    plain = _run_statements(owner, "")
    with Receiver() as receiver:
        with_endpoint = _run_statements(owner, receiver.url)
    postgres = connection.vendor == "postgresql"
    assert plain <= (5 if postgres else 22)
    queue = 3 if uses_orm_broker() else 0  # BEGIN, INSERT django_q_ormq, COMMIT
    assert with_endpoint - plain == (queue if postgres else queue + 1)
