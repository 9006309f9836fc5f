"""Named events: the one door through which the engine reports what it did.

`emit(Event.TASK_TRIGGERED, task_id=..., workflow=...)` writes a log record whose
message is the event name and whose `pilot` attribute holds the fields; the
formatters in `observability.logging` render it. Events that describe a
database change are emitted after commit (`emit_on_commit`), so a log line never
reports a change that rolled back.

`log_context(trace_id=...)` binds fields (typically the request's trace id) to
every event emitted inside it, in this thread or task; explicit fields win.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import types
from enum import StrEnum

from django.db import transaction

logger = logging.getLogger("pilot.events")

class Event(StrEnum):
    """Every event PILOT reports, by name (docs/operations.md lists what each
    says). A member is its name as a string (a log record's `event`); emitting a
    name that is not here is refused by tests/observability/test_events.py."""

    BROKER_RECONNECTED = "broker_reconnected"
    BROKER_UNREACHABLE = "broker_unreachable"
    CACHE_MISCONFIGURED = "cache_misconfigured"
    CACHE_UNAVAILABLE = "cache_unavailable"
    CANCEL_NOTICED = "cancel_noticed"
    CLAIM_ADOPTED = "claim_adopted"
    CLEANUP_BATCH = "cleanup_batch"
    CLEANUP_FINISHED = "cleanup_finished"
    COMPENSATION_FAILED = "compensation_failed"
    DATABASE_SWITCHED = "database_switched"
    DISPATCHER_ACTION = "dispatcher_action"
    DISPATCHER_DB_UNAVAILABLE = "dispatcher_db_unavailable"
    DISPATCHER_ERROR = "dispatcher_error"
    DISPATCHER_PASS = "dispatcher_pass"
    DISPATCHER_STARTED = "dispatcher_started"
    DISPATCHER_STOPPED = "dispatcher_stopped"
    ENQUEUE_FAILED = "enqueue_failed"
    HEARTBEAT_SKIPPED = "heartbeat_skipped"
    LEASE_LOST = "lease_lost"
    LOGIN_LOCKED_OUT = "login_locked_out"
    LOGIN_REFUSED_LOCKED_OUT = "login_refused_locked_out"
    LOGIN_REFUSED_UNAVAILABLE = "login_refused_unavailable"
    LOGIN_UNLOCKED = "login_unlocked"
    PASSWORD_CHECK_LOCKED_OUT = "password_check_locked_out"
    PROXY_SETTING_SUSPECT = "proxy_setting_suspect"
    Q_RESULTS_PRUNED = "q_results_pruned"
    READINESS_DEGRADED = "readiness_degraded"
    RETRY_SCHEDULED = "retry_scheduled"
    RUN_FAILED = "run_failed"
    RUN_INTERRUPTED = "run_interrupted"
    SIGNAL_RECEIVED = "signal_received"
    SCHEDULE_CREATED = "schedule_created"
    SCHEDULE_DELETED = "schedule_deleted"
    SCHEDULE_ENABLED = "schedule_enabled"
    SCHEDULE_FIRE_REFUSED = "schedule_fire_refused"
    SCHEDULE_FIRED = "schedule_fired"
    SCHEDULE_PAUSED = "schedule_paused"
    SCHEDULE_SLOTS_SKIPPED = "schedule_slots_skipped"
    SCHEDULE_UPDATED = "schedule_updated"
    SCHEDULER_DB_UNAVAILABLE = "scheduler_db_unavailable"
    SCHEDULER_ERROR = "scheduler_error"
    SCHEDULER_PASS = "scheduler_pass"
    SCHEDULER_STARTED = "scheduler_started"
    SCHEDULER_STOPPED = "scheduler_stopped"
    SCHEDULES_SYNCED = "schedules_synced"
    STEP_COMPENSATED = "step_compensated"
    STEP_FINISHED = "step_finished"
    STEP_STARTED = "step_started"
    TASK_CANCEL_REQUESTED = "task_cancel_requested"
    TASK_CLAIMED = "task_claimed"
    TASK_PARKED = "task_parked"
    TASK_RECOVERED = "task_recovered"
    TASK_REPLAYED = "task_replayed"
    TASK_RESTARTED = "task_restarted"
    TASK_TRANSITIONED = "task_transitioned"
    TASK_TRIGGERED = "task_triggered"
    TASK_WOKEN = "task_woken"
    TRIGGER_REFUSED = "trigger_refused"
    TRIGGER_RETRIED = "trigger_retried"
    WEBHOOK_CLAIM_LOST = "webhook_claim_lost"
    WEBHOOK_DELIVERED = "webhook_delivered"
    WEBHOOK_DELIVERIES_PRUNED = "webhook_deliveries_pruned"
    WEBHOOK_ENDPOINT_PAUSED = "webhook_endpoint_paused"
    WEBHOOK_ERROR = "webhook_error"
    WEBHOOK_FAILED = "webhook_failed"
    WEBHOOK_GAVE_UP = "webhook_gave_up"
    WEBHOOK_RESENT = "webhook_resent"
    CALLBACK_CHECKS_DEFERRED = "callback_checks_deferred"
    WEBHOOK_SECRET_UNREADABLE = "webhook_secret_unreadable"
    WORKER_STATS_UNAVAILABLE = "worker_stats_unavailable"


_listeners: list = []
# Never mutated in place (log_context sets a new dict), so sharing the empty
# default is safe; a MappingProxy keeps it that way.
_context: contextvars.ContextVar = contextvars.ContextVar(
    "pilot_log_context", default=types.MappingProxyType({}))


def add_listener(listener) -> None:
    """Call `listener(event, fields)` for every emitted event (metrics hook in here)."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def current_context() -> dict:
    """The fields bound by the innermost `log_context` (empty outside one)."""
    return dict(_context.get())


@contextlib.contextmanager
def log_context(**fields):
    """Bind `fields` to every event emitted inside the block (nested blocks add
    to the outer ones). Fields set to None are left out."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items()
                                               if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def emit(event: str, *, level: int = logging.INFO, **fields) -> None:
    context = _context.get()
    if context:
        merged = dict(context)
        for name, value in fields.items():
            if value not in (None, "") or name not in merged:  # an empty value keeps the bound one
                merged[name] = value
        fields = merged
    for listener in _listeners:
        try:
            listener(event, fields)
        except Exception:  # a broken metric must never break the engine
            logger.exception("event listener failed for %s", event)
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "pilot": fields})


def emit_on_commit(event: str, *, level: int = logging.INFO, **fields) -> None:
    """`emit` once the current transaction commits (at once outside one); never
    if it rolls back. The log context is the one in force now, not at commit."""
    context = _context.get()

    def send():
        token = _context.set(context)
        try:
            emit(event, level=level, **fields)
        finally:
            _context.reset(token)

    transaction.on_commit(send)
