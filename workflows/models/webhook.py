"""Completion webhooks (docs/webhooks.md): a client's signing secret and default
endpoint, and the outbox of deliveries.

`ClientWebhook` — one per API client: the `whsec_…` secret every delivery of
its tasks is signed with (shown once, by `create_api_client`), and the default
endpoint a trigger without `callback_url` gets. Written by workflows.accounts.

`WebhookDelivery` — one POST owed to a task's endpoint for one terminal state
it reached: the outbox row, inserted by the store in the same statement (or
transaction) as the terminal transition, so a committed ending always has its
delivery and a rolled-back one never does. Unique per (task, terminal state,
restarts): its `message_id` `<task id>:<state>:<n>` is the `webhook-id` a
receiver dedupes on. Sent and retried by workers (workflows.engine.deliveries),
each attempt claimed under `claim_token` (a version bumped by every claim, so a
sender whose claim expired can never record an outcome) and `claimed_until`.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workflows.states import FINISHED_STATES


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class ClientWebhook(models.Model):
    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                 primary_key=True, related_name="pilot_webhook")
    # The default endpoint of the client's tasks ("" = none: only tasks
    # triggered with a callback_url are delivered).
    url = models.CharField(max_length=2000, blank=True, default="")
    # "whsec_" + base64 of 32 random bytes; it signs, so it is stored as is and
    # never rendered on a page (docs/security.md).
    secret = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "client webhook"

    def __str__(self) -> str:
        return f"webhook of {self.owner}"


class WebhookDelivery(models.Model):
    task = models.ForeignKey("workflows.Task", on_delete=models.CASCADE,
                             related_name="deliveries")
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
            models.Index(fields=["next_attempt_at"], name="delivery_due_idx",
                         condition=Q(state=DeliveryState.PENDING)),
        ]

    def __str__(self) -> str:
        return self.message_id

    @property
    def message_id(self) -> str:
        """The `webhook-id` header: the same on every attempt and re-send."""
        return delivery_message_id(self.task_id, self.task_state, self.restarts)


def delivery_message_id(task_id: object, task_state: str, restarts: int) -> str:
    return f"{task_id}:{task_state}:{restarts}"


def delivery_message_parse(message_id: str) -> tuple[str, str, int] | None:
    """(task id, state, n) of a `webhook-id`, or None if it is not one."""
    parts = str(message_id).split(":")
    if len(parts) != 3 or parts[1] not in FINISHED_STATES or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])
