"""Sending the outbox (workflows/engine/deliveries.py) to a real receiver over
real sockets: signed once per ending, retried with backoff until a 2xx,
claimed so that two senders never send one delivery at once, fenced so that a
sender whose claim expired records nothing, re-sent by the dispatcher when a
message or a sender is lost, given up after its window, re-sendable."""

import random
import threading
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now
from pilot_client import verify_webhook
from standardwebhooks import Webhook

from tests.support.helpers import (
    background,
    drain,
    in_thread,
    pop_queued,
    pop_queued_messages,
    purge_queue,
    queued_webhooks,
    row_lock_waiters,
    wait_for,
)
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.engine.cleanup import tasks_cleanup
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
from workflows.models import ClientWebhook, Task, WebhookDelivery
from workflows.representation import task_data
from workflows.rules.backoff import backoff_ceiling
from workflows.rules.errors import InvalidTransition, PermissionDenied, TaskNotFound

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
    expected = task_data(task, deliveries=[], signals=[])
    del expected["deliveries"], expected["signals"]
    for step in expected["steps"]:
        del step["failures"]  # a webhook carries no tracebacks
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
    with Receiver() as receiver:
        task = trigger(owner, receiver)
        drain(delivered(task))
    with transaction.atomic():
        assert store().delete_tasks_in_tx([task.pk]) == 1
    assert not WebhookDelivery.objects.exists()


def test_a_message_for_something_that_is_not_a_delivery_is_skipped():
    for message_id in ("nonsense", "a:b:c", "00000000-0000-0000-0000-000000000000:succeeded:0",
                       "x:running:0", "x:succeeded:-1"):
        assert delivery_send(message_id=message_id).outcome == "skipped"


def _run_statements(owner, callback_url) -> int:
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

    from workflows.engine.enqueue import uses_orm_broker

    plain = _run_statements(owner, "")
    with Receiver() as receiver:
        with_endpoint = _run_statements(owner, receiver.url)
    postgres = connection.vendor == "postgresql"
    assert plain <= (5 if postgres else 22)
    queue = 3 if uses_orm_broker() else 0  # BEGIN, INSERT django_q_ormq, COMMIT
    assert with_endpoint - plain == (queue if postgres else queue + 1)


# --- a delivery outlives its task -----------------------------------------------------------

def _run_tasks_only() -> list[str]:
    """Run the queued task messages; return the webhook messages, unsent."""
    from workflows.worker import run_task

    webhooks: list[str] = []
    while messages := pop_queued_messages():
        for func, arg in messages:
            if func.endswith("run_task"):
                run_task(arg)
            else:
                webhooks.append(arg)
    return webhooks


def test_a_delivery_outlives_its_task_deleted_by_a_re_trigger_of_its_expired_key(
        owner, secret, temp_workflow):
    """TTL 0: the task ends, its webhook is on its way, the next trigger with
    the key makes a new task at once — and the first run's ending is still
    announced, with the body it ended with (steps included, though they are
    gone with the task)."""
    workflow = temp_workflow("t.ttl0", idempotency_ttl=0)
    workflow.add_step("only", lambda ctx: "done")
    with Receiver() as receiver:
        first = trigger(owner, receiver, workflow="t.ttl0")
        [message] = _run_tasks_only()
        assert message == f"{first.pk}:succeeded:0" and delivery_of(first).body is None
        again = task_trigger(owner=owner, key="k", workflow="t.ttl0", payload={"n": 1},
                             callback_url=receiver.url)
        assert again.outcome == "created" and again.task.pk != first.pk  # the key is free
        assert not Task.objects.filter(pk=first.pk).exists()
        d = delivery_of(first)
        assert (d.state, d.owner_id) == ("pending", owner.pk)
        assert d.detached_at is not None and d.body is not None  # fixed before the task went
        assert delivery_send(message_id=message).outcome == "delivered"
    [got] = receiver.received
    assert got.message_id == message
    body = Webhook(secret).verify(got.body, got.headers)
    assert (body["id"], body["state"]) == (str(first.pk), "succeeded")
    assert [(s["name"], s["output"]) for s in body["steps"]] == [("only", "done")]
    assert got.headers["traceparent"].split("-")[1] == first.trace_id
    assert list(WebhookDelivery.objects.filter(task_id=again.task.pk)) == []  # not yet ended


def test_cleanup_leaves_a_delivery_still_being_retried_and_removes_it_once_it_ended(
        owner, secret, temp_workflow, settings):
    """The key's 60 s are long over, the webhook has 23 hours of retries left:
    cleanup deletes the task, not the delivery; the next attempt delivers it;
    the next cleanup removes it."""
    # A backoff drawn from [0, 1 h): the sender that recorded the failure must not
    # find it due already and hand it its message (full jitter may draw ~0 s).
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 3600
    workflow = temp_workflow("t.ttl60", idempotency_ttl=60)
    workflow.add_step("only", lambda ctx: "done")
    with Receiver(lambda mid, n: (503, 0) if n == 1 else (204, 0)) as receiver:
        task = trigger(owner, receiver, workflow="t.ttl60")
        [message] = _run_tasks_only()
        assert delivery_send(message_id=message).outcome == "retrying"
        Task.objects.filter(pk=task.pk).update(expires_at=F("expires_at") - timedelta(hours=1))
        report = tasks_cleanup()
        assert (report.tasks, report.deliveries) == (1, 0)
        assert not Task.objects.filter(pk=task.pk).exists()
        d = delivery_of(task)
        assert (d.state, d.attempts) == ("pending", 1) and d.detached_at is not None
        assert d.give_up_at - d.created_at == timedelta(hours=24)  # its window is its own
        WebhookDelivery.objects.filter(pk=d.pk).update(next_attempt_at=Now())  # backoff over
        assert dispatch_once().deliveries_enqueued == 1
        drain(delivered(task))
    assert [r.status for r in receiver.of(message)] == [503, 204]
    assert tasks_cleanup().deliveries == 1
    assert not WebhookDelivery.objects.exists()


def test_cleanup_removes_ended_deliveries_of_deleted_tasks_in_batches_never_a_pending_one(
        owner, secret, temp_workflow):
    from workflows.engine.cleanup import deliveries_prune

    workflow = temp_workflow("t.ttl0b", idempotency_ttl=0)
    workflow.add_step("only", lambda ctx: "done")
    with Receiver() as receiver:
        tasks = [trigger(owner, receiver, key=f"k{i}", workflow="t.ttl0b") for i in range(6)]
        _run_tasks_only()
    assert tasks_cleanup().tasks == 6
    assert WebhookDelivery.objects.filter(detached_at__isnull=False).count() == 6
    WebhookDelivery.objects.filter(task_id__in=[t.pk for t in tasks[:5]]).update(
        state="delivered")
    assert deliveries_prune(batch_size=2, dry_run=True) == 5
    assert deliveries_prune(batch_size=2) == 5
    assert list(WebhookDelivery.objects.values_list("task_id", "state")) == [
        (tasks[5].pk, "pending")]


@pytest.mark.postgres
def test_a_sender_waiting_on_the_task_a_cleanup_deletes_sends_the_body_fixed_before(
        owner, secret):
    """The lock order, task then delivery, across the task's deletion: the
    sender waits at the task's row lock while cleanup's batch deletes the
    task; it then finds no task, locks the delivery and sends the body cleanup
    fixed from the task and its steps."""
    import threading


    with Receiver() as receiver:
        task = trigger(owner, receiver)
        [message] = _run_tasks_only()
        held, release = threading.Event(), threading.Event()

        def cleanup_batch():
            with transaction.atomic():
                list(Task.objects.select_for_update().filter(pk=task.pk))
                assert store().delete_tasks_in_tx([task.pk]) == 1
                held.set()
                assert release.wait(10)

        batch = background(cleanup_batch)
        assert held.wait(10)
        sender = background(lambda: delivery_send(message_id=message))
        wait_for(lambda: row_lock_waiters() == 1, what="the sender to wait at the task's lock")
        assert not sender.done.is_set()
        release.set()
        assert batch.result() is None
        assert sender.result().outcome == "delivered"
    [got] = receiver.received
    body = Webhook(secret).verify(got.body, got.headers)
    assert body["id"] == str(task.pk) and body["result"] == {"echo": {"n": 1}}
    assert [s["name"] for s in body["steps"]] == ["echo"]


# --- the operator's re-send is a new version -------------------------------------------------

def test_a_resend_moves_the_claim_on_so_a_stale_senders_late_outcome_is_refused(
        owner, secret, django_user_model, monkeypatch):
    """Sender A claimed, then stalled past its claim; the operator re-sends; A
    comes back with its receiver's 503 computed against the old window: it is
    refused (claim_lost), and the re-send's message sends."""
    from workflows.engine import deliveries
    from workflows.webhooks.http import Answer

    monkeypatch.setattr(deliveries, "backoff_delay", lambda policy, n: 2.0)  # its ceiling
    operator = django_user_model.objects.create_superuser("op", "op@x", "pw-op-123456")
    with Receiver() as receiver:
        task = trigger(owner, receiver)
        [message] = _run_tasks_only()
        d = delivery_of(task)
        WebhookDelivery.objects.filter(pk=d.pk).update(give_up_at=Now() + timedelta(seconds=1))
        stale = deliveries._claim(message, "slow-worker")
        assert stale is not None and stale.token == 1
        WebhookDelivery.objects.filter(pk=d.pk).update(claimed_until=Now() - timedelta(seconds=1))
        again = delivery_resend(delivery_id=d.pk, user=operator, reason="retry it")
        assert (again.state, again.claim_token) == ("pending", 2)
        assert again.give_up_at > stale.delivery.give_up_at
        assert deliveries._record(stale, Answer(503, "HTTP 503", 1.0)) == "claim_lost"
        d.refresh_from_db()
        assert (d.state, d.give_up_at, d.last_status) == ("pending", again.give_up_at, None)
        assert queued_webhooks() == [message]  # the re-send's message
        assert delivery_send(message_id=message).outcome == "delivered"
    assert len(receiver.received) == 1
    d.refresh_from_db()
    assert (d.state, d.attempts, d.claim_token) == ("delivered", 2, 3)
    assert [e["n"] for e in d.attempt_log] == [2]


# --- the held-open race of two senders (mutant webhook-claim-without-row-locks) ------------

@pytest.mark.postgres
def test_a_second_sender_waits_at_the_row_locks_then_finds_the_attempt_claimed(
        owner, secret, settings):
    """Claim 1 holds its transaction open after claiming; claim 2 must wait
    for it at the task's and delivery's row locks and then see the live claim.
    Without the locks it would read the delivery unclaimed and claim it too.
    (The caps are off: their locks would serialise the two claims anyway.)"""
    import threading

    from workflows.engine.deliveries import _claim

    settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 0
    settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT = 0
    settings.PILOT_WEBHOOK_BREAKER_FAILURES = 0
    with Receiver() as receiver:
        task = trigger(owner, receiver)
        [message] = _run_tasks_only()
    held, release = threading.Event(), threading.Event()

    def first():
        with transaction.atomic():
            claim = _claim(message, "w1")
            held.set()
            assert release.wait(10)
            return claim

    one = background(first)
    assert held.wait(10)
    two = background(lambda: _claim(message, "w2"))
    wait_for(lambda: row_lock_waiters() == 1, what="the second claim to wait at a row lock")
    assert not two.done.is_set()
    release.set()
    assert one.result() is not None
    assert two.result() is None
    d = delivery_of(task)
    assert (d.attempts, d.claim_token, d.claimed_by) == (1, 1, "w1")


# --- one deadline per attempt, inside its claim --------------------------------------------

def test_an_attempt_ends_inside_its_claim_even_when_dns_takes_longer_than_the_claim(
        owner, secret, settings):
    """A lookup of 8 s under a 1 s timeout: before, it ran before the deadline
    started and outlived the claim (1 s + 5 s margin), so the dispatcher could
    give a live attempt to a second sender. Now the attempt ends at its
    deadline, and its record lands well inside its claim."""
    from tests.support.slow_dns import slow_dns

    settings.PILOT_WEBHOOK_TIMEOUT_SECONDS = 1.0
    with Receiver() as receiver, slow_dns("slow.test", 8.0) as lookups:
        port = receiver.url.split(":")[2].split("/")[0]
        task = task_trigger(owner=owner, key="dns", workflow="demo.echo", payload={},
                            callback_url=f"http://hooks.slow.test:{port}/hooks").task
        [message] = _run_tasks_only()
        assert delivery_send(message_id=message).outcome == "retrying"
    assert lookups[-1] == ("hooks.slow.test", 8.0)
    d = delivery_of(task)
    [entry] = d.attempt_log
    assert "the DNS lookup of hooks.slow.test did not finish" in entry["error"]
    assert entry["ms"] < 1500
    recorded = datetime.fromisoformat(entry["at"])
    assert recorded - d.last_attempt_at < timedelta(seconds=1.5)  # claim: 1 s + 5 s margin
    assert receiver.received == []


# --- migration 0018 -----------------------------------------------------------------------------

def test_the_migration_gives_existing_deliveries_their_owner_traceparent_and_endpoint(owner):
    """Migration 0017 on rows written before it: each delivery gets its task's
    owner and traceparent, a pending one its endpoint; and the task no longer
    holds them (deleting it leaves them)."""
    from django.db.migrations.executor import MigrationExecutor

    before_0017 = ("workflows", "0016_task_idempotency_ttl")
    executor = MigrationExecutor(connection)
    executor.migrate([before_0017])
    try:
        old = executor.loader.project_state(before_0017).apps
        task = old.get_model("workflows", "Task").objects.create(
            owner_id=owner.pk, idempotency_key="old", workflow="demo.echo", payload={},
            fingerprint="f", max_attempts=1, state="failed", callback_url="https://a.example/h",
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        for ended, state, url in (("failed", "pending", "https://A.example:8443/h"),
                                  ("succeeded", "delivered", "http://b.example/h")):
            old.get_model("workflows", "WebhookDelivery").objects.create(
                task_id=task.pk, task_state=ended, restarts=0, url=url, state=state,
                next_attempt_at=task.created_at, give_up_at=task.created_at)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    rows = list(WebhookDelivery.objects.order_by("state").values_list(
        "state", "owner_id", "traceparent", "endpoint", "detached_at"))
    assert rows == [
        ("delivered", owner.pk, task.traceparent, "", None),
        ("pending", owner.pk, task.traceparent, "a.example:8443", None)]
    Task.objects.filter(pk=task.pk)._raw_delete(Task.objects.db)
    assert WebhookDelivery.objects.count() == 2
