"""Completion webhooks: sending the outbox (docs/webhooks.md).

The store writes a `WebhookDelivery` row with every ending of a task that has
an endpoint, in the same statement (PostgreSQL) or transaction as the ending,
and enqueues it on commit. From there:

    delivery_send (a worker, for one message)
      claim: lock the task while it exists, then the delivery (the one lock
        order: task first); pending, due, not claimed by a live sender; then a
        slot (webhook_slots.slot_take: the client's and the endpoint's caps,
        the endpoint's breaker) — none free: nothing is sent, the delivery is
        owed a message (`enqueued_at` NULL) and waits; else attempts + 1, a new
        `claim_token`, `claimed_until` = now + timeout + margin; the body is
        fixed now if it is not yet (the task as it is: ended); commit
      POST it, signed, to a checked address, by the attempt's deadline — the
        claim's start + the timeout, DNS included, so `claimed_until` covers it
        all (no lock held)
      record the outcome where the delivery still carries our claim token:
        2xx → delivered; otherwise the next attempt after a jittered backoff
        (first within PILOT_WEBHOOK_FIRST_RETRY_SECONDS, doubling, at most
        PILOT_WEBHOOK_MAX_DELAY_SECONDS), or failed once that would fall after
        `give_up_at`; and, in the same transaction, the endpoint's breaker
      hand the freed slot on: one message for the oldest delivery of the same
        client or endpoint that waits for one (if any)
    deliveries_enqueue_due (the dispatcher, every pass)
      the pending deliveries that are due, not claimed by a live sender and
      without a recent message — retries, deliveries waiting for a slot, lost
      messages, senders that died mid-attempt: those the slots allow, every
      client's oldest first (clients served in turn), locked FOR UPDATE SKIP
      LOCKED, each get a message at the back of the queue

So two workers never send one delivery at once (the claim), a sender that
dies mid-attempt is retried once its claim expires (and its late record, if
it comes back, is refused by the token), and a 2xx is recorded once. A
receiver may still see an attempt twice — a 2xx whose worker died before
recording it — which is why `webhook-id` is stable: receivers dedupe on it.
One client's or one receiver's slowness holds at most its caps' worth of
workers, and a waiting delivery never loops through the broker. Every time is
the database's: the claim reads it, the record continues it.

A delivery outlives its task (store/deliveries.py, `outlive`): when cleanup or an
expired key's re-trigger deletes the task, a pending delivery stays, its body
fixed first, and goes on being sent; it needs nothing of the task but its id.

`delivery_resend` (the console) sends a delivery again, with the same id
and body, a fresh 24 hours and a new claim version (a slow sender of an
earlier attempt can no longer record over it); it goes even to a paused
endpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from workflows.accounts import client_signing_secrets
from workflows.conf import pilot_settings
from workflows.engine.enqueue import deliveries_enqueue_on_commit
from workflows.engine.leases import DbClock, patiently, worker_id
from workflows.engine.store import store
from workflows.engine.store.orm import give_up_after
from workflows.engine.webhook_slots import Limits, Slots, breaker_record, slot_take
from workflows.models import DeliveryState, StepCheckpoint, Task, WebhookDelivery
from workflows.models.webhook import delivery_message_parse
from workflows.observability import tracing
from workflows.observability.events import Event, emit, emit_on_commit
from workflows.representation import webhook_body
from workflows.rules.backoff import RetryPolicy, backoff_delay
from workflows.rules.errors import InvalidTransition, PermissionDenied, TaskNotFound
from workflows.selectors import can_view_all
from workflows.webhooks.http import Answer, post_once
from workflows.webhooks.signing import webhook_headers
from workflows.webhooks.targets import endpoint_of

# How long past its deadline a claimed attempt stays claimed (the claim's commit,
# the record itself): after that the dispatcher gives the delivery to another
# worker. The deadline itself covers DNS, connect, TLS and the answer.
CLAIM_MARGIN_SECONDS = 5.0
# The attempts kept in `attempt_log` (the counter `attempts` keeps counting).
LOG_ENTRIES = 20
BATCH = 200
# Owed deliveries a sender considers when it hands its slot on.
HAND_ON = 10
SKIPPED = "skipped"
RESEND_PERMISSION = "workflows.resend_webhook"


def retry_policy() -> RetryPolicy:
    return RetryPolicy(max_attempts=0, initial=pilot_settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS,
                       factor=2.0, max_delay=pilot_settings.PILOT_WEBHOOK_MAX_DELAY_SECONDS)


def _timeout() -> float:
    return pilot_settings.PILOT_WEBHOOK_TIMEOUT_SECONDS


@dataclasses.dataclass
class SendReport:
    message_id: str
    # skipped | waiting (over a cap) | paused (its endpoint's breaker) | delivered
    # | retrying | failed | claim_lost | error
    outcome: str = ""
    status: int | None = None


@dataclasses.dataclass
class _HeldAttempt:
    """One attempt of a delivery this worker claimed — a held claim, as a run's
    attempt is (leases.py): its claim `token` fences the outcome's write (a
    re-send or a later sender moved it on: claim_lost), `clock` is the
    database's from the claim on, the write is patient across a lost
    connection. Unlike a run it holds no lease to renew: `claimed_until` covers
    the whole attempt, which ends by `deadline`."""

    delivery: WebhookDelivery
    token: int
    clock: DbClock
    secrets: tuple[str, ...]  # the client's signing secrets (two during a rotation)
    body: bytes
    endpoint: str
    deadline: float  # monotonic: the attempt ends by then, inside `claimed_until`
    workflow: str | None  # for log lines: None once the task is gone
    trace_id: str | None


# --- sending -------------------------------------------------------------------------------

def delivery_send(*, message_id: str, worker: str | None = None) -> SendReport:
    """Send one delivery (by its `webhook-id`) once, if it is pending, due,
    not being sent by a live sender and a slot is free; never raises (worker
    isolation). A second message for the same delivery while it is claimed, or
    after it ended, is "skipped" and changes nothing; one over a cap is
    "waiting", one to a paused endpoint "paused" (both wait for the message
    that a freed slot, or the dispatcher, sends them). After an attempt the
    freed slot is handed on (`_hand_on`)."""
    report = SendReport(str(message_id))
    worker = worker or worker_id()
    try:
        claim = _claim_or_why(str(message_id), worker, time.monotonic())
        if isinstance(claim, str):
            report.outcome = claim
            return report
        answer = _post(claim)
        report.status = answer.status
        report.outcome = _record(claim, answer)
    except Exception as exc:  # noqa: BLE001 - isolation: the claim expires, it is retried
        logging.getLogger("pilot.webhooks").exception("delivery %s failed", message_id)
        emit(Event.WEBHOOK_ERROR, level=logging.ERROR, delivery=str(message_id)[:120],
             error=f"{type(exc).__name__}: {exc}"[:300])
        report.outcome = "error"
        return report
    try:
        _hand_on(claim)
    except Exception as exc:  # noqa: BLE001 - the dispatcher hands it on instead
        emit(Event.WEBHOOK_ERROR, level=logging.ERROR, delivery=str(message_id)[:120],
             error=f"hand-on: {type(exc).__name__}: {exc}"[:300])
    return report


def _claim(message_id: str, worker: str) -> _HeldAttempt | None:
    """The claim of one attempt, or None (nothing to send now, for whatever reason)."""
    claim = _claim_or_why(message_id, worker, time.monotonic())
    return None if isinstance(claim, str) else claim


def _claim_or_why(message_id: str, worker: str, started: float) -> _HeldAttempt | str:
    """Claim one attempt (module docstring) — or say why not: SKIPPED, or the
    slot's answer (webhook_slots.WAITING / PAUSED). `started` (monotonic, taken
    before the transaction) starts the attempt's deadline, so the deadline ends
    before `claimed_until` less the margin, whatever the claim itself took."""
    parsed = delivery_message_parse(message_id)
    if parsed is None:
        return SKIPPED
    task_id, task_state, restarts = parsed
    limits = Limits.now()
    rows = store().deliveries
    with transaction.atomic():
        # The one lock order: the task (while it exists: a delivery outlives
        # it), then the delivery.
        locked = rows.lock_for_claim_in_tx(task_id, task_state, restarts)
        if locked is None or locked[1].state != DeliveryState.PENDING:
            return SKIPPED
        task, delivery, now = locked
        if delivery.next_attempt_at > now or (delivery.claimed_until is not None
                                              and delivery.claimed_until > now):
            return SKIPPED  # not due yet, or a live sender has it
        if now >= delivery.give_up_at:
            _end(delivery, DeliveryState.FAILED, now, error=delivery.last_error
                 or "gave up: the delivery window closed before it could be sent")
            return SKIPPED
        endpoint = delivery.endpoint or endpoint_of(delivery.url)
        why = slot_take(delivery, endpoint, now, limits)
        if why:
            # Nothing sent: the message is consumed and the delivery is owed one,
            # which a freed slot (or the dispatcher) sends — never a loop.
            rows.owe_message(delivery.pk, endpoint=endpoint)
            return why
        body = delivery.body
        if body is None:
            if task is None:  # cannot happen: the store's `outlive` fixes it first
                _end(delivery, DeliveryState.FAILED, now,
                     error="gave up: its task was deleted before its body was fixed")
                return SKIPPED
            body = webhook_body(task, StepCheckpoint.objects.filter(task_id=task.pk)
                                .order_by("index")).decode("ascii")
        secrets = client_signing_secrets(delivery.owner_id, now)
        token = delivery.claim_token + 1
        rows.claim_attempt_in_tx(delivery, token=token, worker=worker, now=now, body=body,
                           claimed_until=now + timedelta(seconds=_timeout()
                                                         + CLAIM_MARGIN_SECONDS),
                           endpoint=endpoint)
    return _HeldAttempt(delivery, token, DbClock(now), secrets, body.encode("ascii"), endpoint,
                  started + _timeout(), task.workflow if task is not None else None,
                  (task.trace_id if task is not None else "")
                  or tracing.trace_id_of(delivery.traceparent) or None)


def _post(claim: _HeldAttempt) -> Answer:
    delivery = claim.delivery
    if not claim.secrets:
        return Answer(None, "not sent: the client has no signing secret that can be read "
                            "(manage.py create_api_client issues one)", 0.0)
    with tracing.span("pilot.webhook", parent=delivery.traceparent, kind="client",
                      task_id=str(delivery.task_id), delivery=delivery.message_id,
                      attempt=delivery.attempts) as span:
        headers = webhook_headers(claim.secrets, delivery.message_id,
                                  int(claim.clock.now().timestamp()), claim.body)
        traceparent = (tracing.span_traceparent(span) if span is not None
                       else delivery.traceparent)
        if traceparent:
            headers["traceparent"] = traceparent
        answer = post_once(delivery.url, claim.body, headers, timeout=_timeout(),
                           deadline=claim.deadline)
        tracing.span_set(span, status=answer.status)
        if not answer.ok:
            tracing.span_failed(span, message=answer.error[:200])
    return answer


def _record(claim: _HeldAttempt, answer: Answer) -> str:
    """The attempt's outcome, written only if our claim still holds, and —
    in the same transaction, after it (the lock order) — counted against the
    endpoint's breaker (not when nothing was sent: no secret)."""
    delivery, now = claim.delivery, claim.clock.now()
    entry = {"n": delivery.attempts, "at": now.isoformat(), "status": answer.status,
             "error": answer.error, "ms": answer.ms}
    fields: dict[str, Any]
    fields = {"attempt_log": [*delivery.attempt_log, entry][-LOG_ENTRIES:],
              "last_status": answer.status, "last_error": answer.error,
              "claimed_until": None, "claimed_by": ""}
    outcome: str
    if answer.ok:
        outcome = DeliveryState.DELIVERED
        fields.update(state=DeliveryState.DELIVERED, delivered_at=now)
    else:
        delay = backoff_delay(retry_policy(), delivery.attempts)
        due = now + timedelta(seconds=delay)
        if due >= delivery.give_up_at:
            outcome = DeliveryState.FAILED
            fields.update(state=DeliveryState.FAILED)
        else:
            outcome = "retrying"
            fields.update(next_attempt_at=due, enqueued_at=None)
    def record() -> tuple[bool, datetime | None]:
        with transaction.atomic():
            held = store().deliveries.record_outcome(delivery.pk, claim_token=claim.token,
                                                      fields=fields)
            if held and claim.secrets:
                return True, breaker_record(claim.endpoint, ok=answer.ok, now=now,
                                            error=answer.error)
            return held, None

    # A held claim's write: fenced by its token, so retried across a lost
    # connection like every write a held attempt makes (leases.patiently).
    held, paused = patiently(record, doing="record the webhook attempt")
    event = {DeliveryState.DELIVERED: Event.WEBHOOK_DELIVERED, "retrying": Event.WEBHOOK_FAILED,
             DeliveryState.FAILED: Event.WEBHOOK_GAVE_UP}[outcome]
    if not held:
        event, outcome = Event.WEBHOOK_CLAIM_LOST, "claim_lost"
    emit(event, level=logging.INFO if answer.ok else logging.WARNING,
         task_id=str(delivery.task_id), workflow=claim.workflow, trace_id=claim.trace_id,
         delivery=delivery.message_id, attempt=delivery.attempts, status=answer.status,
         duration_ms=answer.ms, host=_host(claim.endpoint), error=answer.error[:200] or None)
    if paused is not None:
        emit(Event.WEBHOOK_ENDPOINT_PAUSED, level=logging.WARNING, host=_host(claim.endpoint),
             until=paused.isoformat(), error=answer.error[:200] or None)
    return outcome


def _host(endpoint: str) -> str:
    """The host of an endpoint, for log lines (never the URL: it may carry a token)."""
    return endpoint.rsplit(":", 1)[0].strip("[]") or "?"


def _end(delivery: WebhookDelivery, state: str, now: datetime, *, error: str) -> None:
    store().deliveries.end(delivery.pk, state, error=error)
    emit_on_commit(Event.WEBHOOK_GAVE_UP, task_id=str(delivery.task_id),
                   delivery=delivery.message_id, attempt=delivery.attempts)


def _hand_on(claim: _HeldAttempt) -> None:
    """After an attempt its slot is free: give it to a delivery of the same
    client or endpoint that waits for one (one message, at the back of the
    queue), so a burst to one receiver flows at the receiver's pace, not the
    dispatcher's. Nothing to do (one small query each) when none waits."""
    limits = Limits.now()
    if not (limits.client or limits.endpoint or limits.failures):
        return  # nothing is ever capped: nothing waits for a slot
    now = claim.clock.now()
    near = Q(owner_id=claim.delivery.owner_id) if limits.client else Q(pk__in=[])
    if claim.endpoint:
        near |= Q(endpoint=claim.endpoint)
    waiting = _owed(now).filter(near)
    if waiting.exists():
        _enqueue_chosen(now, waiting, HAND_ON, limits)


# --- the dispatcher's scan -------------------------------------------------------------------

def _stale(now: datetime) -> datetime:
    return now - timedelta(seconds=pilot_settings.PILOT_REENQUEUE_SECONDS)


def _due(now: datetime) -> Q:
    return (Q(state=DeliveryState.PENDING, next_attempt_at__lte=now)
            & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            & (Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=_stale(now))))


def _owed(now: datetime) -> QuerySet[WebhookDelivery]:
    """Due deliveries owed a message (a claim refused for a slot, a retry whose
    backoff elapsed): those the owed indexes serve, by owner or endpoint."""
    return WebhookDelivery.objects.filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
        state=DeliveryState.PENDING, enqueued_at__isnull=True, next_attempt_at__lte=now)


def deliveries_enqueue_due(now: datetime, *, batch: int = BATCH) -> tuple[int, bool]:
    """Enqueue (to the back of the queue) the deliveries that are due at `now`
    (a database time), have no live sender nor a recent message, and have a
    free slot: a retry whose backoff elapsed, one that waited for a slot or for
    its endpoint's pause to end, a message that was lost, an attempt whose
    sender died. A delivery past its `give_up_at` is sent its message whatever
    the slots (its claim only ends it). Every client's oldest first, so one
    client's backlog never hides another's (webhook_slots.Slots chooses; each
    claim decides). Returns (how many, whether to run again at once). Idle, it
    costs one small query; else one short transaction over SELECT … FOR UPDATE
    SKIP LOCKED, so several dispatchers never enqueue one delivery twice."""
    if not WebhookDelivery.objects.filter(_due(now)).exists():
        return 0, False
    return _enqueue_chosen(now, WebhookDelivery.objects.filter(_due(now)), batch, Limits.now())


def _enqueue_chosen(now: datetime, due: QuerySet[WebhookDelivery], batch: int,
                    limits: Limits) -> tuple[int, bool]:
    """Of `due` (a queryset of due deliveries), enqueue those the slots allow,
    up to `batch`; (how many, whether the batch was full and some went)."""
    slots = Slots(now, _stale(now), limits)
    candidates = list(
        due.exclude(slots.blocked_q() & Q(give_up_at__gt=now))
        .annotate(place=Window(RowNumber(), partition_by=[F("owner_id")],
                               order_by=[F("next_attempt_at").asc(), F("id").asc()]))
        .order_by("place", "next_attempt_at", "id")
        .values_list("pk", "owner_id", "endpoint", "url", "give_up_at", "resend_owed")[:batch])
    chosen = [pk for pk, owner_id, endpoint, url, give_up_at, resend in candidates
              if give_up_at <= now
              or slots.take(owner_id, endpoint or endpoint_of(url), resend=resend)]
    if not chosen:
        return 0, False
    with transaction.atomic():
        rows = store().deliveries.mark_sent_in_tx(WebhookDelivery.objects.filter(_due(now)),
                                                  chosen, now)
        if rows:
            # The back of the queue: a retry (or a burst to one slow receiver)
            # must not go ahead of the runs waiting for a worker.
            deliveries_enqueue_on_commit([d.message_id for d in rows], front=False)
    return len(rows), len(candidates) == batch and bool(rows)


# --- the operator's re-send -------------------------------------------------------------------

def delivery_resend(*, delivery_id: Any, user: Any, reason: str = "") -> WebhookDelivery:
    """Send a delivery again — delivered, failed or waiting for its next
    attempt — with the same `webhook-id` and body, due now, with a fresh
    PILOT_WEBHOOK_GIVE_UP_SECONDS; enqueued on commit. A new version: the claim
    token moves on, so a slow sender of an earlier attempt cannot record its
    outcome over the re-send (`claim_lost`). It goes even while its endpoint is
    paused by the breaker (the caps still apply). Locks the task (while it
    exists), then the delivery. Raises TaskNotFound (no such delivery, or its
    task is not visible to `user`), PermissionDenied (no
    workflows.resend_webhook), InvalidTransition (an attempt is in flight right
    now)."""
    delivery = WebhookDelivery.objects.filter(pk=delivery_id).only("task_id").first()
    if delivery is None or not can_view_all(user):
        raise TaskNotFound("No such delivery")
    if not user.has_perm(RESEND_PERMISSION):
        raise PermissionDenied("You may not re-send webhooks")
    with transaction.atomic():
        locked = store().deliveries.lock_for_resend_in_tx(delivery_id, delivery.task_id)
        if locked is None:
            raise TaskNotFound("No such delivery")
        delivery, now = locked
        if delivery.claimed_until is not None and delivery.claimed_until > now:
            raise InvalidTransition("An attempt of this delivery is in flight; wait for it "
                                    "to end (at most "
                                    f"{_timeout() + CLAIM_MARGIN_SECONDS:g} s)")
        store().deliveries.resend(delivery.pk, now=now, give_up_at=now + give_up_after())
        deliveries_enqueue_on_commit([delivery.message_id], front=True)
        emit_on_commit(Event.WEBHOOK_RESENT, task_id=str(delivery.task_id),
                       delivery=delivery.message_id, actor=user.get_username(),
                       reason=reason[:200] or None)
    delivery.refresh_from_db()
    return delivery


# --- bodies -------------------------------------------------------------------------------------

def deliveries_freeze(task: Task) -> int:
    """Fix the body of `task`'s deliveries that have none yet, from the task as
    it is now — called under the task's row lock by `retry` before it sends a
    finished task back to pending, so a delivery announcing the ending never
    carries the restarted task. Returns how many; no query without an endpoint."""
    if not task.callback_url:
        return 0
    return store().deliveries.freeze_bodies_in_tx(task)


__all__ = ["SendReport", "deliveries_enqueue_due", "deliveries_freeze", "delivery_resend",
           "delivery_send", "retry_policy"]
