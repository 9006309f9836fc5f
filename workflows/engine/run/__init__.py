"""Running a task (docs/design.md, "Execution"): the driver (driver.py) claims
and holds a task (held.py) and sequences its phases — forward (forward.py) and
compensation (compensation.py) — by what each hands back (outcomes.py)."""

from workflows.engine.run.driver import Run, task_run, tasks_drain
from workflows.engine.run.outcomes import RunReport

__all__ = ["Run", "RunReport", "task_run", "tasks_drain"]
