"""The store's verbs for the schedule aggregate (docs/design.md, "The store";
docs/schedules.md).

schedules.py (firing) and schedule_definitions.py (defining) decide; every
`PilotSchedule` row they lock or change is locked or changed here. Nothing
here emits an event: the callers do, on commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from workflows.database import in_callers_transaction
from workflows.models import PilotSchedule


class ScheduleStore:
    @in_callers_transaction
    def lock_next_due_in_tx(self, now: datetime, tried: set[int]) -> PilotSchedule | None:
        """The next enabled schedule due at `now` that no other scheduler holds
        (FOR UPDATE SKIP LOCKED: passed by, never waited for), and not one of
        `tried`, with its owner; in the caller's transaction."""
        return (PilotSchedule.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("owner")
                .filter(enabled=True, next_slot_at__lte=now).exclude(pk__in=tried)
                .order_by("next_slot_at", "pk").first())

    @in_callers_transaction
    def lock_by_name_in_tx(self, name: str) -> PilotSchedule | None:
        """Schedule `name` FOR UPDATE (None: there is none), in the caller's
        transaction."""
        return PilotSchedule.objects.select_for_update().filter(name=name).first()

    @in_callers_transaction
    def write_in_tx(self, schedule: PilotSchedule, fields: list[str]) -> None:
        """Write `fields` of a schedule the caller holds locked."""
        schedule.save(update_fields=fields)

    @in_callers_transaction
    def insert_in_tx(self, schedule: PilotSchedule) -> tuple[PilotSchedule, bool]:
        """Insert `schedule` in a savepoint: (it, True); or, when another
        transaction created the name first, (that row locked, False)."""
        try:
            with transaction.atomic():
                schedule.save(force_insert=True)
            return schedule, True
        except IntegrityError:
            return PilotSchedule.objects.select_for_update().get(name=schedule.name), False

    @in_callers_transaction
    def remove_in_tx(self, schedule: PilotSchedule) -> None:
        """Delete a schedule the caller holds locked (its runs stay)."""
        schedule.delete()

    def pause_after_error(self, pk: Any, *, now: datetime, error: str) -> None:
        """Never due until saved again (`next_slot_at` cleared), with why."""
        PilotSchedule.objects.filter(pk=pk).update(next_slot_at=None, updated_at=now,
                                                   last_error=error, last_error_at=now)


__all__ = ["ScheduleStore"]
