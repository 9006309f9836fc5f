"""PILOT's own workflows: the demo contract of SPEC §12."""

from workflows.demo import workflows  # noqa: F401  (registers demo.*)
