"""What the task page shows, read once and shaped for its templates; the live
endpoint renders the same parts again (workflows/admin/live.py). Reads only.

- steps: every step of the run's plan (`registry.find(...).steps_for(payload)`,
  guarded: a plan may raise after a deploy), each with its checkpoint if it has
  one, so planned steps not yet started are listed too;
- "now": for unfinished tasks, what the task is doing or waiting for — the
  running step with its elapsed time, last heartbeat, saved progress and
  "step k of n", or the backoff / wait for a worker;
- failures: every failed attempt its steps keep (engine/failures.py), with
  its exception type, message and bounded traceback, newest first;
- history: every transition, with how long each attempt waited before it;
- replays: when duplicate triggers were absorbed;
- webhooks: its completion deliveries, attempt by attempt (only for a task
  with an endpoint).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta

from workflows.admin.deliveries import delivery_views
from workflows.admin.phases import WAITING, task_phases, waits_before
from workflows.admin.pictures.timeline import task_timeline
from workflows.admin.text import duration_text
from workflows.admin.workers import live_workers
from workflows.conf import pilot_settings
from workflows.engine import CANCELLED_WHILE_RUNNING, Why, why_not_running
from workflows.models import StepCheckpoint, TaskReplay, TaskTransition
from workflows.registry import registry
from workflows.rules.states import COMPENSATION_STATES, StepState, TaskState
from workflows.selectors import children_by_state

# What the runner writes on the step a cancel stopped; such a step is shown as
# cancelled, not failed.
CANCELLED_STEP_ERROR = CANCELLED_WHILE_RUNNING
PROGRESS_CHARS = 300
MAX_REPLAYS_SHOWN = 50


@dataclasses.dataclass
class StepView:
    index: int
    name: str
    state: str            # a StepState, or "cancelled" / "planned" (display only)
    attempts: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    output: object = None
    progress: object = None
    error: str = ""
    compensation: str | None = None
    recorded: bool = True  # False: planned, no checkpoint yet

    @property
    def label(self) -> str:
        return {"planned": "not started", "cancelled": "cancelled"}.get(self.state, self.state)

    @property
    def running(self) -> bool:
        return self.state == StepState.RUNNING

    def duration(self, now: datetime) -> str:
        return duration_text(self.started_at, self.finished_at or (now if self.running else None))


@dataclasses.dataclass
class NowPanel:
    kind: str                     # running | cancelling | compensating | parked | waiting | backoff
    since: datetime               # start of what is happening now
    step: StepView | None = None
    k: int = 0                    # 1-based position of the running step in the plan
    n: int = 0                    # steps in the plan (0: unknown)
    remaining: list = dataclasses.field(default_factory=list)
    heartbeat_at: datetime | None = None
    lease_expires_at: datetime | None = None
    worker: str = ""
    progress_text: str = ""
    due_at: datetime | None = None
    why: Why | None = None        # waiting for a worker: why none has taken it (engine/why.py)
    # cancelling / compensating: the step whose compensation runs, and those still
    # owed theirs (last first, the order they run in)
    undoing: StepView | None = None
    to_undo: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class RunView:
    """The current run: since the last retry, if the task was retried (its
    attempts and time then count from there; `life_attempts` over its life)."""

    attempts: int
    max_attempts: int
    started_at: datetime | None
    retried_at: datetime | None = None
    life_attempts: int = 0


def run_view(task, transitions: list) -> RunView:
    """Attempts and start of the current run, from the history: a retry gives a
    fresh budget and a new run, and the gap before it belongs to neither."""
    retries = [i for i, t in enumerate(transitions) if t.transition == "retry"]
    if not retries:
        return RunView(task.attempts, task.max_attempts, task.started_at)
    last = retries[-1]
    before = sum(t.transition == "claim" for t in transitions[:last])
    first_claim = next((t.at for t in transitions[last + 1:] if t.transition == "claim"), None)
    return RunView(task.attempts - before, task.max_attempts - before, first_claim,
                   retried_at=transitions[last].at, life_attempts=task.attempts)


def task_plan(task) -> tuple[list | None, str]:
    """(the steps this task's run executes, "") or (None, why not)."""
    workflow = registry.for_task(task)
    if workflow is None:
        return None, f"workflow {task.workflow} is not registered in this process"
    try:
        return list(workflow.steps_for(task.payload)), ""
    except Exception as exc:  # noqa: BLE001 - a workflow's plan is user code
        return None, f"its plan raised {type(exc).__name__}: {exc}"[:300]


def _was_cancelled(transitions: list) -> bool:
    return any(t.transition == "cancel" for t in transitions)


def _view(cp: StepCheckpoint, cancelled: bool, compensation: str | None) -> StepView:
    state = cp.state
    if state == StepState.FAILED and cancelled and cp.error == CANCELLED_STEP_ERROR:
        state = "cancelled"
    return StepView(cp.index, cp.name, state, cp.attempts, cp.started_at, cp.finished_at,
                    cp.output, cp.progress, cp.error, compensation)


def step_views(checkpoints: list, plan: list | None, transitions: list) -> list[StepView]:
    """The plan's steps in order, each with its checkpoint if any; checkpoints
    beyond the plan (the workflow changed) are kept, never hidden."""
    cancelled = _was_cancelled(transitions)
    by_index = {cp.index: cp for cp in checkpoints}
    views = []
    for index, step in enumerate(plan or []):
        compensation = getattr(step.compensation, "__name__", None)
        cp = by_index.pop(index, None)
        views.append(_view(cp, cancelled, compensation) if cp is not None else
                     StepView(index, step.name, "planned", compensation=compensation,
                              recorded=False))
    views.extend(_view(cp, cancelled, None) for cp in sorted(by_index.values(),
                                                             key=lambda c: c.index))
    views.sort(key=lambda v: v.index)
    return views


def _progress_text(progress) -> str:
    if progress is None:
        return ""
    text = json.dumps(progress, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= PROGRESS_CHARS else text[:PROGRESS_CHARS - 1] + "…"


def now_panel(task, steps: list[StepView], plan: list | None, phases: list, *,
              now: datetime) -> NowPanel | None:
    """What an unfinished task is doing right now; None once it has finished."""
    if task.is_finished:
        return None
    current = phases[-1]
    if task.state in (TaskState.RUNNING, *COMPENSATION_STATES):
        running = next((s for s in reversed(steps) if s.running), None)
        lease = task.lease_expires_at
        panel = NowPanel(
            kind=task.state, since=running.started_at if running and running.started_at
            else current.start, step=running, n=len(plan) if plan is not None else 0,
            lease_expires_at=lease, worker=task.lease_owner,
            # The lease is renewed at each heartbeat to now + PILOT_LEASE_SECONDS.
            heartbeat_at=lease - timedelta(seconds=pilot_settings.PILOT_LEASE_SECONDS)
            if lease else None)
        if running is not None:
            panel.k = running.index + 1
            panel.remaining = [s.name for s in steps if s.index > running.index
                               and s.state in ("planned", StepState.PENDING)]
            panel.progress_text = _progress_text(running.progress)
        if task.state != TaskState.RUNNING:
            panel.undoing = next((s for s in steps if s.state == StepState.COMPENSATING), None)
            panel.to_undo = [s.name for s in sorted(steps, key=lambda v: -v.index)
                             if s.state == StepState.SUCCEEDED and s.compensation
                             and (panel.undoing is None or s.index < panel.undoing.index)]
            if panel.undoing is not None:
                panel.since = current.start
        return panel
    if task.state == TaskState.WAITING:
        return NowPanel(kind="parked", since=current.start, n=len(plan or []),
                        remaining=[s.name for s in steps if s.state != StepState.SUCCEEDED])
    if current.kind == WAITING:
        why = why_not_running([task], now=now, workers=live_workers).get(task.pk)
        return NowPanel(kind="waiting", since=current.start, n=len(plan or []),
                        remaining=[s.name for s in steps if s.state != StepState.SUCCEEDED],
                        why=why, due_at=why.until if why else None)
    return NowPanel(kind="backoff", since=current.start, due_at=task.next_attempt_at,
                    n=len(plan or []))


@dataclasses.dataclass(frozen=True)
class FailureView:
    attempt: int
    step: str
    at: datetime | None
    type: str
    message: str
    traceback: str


def failure_views(checkpoints: list) -> list[FailureView]:
    """The steps' failed attempts, newest first (a log entry is engine data:
    a missing key reads as empty, never as an error page)."""
    views = []
    for cp in checkpoints:
        for f in cp.failures or []:
            if not isinstance(f, dict):
                continue
            try:
                at = datetime.fromisoformat(f.get("at") or "")
            except (TypeError, ValueError):
                at = None
            attempt = f.get("attempt")
            views.append(FailureView(attempt if isinstance(attempt, int) else 0, cp.name, at,
                                     str(f.get("type") or ""), str(f.get("message") or ""),
                                     str(f.get("traceback") or "")))
    views.sort(key=lambda v: (v.attempt, v.at.timestamp() if v.at else 0), reverse=True)
    return views


def task_page(task, *, now: datetime) -> dict:
    """The task page's live part, as a template context: three queries (history,
    checkpoints, replays), a fourth for its webhooks when it has an endpoint,
    and the plan from the registry."""
    transitions = list(TaskTransition.objects.filter(task_id=task.pk).order_by("at", "id"))
    checkpoints = list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index"))
    replays = list(TaskReplay.objects.filter(task_id=task.pk).order_by("-at")
                   [:MAX_REPLAYS_SHOWN])
    plan, plan_error = task_plan(task)
    steps = step_views(checkpoints, plan, transitions)
    phases = task_phases(task, transitions, end=task.finished_at or now)
    waits = waits_before(phases)
    history = [{"t": t, "note": waits.get(t.at, "") if t.transition == "claim" else ""}
               for t in transitions]
    return {
        "task": task,
        "now": now,
        "steps": steps,
        "plan_error": plan_error,
        "failures": failure_views(checkpoints),
        "panel": now_panel(task, steps, plan, phases, now=now),
        "run": run_view(task, transitions),
        "history": history,
        "replays": replays,
        "deliveries": delivery_views(task, now),
        "timeline_svg": task_timeline(task, phases, steps, now=now),
        "workflow_known": registry.for_task(task) is not None,
        # a parent's children by state, in the states' order (one GROUP BY)
        "children_states": _children_states(task),
    }


def _children_states(task) -> list[tuple[str, int]]:
    if not task.children_count:
        return []
    counts = children_by_state(task.pk)
    return [(state, counts[state]) for state in TaskState.values if counts.get(state)]
