"""Plans: what a run, a cancel or a retry will do, decided before it is done.

- `Plan.build(task, checkpoints)`: the run a claim carries out, built once at
  claim time from the workflow's steps for the task's payload and the stored
  checkpoints. It refuses (PlanUnavailable) when the workflow is gone, its
  plan raises, or a checkpoint names a different step than the workflow now
  has at that index (WorkflowChanged: resuming would skip the wrong step).
- `cancel_plan(task, owed)` and `retry_plan(task, ...)`: pure decisions that
  the engine applies (operations.py) and the console shows as its dry run, so
  the two can never disagree.

Nothing here touches the database except `owed_compensations`, a read.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from workflows.models import StepCheckpoint, Task
from workflows.registry import Step, Workflow, registry, unknown_workflow_message
from workflows.rules.errors import WorkflowChanged, WorkflowVersionMissing
from workflows.rules.states import TO_COMPENSATE, StepState, TaskState


class PlanUnavailable(Exception):  # noqa: N818 - names the condition
    """The run cannot be planned; `reason` says why, `error_type` classifies it."""

    def __init__(self, reason: str, error_type: str):
        self.reason, self.error_type = reason, error_type
        super().__init__(reason)


@dataclasses.dataclass
class Plan:
    workflow: Workflow
    steps: list[Step]
    checkpoints: dict[int, StepCheckpoint]

    @classmethod
    def build(cls, task: Task, checkpoints: dict[int, StepCheckpoint]) -> Plan:
        workflow = registry.for_task(task)
        if workflow is None:
            if registry.find(task.workflow) is None:
                raise PlanUnavailable(unknown_workflow_message(task.workflow),
                                      "UnknownWorkflow")
            missing = WorkflowVersionMissing(
                f"version {task.version} of {task.workflow} is no longer registered (the "
                f"task was triggered on it; registered: "
                f"{', '.join(str(w.version) for w in registry.versions(task.workflow))}); "
                "no step of another version runs for it")
            raise PlanUnavailable(str(missing), "WorkflowVersionMissing")
        try:
            steps = list(workflow.steps_for(task.payload))
        except Exception as exc:  # noqa: BLE001 - the workflow's own code raised
            raise PlanUnavailable(f"the plan of {workflow.name} raised "
                                  f"{type(exc).__name__}: {exc}", type(exc).__name__) from None
        for index, cp in checkpoints.items():
            if cp.state == StepState.PENDING:
                continue
            if index >= len(steps) or cp.name != steps[index].name:
                expected = repr(steps[index].name) if index < len(steps) else "no step"
                problem = WorkflowChanged(
                    f"checkpoint {index} is step {cp.name!r} but {workflow.name} now has "
                    f"{expected} there; resuming would skip the wrong step")
                raise PlanUnavailable(str(problem), "WorkflowChanged")
        return cls(workflow, steps, checkpoints)

    def done(self) -> dict[int, object]:
        """{index: output} of the succeeded steps (memoized for this run)."""
        return {i: cp.output for i, cp in self.checkpoints.items()
                if cp.state == StepState.SUCCEEDED and i < len(self.steps)}

    def todo(self) -> list[int]:
        done = self.done()
        return [i for i in range(len(self.steps)) if i not in done]

    def attempts_of(self, index: int) -> int:
        cp = self.checkpoints.get(index)
        return cp.attempts if cp else 0

    def progress_of(self, index: int) -> Any:
        cp = self.checkpoints.get(index)
        return cp.progress if cp else None

    def step_at(self, index: int, name: str) -> Step | None:
        """The step at `index` if it is still the one called `name`."""
        if index < len(self.steps) and self.steps[index].name == name:
            return self.steps[index]
        return None


def owed_compensations(task_ids: Iterable[Any]) -> dict[Any, list[str]]:
    """{task id: [step names whose compensation is still owed, last first]}
    for the given tasks, from the checkpoints alone (no workflow code)."""
    owed: dict[Any, list[str]] = defaultdict(list)
    rows = (StepCheckpoint.objects.filter(task_id__in=list(task_ids), state__in=TO_COMPENSATE,
                                          compensable=True)
            .order_by("task_id", "-index").values_list("task_id", "name"))
    for task_id, name in rows:
        owed[task_id].append(name)
    return owed


@dataclasses.dataclass(frozen=True)
class CancelPlan:
    allowed: bool
    summary: str                 # the outcome in plain words, for the dry run
    target: str | None = None    # cancelled | cancelling
    compensate: bool = False     # a worker must run compensations first
    enqueue: bool = False        # send it to a worker now (nobody holds it)

    @property
    def change(self) -> str:
        return f"→ {self.target}" if self.allowed else "no change"


def cancel_plan(task: Task, owed: list[str]) -> CancelPlan:
    """What cancelling `task` does, given the steps whose compensation it owes."""
    if task.state == TaskState.RUNNING:
        return CancelPlan(True, "its worker stops at the next step boundary or heartbeat, runs "
                          "the compensations of finished steps, then it becomes cancelled",
                          TaskState.CANCELLING, compensate=True)
    if task.state in (TaskState.PENDING, TaskState.RETRYING, TaskState.WAITING):
        if owed:
            return CancelPlan(True, "a worker runs the compensations of " + ", ".join(owed)
                              + ", then it becomes cancelled", TaskState.CANCELLING,
                              compensate=True, enqueue=True)
        return CancelPlan(True, "cancelled at once", TaskState.CANCELLED)
    if task.state == TaskState.COMPENSATING:
        return CancelPlan(False, "a compensating task is already undoing its work; it ends "
                                 "failed when its compensations have run")
    if task.state == TaskState.CANCELLING:
        return CancelPlan(False, "it is already being cancelled")
    return CancelPlan(False, f"a {task.state} task cannot be cancelled")


@dataclasses.dataclass(frozen=True)
class RetryPlan:
    allowed: bool
    summary: str
    budget: int = 0                       # fresh attempts granted
    reset_to_pending: tuple[int, ...] = ()  # step indexes that run again
    keep_as_done: tuple[int, ...] = ()     # compensation_failed steps: their effect stands
    unknown_step: bool = False             # refused for the request (a bad from_step)


def retry_plan(task: Task, steps: list[StepCheckpoint], *, from_start: bool,
               from_step: str | None = None) -> RetryPlan:
    """What retrying `task` does: back to pending with a fresh budget; with
    `from_start` every step runs again, otherwise it resumes from its
    checkpoints — succeeded steps are kept, compensated ones (their effect was
    undone) run again, and a step whose compensation failed counts as done
    (its effect is still in place) with a fresh compensation budget. With
    `from_step` (a step of the task's workflow), that step and every later one
    run again; the earlier ones are judged as above."""
    if task.state not in (TaskState.FAILED, TaskState.CANCELLED):
        return RetryPlan(False, f"a {task.state} task cannot be retried; only failed and "
                                "cancelled tasks can")
    workflow = registry.for_task(task)
    if workflow is None:
        gone = (f"workflow {task.workflow!r}" if registry.find(task.workflow) is None
                else f"version {task.version} of workflow {task.workflow!r}")
        return RetryPlan(False, f"{gone} is no longer registered; the task cannot run")
    # Finished: their effect is in place (a compensated step's was undone).
    finished = [s for s in steps if s.state in (StepState.SUCCEEDED,
                                                 StepState.COMPENSATION_FAILED,
                                                 StepState.COMPENSATING)]
    if from_start:
        return RetryPlan(True, f"every step runs again from the first ({len(finished)} "
                               "finished step(s) reset)", workflow.max_attempts,
                         reset_to_pending=tuple(s.index for s in steps))
    first = len(workflow.steps)
    if from_step is not None:
        names = [step.name for step in workflow.steps]
        if from_step not in names:
            return RetryPlan(False, f"there is no step {from_step!r} in {task.workflow} (its "
                                    f"steps: {', '.join(names)})", unknown_step=True)
        first = names.index(from_step)
    again = [s for s in steps if s.index >= first]
    earlier = [s for s in steps if s.index < first]
    reset = tuple(s.index for s in earlier if s.state == StepState.COMPENSATED)
    kept = tuple(s.index for s in earlier
                 if s.state in (StepState.COMPENSATION_FAILED, StepState.COMPENSATING))
    done = [s.name for s in earlier if s.state == StepState.SUCCEEDED or s.index in kept]
    if from_step is not None:
        summary = f"runs again from step {from_step}"
        if done:
            summary += f", keeping the finished step(s) {', '.join(done)}"
        redone = [s.name for s in again if s.state in (StepState.SUCCEEDED,
                                                       StepState.COMPENSATION_FAILED)]
        if redone:
            summary += (f"; the finished step(s) {', '.join(redone)} run again, their "
                        "effect not undone first")
    elif done:
        summary = f"resumes after its finished step(s) {', '.join(done)}"
    else:
        summary = "runs from the first step (none finished)"
    if reset:
        undone = [s.name for s in steps if s.index in reset]
        summary += f"; the undone step(s) {', '.join(undone)} run again"
    return RetryPlan(True, summary, workflow.max_attempts,
                     reset_to_pending=reset + tuple(s.index for s in again), keep_as_done=kept)


__all__ = ["CancelPlan", "Plan", "PlanUnavailable", "RetryPlan",
           "cancel_plan", "owed_compensations", "retry_plan"]
