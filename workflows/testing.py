"""Testing a workflow: run it synchronously through the real engine.

    from workflows.testing import run_workflow

    def test_sync_writes_every_order(db):
        task = run_workflow("acme.sync", {"batch": "b-1"})
        assert task.state == "succeeded"
        assert [s.name for s in task.steps.all()] == ["fetch", "write"]

`run_workflow` triggers the workflow as an API call would (`task_trigger`: the
payload is validated, the key recorded, the task row created), then plays
worker and dispatcher in this process until the task has finished: it calls
the engine's own `task_run` — claim, every step's checkpoint, retries,
compensations, the ending, all fenced and recorded exactly as a django-q2 worker
would — as many times as the run needs. It needs a database (pytest-django's
`db` or `transactional_db`, Django's `TestCase` or `TransactionTestCase`): it
writes real rows there and nowhere else.

Two things differ from production, both about time and nothing about order:

- a retry's backoff is not waited for: the task is made due at once (the
  attempt count, the error and the order of the attempts stay as they are);
- nothing is sent to a broker to be picked up later: the run happens here.

**Crashes.** `crash_at` names one of the engine's fault points
(`workflows.engine.FAULT_POINTS`); the worker "dies" there: the exception
`SimulatedCrash` escapes everything (only the open transaction rolls back, as
when a process is killed), then the lease is let run out and a dispatcher pass
recovers the task, as it would after a real crash, and the run goes on on a
"new worker". `crash_skip` lets that many passes through the point go by first
(`crash_at="after_checkpoint", crash_skip=1` dies right after the second step's
checkpoint), `crash_times` crashes more than once. The task's `attempts`
counts the lost ones, so a workflow that crashes more often than its
`max_attempts` ends failed — as in production.

The dispatcher pass (`dispatch_once`) is the real one and acts on every task in
the test database, not only this one; a test database holds only what the test
made.
"""

from __future__ import annotations

import contextlib
import uuid

from django.contrib.auth import get_user_model

from workflows.engine import (
    FAULT_POINTS,
    SimulatedCrash,
    dispatch_once,
    fault_armed,
    fault_point,
    task_expire_lease,
    task_run,
    task_signal,
    task_skip_backoff,
    task_trigger,
)
from workflows.models import Task
from workflows.rules.states import TaskState

__all__ = ["DEFAULT_OWNER", "WorkflowRunStuck", "run_workflow"]

# The user tasks run by `run_workflow` belong to unless `owner` names another.
DEFAULT_OWNER = "pilot-tests"


class WorkflowRunStuck(AssertionError):
    """The task did not finish in `max_deliveries` deliveries, or the engine
    could not run it (the database was unreachable, a bug in the engine)."""


def run_workflow(name: str, payload: dict | None = None, *, key: str | None = None,
                 owner=None, signals: dict[str, dict] | None = None,
                 crash_at: str | None = None, crash_skip: int = 0,
                 crash_times: int = 1, max_deliveries: int = 100) -> Task:
    """Trigger workflow `name` with `payload` and run it to its end in this
    process through the real engine; return the finished Task, read afresh
    (`state`, `result`, `error`, `error_type`, `attempts`; its checkpoints in
    order: `task.steps.all()`, each with `name`, `state`, `output`, `attempts`).

    `key` is the idempotency key (default: a new uuid); `owner` the user the
    task belongs to (default: the user "pilot-tests", created if missing).
    Refusals raise as they would answer the API: a bad payload
    (`ValidationFailed`), `UnknownWorkflow`, `IdempotencyKeyReused`... A key
    whose task has already finished replays it: the same task comes back, run
    once.

    Waits take no time: a timer (or a signal's timeout) is due at once. A
    signal wait consumes what `signals` sends ({name: payload}, each sent once,
    before the run, as a partner would early: the mailbox keeps it). Children
    the task starts run too, in the same rounds, until they end.

    `crash_at` / `crash_skip` / `crash_times`: kill the worker at an engine
    fault point (see the module docstring). Raises `WorkflowRunStuck` if the
    task has not finished after `max_deliveries` deliveries."""
    if crash_at is not None and crash_at not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {crash_at!r}; one of: {', '.join(FAULT_POINTS)}")
    if owner is None:
        owner, _ = get_user_model().objects.get_or_create(username=DEFAULT_OWNER)
    outcome = task_trigger(owner=owner, workflow=name, payload={} if payload is None else payload,
                           key=key or str(uuid.uuid4()))
    task_id = outcome.task.pk
    for signal_name, signal_payload in (signals or {}).items():
        task_signal(task_id=task_id, name=signal_name, payload=signal_payload,
                    key=f"run_workflow:{signal_name}", user=None,
                    actor="test:run_workflow")
    crashes = (fault_armed(crash_at, skip=crash_skip, times=crash_times) if crash_at
               else contextlib.nullcontext())
    with crashes:
        for _ in range(max_deliveries):
            task = Task.objects.get(pk=task_id)
            if task.is_finished:
                return task
            # its children (and theirs) run too, one delivery each a round
            for child_id in _open_descendants(task_id):
                _deliver(child_id)
            _deliver(task_id)
    task = Task.objects.get(pk=task_id)
    if task.is_finished:
        return task
    raise WorkflowRunStuck(f"task {task_id} ({name}) is still {task.state} after "
                           f"{max_deliveries} deliveries")


def _deliver(task_id) -> None:
    """One delivery of `task_id`'s message to a worker in this process."""
    task = Task.objects.get(pk=task_id)
    if task.is_finished:
        return
    # what waits out a backoff, a timer or a timeout is due now; a parent whose
    # children all ended is woken by the same pass
    skipped = task_skip_backoff(task_id=task.pk)
    if task.state == TaskState.WAITING and (skipped or task.waits_for.get("kind") == "children"):
        dispatch_once()  # wakes it
    try:
        report = task_run(task_id=task_id)
        fault_point("before_ack")  # where a worker acknowledges its message
    except SimulatedCrash:
        _worker_lost(task_id)
        return
    if report.outcome in ("error", "interrupted"):
        raise WorkflowRunStuck(
            f"the engine could not run task {task_id} ({report.outcome}); see the log")


def _open_descendants(task_id) -> list:
    """The children of `task_id`, theirs and so on, that have not ended."""
    found: list = []
    level = [task_id]
    while level:
        level = list(Task.objects.filter(parent_id__in=level)
                     .exclude(state__in=[TaskState.SUCCEEDED, TaskState.FAILED,
                                         TaskState.CANCELLED])
                     .order_by("parent_index").values_list("pk", flat=True))
        found += level
    return found


def _worker_lost(task_id) -> None:
    """After a simulated crash: the dead worker's lease runs out, and a
    dispatcher pass does what it does for a dead worker (a running task is
    recovered to retrying, or failed / compensated when no attempt is left; a
    compensation phase is left for the next worker to take over)."""
    task_expire_lease(task_id=task_id)
    dispatch_once()
