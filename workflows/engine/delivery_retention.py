"""Webhook deliveries that outlive their task (docs/webhooks.md, "Retries and
what is guaranteed"; docs/design.md, "Cleanup").

A task goes when its key expires — cleanup, or a re-trigger of the expired
key (cleanup.tasks_delete either way) — which may be long before its
webhook's 24 hours are over, or before its first attempt. Its delivery stays:
it carries its owner, traceparent and task id, and its body is fixed here,
from the task and its steps, before they go. Sending needs nothing else
(deliveries.py). Once such a delivery has ended (delivered, given up),
`deliveries_prune` removes it, in batches, from cleanup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from workflows.models import DeliveryState, StepCheckpoint, Task, WebhookDelivery
from workflows.observability.events import Event, emit
from workflows.representation import webhook_body


def deliveries_outlive(task_ids: Iterable[Any]) -> int:
    """The tasks `task_ids` are about to be deleted (cleanup.tasks_delete, in
    its transaction, under the tasks' row locks, before their steps go): their
    deliveries that have ended (delivered, failed) are deleted with them; the
    pending ones stay — their body fixed now if it was not yet, marked
    `detached_at` — and go on being sent and retried until delivered or given
    up, then `deliveries_prune` removes them. Returns how many stay. One query
    when the tasks have no delivery."""
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


def deliveries_prune(*, batch_size: int = 1000, dry_run: bool = False) -> int:
    """Delete the deliveries that outlived their task and have ended since
    (delivered or failed), `batch_size` per transaction, skipping rows others
    hold (a sender recording, a second cleanup). Returns how many (would) go.
    A pending one is never touched: it is still owed."""
    done = WebhookDelivery.objects.filter(detached_at__isnull=False).exclude(
        state=DeliveryState.PENDING)
    if dry_run:
        return done.count()
    total = 0
    while True:
        with transaction.atomic():
            ids = list(done.select_for_update(skip_locked=True).order_by()
                       .values_list("pk", flat=True)[:batch_size])
            if ids:
                WebhookDelivery.objects.filter(pk__in=ids).exclude(
                    state=DeliveryState.PENDING)._raw_delete(WebhookDelivery.objects.db)
        total += len(ids)
        if len(ids) < batch_size:
            break
    if total:
        emit(Event.WEBHOOK_DELIVERIES_PRUNED, deleted=total)
    return total


__all__ = ["deliveries_outlive", "deliveries_prune"]
