"""What a worker writes about one step: a `StepRow`, one per (task, index).

A row says the state the step moves to and only the facts that move with it;
the store's upsert keeps everything else (docs/design.md, "Checkpoints"):

- `output` and `compensable` are written with `succeeded` only;
- `attempts` and `compensation_attempts` only ever grow (0 = keep);
- `failures` (the failed attempts' log: type, message, bounded traceback)
  is written with `failed` only, whole — the writer appends to what the
  plan read — so a success, a retry or a compensation keeps it;
- `started_at` is kept unless the row starts an attempt; `error` is kept by
  `compensating` and `compensated` (the forward error stays readable);
- the move itself must be allowed by states.STEP_OVERWRITES, or the row is
  left as it is — a succeeded step is never downgraded, a finished
  compensation never redone.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from workflows.rules.states import StepState

MAX_STEP_ERROR = 4000
# The error of a step a cancel stopped in flight (the console shows it as cancelled).
CANCELLED_WHILE_RUNNING = "cancelled while it ran"
# How a given-up compensation's reason is stored in the step's error.
COMPENSATION_FAILED_PREFIX = "compensation failed: "


@dataclasses.dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    state: str
    output: object = None
    attempts: int = 0
    compensable: bool = False
    compensation_attempts: int = 0
    error: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    failures: list[dict[str, Any]] | None = None  # None: keep the stored log


def started(index: int, name: str, attempts: int, now: datetime) -> StepRow:
    return StepRow(index, name, StepState.RUNNING, attempts=attempts, started_at=now)


def succeeded(index: int, name: str, output: Any, now: datetime, *, compensable: bool) -> StepRow:
    return StepRow(index, name, StepState.SUCCEEDED, output=output, compensable=compensable,
                   finished_at=now)


def failed(index: int, name: str, error: str, now: datetime, *,
           failures: list[dict[str, Any]] | None = None) -> StepRow:
    return StepRow(index, name, StepState.FAILED, error=error[:MAX_STEP_ERROR], finished_at=now,
                   failures=failures)


def compensation_started(index: int, name: str, attempt: int) -> StepRow:
    return StepRow(index, name, StepState.COMPENSATING, compensation_attempts=attempt)


def compensated(index: int, name: str, now: datetime) -> StepRow:
    return StepRow(index, name, StepState.COMPENSATED, finished_at=now)


def compensation_failed(index: int, name: str, error: str, now: datetime) -> StepRow:
    return StepRow(index, name, StepState.COMPENSATION_FAILED,
                   error=f"{COMPENSATION_FAILED_PREFIX}{error}"[:MAX_STEP_ERROR], finished_at=now)
