"""Completion webhooks on the task page (docs/webhooks.md): each delivery with
its attempts, and the operator's re-send.

`delivery_views(task, now)` reads a task's deliveries (one query, only when
the task has an endpoint; one more when one is pending) and shapes each
attempt for the template — an attempt counted but without a recorded outcome
is one whose sender was lost (or is in flight right now) — and what a pending
one waits for: its endpoint paused by the circuit breaker (until when, after
how many failures), or a free slot (its client's or endpoint's attempts in
flight at their cap; docs/webhooks.md, "Slow and failing receivers"). `now`
is the database's. `resend_view` is `<task>/webhook/<delivery>/resend/`: GET
shows what would happen, POST calls the engine (`delivery_resend`), logs the
console action and returns to the task page with the outcome.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.dateparse import parse_datetime

from workflows.admin.audit import action_message, console_action_log
from workflows.admin.forms import ReasonForm
from workflows.engine import LOG_ENTRIES, RESEND_PERMISSION, delivery_resend
from workflows.models import DeliveryState, WebhookDelivery, WebhookEndpoint
from workflows.rules.errors import PilotError


@dataclasses.dataclass
class AttemptView:
    n: int
    at: object = None
    status: int | None = None
    error: str = ""
    ms: float | None = None
    lost: bool = False  # counted, no outcome recorded


@dataclasses.dataclass
class DeliveryView:
    delivery: WebhookDelivery
    attempts: list[AttemptView]
    paused: WebhookEndpoint | None = None  # its endpoint, while the breaker pauses it
    waiting: bool = False  # due, owed a message: waits for a free slot


def _attempts(delivery: WebhookDelivery) -> list[AttemptView]:
    logged = {entry.get("n"): entry for entry in delivery.attempt_log or []}
    # A full log has dropped its oldest entries; a shorter one misses only the
    # attempts whose outcome was never recorded.
    first = min(logged, default=1) if len(logged) >= LOG_ENTRIES else 1
    views = []
    for n in range(first, delivery.attempts + 1):
        entry = logged.get(n)
        if entry is None:
            views.append(AttemptView(n, lost=True))
        else:
            views.append(AttemptView(n, parse_datetime(entry.get("at") or ""),
                                     entry.get("status"), entry.get("error") or "",
                                     entry.get("ms")))
    return views


def delivery_views(task, now: datetime) -> list[DeliveryView]:
    if not task.callback_url:
        return []
    deliveries = list(WebhookDelivery.objects.filter(task_id=task.pk).order_by("id"))
    endpoints = {d.endpoint for d in deliveries if d.state == DeliveryState.PENDING
                 and d.endpoint}
    paused = {row.key: row for row in WebhookEndpoint.objects.filter(
        key__in=endpoints, paused_until__gt=now)} if endpoints else {}
    views = []
    for d in deliveries:
        view = DeliveryView(d, _attempts(d))
        if d.state == DeliveryState.PENDING:
            view.paused = None if d.resend_owed else paused.get(d.endpoint)
            view.waiting = (view.paused is None and d.enqueued_at is None
                            and d.next_attempt_at <= now
                            and (d.claimed_until is None or d.claimed_until <= now))
        views.append(view)
    return views


def can_resend(user) -> bool:
    return bool(user and user.is_active and user.has_perm(RESEND_PERMISSION))


def resend_view(model_admin, request, object_id, delivery_id):
    if not (can_resend(request.user) and model_admin.has_view_permission(request)):
        raise PermissionDenied(f"Re-sending needs the permission {RESEND_PERMISSION} "
                               "(and workflows.view_task)")
    task = model_admin.get_object(request, object_id)
    delivery = (WebhookDelivery.objects.filter(pk=delivery_id, task_id=task.pk).first()
                if task is not None else None)
    if delivery is None:
        raise Http404("No such delivery")
    task_url = reverse("admin:workflows_task_change", args=[task.pk])
    form = ReasonForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        reason = form.cleaned_data["reason"]
        try:
            sent = delivery_resend(delivery_id=delivery.pk, user=request.user, reason=reason)
        except PilotError as exc:
            messages.error(request, f"Re-send refused — {exc.code}: {exc.detail}")
        else:
            console_action_log(request.user, [task],
                               action_message(f"Re-send webhook {sent.message_id}", reason))
            messages.success(request, f"Webhook {sent.message_id} will be sent again now.")
        return HttpResponseRedirect(task_url)
    return TemplateResponse(request, "pilot/admin/delivery_resend.html", {
        **model_admin.admin_site.each_context(request), "opts": model_admin.model._meta,
        "title": "Re-send webhook: confirm", "original": task, "delivery": delivery,
        "form": form, "cancel_url": task_url})
