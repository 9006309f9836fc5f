"""A task's life as phases, rebuilt from its audit trail (no database).

Every TaskTransition starts a new state; the console splits the waits so an
operator can tell them apart:

- `pending` is *waiting for a worker* (the task is due; no worker took it yet);
- `waiting` is *parked* at a wait step (a timer, a signal, its children): no
  worker is held, so it is never "waiting for a worker";
- `retrying` is a *backoff* until the retry is due, then *waiting for a
  worker* again. The due time is known for the current wait
  (`task.next_attempt_at`) and for past waits (the audit reason of
  `schedule_retry` and `recover` says "retry in 0.089s"); a wait whose reason
  does not say (older history) stays one undivided "retrying (backoff, then
  waiting for a worker)" phase rather than a guess.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timedelta

from workflows.admin.text import seconds_text
from workflows.rules.states import TaskState

# The audit reason of schedule_retry and recover: "…; retry in 0.089s".
_RETRY_DELAY = re.compile(r"retry in (\d+(?:\.\d+)?)s\b")

WAITING = "queued"       # due, no worker has taken it yet
PARKED = "parked"        # state `waiting`: a wait step parked it, holding no worker
BACKOFF = "backoff"      # not due yet
WAIT_OR_BACKOFF = "backoff+waiting"  # a retrying wait whose due time was not recorded


@dataclasses.dataclass(frozen=True)
class Phase:
    state: str            # the task's state during the phase
    kind: str             # WAITING, BACKOFF, WAIT_OR_BACKOFF, or the state itself
    start: datetime
    end: datetime
    how: str              # what began it: "created", "claim by worker:…"

    @property
    def label(self) -> str:
        return {WAITING: "waiting for a worker", BACKOFF: "backoff",
                PARKED: "parked (a wait step: no worker held)",
                WAIT_OR_BACKOFF: "retrying (backoff, then waiting for a worker)"
                }.get(self.kind, self.state)

    @property
    def seconds(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.0)


def retry_delay(reason: str) -> timedelta | None:
    """The backoff a schedule_retry or recover audit row announced, if it says."""
    match = _RETRY_DELAY.search(reason or "")
    return timedelta(seconds=float(match.group(1))) if match else None


def _split(state, start, end, how, due) -> list[Phase]:
    if state == TaskState.PENDING:
        return [Phase(state, WAITING, start, end, how)]
    if state == TaskState.WAITING:
        return [Phase(state, PARKED, start, end, how)]
    if state != TaskState.RETRYING:
        return [Phase(state, state, start, end, how)]
    if due is None:
        return [Phase(state, WAIT_OR_BACKOFF, start, end, how)]
    due = min(max(due, start), end)
    phases = [Phase(state, BACKOFF, start, due, how)]
    if due < end:
        phases.append(Phase(state, WAITING, due, end, "backoff over"))
    return phases


def task_phases(task, transitions: list, *, end: datetime) -> list[Phase]:
    """The phases of `task` from its `transitions` (oldest first) up to `end`
    (its finish, or now)."""
    phases: list[Phase] = []
    state, since, how, due = TaskState.PENDING, task.created_at, "created", None
    for t in transitions:
        phases.extend(_split(state, since, max(t.at, since), how, due))
        state, since, how = t.to_state, t.at, f"{t.transition} by {t.actor}"
        due = None
        if t.to_state == TaskState.RETRYING:
            delay = (retry_delay(t.reason) if t.transition in ("schedule_retry", "recover")
                     else None)
            due = t.at + delay if delay is not None else None
    if state == TaskState.RETRYING and task.next_attempt_at is not None:
        due = task.next_attempt_at  # the current wait: the row says when it is due
    phases.extend(_split(state, since, max(end, since), how, due))
    return phases


def waits_before(phases: list[Phase]) -> dict[datetime, str]:
    """{start of an attempt: "after …"}: for each attempt (a `running` phase,
    which its claim began), how long it waited in backoff and for a worker."""
    notes: dict[datetime, str] = {}
    backoff = waiting = 0.0
    undivided = 0.0
    for phase in phases:
        if phase.kind == BACKOFF:
            backoff += phase.seconds
        elif phase.kind == WAITING:
            waiting += phase.seconds
        elif phase.kind == WAIT_OR_BACKOFF:
            undivided += phase.seconds
        else:
            if phase.state == TaskState.RUNNING and (backoff or waiting or undivided):
                notes[phase.start] = _describe(backoff, waiting, undivided)
            backoff = waiting = undivided = 0.0
    return notes


def _describe(backoff: float, waiting: float, undivided: float) -> str:
    parts = []
    if backoff:
        parts.append(f"{seconds_text(backoff)} backoff")
    if waiting:
        parts.append(f"{seconds_text(waiting)} waiting for a worker")
    if undivided:
        parts.append(f"{seconds_text(undivided)} backoff and waiting")
    return "after " + ", then ".join(parts)
