"""Completion webhooks: sending the outbox (docs/webhooks.md).

The store writes a `WebhookDelivery` row with every ending of a task that has
an endpoint, in the same statement (PostgreSQL) or transaction as the ending,
and enqueues it on commit. From there:

    delivery_send (a worker, for one message)
      claim: lock the task, then the delivery (the one lock order: task
        first); pending, due, not claimed by a live sender → attempts + 1, a
        new `claim_token`, `claimed_until` = now + timeout + margin; the body
        is fixed now if it is not yet (the task as it is: ended); commit
      POST it, signed, to a checked address, within the timeout (no lock held)
      record the outcome where the delivery still carries our claim token:
        2xx → delivered; otherwise the next attempt after a jittered backoff
        (first within PILOT_WEBHOOK_FIRST_RETRY_SECONDS, doubling, at most
        PILOT_WEBHOOK_MAX_DELAY_SECONDS), or failed once that would fall after
        `give_up_at`
    deliveries_enqueue_due (the dispatcher, every pass)
      SELECT … FOR UPDATE SKIP LOCKED the pending deliveries that are due,
      not claimed by a live sender and without a recent message — retries,
      lost messages, senders that died mid-attempt — and enqueue them

So two workers never send one delivery at once (the claim), a sender that
dies mid-attempt is retried once its claim expires (and its late record, if
it comes back, is refused by the token), and a 2xx is recorded once. A
receiver may still see an attempt twice — a 2xx whose worker died before
recording it — which is why `webhook-id` is stable: receivers dedupe on it.
Every time is the database's: the claim reads it, the record continues it.

`delivery_resend` (the console) sends a delivery again, with the same id
and body, and a fresh 24 hours.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Q
from django.db.models.functions import Now

from workflows.backoff import backoff_delay
from workflows.conf import pilot_settings
from workflows.engine.enqueue import deliveries_enqueue_on_commit
from workflows.engine.leases import DbClock, worker_id
from workflows.engine.store.orm import give_up_after
from workflows.errors import InvalidTransition, PermissionDenied, TaskNotFound
from workflows.models import ClientWebhook, DeliveryState, StepCheckpoint, Task, WebhookDelivery
from workflows.models.webhook import delivery_message_parse
from workflows.observability import tracing
from workflows.observability.events import emit, emit_on_commit
from workflows.registry import RetryPolicy
from workflows.representation import webhook_body
from workflows.selectors import can_view_all
from workflows.webhooks.http import Answer, post_once
from workflows.webhooks.signing import webhook_headers
from workflows.webhooks.targets import target_parse

# How long past its timeout a claimed attempt stays claimed (DNS, TLS, the
# record itself): after that the dispatcher gives the delivery to another worker.
CLAIM_MARGIN_SECONDS = 5.0
# The attempts kept in `attempt_log` (the counter `attempts` keeps counting).
LOG_ENTRIES = 20
BATCH = 200
RESEND_PERMISSION = "workflows.resend_webhook"


def retry_policy() -> RetryPolicy:
    return RetryPolicy(max_attempts=0, initial=pilot_settings.PILOT_WEBHOOK_FIRST_RETRY_SECONDS,
                       factor=2.0, max_delay=pilot_settings.PILOT_WEBHOOK_MAX_DELAY_SECONDS)


def _timeout() -> float:
    return pilot_settings.PILOT_WEBHOOK_TIMEOUT_SECONDS


@dataclasses.dataclass
class SendReport:
    message_id: str
    # skipped | delivered | retrying | failed | claim_lost | error
    outcome: str = ""
    status: int | None = None


@dataclasses.dataclass
class _Claim:
    delivery: WebhookDelivery
    task: Task
    token: int
    clock: DbClock
    secret: str
    body: bytes


# --- sending -------------------------------------------------------------------------------

def delivery_send(*, message_id: str, worker: str | None = None) -> SendReport:
    """Send one delivery (by its `webhook-id`) once, if it is pending, due and
    not being sent by a live sender; never raises (worker isolation). A second
    message for the same delivery while it is claimed, or after it ended, is
    "skipped" and changes nothing."""
    report = SendReport(str(message_id))
    worker = worker or worker_id()
    try:
        claim = _claim(str(message_id), worker)
        if claim is None:
            report.outcome = "skipped"
            return report
        answer = _post(claim)
        report.status = answer.status
        report.outcome = _record(claim, answer)
    except Exception as exc:  # noqa: BLE001 - isolation: the claim expires, it is retried
        logging.getLogger("pilot.webhooks").exception("delivery %s failed", message_id)
        emit("webhook_error", level=logging.ERROR, delivery=str(message_id)[:120],
             error=f"{type(exc).__name__}: {exc}"[:300])
        report.outcome = "error"
    return report


def _claim(message_id: str, worker: str) -> _Claim | None:
    parsed = delivery_message_parse(message_id)
    if parsed is None:
        return None
    task_id, task_state, restarts = parsed
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None:
            return None
        delivery = (WebhookDelivery.objects.select_for_update().annotate(pilot_db_now=Now())
                    .filter(task_id=task.pk, task_state=task_state, restarts=restarts).first())
        if delivery is None or delivery.state != DeliveryState.PENDING:
            return None
        now = delivery.pilot_db_now
        if delivery.next_attempt_at > now or (delivery.claimed_until is not None
                                              and delivery.claimed_until > now):
            return None  # not due yet, or a live sender has it
        if now >= delivery.give_up_at:
            _end(delivery, DeliveryState.FAILED, now, error=delivery.last_error
                 or "gave up: the delivery window closed before it could be sent")
            return None
        body = delivery.body
        if body is None:
            body = webhook_body(task, StepCheckpoint.objects.filter(task_id=task.pk)
                                .order_by("index")).decode("ascii")
        secret = (ClientWebhook.objects.filter(owner_id=task.owner_id)
                  .values_list("secret", flat=True).first())
        token = delivery.claim_token + 1
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            claim_token=token, claimed_by=worker[:200],
            claimed_until=now + timedelta(seconds=_timeout() + CLAIM_MARGIN_SECONDS),
            attempts=delivery.attempts + 1, enqueued_at=None, last_attempt_at=now, body=body)
        delivery.attempts += 1
    return _Claim(delivery, task, token, DbClock(now), secret or "", body.encode("ascii"))


def _post(claim: _Claim) -> Answer:
    delivery, task = claim.delivery, claim.task
    if not claim.secret:
        return Answer(None, "not sent: the client has no signing secret "
                            "(manage.py create_api_client issues one)", 0.0)
    with tracing.span("pilot.webhook", parent=task.traceparent, kind="client",
                      task_id=str(task.pk), delivery=delivery.message_id,
                      attempt=delivery.attempts) as span:
        headers = webhook_headers(claim.secret, delivery.message_id,
                                  int(claim.clock.now().timestamp()), claim.body)
        traceparent = tracing.span_traceparent(span) if span is not None else task.traceparent
        if traceparent:
            headers["traceparent"] = traceparent
        answer = post_once(delivery.url, claim.body, headers, timeout=_timeout())
        tracing.span_set(span, status=answer.status)
        if not answer.ok:
            tracing.span_failed(span, message=answer.error[:200])
    return answer


def _record(claim: _Claim, answer: Answer) -> str:
    """The attempt's outcome, written only if our claim still holds."""
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
    for round_ in range(3):
        try:
            held = WebhookDelivery.objects.filter(pk=delivery.pk,
                                                  claim_token=claim.token).update(**fields)
            break
        except DatabaseError:
            if round_ == 2:
                raise
            time.sleep(0.2 * (round_ + 1))
    event = {DeliveryState.DELIVERED: "webhook_delivered", "retrying": "webhook_failed",
             DeliveryState.FAILED: "webhook_gave_up"}[outcome]
    if not held:
        event, outcome = "webhook_claim_lost", "claim_lost"
    emit(event, level=logging.INFO if answer.ok else logging.WARNING,
         task_id=str(claim.task.pk), workflow=claim.task.workflow,
         trace_id=claim.task.trace_id or None, delivery=delivery.message_id,
         attempt=delivery.attempts, status=answer.status, duration_ms=answer.ms,
         host=_host(delivery.url), error=answer.error[:200] or None)
    return outcome


def _host(url: str) -> str:
    try:
        return target_parse(url).host
    except Exception:  # noqa: BLE001 - for a log line only
        return "?"


def _end(delivery: WebhookDelivery, state: str, now: datetime, *, error: str) -> None:
    WebhookDelivery.objects.filter(pk=delivery.pk).update(state=state, last_error=error,
                                                          claimed_until=None, claimed_by="")
    emit_on_commit("webhook_gave_up", task_id=str(delivery.task_id),
                   delivery=delivery.message_id, attempt=delivery.attempts)


# --- the dispatcher's scan -------------------------------------------------------------------

def _due(now: datetime) -> Q:
    stale = now - timedelta(seconds=pilot_settings.PILOT_REENQUEUE_SECONDS)
    return (Q(state=DeliveryState.PENDING, next_attempt_at__lte=now)
            & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            & (Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale)))


def deliveries_enqueue_due(now: datetime, *, batch: int = BATCH) -> tuple[int, bool]:
    """Enqueue (to the front) the deliveries that are due at `now` (a database
    time) and have no live sender nor a recent message: a retry whose backoff
    elapsed, a message that was lost, an attempt whose sender died. Returns
    (how many, whether the batch was full). Idle, it costs one small query; else
    one short transaction over SELECT … FOR UPDATE SKIP LOCKED, so several
    dispatchers never enqueue one delivery twice."""
    if not WebhookDelivery.objects.filter(_due(now)).exists():
        return 0, False
    with transaction.atomic():
        rows = list(WebhookDelivery.objects.filter(_due(now))
                    .select_for_update(skip_locked=True)
                    .only("pk", "task_id", "task_state", "restarts").order_by()[:batch])
        if rows:
            WebhookDelivery.objects.filter(pk__in=[d.pk for d in rows]).update(enqueued_at=now)
            deliveries_enqueue_on_commit([d.message_id for d in rows], front=True)
    return len(rows), len(rows) == batch


# --- the operator's re-send -------------------------------------------------------------------

def delivery_resend(*, delivery_id: Any, user: Any, reason: str = "") -> WebhookDelivery:
    """Send a delivery again — delivered, failed or waiting for its next
    attempt — with the same `webhook-id` and body, due now, with a fresh
    PILOT_WEBHOOK_GIVE_UP_SECONDS; enqueued on commit. Locks the task, then
    the delivery. Raises TaskNotFound (no such delivery, or its task is not
    visible to `user`), PermissionDenied (no workflows.resend_webhook),
    InvalidTransition (an attempt is in flight right now)."""
    delivery = WebhookDelivery.objects.filter(pk=delivery_id).only("task_id").first()
    if delivery is None or not can_view_all(user):
        raise TaskNotFound("No such delivery")
    if not user.has_perm(RESEND_PERMISSION):
        raise PermissionDenied("You may not re-send webhooks")
    with transaction.atomic():
        Task.objects.select_for_update().filter(pk=delivery.task_id).first()
        delivery = (WebhookDelivery.objects.select_for_update().annotate(pilot_db_now=Now())
                    .filter(pk=delivery_id).first())
        if delivery is None:
            raise TaskNotFound("No such delivery")
        now = delivery.pilot_db_now
        if delivery.claimed_until is not None and delivery.claimed_until > now:
            raise InvalidTransition("An attempt of this delivery is in flight; wait for it "
                                    "to end (at most "
                                    f"{_timeout() + CLAIM_MARGIN_SECONDS:g} s)")
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            state=DeliveryState.PENDING, next_attempt_at=now, enqueued_at=now,
            give_up_at=now + give_up_after(), claimed_until=None, claimed_by="")
        deliveries_enqueue_on_commit([delivery.message_id], front=True)
        emit_on_commit("webhook_resent", task_id=str(delivery.task_id),
                       delivery=delivery.message_id, actor=getattr(user, "username", "?"),
                       reason=reason[:200] or None)
    delivery.refresh_from_db()
    return delivery


def deliveries_freeze(task: Task) -> int:
    """Fix the body of `task`'s deliveries that have none yet, from the task as
    it is now — called under the task's row lock by `retry` before it sends a
    finished task back to pending, so a delivery announcing the ending never
    carries the restarted task. Returns how many; no query without an endpoint."""
    if not task.callback_url:
        return 0
    ids = list(WebhookDelivery.objects.filter(task_id=task.pk, body__isnull=True)
               .values_list("pk", flat=True))
    if not ids:
        return 0
    body = webhook_body(task, StepCheckpoint.objects.filter(task_id=task.pk).order_by("index"))
    return WebhookDelivery.objects.filter(pk__in=ids, body__isnull=True).update(
        body=body.decode("ascii"))


__all__ = ["SendReport", "deliveries_enqueue_due", "deliveries_freeze", "delivery_resend",
           "delivery_send", "retry_policy"]
