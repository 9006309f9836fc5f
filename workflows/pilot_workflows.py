"""PILOT's own workflows: the demo contract, only when PILOT_DEMO_WORKFLOWS is true."""

from django.conf import settings

if getattr(settings, "PILOT_DEMO_WORKFLOWS", False):
    from workflows.demo import workflows  # noqa: F401  (registers demo.*)
