"""The engine: the only code that changes a task's state (docs/design.md,
"Layers and doors").

api/, admin/, management commands and worker.py call these functions; each one
locks what it changes, applies a django-fsm transition, saves and audits inside
one transaction, and says in its docstring what a second call does.

The names below are the engine's doors, re-exported from the modules that
define them: callers import them from here (`from workflows.engine import
task_trigger`). The modules themselves are the engine's inside.
"""

from workflows.engine.claims import task_claim, task_resume
from workflows.engine.cleanup import CleanupReport, q_results_prune, tasks_cleanup
from workflows.engine.context import StepContext
from workflows.engine.deliveries import (
    LOG_ENTRIES,
    RESEND_PERMISSION,
    deliveries_enqueue_due,
    delivery_resend,
    delivery_send,
)
from workflows.engine.dispatcher import DispatchReport, dispatch_once
from workflows.engine.enqueue import enqueue_on_commit, uses_orm_broker
from workflows.engine.leases import worker_id
from workflows.engine.loop import dispatcher_loop
from workflows.engine.operations import (
    task_cancel,
    task_restart,
    task_retry,
    transition_permission,
)
from workflows.engine.plans import cancel_plan, owed_compensations, retry_plan
from workflows.engine.runner import RunReport, task_run, tasks_drain
from workflows.engine.schedule_definitions import (
    SyncReport,
    schedule_delete,
    schedule_save,
    schedule_set_enabled,
    schedule_validate,
    schedules_sync_after_migrate,
    schedules_sync_declared,
)
from workflows.engine.scheduler_loop import scheduler_loop
from workflows.engine.schedules import ScheduleFireReport, database_now, schedules_fire_due
from workflows.engine.triggers import (
    CREATED,
    MAX_BATCH,
    REPLAYED,
    TriggerOutcome,
    TriggerRequest,
    payload_validate,
    task_trigger,
    task_trigger_many,
)

__all__ = [
    "CREATED",
    "LOG_ENTRIES",
    "MAX_BATCH",
    "REPLAYED",
    "RESEND_PERMISSION",
    "CleanupReport",
    "DispatchReport",
    "RunReport",
    "ScheduleFireReport",
    "StepContext",
    "SyncReport",
    "TriggerOutcome",
    "TriggerRequest",
    "cancel_plan",
    "database_now",
    "deliveries_enqueue_due",
    "delivery_resend",
    "delivery_send",
    "dispatch_once",
    "dispatcher_loop",
    "enqueue_on_commit",
    "owed_compensations",
    "payload_validate",
    "q_results_prune",
    "retry_plan",
    "schedule_delete",
    "schedule_save",
    "schedule_set_enabled",
    "schedule_validate",
    "scheduler_loop",
    "schedules_fire_due",
    "schedules_sync_after_migrate",
    "schedules_sync_declared",
    "task_cancel",
    "task_claim",
    "task_restart",
    "task_resume",
    "task_retry",
    "task_run",
    "task_trigger",
    "task_trigger_many",
    "tasks_cleanup",
    "tasks_drain",
    "transition_permission",
    "uses_orm_broker",
    "worker_id",
]
