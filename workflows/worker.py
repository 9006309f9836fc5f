"""django-q2 entry points. Thin: the engine does the work (STYLE)."""

from django.db import close_old_connections

from workflows.engine import faults
from workflows.engine.deliveries import delivery_send
from workflows.engine.runner import task_run


def run_task(task_id: str) -> str:
    """Claim and run one task; a duplicate or stale message is a no-op ("skipped")."""
    close_old_connections()  # a restarted database costs a reconnect, not a failure
    report = task_run(task_id=task_id)
    faults.fault_point("before_ack")
    return report.outcome


def deliver_webhook(message_id: str) -> str:
    """Send one completion webhook (by its webhook-id) once, if it is due and
    nobody else is sending it; a duplicate or stale message is "skipped"."""
    close_old_connections()
    return delivery_send(message_id=message_id).outcome
