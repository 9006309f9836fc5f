"""TaskSignal: a signal sent to a task — a partner's callback, an operator's
approval (docs/waiting.md).

Stored before the sender hears 202, so nothing acknowledged is lost; kept when
it arrives before the task waits for it (a mailbox). A wait consumes the
oldest unconsumed signal of its name, once: `consumed_at` and `consumed_step`
are written in the transaction that records the wait step's success, under
the task's row lock and its worker's fence, so no two waits — nor a stale
worker — ever consume the same signal. Keys are the sender's, scoped to the
task (the trigger's key rules): the same key and payload is a replay, the key
with another payload is refused.
"""

from django.db import models
from django.db.models import Q

from workflows.rules.keys import MAX_KEY_LENGTH


class TaskSignal(models.Model):
    # Indexed through pilot_signal_task_key_uniq (task_id is its first column).
    task = models.ForeignKey("workflows.Task", on_delete=models.CASCADE, related_name="signals",
                             db_index=False)
    name = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=MAX_KEY_LENGTH)
    # SHA-256 of the canonical JSON of name + payload: decides "same signal".
    fingerprint = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    # Who sent it: "client:<name>", "user:<name>", "cli:<name>".
    actor = models.CharField(max_length=200)
    received_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)
    # The index of the wait step that consumed it.
    consumed_step = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["task", "id"]
        constraints = [
            # The arbiter of concurrent sends of one key.
            models.UniqueConstraint(fields=["task", "idempotency_key"],
                                    name="pilot_signal_task_key_uniq"),
            models.CheckConstraint(condition=Q(consumed_at__isnull=True)
                                   | Q(consumed_step__isnull=False),
                                   name="pilot_signal_consumed_by_chk"),
        ]
        indexes = [
            # A wait's mailbox: the oldest unconsumed signal of a name.
            models.Index(fields=["task", "name", "id"], name="pilot_signal_mailbox_idx",
                         condition=Q(consumed_at__isnull=True)),
        ]

    def __str__(self) -> str:
        state = "consumed" if self.consumed_at else "waiting"
        return f"{self.name} ({state})"
