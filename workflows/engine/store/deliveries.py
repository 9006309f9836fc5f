"""The store's verbs for the webhook aggregate: deliveries and their endpoints
(docs/design.md, "The store"; docs/webhooks.md).

Every row of `WebhookDelivery` and `WebhookEndpoint` the engine changes or
locks is changed or locked here; deliveries.py, webhook_slots.py and cleanup
decide what to do and call these. Nothing here emits an event or sends a
message: each verb returns what it did, the caller acts on it.

Lock order (deliveries.py): the task while it exists, then the delivery, then
the client's lock, then the endpoint's row.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, F, Q, QuerySet
from django.db.models.functions import Now

from workflows.database import in_callers_transaction
from workflows.models import DeliveryState, StepCheckpoint, Task, WebhookDelivery, WebhookEndpoint
from workflows.representation import webhook_body


class DeliveryStore:
    # --- the claim of one attempt (deliveries._claim_or_why) ---------------------------

    @in_callers_transaction
    def lock_for_claim_in_tx(self, task_id: Any, task_state: str, restarts: int,
                             ) -> tuple[Task | None, WebhookDelivery, datetime] | None:
        """Inside the caller's transaction: the task FOR UPDATE (None once it is
        gone: a delivery outlives it), then its delivery for that ending, FOR
        UPDATE, and the database's time as it read them; None when there is no
        such delivery."""
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        delivery = (WebhookDelivery.objects.select_for_update().annotate(pilot_db_now=Now())
                    .filter(task_id=task_id, task_state=task_state, restarts=restarts).first())
        return None if delivery is None else (task, delivery, delivery.pilot_db_now)

    def owe_message(self, delivery_id: Any, *, endpoint: str) -> None:
        """A claim that took no slot consumed its message: the delivery is owed
        one (`enqueued_at` NULL), which a freed slot or the dispatcher sends."""
        WebhookDelivery.objects.filter(pk=delivery_id).update(enqueued_at=None,
                                                              endpoint=endpoint)

    @in_callers_transaction
    def claim_attempt_in_tx(self, delivery: WebhookDelivery, *, token: int, worker: str,
                      now: datetime, claimed_until: datetime, body: str,
                      endpoint: str) -> None:
        """Record the claim of the next attempt of `delivery` (locked by the
        caller): the new claim token, its sender and deadline, attempts + 1, the
        body fixed. The in-memory row follows (attempts, endpoint)."""
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            claim_token=token, claimed_by=worker[:200], claimed_until=claimed_until,
            attempts=delivery.attempts + 1, enqueued_at=None, last_attempt_at=now, body=body,
            endpoint=endpoint, resend_owed=False)
        delivery.attempts += 1
        delivery.endpoint = endpoint

    def end(self, delivery_id: Any, state: str, *, error: str) -> None:
        """End a delivery without an attempt (its window closed, its task gone)."""
        WebhookDelivery.objects.filter(pk=delivery_id).update(state=state, last_error=error,
                                                              claimed_until=None, claimed_by="")

    def record_outcome(self, delivery_id: Any, *, claim_token: int,
                       fields: dict[str, Any]) -> bool:
        """Write an attempt's outcome if the delivery still carries `claim_token`
        (the sender's claim); False, writing nothing, when a re-send or another
        sender moved it on."""
        return bool(WebhookDelivery.objects.filter(pk=delivery_id, claim_token=claim_token)
                    .update(**fields))

    # --- messages (the dispatcher's scan, a sender's hand-on) ---------------------------

    @in_callers_transaction
    def mark_sent_in_tx(self, due: QuerySet[WebhookDelivery], chosen: list[Any],
                  now: datetime) -> list[WebhookDelivery]:
        """Of the `chosen` ids still in `due`, those no one else holds (FOR
        UPDATE SKIP LOCKED), stamped as sent a message at `now`; the caller
        enqueues theirs on commit. Inside the caller's transaction."""
        rows = list(due.filter(pk__in=chosen).select_for_update(skip_locked=True)
                    .only("pk", "task_id", "task_state", "restarts").order_by("id"))
        if rows:
            WebhookDelivery.objects.filter(pk__in=[d.pk for d in rows]).update(enqueued_at=now)
        return rows

    # --- the operator's re-send --------------------------------------------------------

    @in_callers_transaction
    def lock_for_resend_in_tx(self, delivery_id: Any,
                              task_id: Any) -> tuple[WebhookDelivery, datetime] | None:
        """Inside the caller's transaction: the task (while it exists), then the
        delivery FOR UPDATE, and the database's time as it read it; None when
        there is no such delivery."""
        Task.objects.select_for_update().filter(pk=task_id).first()
        delivery = (WebhookDelivery.objects.select_for_update().annotate(pilot_db_now=Now())
                    .filter(pk=delivery_id).first())
        return None if delivery is None else (delivery, delivery.pilot_db_now)

    def resend(self, delivery_id: Any, *, now: datetime, give_up_at: datetime) -> None:
        """Pending again, due and sent at `now`, a fresh window, no sender, the
        claim version moved on (a slow sender's late outcome is refused)."""
        WebhookDelivery.objects.filter(pk=delivery_id).update(
            state=DeliveryState.PENDING, next_attempt_at=now, enqueued_at=now,
            give_up_at=give_up_at, claimed_until=None, claimed_by="",
            claim_token=F("claim_token") + 1, resend_owed=True)

    # --- bodies --------------------------------------------------------------------------

    @in_callers_transaction
    def freeze_bodies_in_tx(self, task: Task) -> int:
        """Fix the body of `task`'s deliveries that have none yet, from the task
        and its steps as they are now (the caller holds the task's row lock).
        Returns how many; one query when there are none."""
        ids = list(WebhookDelivery.objects.filter(task_id=task.pk, body__isnull=True)
                   .values_list("pk", flat=True))
        if not ids:
            return 0
        body = webhook_body(task, StepCheckpoint.objects.filter(task_id=task.pk)
                            .order_by("index"))
        return WebhookDelivery.objects.filter(pk__in=ids, body__isnull=True).update(
            body=body.decode("ascii"))

    # --- retention -------------------------------------------------------------------------
    # A task goes when its key expires — cleanup, or a re-trigger of the expired
    # key (OrmStore.delete_tasks either way) — which may be long before its
    # webhook's 24 hours are over, or before its first attempt. Its delivery
    # stays: it carries its owner, traceparent and task id, and its body is
    # fixed here, from the task and its steps, before they go; sending needs
    # nothing else (deliveries.py). Once such a delivery has ended, cleanup's
    # `deliveries_prune` removes it in batches (docs/webhooks.md, "Retries and
    # what is guaranteed").

    @in_callers_transaction
    def outlive_in_tx(self, task_ids: Iterable[Any]) -> int:
        """The tasks `task_ids` are about to be deleted (in the caller's
        transaction, under their row locks, before their steps go): their ended
        deliveries go with them; the pending ones stay, their body fixed now if
        it was not, marked `detached_at`. Returns how many stay; one query when
        the tasks have no delivery."""
        ids = list(task_ids)
        rows = list(WebhookDelivery.objects.filter(task_id__in=ids)
                    .annotate(no_body=ExpressionWrapper(Q(body__isnull=True),
                                                        output_field=BooleanField()))
                    .values_list("pk", "task_id", "state", "no_body"))
        if not rows:
            return 0
        ended = [pk for pk, _, state, _ in rows if state != DeliveryState.PENDING]
        if ended:
            WebhookDelivery.objects.filter(pk__in=ended)._raw_delete(WebhookDelivery.objects.db)
        unsigned = {task_id for _, task_id, state, no_body in rows
                    if state == DeliveryState.PENDING and no_body}
        if unsigned:
            steps: dict[Any, list[StepCheckpoint]] = {}
            for step in StepCheckpoint.objects.filter(task_id__in=unsigned).order_by("index"):
                steps.setdefault(step.task_id, []).append(step)
            for task in Task.objects.filter(pk__in=unsigned):
                WebhookDelivery.objects.filter(task_id=task.pk, state=DeliveryState.PENDING,
                                               body__isnull=True).update(
                    body=webhook_body(task, steps.get(task.pk, [])).decode("ascii"))
        staying = [pk for pk, _, state, _ in rows if state == DeliveryState.PENDING]
        if staying:
            WebhookDelivery.objects.filter(pk__in=staying).update(detached_at=Now())
        return len(staying)

    @in_callers_transaction
    def prune_detached_in_tx(self, batch_size: int) -> int:
        """Delete up to `batch_size` deliveries that outlived their task and have
        ended since, skipping rows others hold (a sender recording, a second
        cleanup), in the caller's transaction. Returns how many went. A pending
        one is never touched."""
        ids = list(self.detached_ended().select_for_update(skip_locked=True).order_by()
                   .values_list("pk", flat=True)[:batch_size])
        if ids:
            WebhookDelivery.objects.filter(pk__in=ids).exclude(
                state=DeliveryState.PENDING)._raw_delete(WebhookDelivery.objects.db)
        return len(ids)

    @staticmethod
    def detached_ended() -> QuerySet[WebhookDelivery]:
        return WebhookDelivery.objects.filter(detached_at__isnull=False).exclude(
            state=DeliveryState.PENDING)

    # --- endpoints (webhook_slots.py's breaker) --------------------------------------------

    @in_callers_transaction
    def endpoint_locked_in_tx(self, key: str) -> WebhookEndpoint:
        """The endpoint's row, FOR UPDATE; inserted first if it has none (a race
        of two inserts leaves one row: the second waits for the first and skips)."""
        row = WebhookEndpoint.objects.select_for_update().filter(key=key).first()
        if row is None:
            WebhookEndpoint.objects.bulk_create([WebhookEndpoint(key=key)],
                                                ignore_conflicts=True)
            row = WebhookEndpoint.objects.select_for_update().get(key=key)
        return row

    def endpoint_close(self, key: str) -> None:
        """A success closes the endpoint's breaker: one UPDATE, none at all when
        it was closed already."""
        (WebhookEndpoint.objects.filter(key=key)
         .filter(Q(failures__gt=0) | Q(trips__gt=0) | Q(paused_until__isnull=False))
         .update(failures=0, trips=0, paused_until=None))

    @in_callers_transaction
    def endpoint_save_in_tx(self, row: WebhookEndpoint) -> None:
        """Write a failure counted on a locked endpoint row (endpoint_locked)."""
        row.save(update_fields=["failures", "trips", "paused_until", "last_error",
                                "last_failure_at"])


__all__ = ["DeliveryStore"]
