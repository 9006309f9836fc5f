"""Why a task that is not running is not running (docs/design.md, "Fairness"):
the answer the console gives on the task page, in the task list and on
Workers & queue. It reads the engine's own rules — `Task.is_due` and the
caps' `Slots.refusal` — so the console can never tell another story than the
claim would.

In the order a claim meets them:

- `waiting`: parked at a wait step (timer, signal, children), holding nothing;
- `delayed`: pending with a `run_after` (its next_attempt_at) still ahead;
- `backoff`: retrying, its backoff not over;
- `client_cap` / `workflow_cap` / `concurrency`: due, but its client's
  PILOT_MAX_RUNNING_PER_CLIENT, its workflow's `max_running` (per client) or
  its workflow's `concurrency` (every client) is taken;
- `no_worker`: due and under every cap, and no live worker reports (the
  caller says how many it sees: None, not known);
- `queued`: due, under every cap, workers alive: it waits for a free one.

One snapshot of the held tasks (`Slots.now`, one query) answers a whole page;
it is read only when some task is due.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from workflows.engine.caps import HeldBack, Slots, caps
from workflows.rules.states import TaskState

# States in which a task waits for a worker to take it up: a run, or an undo phase.
NOT_HELD = (TaskState.PENDING, TaskState.RETRYING, TaskState.WAITING)
UNDO = (TaskState.COMPENSATING, TaskState.CANCELLING)

CAP_KINDS = {"client": "client_cap", "own": "workflow_cap", "total": "concurrency"}


@dataclasses.dataclass(frozen=True)
class Why:
    kind: str                     # see the module docstring
    until: datetime | None = None  # delayed / backoff: when it is due
    held: HeldBack | None = None   # the caps: the cap and how many hold it
    detail: str = ""               # waiting: "timer" / "signal <name>" / "children"

    @property
    def text(self) -> str:
        """One line for an operator, with the setting or option that decides."""
        if self.kind == "waiting":
            return f"waiting for {self.detail}" if self.detail else "waiting"
        if self.kind == "delayed":
            return "delayed start (run_after)"
        if self.kind == "backoff":
            return "backoff after a failed attempt"
        if self.held is not None:
            taken = f"{self.held.held} of {self.held.cap}"
            return {"client_cap": f"at its client's cap: {taken} running "
                                  "(PILOT_MAX_RUNNING_PER_CLIENT)",
                    "workflow_cap": f"at its workflow's max_running: {taken} of this "
                                    "client's running",
                    "concurrency": f"at its workflow's concurrency: {taken} running"}[self.kind]
        if self.kind == "no_worker":
            return "no live worker (is run_workers running?)"
        return "queued: waiting for a free worker"


def _wait_detail(task: Any) -> str:
    shown = task.waits_for or {}
    kind = shown.get("kind", "")
    if kind == "signal":
        return f"signal {shown.get('name') or ''}".strip()
    return {"timer": "its timer", "children": "its children"}.get(kind, kind)


def _undo_waiting(task: Any, now: datetime) -> bool:
    lease = task.lease_expires_at
    return (task.state in UNDO and (lease is None or lease <= now)
            and (task.next_attempt_at is None or task.next_attempt_at <= now))


def why_not_running(tasks: Iterable[Any], *, now: datetime,
                    workers: Callable[[], int | None]) -> dict[Any, Why]:
    """{task pk: Why} for each of `tasks` (Task rows, `now` a database time)
    that waits to be taken up; tasks running, finished or held by a live
    undo phase are left out. At most one query (the caps' snapshot), and one
    call of `workers` (the live workers seen, None: not known) when a due task
    is under every cap."""
    rows = [t for t in tasks if t.state in NOT_HELD or _undo_waiting(t, now)]
    answers: dict[Any, Why] = {}
    due = []
    for task in rows:
        if task.state == TaskState.WAITING:
            answers[task.pk] = Why("waiting", detail=_wait_detail(task))
        elif task.state in NOT_HELD and not task.is_due(now):
            if task.attempts >= task.max_attempts:
                continue  # no attempt left: the dispatcher ends it, nothing waits
            answers[task.pk] = Why("backoff" if task.state == TaskState.RETRYING else "delayed",
                                   until=task.next_attempt_at)
        else:
            due.append(task)
    if not due:
        return answers
    limits = caps()
    slots = Slots.now(limits) if limits is not None else Slots(None)
    seen: list[int | None] = []
    for task in due:
        refused = slots.refusal(task.owner_id, task.workflow, undo=task.state in UNDO)
        if refused is not None:
            answers[task.pk] = Why(CAP_KINDS[refused.kind], held=refused)
            continue
        if not seen:
            seen.append(workers())
        if seen[0] == 0:
            answers[task.pk] = Why("no_worker")
        else:
            answers[task.pk] = Why("queued")
    return answers


def client_shares() -> list[tuple[Any, str, int, int]]:
    """(client id, cap group — "" for the client-wide one, else the workflow
    with its own max_running —, held, cap) for each client holding workers
    now, most held first; [] when nothing is capped (one query)."""
    limits = caps()
    return Slots.now(limits).usage() if limits is not None else []


__all__ = ["Why", "client_shares", "why_not_running"]
