"""Operator actions — cancel, retry, retry from start — defined once for the
task page's buttons, its transition URLs and the list's bulk actions, so the
list and the detail page behave the same.

An action is available on a task when django-fsm says the user may take its
transition from the task's current state (`has_transition_perm`: the edge is
legal AND the user holds the permission declared on it). `plan` is the dry run
shown on the confirmation page; `apply` is one call into the engine per task —
its own short transaction that locks the row, re-checks legality and
permission (the admin passes `owner_may=False`), transitions, audits and
enqueues. The admin never changes a task itself.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from django_fsm import has_transition_perm

from workflows.engine import (
    cancel_plan,
    owed_compensations,
    retry_plan,
    task_cancel,
    task_retry,
    transition_permission,
)
from workflows.models import StepCheckpoint, Task
from workflows.rules.errors import PilotError


@dataclasses.dataclass(frozen=True)
class OperatorAction:
    name: str          # URL and form value: cancel | retry | retry_from_start
    label: str
    transition: str    # the Task FSM transition it takes
    bulk_name: str     # the list's admin action (TaskAdmin method) that runs it
    from_start: bool = False

    @property
    def permission(self) -> str:
        return transition_permission(self.transition)

    def permitted(self, user) -> bool:
        return bool(user and user.is_active and user.has_perm(self.permission))

    def available(self, task: Task, user) -> bool:
        """Legal from the task's state and permitted to `user` (django-fsm decides both)."""
        return bool(user and user.is_active) and has_transition_perm(
            getattr(task, self.transition), user)

    def apply(self, *, task_id, user, reason: str, from_step: str | None = None) -> Task:
        """Take the action through the engine; raises the engine's PilotError.
        `from_step`: a retry's first step to run again (the task page's form)."""
        if self.transition == "cancel":
            return task_cancel(task_id=task_id, user=user, reason=reason, owner_may=False)
        return task_retry(task_id=task_id, user=user, from_start=self.from_start,
                          from_step=from_step, reason=reason, owner_may=False)


CANCEL = OperatorAction("cancel", "Cancel", "cancel", "cancel_selected")
RETRY = OperatorAction("retry", "Retry", "retry", "retry_selected")
RETRY_FROM_START = OperatorAction("retry_from_start", "Retry from start", "retry",
                                  "retry_selected_from_start", from_start=True)
ACTIONS = {a.name: a for a in (CANCEL, RETRY, RETRY_FROM_START)}


def actions_available(task: Task, user) -> list[OperatorAction]:
    return [a for a in ACTIONS.values() if a.available(task, user)]


@dataclasses.dataclass
class PlannedChange:
    """What confirming would do to one task (the dry run)."""

    task: Task
    changes: bool
    outcome: str       # e.g. "running → cancelling", or "no change"
    detail: str


@dataclasses.dataclass
class AppliedChange:
    """What happened to one task when the action was confirmed."""

    task_id: object
    label: str
    ok: bool
    before: str
    after: str
    detail: str
    task: Task | None = None  # as the engine left it (ok only)


def _steps_of(tasks: list[Task]) -> dict:
    """{task id: [StepCheckpoint, …]} in one query."""
    steps: dict = defaultdict(list)
    for cp in StepCheckpoint.objects.filter(task_id__in=[t.pk for t in tasks]).order_by("index"):
        steps[cp.task_id].append(cp)
    return steps


def _plan_cancel(task: Task, owed: list[str]) -> PlannedChange:
    plan = cancel_plan(task, owed)
    if not plan.allowed:
        return PlannedChange(task, False, "no change", plan.summary)
    return PlannedChange(task, True, f"{task.state} → {plan.target}", plan.summary)


def _plan_retry(task: Task, steps: list, *, from_start: bool,
                from_step: str | None = None) -> PlannedChange:
    plan = retry_plan(task, steps, from_start=from_start, from_step=from_step)
    if not plan.allowed:
        return PlannedChange(task, False, "no change", plan.summary)
    return PlannedChange(task, True, f"{task.state} → pending",
                         f"{plan.summary}; a fresh budget of {plan.budget} attempt(s)")


def actions_plan(action: OperatorAction, tasks: list[Task], *,
                 from_step: str | None = None) -> list[PlannedChange]:
    """The dry run of `action` over `tasks`, decided by the engine's own plans
    (`cancel_plan`, `retry_plan`) from one read of their checkpoints, no writes.
    The real outcome is decided again, under lock, by `apply`."""
    if action.transition == "cancel":
        owed = owed_compensations([t.pk for t in tasks])
        return [_plan_cancel(task, owed.get(task.pk, [])) for task in tasks]
    steps = _steps_of(tasks)
    return [_plan_retry(task, steps[task.pk], from_start=action.from_start,
                        from_step=from_step) for task in tasks]


def actions_apply(action: OperatorAction, tasks: list[Task], *, user, reason: str,
                  from_step: str | None = None) -> list[AppliedChange]:
    """Apply `action` to each task in turn, each in its own engine transaction:
    one task's refusal never rolls back another's change."""
    results = []
    for task in tasks:
        try:
            changed = action.apply(task_id=task.pk, user=user, reason=reason,
                                   from_step=from_step)
        except PilotError as exc:
            results.append(AppliedChange(task.pk, str(task), False, task.state, task.state,
                                         f"{exc.code}: {exc.detail}"))
            continue
        results.append(AppliedChange(task.pk, str(task), True, task.state, changed.state,
                                     f"{task.state} → {changed.state}", changed))
    return results
