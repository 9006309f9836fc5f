"""Completion webhooks (docs/webhooks.md): a client's signing secret and default
endpoint, the outbox of deliveries, and each receiver's circuit breaker.

`ClientWebhook` — one per API client: the `whsec_…` secret every delivery of
its tasks is signed with (shown once, by `create_api_client`), and the default
endpoint a trigger without `callback_url` gets. Written by workflows.accounts.

`WebhookDelivery` — one POST owed to a task's endpoint for one terminal state
it reached: the outbox row, inserted by the store in the same statement (or
transaction) as the terminal transition, so a committed ending always has its
delivery and a rolled-back one never does. Unique per (task, terminal state,
restarts): its `message_id` `<task id>:<state>:<n>` is the `webhook-id` a
receiver dedupes on. Sent and retried by workers (workflows.engine.deliveries),
each attempt claimed under `claim_token` (a version bumped by every claim and
every operator re-send, so a sender whose claim expired can never record an
outcome) and `claimed_until`. A delivery outlives its task: it carries what a
send needs without it (below), and cleanup removes it once it has ended.

`WebhookEndpoint` — one receiver (`host:port`) as every worker sees it: its
consecutive failures and, once they reach PILOT_WEBHOOK_BREAKER_FAILURES, the
time until which its deliveries are paused (the circuit breaker,
workflows.engine.webhook_slots). A row appears with the endpoint's first claim.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workflows.rules.states import FINISHED_STATES


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


# A delivery failing: retrying (an attempt failed, more to come) or given up.
FAILING_DELIVERY = (Q(state=DeliveryState.FAILED)
                    | Q(state=DeliveryState.PENDING, attempts__gt=0))


class ClientWebhook(models.Model):
    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                 primary_key=True, related_name="pilot_webhook")
    # The default endpoint of the client's tasks ("" = none: only tasks
    # triggered with a callback_url are delivered).
    url = models.CharField(max_length=2000, blank=True, default="")
    # "whsec_" + base64 of 32 random bytes, sealed (workflows.accounts.vault:
    # `fernet:…`, under a key the database does not hold), never rendered on a
    # page (docs/security.md).
    secret = models.TextField()
    # The secret a rotation replaced, sealed the same way: deliveries carry its
    # signature beside the new one's until `previous_until` (PILOT_ROTATION_OVERLAP_SECONDS),
    # so receivers can switch over without refusing one ("" = none).
    previous_secret = models.TextField(blank=True, default="", db_default="")
    previous_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "client webhook"

    def __str__(self) -> str:
        return f"webhook of {self.owner}"


class WebhookDelivery(models.Model):
    # The task it announces — a reference without a database constraint, and
    # nothing done to the delivery when the task is deleted: a delivery outlives
    # its task (cleanup, an expired key's re-trigger) until it is delivered or
    # given up (docs/webhooks.md, "Retries and what is guaranteed"). `task_id`
    # stays as it was, the <task id> of the webhook-id. Everything else a send
    # needs is on the row: `owner` (the signing secret, the client's cap),
    # `traceparent`, and the body, fixed before the task goes
    # (engine/store/deliveries.py, `outlive`). A nullable reference plus a copied id
    # would say the same with two columns and a webhook-id that changes its
    # source; this keeps one.
    task = models.ForeignKey("workflows.Task", on_delete=models.DO_NOTHING,
                             db_constraint=False, related_name="deliveries")
    # The task's owner, copied at insert. The caps' counts by owner read only
    # the rows in flight (pilot_delivery_claimed_idx); the console's list by
    # client has pilot_delivery_owner_id_idx.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="+", db_index=False)
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")
    task_state = models.CharField(max_length=20)  # the terminal state it announces
    restarts = models.PositiveIntegerField()      # the task's restarts then: <n>
    url = models.CharField(max_length=2000)
    state = models.CharField(max_length=10, choices=DeliveryState.choices,
                             default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # The last attempts, oldest first: [{"n", "at", "status", "error", "ms"}].
    attempt_log = models.JSONField(default=list, blank=True)
    # The signed bytes, fixed at the first attempt so every retry sends the same.
    body = models.TextField(null=True, blank=True)  # noqa: DJ001 - NULL: not signed yet
    claim_token = models.PositiveBigIntegerField(default=0)
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField()
    enqueued_at = models.DateTimeField(null=True, blank=True)
    give_up_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The receiver's `host:port` (targets.Target.endpoint), written by the first
    # claim ("" before): what the per-endpoint cap and the breaker count by.
    endpoint = models.CharField(max_length=2000, blank=True, default="", db_default="")
    # An operator's re-send not yet attempted: it goes even while its endpoint
    # is paused by the breaker (the caps still apply).
    resend_owed = models.BooleanField(default=False, db_default=False)
    # When its task was deleted with the delivery still pending (NULL while the
    # task exists); cleanup removes it once it has ended.
    detached_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            # One delivery per terminal state a task reaches: the arbiter that
            # makes `<task id>:<state>:<n>` a stable id. Also serves a task's
            # deliveries (task_id first).
            models.UniqueConstraint(fields=["task", "task_state", "restarts"],
                                    name="delivery_task_event_uniq"),
            models.CheckConstraint(condition=Q(state__in=DeliveryState.values),
                                   name="delivery_state_valid_chk"),
            models.CheckConstraint(condition=Q(task_state__in=list(FINISHED_STATES)),
                                   name="delivery_task_state_valid_chk"),
        ]
        indexes = [
            # Dispatcher: pending deliveries that are due (next_attempt_at <= now),
            # unclaimed, needing a message.
            models.Index(fields=["next_attempt_at"], name="pilot_delivery_due_idx",
                         condition=Q(state=DeliveryState.PENDING)),
            # The caps: the attempts in flight (claimed_until > now) by owner and
            # by endpoint — a claim's exact count and the dispatcher's slots. Only
            # claimed rows: a record sets claimed_until back to NULL.
            models.Index(fields=["claimed_until"], name="pilot_delivery_claimed_idx",
                         condition=Q(claimed_until__isnull=False)),
            # The caps: pending deliveries whose message is on its way (it will
            # try for a slot first) — the dispatcher's slots.
            models.Index(fields=["enqueued_at"], name="pilot_delivery_sent_idx",
                         condition=Q(enqueued_at__isnull=False, state=DeliveryState.PENDING)),
            # A sender handing its freed slot on: the due deliveries owed a message
            # (a claim refused for a slot, a retry) of its client, of its endpoint.
            models.Index(fields=["owner", "next_attempt_at"], name="pilot_delivery_owed_owner_idx",
                         condition=Q(enqueued_at__isnull=True, state=DeliveryState.PENDING)),
            models.Index(fields=["endpoint", "next_attempt_at"],
                         name="pilot_delivery_owed_ep_idx",
                         condition=Q(enqueued_at__isnull=True, state=DeliveryState.PENDING)),
            # The console (workflows/admin/fleet_webhooks.py): the dashboard's
            # deliveries retrying or given up in the last 24 h, by last attempt;
            # the deliveries list filtered to those, newest first; and by
            # endpoint, by client, newest first. The failing ones are few:
            # partial indexes that stay small.
            models.Index(fields=["last_attempt_at"], name="pilot_delivery_failing_idx",
                         condition=FAILING_DELIVERY),
            models.Index(fields=["id"], name="pilot_delivery_failing_id_idx",
                         condition=FAILING_DELIVERY),
            models.Index(fields=["endpoint", "id"], name="pilot_delivery_endpoint_id_idx"),
            models.Index(fields=["owner", "id"], name="pilot_delivery_owner_id_idx"),
            # Cleanup: deliveries whose task is gone (to remove once they ended).
            models.Index(fields=["id"], name="pilot_delivery_detached_idx",
                         condition=Q(detached_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.message_id

    @property
    def message_id(self) -> str:
        """The `webhook-id` header: the same on every attempt and re-send."""
        return delivery_message_id(self.task_id, self.task_state, self.restarts)


class WebhookEndpoint(models.Model):
    """One receiver's circuit breaker (workflows.engine.webhook_slots): after
    PILOT_WEBHOOK_BREAKER_FAILURES failed attempts in a row its deliveries are
    paused until `paused_until` — a window that doubles with every trip
    (`trips`) up to PILOT_WEBHOOK_MAX_DELAY_SECONDS; a success closes it. Its
    row is also the lock a claim takes to count the endpoint's attempts in
    flight."""

    key = models.CharField(max_length=2000, primary_key=True)  # host:port
    failures = models.PositiveIntegerField(default=0)  # failed attempts in a row
    trips = models.PositiveIntegerField(default=0)  # times paused since the last success
    paused_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_failure_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "webhook endpoint"
        indexes = [
            # The dispatcher's slots, every pass: the endpoints paused or probing
            # (both have failures > 0; a success puts a row back to 0).
            models.Index(fields=["key"], name="pilot_endpoint_failing_idx",
                         condition=Q(failures__gt=0)),
        ]

    def __str__(self) -> str:
        return self.key


def delivery_message_id(task_id: object, task_state: str, restarts: int) -> str:
    return f"{task_id}:{task_state}:{restarts}"


def delivery_message_parse(message_id: str) -> tuple[str, str, int] | None:
    """(task id, state, n) of a `webhook-id`, or None if it is not one."""
    parts = str(message_id).split(":")
    if len(parts) != 3 or parts[1] not in FINISHED_STATES or not parts[2].isdigit():
        return None
    try:
        uuid.UUID(parts[0])
    except ValueError:
        return None
    return parts[0], parts[1], int(parts[2])
