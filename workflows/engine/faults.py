"""Named fault points: places where a crash is most interesting.

In production `fault_point(name)` does nothing. Tests arm a point to open a
crash window deterministically (or `on(name, hook)` to run something there,
once: another actor's move between two of the worker's writes):

- in-process: `with faults.armed("after_step_body"): ...` raises SimulatedCrash
  there (a BaseException, so no engine code handles it — like a dead process,
  only the open transaction's rollback happens); `armed(name, error=exc)`
  raises `exc` instead (e.g. an OperationalError after a COMMIT went through:
  a lost reply);
- in a real worker process: PILOT_FAULTS="after_step_body=exit" makes the
  process `os._exit(137)` there. Nothing sets PILOT_FAULTS in production; the
  check costs one dictionary lookup.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

POINTS = (
    "claim_reply",          # a claim or take-over committed; its reply not yet read
    "after_claim",          # claim committed, no step started
    "after_step_body",      # a step's body returned, its checkpoint not yet written
    "after_checkpoint",     # checkpoint committed, the next step not started
    "after_atomic_commit",  # an atomic step's (or compensation's) transaction committed
    "after_compensation_body",  # a plain compensation returned, not yet recorded
    "during_lease_renewal",  # a heartbeat is due, the renewal not yet sent
    "before_transition",    # a worker's transition not yet sent
    "transition_reply",     # a worker's transition committed; its reply not yet read
    "before_ack",           # task finished and committed, message not yet acknowledged
    "before_fold_commit",   # a replay group folded (one row kept, the rest deleted), not committed
    "before_park",          # a wait found nothing to consume; its park not yet written
    "before_wake",          # a dispatcher's wake of a due wait written, not committed
    "child_batch_started",  # a batch of a step's children committed; the next not yet sent
)


class SimulatedCrash(BaseException):
    pass


class Hits:
    """What `armed()` / `on()` yield: how many times their fault fired (or hook
    ran), so a test can assert that its fault landed instead of passing
    vacuously when the point moved or was never reached."""

    def __init__(self) -> None:
        self.fired = 0


_armed: dict[str, list[Any]] = {}  # name -> [passes to let through, crashes left, error, Hits]
# name -> [(callback, Hits)], run (once each) when the point is reached
_hooks: dict[str, list[tuple[Callable[[], object], Hits]]] = {}


def _from_env() -> dict[str, str]:
    raw = os.environ.get("PILOT_FAULTS", "")
    return dict(item.split("=", 1) for item in raw.split(",") if "=" in item)


def fault_point(name: str) -> None:
    if name in _hooks:
        for hook, hits in _hooks.pop(name):
            hits.fired += 1
            hook()
    if name in _armed:
        state = _armed[name]
        if state[0] > 0:
            state[0] -= 1
            return
        state[1] -= 1
        if state[1] <= 0:
            del _armed[name]
        state[3].fired += 1
        raise state[2] if state[2] is not None else SimulatedCrash(name)
    if os.environ.get("PILOT_FAULTS") and _from_env().get(name) == "exit":
        os._exit(137)


@contextlib.contextmanager
def armed(name: str, *, skip: int = 0, times: int = 1,
          error: BaseException | None = None) -> Iterator[Hits]:
    """Let `skip` passes through `name` go by, then crash the next `times`
    (in this process) — or raise `error` there instead. Yields the `Hits`."""
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}")
    hits = Hits()
    _armed[name] = [skip, times, error, hits]
    try:
        yield hits
    finally:
        _armed.pop(name, None)


@contextlib.contextmanager
def on(name: str, hook: Callable[[], object]) -> Iterator[Hits]:
    """Call `hook()` the next time this process reaches point `name` — to open
    an interleaving deterministically (e.g. an operator's cancel right after a
    claim). Yields the `Hits`."""
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}")
    hits = Hits()
    _hooks.setdefault(name, []).append((hook, hits))
    try:
        yield hits
    finally:
        _hooks.pop(name, None)
