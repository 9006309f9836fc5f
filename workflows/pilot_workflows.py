"""PILOT's own workflows: the demo contract, only when PILOT_DEMO_WORKFLOWS is true
(the demo Django tasks too, when TASKS names a PilotTaskBackend)."""

from workflows.apps import pilot_task_backend_alias
from workflows.conf import pilot_settings

if pilot_settings.PILOT_DEMO_WORKFLOWS:
    from workflows.demo import workflows  # noqa: F401  (registers demo.*)

    if pilot_task_backend_alias() is not None:
        from workflows.demo import tasks  # noqa: F401  (workflows.demo.tasks.*)
