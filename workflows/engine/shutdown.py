"""The workers are stopping: no new step starts (docs/operations.md, "Stopping").

`manage.py run_workers` names a flag file for its cluster in the environment
it starts qcluster with (`STOP_FLAG_ENV`) and creates that file when it is
told to stop, before it signals the cluster. Every worker process of the
cluster inherits the name and looks at the file where a run would go on with
something new:

- a step that returns while the flag is up is recorded with its task's
  `release` instead of the next step's start: the task is `pending` again,
  due at once and without a lease, so the next start of the workers resumes
  it at that next step with nothing to wait for (forward.py);
- a message that arrives is not claimed, a drain claims nothing more, and a
  success claims no next task (driver.py, worker.py).

A step already running finishes within PILOT_STOP_SECONDS or is ended with
its worker (SIGKILL) as before; compensations are undo work and go on. A
cluster started without the variable (qcluster on its own) never sees a stop.
The check is a stat() of one file, at most once per step boundary.
"""

from __future__ import annotations

import os
from pathlib import Path

STOP_FLAG_ENV = "PILOT_WORKERS_STOP_FLAG"


def stop_requested() -> bool:
    """True once the cluster this process belongs to was told to stop."""
    flag = os.environ.get(STOP_FLAG_ENV)
    return bool(flag) and os.path.exists(flag)  # type: ignore[arg-type]  # set: checked


def stop_announce(flag: str | Path) -> None:
    """Raise the flag `flag`: the cluster's workers start no new step from now on."""
    Path(flag).touch()
