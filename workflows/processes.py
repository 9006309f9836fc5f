"""Child processes that stop within a bound: what `make run` (pilot/localrun.py)
and `manage.py run_workers` share.

Each child runs in its own session, hence its own process group: a signal meant
for the parent (Ctrl-C in a terminal, a process manager signalling a whole
group) does not reach the child, nor the processes the child forks, behind the
parent's back; the parent decides how its children stop. That matters for
django-q2's `qcluster`: a SIGTERM that reaches its sentinel process as well as
its main process kills the sentinel inside a multiprocessing `Event.wait()`,
and the main process then waits forever in `Event.set()` for a sleeper that
will never wake (a futex; a second SIGTERM does nothing). See
docs/operations.md, "Stopping".

On Linux a child also gets SIGTERM when its parent dies (PR_SET_PDEATHSIG), so
a parent that is SIGKILLed leaves no child running on its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import time
from pathlib import Path

# The signals that ask a PILOT process to stop.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # not Linux: children just outlive a killed parent
    _prctl = None  # type: ignore[assignment]


def _die_with(parent: int):
    """preexec_fn: SIGTERM this child when `parent` dies (Linux)."""

    def preexec() -> None:
        if _prctl is None:
            return
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Child:
    """One child process, leader of its own process group (pgid == pid)."""

    def __init__(self, name: str, popen: subprocess.Popen):
        self.name, self.popen = name, popen

    @classmethod
    def start(cls, name: str, args: list[str], *, env: dict | None = None,
              cwd: str | Path | None = None) -> Child:
        """Start `args` in a new session, stdin closed, stdout and stderr shared
        with this process (its output is ours)."""
        popen = subprocess.Popen([str(a) for a in args], env=env, cwd=cwd,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_die_with(os.getpid()))  # noqa: PLW1509
        return cls(name, popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def terminate(self) -> None:
        """SIGTERM to the child itself (not its group): it stops its own children."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> bool:
        """Wait until the child exited or time.monotonic() reached `deadline`;
        True if it exited."""
        while self.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.alive

    def kill(self) -> None:
        """SIGKILL the child's process group and those of its descendants (a
        child that started its own children in their own sessions), as a crash
        would, and reap the child."""
        for pgid in {self.popen.pid, *(_pgid(pid) for pid in descendants(self.popen.pid))}:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(pgid, signal.SIGKILL)  # type: ignore[arg-type]  # None: TypeError, suppressed
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)

    def group(self) -> list[int]:
        """The pids of the child's process group: the child and what it forked."""
        return group_pids(self.popen.pid)


def _processes() -> dict[int, tuple[str, int, int]]:
    """{pid: (state, ppid, pgid)} of every process, from /proc (empty without it)."""
    table = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # state ppid pgrp ...
            table[int(entry)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def group_pids(pgid: int) -> list[int]:
    """Every live (not zombie) process in process group `pgid`."""
    return sorted(pid for pid, (state, _, group) in _processes().items()
                  if group == pgid and state != "Z")


def descendants(pid: int) -> list[int]:
    """Every live process descended from `pid` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, (state, parent, _) in _processes().items():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _caught_signals(pid: int) -> int | None:
    """The mask of signals process `pid` has a handler for (SigCgt), None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        return None
    return 0


def _bit(sig: int) -> int:
    return 1 << (sig - 1)


class ParentWatch:
    """Notices that our parent, `make`, was told to stop.

    GNU make does not pass SIGINT on to the recipe it runs, and then waits for
    that recipe to end, so `kill -INT <make's pid>` alone would stop nothing.
    What make does is visible, though: its handler for the signal first resets
    the signal to its default action, so the signal leaves make's set of caught
    signals (SigCgt in /proc/<pid>/status). `signalled()` reports that, or the
    parent's death, as the signal's name. Linux only; elsewhere it only notices
    the parent's death.
    """

    WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

    def __init__(self, pid: int):
        self.pid = pid
        caught = _caught_signals(pid) or 0
        self.watched = [sig for sig in self.WATCHED if caught & _bit(sig)]

    def signalled(self) -> str | None:
        """The reason to stop ("SIGINT to make", "make exited"), or None."""
        if os.getppid() != self.pid:
            return "make exited"
        caught = _caught_signals(self.pid)
        if caught is None:
            return "make exited"
        for sig in self.watched:
            if not caught & _bit(sig):
                return f"{signal.Signals(sig).name} to make"
        return None
