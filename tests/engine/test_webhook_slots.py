"""Slow and failing receivers (workflows/engine/webhook_slots.py, and its use
in deliveries.py): the caps on attempts in flight per client and per endpoint,
decided exactly by the claim (the race held open on PostgreSQL); a delivery
over a cap waits without looping through the broker and gets the freed slot;
the dispatcher serves every client in turn; the circuit breaker pauses a
failing endpoint, probes it, closes on a success, and lets an operator's
re-send through. Real receivers on 127.0.0.1, real broker, both databases."""

import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now
from django.test import override_settings

from tests.support.helpers import (
    background,
    drain,
    lock_waiters,
    pop_queued_messages,
    queued_messages,
    queued_webhooks,
    row_lock_waiters,
    wait_for,
)
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.engine import deliveries
from workflows.engine.deliveries import delivery_resend, delivery_send
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.enqueue import enqueue_rollback_unsafe
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import WebhookDelivery, WebhookEndpoint
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fast(settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 0.05
    settings.PILOT_WEBHOOK_TIMEOUT_SECONDS = 5.0
    settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 1
    settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT = 1
    settings.PILOT_WEBHOOK_BREAKER_FAILURES = 3
    settings.PILOT_WEBHOOK_BREAKER_SECONDS = 30.0


_keys = iter(range(10**6))


def ended(owner, url, n=1) -> list[str]:
    """`n` tasks of `owner` run to their end; their webhooks' messages taken
    off the queue, unsent. Returns the webhook ids, oldest first."""
    client_webhook_ensure(owner)
    for _ in range(n):
        task_trigger(owner=owner, key=f"k{next(_keys)}", workflow="demo.echo", payload={},
                     callback_url=url)
    webhooks = []
    while messages := pop_queued_messages():
        for func, arg in messages:
            if func.endswith("run_task"):
                assert run_task(arg) == "succeeded"
            else:
                webhooks.append(arg)
    assert len(webhooks) == n
    return webhooks


def row(message_id) -> WebhookDelivery:
    return WebhookDelivery.objects.get(task_id=message_id.split(":")[0])


class Gate:
    """A receiver script that holds the first request of `message_id` until
    released (the attempt in flight, deterministically), then answers 204."""

    def __init__(self):
        self.arrived, self.release = threading.Event(), threading.Event()

    def __call__(self, message_id, n):
        if n == 1:
            self.arrived.set()
            assert self.release.wait(20)
        return 204, 0


# --- the caps ----------------------------------------------------------------------------------

def test_a_client_at_its_cap_waits_without_a_loop_and_gets_the_slot_its_attempt_frees(
        owner, settings):
    settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT = 0  # only the client's cap here
    gate = Gate()
    with Receiver(gate) as slow, Receiver() as other:
        [first] = ended(owner, slow.url)
        [second] = ended(owner, other.url)
        sender = background(lambda: delivery_send(message_id=first))
        assert gate.arrived.wait(10)  # the first attempt is in flight
        assert delivery_send(message_id=second).outcome == "waiting"
        waiting = row(second)
        assert (waiting.enqueued_at, waiting.attempts, waiting.endpoint) == (
            None, 0, other.url.split("/")[2])
        for _ in range(3):  # nothing is sent while the slot is taken: no loop
            assert dispatch_once().deliveries_enqueued == 0
        assert queued_webhooks() == []
        gate.release.set()
        assert sender.result().outcome == "delivered"
        assert queued_webhooks() == [second]  # the freed slot, handed on at once
        assert dispatch_once().deliveries_enqueued == 0  # its message is on its way
        assert delivery_send(message_id=second).outcome == "delivered"
    assert len(other.received) == 1 and len(slow.received) == 1


def test_an_endpoint_at_its_cap_holds_back_every_clients_delivery_to_it(
        owner, other_owner, settings):
    settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 0  # only the endpoint's cap here
    gate = Gate()
    with Receiver(gate) as receiver:
        [mine] = ended(owner, receiver.url)
        [theirs] = ended(other_owner, receiver.url + "?other")  # another URL, one endpoint
        sender = background(lambda: delivery_send(message_id=mine))
        assert gate.arrived.wait(10)
        assert delivery_send(message_id=theirs).outcome == "waiting"
        assert dispatch_once().deliveries_enqueued == 0
        gate.release.set()
        assert sender.result().outcome == "delivered"
        assert queued_webhooks() == [theirs]
        drain(lambda: row(theirs).state == "delivered", dispatch=False)
    assert [r.message_id for r in receiver.received] == [mine, theirs]


def test_a_burst_to_one_receiver_flows_at_the_receivers_pace_not_the_dispatchers(owner):
    """Six endings at once to one endpoint (cap 1): the five messages that
    arrive while the first attempt is in flight wait; from then on each
    finished attempt hands its slot to the next — no dispatcher pass needed —
    and every delivery is attempted once."""
    gate = Gate()
    with Receiver(gate) as receiver:
        messages = ended(owner, receiver.url, 6)
        sender = background(lambda: delivery_send(message_id=messages[0]))
        assert gate.arrived.wait(10)
        assert [delivery_send(message_id=m).outcome for m in messages[1:]] == ["waiting"] * 5
        gate.release.set()
        assert sender.result().outcome == "delivered"
        for message in messages[1:]:  # one message per freed slot, oldest first
            assert [arg for _, arg in pop_queued_messages()] == [message]
            assert delivery_send(message_id=message).outcome == "delivered"
        assert queued_webhooks() == []
    assert [r.message_id for r in receiver.received] == messages
    assert set(WebhookDelivery.objects.values_list("state", "attempts")) == {("delivered", 1)}


@pytest.mark.postgres
@pytest.mark.parametrize("cap", ["client", "endpoint"])
def test_two_claims_for_the_last_slot_are_decided_one_after_the_other(
        owner, other_owner, settings, cap):
    """The window: claim 1 has counted the attempts in flight and claimed, but
    not committed. Claim 2 must wait for it — at the client's advisory lock or
    the endpoint's row lock — and then see it; counting on its own snapshot it
    would take a second slot."""
    with Receiver() as one, Receiver() as two:
        if cap == "client":
            settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT = 0
            settings.PILOT_WEBHOOK_BREAKER_FAILURES = 0
            [first], [second] = ended(owner, one.url), ended(owner, two.url)
        else:
            settings.PILOT_WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = 0
            [first], [second] = ended(owner, one.url), ended(other_owner, one.url)
            WebhookEndpoint.objects.create(key=one.url.split("/")[2])  # no insert to wait on
    held, release = threading.Event(), threading.Event()

    def claim_and_hold():
        with transaction.atomic():
            claim = deliveries._claim(first, "w1")
            held.set()
            assert release.wait(10)
            return claim

    claim_one = background(claim_and_hold)
    assert held.wait(10)
    claim_two = background(lambda: deliveries._claim_or_why(second, "w2", 0.0))
    waiting = (lambda: lock_waiters("advisory")) if cap == "client" else row_lock_waiters
    wait_for(lambda: waiting() == 1, what=f"the second claim to wait at the {cap}'s lock")
    assert not claim_two.done.is_set()
    release.set()
    assert claim_one.result() is not None
    assert claim_two.result() == "waiting"
    assert (row(second).attempts, row(second).enqueued_at) == (0, None)


def test_the_dispatcher_serves_every_client_in_turn_and_sends_nothing_over_a_cap(
        owner, other_owner):
    """Client A has five deliveries waiting for one endpoint, client B one,
    due after all of A's. A pass with room for two sends A's oldest and B's —
    not A's first two, of which only one could go — and the next passes send
    nothing while those are on their way."""
    with Receiver() as a, Receiver() as b:
        mine = ended(owner, a.url, 5)
        [theirs] = ended(other_owner, b.url)
    now = store().db_now()
    for i, message in enumerate([*mine, theirs]):  # owed, due in this order
        WebhookDelivery.objects.filter(pk=row(message).pk).update(
            enqueued_at=None, next_attempt_at=now - timedelta(seconds=60 - i))
    assert deliveries.deliveries_enqueue_due(now, batch=2) == (2, True)
    assert sorted(queued_webhooks()) == sorted([mine[0], theirs])
    assert deliveries.deliveries_enqueue_due(now, batch=2) == (0, False)
    assert deliveries.deliveries_enqueue_due(now, batch=200) == (0, False)


@pytest.mark.redis  # the ORM broker has no front and back
def test_a_due_retry_of_a_webhook_queues_behind_the_runs_waiting_for_a_worker(owner, settings):
    settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS = 60.0  # not due until the test says so
    with Receiver(lambda mid, n: (500, 0) if n == 1 else (204, 0)) as receiver:
        [message] = ended(owner, receiver.url)
        assert delivery_send(message_id=message).outcome == "retrying"
        WebhookDelivery.objects.filter(pk=row(message).pk).update(next_attempt_at=Now())
        enqueue_rollback_unsafe(["a-run-waiting-for-a-worker"])
        assert dispatch_once().deliveries_enqueued == 1
    assert queued_messages() == [("workflows.worker.run_task", "a-run-waiting-for-a-worker"),
                                 ("workflows.worker.deliver_webhook", message)]


# --- the circuit breaker -----------------------------------------------------------------------

def endpoint_of(receiver) -> WebhookEndpoint:
    return WebhookEndpoint.objects.get(key=receiver.url.split("/")[2])


def pause_over(receiver) -> None:
    WebhookEndpoint.objects.filter(key=receiver.url.split("/")[2]).update(
        paused_until=Now() - timedelta(seconds=1))


def all_due() -> None:
    WebhookDelivery.objects.filter(state="pending").update(next_attempt_at=Now())


def test_an_endpoint_failing_n_times_in_a_row_is_paused_probed_and_closed_by_a_success(owner):
    failing = {"on": True}
    with Receiver(lambda mid, n: (500, 0) if failing["on"] else (204, 0)) as receiver:
        messages = ended(owner, receiver.url, 4)
        for message in messages[:3]:  # three failures in a row, three deliveries
            assert delivery_send(message_id=message).outcome == "retrying"
        state = endpoint_of(receiver)
        assert (state.failures, state.trips, state.last_error) == (3, 1, "HTTP 500: ok")
        assert state.paused_until - state.last_failure_at == timedelta(seconds=30)
        all_due()
        assert delivery_send(message_id=messages[3]).outcome == "paused"  # not attempted
        assert (row(messages[3]).attempts, row(messages[3]).enqueued_at) == (0, None)
        for message in messages[:3]:
            assert delivery_send(message_id=message).outcome == "paused"
        assert dispatch_once().deliveries_enqueued == 0  # paused: no message at all
        assert len(receiver.received) == 3

        pause_over(receiver)  # the pause is over: one attempt probes it
        assert dispatch_once().deliveries_enqueued == 1
        [probe] = queued_webhooks()
        assert delivery_send(message_id=probe).outcome == "retrying"  # still failing
        state = endpoint_of(receiver)
        assert (state.failures, state.trips) == (4, 2)
        assert state.paused_until - state.last_failure_at == timedelta(seconds=60)  # doubled
        pop_queued_messages()

        failing["on"] = False
        pause_over(receiver)
        all_due()
        assert dispatch_once().deliveries_enqueued == 1  # one probe at a time
        [probe] = queued_webhooks()
        assert delivery_send(message_id=probe).outcome == "delivered"
        state = endpoint_of(receiver)
        assert (state.failures, state.trips, state.paused_until) == (0, 0, None)  # closed
        drain(lambda: WebhookDelivery.objects.filter(state="delivered").count() == 4)
    assert len(receiver.received) == 3 + 1 + 4


def test_a_success_between_failures_starts_the_count_again(owner):
    answers = iter([500, 500, 204, 500, 500, 204])
    with Receiver(lambda mid, n: (next(answers), 0)) as receiver:
        messages = ended(owner, receiver.url, 6)
        for message in messages:
            delivery_send(message_id=message)
        state = endpoint_of(receiver)
    assert (state.failures, state.trips, state.paused_until) == (0, 0, None)
    assert len(receiver.received) == 6


def test_an_operators_resend_goes_while_its_endpoint_is_paused(owner, django_user_model):
    operator = django_user_model.objects.create_superuser("op", "op@x", "pw-op-123456")
    with Receiver(lambda mid, n: (500, 0) if n == 1 else (204, 0)) as receiver:
        messages = ended(owner, receiver.url, 3)
        for message in messages:
            assert delivery_send(message_id=message).outcome == "retrying"
        assert endpoint_of(receiver).paused_until is not None
        all_due()
        again = delivery_resend(delivery_id=row(messages[0]).pk, user=operator)
        assert again.resend_owed
        assert delivery_send(message_id=messages[1]).outcome == "paused"  # only the re-send
        assert dispatch_once().deliveries_enqueued == 0  # its message went with the re-send
        assert queued_webhooks() == [messages[0]]
        assert delivery_send(message_id=messages[0]).outcome == "delivered"
    d = row(messages[0])
    assert (d.state, d.resend_owed) == ("delivered", False)
    assert endpoint_of(receiver).paused_until is None  # and its success closed the breaker


def test_a_paused_delivery_keeps_its_window_and_ends_failed_when_it_closes(owner):
    with Receiver(lambda mid, n: (500, 0)) as receiver:
        messages = ended(owner, receiver.url, 4)
        for message in messages[:3]:
            assert delivery_send(message_id=message).outcome == "retrying"
        assert delivery_send(message_id=messages[3]).outcome == "paused"
        last = row(messages[3])
        assert last.give_up_at - last.created_at == timedelta(hours=24)  # kept while paused
        assert dispatch_once().deliveries_enqueued == 0
        WebhookDelivery.objects.filter(pk=last.pk).update(give_up_at=Now())  # 24 h later
        assert endpoint_of(receiver).paused_until is not None
        assert dispatch_once().deliveries_enqueued == 1  # past its window: ended, not sent
        assert delivery_send(message_id=messages[3]).outcome == "skipped"
    last.refresh_from_db()
    assert (last.state, last.attempts) == ("failed", 0)
    assert "window closed" in last.last_error
    assert len(receiver.received) == 3


def test_an_endpoint_row_is_kept_per_host_and_port_not_per_url(owner):
    with Receiver() as receiver:
        for path in ("/a", "/b?x=1"):
            [message] = ended(owner, receiver.url.rsplit("/", 1)[0] + path)
            assert delivery_send(message_id=message).outcome == "delivered"
    assert list(WebhookEndpoint.objects.values_list("key", flat=True)) == [
        receiver.url.split("/")[2]]
    assert set(WebhookDelivery.objects.values_list("endpoint", flat=True)) == {
        receiver.url.split("/")[2]}


# --- the rules, alone ---------------------------------------------------------------------------

@override_settings(PILOT_WEBHOOK_BREAKER_SECONDS=30, PILOT_WEBHOOK_MAX_DELAY_SECONDS=600)
def test_each_pause_in_a_row_lasts_twice_as_long_up_to_the_longest_delay():
    from workflows.engine.webhook_slots import pause_after

    assert [pause_after(n).total_seconds() for n in (1, 2, 3, 4, 5, 6, 100)] == [
        30, 60, 120, 240, 480, 600, 600]


def test_an_endpoint_being_probed_after_a_pause_takes_one_attempt_at_a_time():
    from workflows.engine.webhook_slots import Limits

    limits = Limits(client=4, endpoint=8, failures=5)
    assert [limits.endpoint_cap(n) for n in (0, 4, 5, 9)] == [8, 8, 1, 1]
    assert Limits(client=4, endpoint=8, failures=0).endpoint_cap(99) == 8
