"""What a run reports, and what a phase hands back to the driver: the next
thing to do (docs/design.md, "Execution"). A phase never calls another."""

from __future__ import annotations

import dataclasses

from workflows.engine.store import Claimed
from workflows.registry import Step

MISSING = object()


@dataclasses.dataclass
class RunReport:
    task_id: str | None
    # idle (nothing due) | skipped | succeeded | retrying | failed | cancelled | deferred |
    # lease_lost | interrupted | error
    outcome: str = ""
    steps_run: list[str] = dataclasses.field(default_factory=list)
    compensations_run: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class InFlight:
    """The step whose body is running (or just returned, not yet recorded)."""

    index: int
    step: Step
    output: object = MISSING  # a plain step's body returned this


@dataclasses.dataclass(frozen=True)
class Ended:
    """The run is over: the task ended, or waits for its retry or backoff.
    A success that claimed the next task in the same statement names it."""

    outcome: str
    next_claimed: Claimed | None = None


@dataclasses.dataclass(frozen=True)
class Compensate:
    """The task is `compensating` under this attempt: the compensation phase next."""


@dataclasses.dataclass(frozen=True)
class CancelNoticed:
    """An operator cancelled the running attempt: take the phase over, record
    the step in flight, compensate."""

    in_flight: InFlight | None


@dataclasses.dataclass(frozen=True)
class Lost:
    """The task is no longer this worker's (a recover, a take-over, an end)."""

    signal: BaseException


Next = Ended | Compensate | CancelNoticed | Lost


def describe(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text, type(exc).__name__
