"""Compensation (saga): undo succeeded steps in reverse order (SPEC §7).

Runs when a task fails for good (state `running`) or is cancelled (state
`cancelling`), under the worker's fence for that state. Each compensation body
runs outside any transaction; its step then becomes `compensated`. A step
without a compensation stays `succeeded` (nothing to undo).

A compensation that raises stops the saga: the failing step stays `succeeded`
with "compensation failed: …" in its error, the steps before it stay
`succeeded` too, and the problem is returned so that the task ends with
error_type CompensationFailed. Nothing is hidden: an operator sees which effect
is still in place, and a retry resumes with those steps memoized.
"""

from __future__ import annotations

from workflows.engine import checkpoints
from workflows.engine.context import StepContext
from workflows.engine.leases import Lease
from workflows.models import StepCheckpoint, Task
from workflows.observability.events import emit
from workflows.registry import Step
from workflows.states import StepState


def compensate(lease: Lease, task: Task, plan: list[Step], *, states) -> str | None:
    """Run the compensations of `task`'s succeeded steps, last first. Returns None
    when all ran, or a description of the one that failed."""
    done = (StepCheckpoint.objects.filter(task_id=task.pk, state=StepState.SUCCEEDED)
            .order_by("-index"))
    for cp in done:
        step = plan[cp.index] if cp.index < len(plan) else None
        if step is None or step.name != cp.name or step.compensation is None:
            continue
        ctx = StepContext(lease=lease, workflow=task.workflow, payload=task.payload,
                          outputs={}, attempt=task.attempts, step_index=cp.index,
                          step_name=cp.name, output=cp.output, fence_states=states)
        try:
            step.compensation(ctx)
        except Exception as exc:  # noqa: BLE001 - recorded for the operator
            error = f"{type(exc).__name__}: {exc}"
            checkpoints.step_compensation_failed(lease, index=cp.index, name=cp.name,
                                                 error=error, states=states)
            emit("compensation_failed", task_id=str(task.pk), workflow=task.workflow,
                 step=cp.name, error_type=type(exc).__name__)
            return f"compensation of step {cp.name!r} failed: {error}"
        checkpoints.step_compensated(lease, index=cp.index, name=cp.name, states=states)
        emit("step_compensated", task_id=str(task.pk), workflow=task.workflow, step=cp.name)
    return None


def needs_compensation(task: Task, plan: list[Step]) -> bool:
    """Does `task` have a succeeded step with a compensation to run?"""
    compensable = {(i, s.name) for i, s in enumerate(plan) if s.compensation is not None}
    if not compensable:
        return False
    done = StepCheckpoint.objects.filter(task_id=task.pk, state=StepState.SUCCEEDED)
    return any((cp.index, cp.name) in compensable for cp in done.only("index", "name"))
