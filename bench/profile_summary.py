"""Summarise a py-spy profile of the qcluster (collapsed stacks, `--format raw
--function --idle --subprocesses`) into what the worker hot path spends its
time on. Standard library only.

Only the samples of django-q2 worker processes count. "busy" samples are those
inside PILOT's `run_task`; each busy sample is put in one category by its
innermost frame (where the time really went), and each PILOT function gets its
inclusive share (time in it and everything it called).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

WORKER_FRAME = "worker (django_q/worker.py"
HOT_PATH_FRAME = "run_task (workflows/worker.py"

# (prefix of the innermost frame's location, category); the first match wins.
# psycopg's C extension does the network I/O, so a sample blocked in it shows
# the Python frame that called into C: Connection.wait (waiting for the
# server), _execute_send (sending a query), _exec_command (BEGIN/COMMIT).
ROUND_TRIPS = "PostgreSQL round trips (psycopg send + wait, in C)"
CATEGORIES = [
    ("psycopg/connection.py", ROUND_TRIPS),
    ("psycopg/_connection_base.py", ROUND_TRIPS),
    ("psycopg/client_cursor.py", ROUND_TRIPS),
    ("psycopg/waiting.py", ROUND_TRIPS),
    ("psycopg/generators.py", ROUND_TRIPS),
    ("psycopg/", "psycopg in Python (parameter adaptation, results)"),
    ("django/db/models/base.py", "Django model instances (init, refresh)"),
    ("django/db/", "Django ORM (query building, SQL compilation)"),
    ("django_fsm/", "django-fsm transitions"),
    ("logging/", "logging (event log lines)"),
    ("workflows/", "PILOT's own code"),
    ("json/", "JSON"),
    ("django/", "Django other"),
]


@dataclasses.dataclass
class Summary:
    worker_samples: int
    busy_samples: int
    categories: list[tuple[str, int]]
    functions: list[tuple[str, int]]

    def lines(self, top: int = 12) -> list[str]:
        if not self.busy_samples:
            return ["(no samples inside run_task: the profile is empty)"]
        pct = lambda n: f"{100 * n / self.busy_samples:5.1f} %"  # noqa: E731
        out = [f"worker processes: {self.worker_samples} samples, "
               f"{100 * self.busy_samples / max(1, self.worker_samples):.0f} % of them inside "
               "run_task (the rest: waiting for the next message)",
               "", "where run_task's time goes (innermost frame):"]
        out += [f"  {pct(n)}  {name}" for name, n in self.categories]
        out += ["", "PILOT functions, inclusive (time in them and what they call):"]
        out += [f"  {pct(n)}  {name}" for name, n in self.functions[:top]]
        return out


def _frame_key(frame: str) -> str:
    """'task_claim (workflows/engine/claims.py:41)' -> 'task_claim (workflows/engine/claims.py)'."""
    name, _, location = frame.partition(" (")
    return f"{name} ({location.rsplit(':', 1)[0]})" if location else name


def _category(frame: str) -> str:
    location = frame.partition(" (")[2]
    for prefix, category in CATEGORIES:
        if location.startswith(prefix):
            return category
    return "other (interpreter, stdlib)"


def summarise(path: Path) -> Summary:
    worker = busy = 0
    categories: Counter = Counter()
    functions: Counter = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, n = stack.split(";"), int(count)
        if not any(f.startswith(WORKER_FRAME) for f in frames):
            continue
        worker += n
        if not any(f.startswith(HOT_PATH_FRAME) for f in frames):
            continue
        busy += n
        categories[_category(frames[-1])] += n
        for key in {_frame_key(f) for f in frames if "(workflows/" in f}:
            functions[key] += n
    return Summary(worker, busy, categories.most_common(), functions.most_common())


if __name__ == "__main__":
    import sys

    print("\n".join(summarise(Path(sys.argv[1])).lines()))
