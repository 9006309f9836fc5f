"""Raw django-q2 as a user would run it: the bench settings with django-q2's own
defaults (results saved and pruned to 250, poll 0.2 s, no timeout) — only the
cluster name, worker count and broker are PILOT's. The baseline the issue's
reference figures describe; `bench.settings` keeps PILOT's tuned cluster for
the other raw baseline, the ceiling."""

from bench.settings import *  # noqa: F403

Q_CLUSTER = {key: Q_CLUSTER[key] for key in ("name", "workers", "orm", "redis")  # noqa: F405
             if key in Q_CLUSTER}  # noqa: F405
# PILOT's checks guard PILOT's cluster; this one is deliberately django-q2's own.
SILENCED_SYSTEM_CHECKS = ["pilot.E001", "pilot.E002", "pilot.E003", "pilot.E008", "pilot.W008"]
