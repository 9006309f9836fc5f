"""django-q2 entry points. Thin: the engine does the work (docs/design.md)."""

from django.db import close_old_connections

from workflows.conf import pilot_settings
from workflows.engine import delivery_send, fault_point, task_run


def run_task(task_id: str) -> str:
    """Claim and run the task the message names (a duplicate or stale message is
    a no-op: "skipped"), then — the database is the queue — go on with the next
    due tasks for up to PILOT_DRAIN_SECONDS. Returns the named task's outcome."""
    close_old_connections()  # a restarted database costs a reconnect, not a failure
    report = task_run(task_id=task_id, drain_seconds=pilot_settings.PILOT_DRAIN_SECONDS)
    fault_point("before_ack")
    return report.outcome


def deliver_webhook(message_id: str) -> str:
    """Send one completion webhook (by its webhook-id) once, if it is due and
    nobody else is sending it; a duplicate or stale message is "skipped"."""
    close_old_connections()
    return delivery_send(message_id=message_id).outcome
