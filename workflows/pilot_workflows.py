"""PILOT's own workflows: the demo contract, only when PILOT_DEMO_WORKFLOWS is true."""

from workflows.conf import pilot_settings

if pilot_settings.PILOT_DEMO_WORKFLOWS:
    from workflows.demo import tasks, workflows  # noqa: F401  (registers demo.* and the tasks)
