"""The raw django-q2 baseline: what a hand-written task does for a 3-step run
without PILOT — three rows, each its own autocommit INSERT, as three
checkpoints would be. No claim, no lease, no audit trail, no fencing."""

from django.utils import timezone

from bench.ceiling.models import BareStep

STEPS = ("one", "two", "three")


def write3(run_id: str) -> str:
    for index, name in enumerate(STEPS):
        now = timezone.now()
        BareStep.objects.create(run=run_id, index=index, name=name, state="succeeded",
                                output=index + 1, started_at=now, finished_at=now)
    return "done"
