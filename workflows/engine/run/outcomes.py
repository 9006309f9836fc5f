"""What a run reports, and what a phase hands back to the driver: the next
thing to do (docs/design.md, "Execution"). A phase never calls another."""

from __future__ import annotations

import dataclasses

from workflows.debug import mask_url_credentials
from workflows.engine.store import Claimed
from workflows.registry import Step

MISSING = object()


@dataclasses.dataclass
class RunReport:
    task_id: str | None
    # idle (nothing due) | skipped | succeeded | retrying | failed | cancelled | deferred |
    # waiting | released (the workers are stopping) | lease_lost | interrupted | error
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


@dataclasses.dataclass(frozen=True)
class WaitReached:
    """The forward phase reached a wait step (recorded as started): the wait
    phase (waiting.py) decides — consume, park, or time out."""

    index: int
    step: Step
    following: int | None  # the next step's index; None: the wait is the last step


@dataclasses.dataclass(frozen=True)
class Waited:
    """The wait phase recorded the wait step's success (`output`; with the
    task's when it was the last step): the forward phase goes on after it."""

    output: object
    last: bool


@dataclasses.dataclass(frozen=True)
class WaitFailed:
    """The wait ended without what it waited for (SignalTimeout, a deadline
    its payload cannot give): the forward phase fails the step like any other."""

    exc: BaseException


Next = Ended | Compensate | CancelNoticed | Lost | WaitReached


def describe(exc: BaseException) -> tuple[str, str]:
    """("<Type>: <message>", "<Type>"), URL credentials masked as the failures'
    log masks them (engine/failures.py): the error is shown and sent too."""
    text = (f"{type(exc).__name__}: {mask_url_credentials(str(exc))}" if str(exc)
            else type(exc).__name__)
    return text, type(exc).__name__
