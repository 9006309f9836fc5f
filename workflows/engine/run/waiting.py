"""The wait phase (docs/design.md, "Execution"; docs/waiting.md): what a wait
step the forward phase reached does, through the held attempt.

    its deadline: read back from the task's `waiting_for` when this step
      parked it before (a timer keeps its end across wakes and crashes),
      else from the wait and the payload, by the database's clock
    a timer: due → record the step (`{"until": …}`); not yet → `park` until then
    a signal, in one transaction holding the task's row under the fence (a
      sender locks the same row, so a signal lands either before the look —
      and is consumed here — or after the park committed — and wakes it):
      the oldest stored signal of its name → consumed and the step recorded
      with its payload as output, together; none and the timeout passed →
      SignalTimeout; none → `park`
    children, in one transaction holding the task's row (a child's ending
      settles its parent under the same lock, engine/children.py): every child
      ended → the step recorded with their results (or ChildFailed); one still
      open → `park`, without a deadline

A parked task holds no worker and no lease; `wake` (a signal, the dispatcher
for a due timer or timeout) sends it back to pending, and the next claim runs
this phase again. The phase hands back (outcomes.py) `Waited` (the forward
phase goes on), `WaitFailed` (it fails the step), `Ended("waiting")`, or the
signals of a cancel or a lost lease.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from workflows.engine import faults
from workflows.engine.plans import Plan
from workflows.engine.run.held import Held, StepFailure
from workflows.engine.run.outcomes import (
    MISSING,
    CancelNoticed,
    Ended,
    InFlight,
    Lost,
    Next,
    Waited,
    WaitFailed,
    WaitReached,
)
from workflows.observability.events import Event
from workflows.registry import Wait
from workflows.rules.errors import CancelRequested, ChildFailed, SignalTimeout, WorkerSignal
from workflows.rules.states import FINISHED_STATES, StepState, TaskState
from workflows.selectors import children_of

Decided = Next | Waited | WaitFailed


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class Waiting:
    """The wait phase of `held`'s attempt at the wait step `reached`."""

    def __init__(self, held: Held, plan: Plan, reached: WaitReached) -> None:
        self.held, self.plan, self.reached = held, plan, reached
        self.wait: Wait = reached.step.wait  # type: ignore[assignment]  # a wait step

    def run(self) -> Generator[str, None, Decided]:
        try:
            return (yield from self._decide())
        except CancelRequested:
            return CancelNoticed(InFlight(self.reached.index, self.reached.step))
        except WorkerSignal as signal:
            return Lost(signal)

    def _decide(self) -> Generator[str, None, Decided]:
        try:
            until = self._deadline()
        except (ValueError, TypeError) as exc:  # the payload gives no deadline
            return WaitFailed(exc)
        if self.wait.kind == "timer":
            assert until is not None  # a timer always ends
            if until <= self.held.clock.now():
                return self._record({"until": _iso(until)})
            self._park(until)
        elif self.wait.kind == "children":
            try:
                decided = self.held.atomically(self._children_or_park, self._settle)
            except StepFailure as failure:
                return WaitFailed(failure.exc)
            if decided[0] == "consumed":
                return Waited(decided[1], last=self.reached.following is None)
            if decided[0] == "child_failed":
                return WaitFailed(ChildFailed(decided[1]))
        else:
            try:
                decided = self.held.atomically(lambda: self._signal_or_park(until),
                                               self._settle)
            except StepFailure as failure:  # the database refused: retried like a step
                return WaitFailed(failure.exc)
            if decided[0] == "consumed":
                return Waited(decided[1], last=self.reached.following is None)
            if decided[0] == "timed_out":
                return WaitFailed(SignalTimeout(
                    f"no signal {self.wait.signal!r} came before {_iso(until)}"))
        yield "parked"
        return Ended("waiting")

    def _deadline(self) -> datetime | None:
        """When the wait ends by itself: as this step parked the task with, or
        (its first look) from the wait and the payload."""
        task, index = self.held.task, self.reached.index
        stored = task.waiting_for or {}
        if stored.get("step") == index and "until" in stored:
            return parse_datetime(stored["until"]) if stored["until"] else None
        return self.wait.deadline(task.payload, self.held.clock.now())

    def _waiting_for(self, until: datetime | None) -> dict[str, Any]:
        shown: dict[str, Any] = {"kind": self.wait.kind, "step": self.reached.index,
                                 "until": _iso(until)}
        if self.wait.kind == "signal":
            shown["name"] = self.wait.signal
        if self.wait.kind == "children" and self.wait.of_step is not None:
            shown["of_step"] = self.wait.of_step
        return shown

    def _park(self, until: datetime | None) -> None:
        faults.fault_point("before_park")
        what = {"signal": f"signal {self.wait.signal!r}", "timer": "a timer",
                "children": "its children"}[self.wait.kind]
        ends = f" until {_iso(until)}" if until is not None else ""
        self.held.transition("park", reason=f"step {self.reached.step.name} waits for "
                                            f"{what}{ends}",
                             waiting_for=self._waiting_for(until), until=until)
        self.held.emit(Event.TASK_PARKED, step=self.reached.step.name, kind=self.wait.kind,
                       until=_iso(until))

    def _record(self, output: Any) -> Waited:
        r = self.reached
        self.held.record_step(self.plan, r.index, r.step, output, r.following)
        return Waited(output, last=r.following is None)

    def _signal_or_park(self, until: datetime | None) -> tuple[str, Any]:
        """Inside one transaction: consume and record, or time out, or park."""
        held, r = self.held, self.reached
        signal = held.consume_signal(self.wait.signal, r.index)  # type: ignore[arg-type]
        if signal is not None:
            held.record_step(self.plan, r.index, r.step, signal.payload, r.following)
            return "consumed", signal.payload
        if until is not None and until <= held.clock.now():
            return "timed_out", None
        self._park(until)
        return "parked", None

    def _children_or_park(self) -> tuple[str, Any]:
        """Inside one transaction holding the task's row (a child's settle
        locks it too: engine/children.py): the children all ended → the
        step's output (or a failed one's ChildFailed); one still open → park."""
        held, r = self.held, self.reached
        held.fenced(lambda lease: held.store.write_steps(lease, []))  # holds the row
        children = list(children_of(held.task.pk, self.wait.of_step).values(
            "id", "state", "result", "error_type", "error"))
        still_open = sum(child["state"] not in FINISHED_STATES for child in children)
        if still_open:
            self._park(None)
            return "parked", None
        failed = [c for c in children if c["state"] != TaskState.SUCCEEDED]
        if failed and not self.wait.collect_failures:
            first = failed[0]
            return "child_failed", (
                f"{len(failed)} of {len(children)} children did not succeed; the first, "
                f"{first['id']}, is {first['state']}"
                + (f" ({first['error'][:300]})" if first["error"] else ""))
        if self.wait.collect_failures:
            output: Any = [{"id": str(c["id"]), "state": c["state"], "result": c["result"],
                            "error_type": c["error_type"] or None, "error": c["error"] or None}
                           for c in children]
        else:
            output = [c["result"] for c in children]
        if self.wait.output is not None:
            output = self.wait.output(output)
        held.record_step(self.plan, r.index, r.step, output, r.following)
        return "consumed", output

    def _settle(self) -> tuple[str, Any] | object:
        """After an error in the decision's transaction: did it commit anyway
        (the reply to COMMIT was lost)? What it decided if so, else MISSING."""
        held, r = self.held, self.reached
        fresh = held.reread()
        if fresh.state == TaskState.WAITING and held.last_change_was_ours("park"):
            held.adopt(fresh)
            return "parked", None
        if r.following is None:
            if fresh.state == TaskState.SUCCEEDED and held.last_change_was_ours("succeed"):
                held.adopt(fresh)
                return "consumed", fresh.result
            return MISSING
        cp = held.checkpoint(r.index)
        if cp is not None and cp.state == StepState.SUCCEEDED:
            return "consumed", cp.output
        return MISSING
