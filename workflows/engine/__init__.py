"""The engine: the only code that changes a task's state (docs/design.md,
"Layers and doors").

api/, admin/, management commands, worker.py and testing.py call these
functions; each one locks what it changes, applies a django-fsm transition,
saves and audits inside one transaction, and says in its docstring what a
second call does.

The names below are the engine's face, re-exported from the modules that
define them: doors import them from here (`from workflows.engine import
task_trigger`) and never a module below it — import-linter holds that
(pyproject.toml). The modules themselves are the engine's inside.
"""

from workflows.engine.cleanup import (
    DEFAULT_BATCH as CLEANUP_DEFAULT_BATCH,
)
from workflows.engine.cleanup import (
    DEFAULT_YIELD as CLEANUP_DEFAULT_YIELD,
)
from workflows.engine.cleanup import (
    MAX_BATCH as CLEANUP_MAX_BATCH,
)
from workflows.engine.cleanup import q_results_prune, tasks_cleanup
from workflows.engine.context import StepContext
from workflows.engine.deliveries import (
    LOG_ENTRIES,
    RESEND_PERMISSION,
    delivery_resend,
    delivery_send,
)
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.enqueue import broker, uses_orm_broker
from workflows.engine.faults import POINTS as FAULT_POINTS
from workflows.engine.faults import SimulatedCrash, fault_point
from workflows.engine.faults import armed as fault_armed
from workflows.engine.leases import worker_id
from workflows.engine.loop import dispatcher_loop, scheduler_loop
from workflows.engine.operations import (
    task_cancel,
    task_expire_lease,
    task_retry,
    task_skip_backoff,
    transition_permission,
)
from workflows.engine.plans import cancel_plan, owed_compensations, retry_plan
from workflows.engine.run import task_run
from workflows.engine.schedule_definitions import (
    schedule_delete,
    schedule_save,
    schedule_set_enabled,
    schedule_validate,
    schedules_sync_after_migrate,
    schedules_sync_declared,
)
from workflows.engine.schedules import schedule_run_now, schedule_run_now_key, schedules_fire_due
from workflows.engine.shutdown import STOP_FLAG_ENV, stop_announce
from workflows.engine.signals import SignalOutcome, task_signal
from workflows.engine.store import database_now
from workflows.engine.store.rows import CANCELLED_WHILE_RUNNING
from workflows.engine.triggers import (
    CREATED,
    MAX_BATCH,
    REPLAYED,
    TriggerOutcome,
    TriggerRequest,
    task_trigger,
    task_trigger_many,
)
from workflows.engine.why import Why, client_shares, why_not_running

__all__ = [
    "CANCELLED_WHILE_RUNNING",
    "CLEANUP_DEFAULT_BATCH",
    "CLEANUP_DEFAULT_YIELD",
    "CLEANUP_MAX_BATCH",
    "CREATED",
    "FAULT_POINTS",
    "LOG_ENTRIES",
    "MAX_BATCH",
    "REPLAYED",
    "RESEND_PERMISSION",
    "STOP_FLAG_ENV",
    "SignalOutcome",
    "SimulatedCrash",
    "StepContext",
    "TriggerOutcome",
    "TriggerRequest",
    "Why",
    "broker",
    "cancel_plan",
    "client_shares",
    "database_now",
    "delivery_resend",
    "delivery_send",
    "dispatch_once",
    "dispatcher_loop",
    "fault_armed",
    "fault_point",
    "owed_compensations",
    "q_results_prune",
    "retry_plan",
    "schedule_delete",
    "schedule_run_now",
    "schedule_run_now_key",
    "schedule_save",
    "schedule_set_enabled",
    "schedule_validate",
    "scheduler_loop",
    "schedules_fire_due",
    "schedules_sync_after_migrate",
    "schedules_sync_declared",
    "stop_announce",
    "task_cancel",
    "task_expire_lease",
    "task_retry",
    "task_run",
    "task_signal",
    "task_skip_backoff",
    "task_trigger",
    "task_trigger_many",
    "tasks_cleanup",
    "transition_permission",
    "uses_orm_broker",
    "why_not_running",
    "worker_id",
]
