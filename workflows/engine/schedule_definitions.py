"""Creating, changing and deleting schedules, and writing the ones declared in
code — the only writers of PilotSchedule besides the firing pass
(workflows.engine.schedules).

`next_slot_at` (the first slot not yet handled) starts at the first slot after
now (database clock) when a schedule is created, when its cron changes and
when it is enabled again: slots from before it existed, from another cron, or
from while it was disabled are never "missed". Any other change (payload,
owner, policy) keeps it, so an edit neither skips nor repeats a slot.

Schedules declared in code (`define_workflow(..., schedule=...)`) are written
by `schedules_sync_declared`, which `migrate` runs (post_migrate, like Django's
own permissions: every deploy migrates, once, with the new code) and which
`schedule_workflow --sync` runs by hand. Not at the start of every process:
during a rolling deploy old and new processes would rewrite each other's
definitions. Operators may pause and resume a code-declared schedule
(`enabled`); everything else about it belongs to the code.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

from django.db import transaction

from workflows.accounts import schedule_owner_problem, scheduler_owner_get
from workflows.engine.store import database_now, store
from workflows.engine.triggers import payload_validate
from workflows.models import MissedPolicy, PilotSchedule, ScheduleOrigin
from workflows.observability.events import Event, emit_on_commit
from workflows.registry import SCHEDULE_NAME_RE, Workflow, registry, unknown_workflow_message
from workflows.rules.cron import CronInvalid, cron_next, cron_normalize
from workflows.rules.errors import PilotError, ValidationFailed

CREATED, UPDATED, UNCHANGED = "created", "updated", "unchanged"
_DEFINITION = ("workflow", "payload", "cron", "owner_id", "missed")


@dataclasses.dataclass
class SyncReport:
    created: list[str] = dataclasses.field(default_factory=list)
    updated: list[str] = dataclasses.field(default_factory=list)
    unchanged: list[str] = dataclasses.field(default_factory=list)
    deleted: list[str] = dataclasses.field(default_factory=list)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


def schedule_validate(*, name: Any, workflow: Any, cron: Any, payload: Any, owner: Any,
                      missed: Any) -> str:
    """Check a definition without writing anything; returns the normalized cron.
    Raises ValidationFailed with one message per bad field (every field is
    checked, so a form can show them all at once)."""
    errors: dict[str, list[str]] = {}
    if not isinstance(name, str) or not SCHEDULE_NAME_RE.match(name):
        errors["name"] = ["1-100 letters, digits, '.', '_' or '-', starting with a letter or "
                          "digit."]
    found = registry.find(workflow)
    if found is None:
        errors["workflow"] = [f"{unknown_workflow_message(workflow)}."]
    try:
        cron = cron_normalize(cron, hash_id=name if isinstance(name, str) else "")
    except CronInvalid as exc:
        errors["cron"] = [str(exc)]
    if missed not in MissedPolicy.values:
        errors["missed"] = [f"Must be one of {', '.join(MissedPolicy.values)}."]
    owner_problem = schedule_owner_problem(owner)
    if owner_problem:
        errors["owner"] = [owner_problem]
    problem = _payload_problem(found, payload)
    if problem:
        errors["payload"] = [problem]
    if errors:
        raise ValidationFailed("The schedule is not valid; see errors", errors=errors)
    return cron


def _payload_problem(workflow: Workflow | None, payload: Any) -> str | None:
    """What the trigger would refuse about this payload (None if nothing), so a
    schedule that could never fire is refused when it is written."""
    try:
        payload_validate(payload, workflow)
    except PilotError as exc:
        if workflow is not None and exc.errors and exc.detail.startswith(
                "The payload is not valid for"):
            return f"Not valid for {workflow.name}: {json.dumps(exc.errors['payload'])}"
        return exc.detail
    return None


def schedule_save(*, name: str, workflow: str, cron: str, payload: dict[str, Any], owner: Any,
                  missed: str = MissedPolicy.SKIP, enabled: bool | None = None,
                  origin: str = ScheduleOrigin.OPERATOR,
                  now: datetime | None = None) -> tuple[PilotSchedule, str]:
    """Create schedule `name` or change it to this definition; returns (schedule,
    created | updated | unchanged). `enabled=None` keeps the current value (a new
    schedule is enabled). Validates first (ValidationFailed, nothing written);
    refuses (ValidationFailed) to let an operator change a schedule declared in
    code, or code take over an operator's schedule of the same name. Locks the
    row for the update; a concurrent create of the same name loses to the
    unique constraint and is retried as an update."""
    cron = schedule_validate(name=name, workflow=workflow, cron=cron, payload=payload,
                             owner=owner, missed=missed)
    now = now or database_now()
    with transaction.atomic():
        schedule = store().schedules.lock_by_name_in_tx(name)
        if schedule is None:
            schedule, created = _create(name=name, workflow=workflow, cron=cron, payload=payload,
                                        owner=owner, missed=missed, origin=origin, now=now,
                                        enabled=True if enabled is None else enabled)
            if created:
                emit_on_commit(Event.SCHEDULE_CREATED, schedule=name, workflow=workflow, cron=cron,
                               origin=origin)
                return schedule, CREATED
        if schedule.origin != origin:
            raise ValidationFailed(
                f"Schedule {name!r} is declared in code; change it there (operators may only "
                "enable or disable it)" if schedule.origin == ScheduleOrigin.CODE else
                f"Schedule {name!r} already exists and was created by an operator",
                errors={"name": ["Belongs to the " + schedule.origin + "."]})
        changed = _apply(schedule, workflow=workflow, cron=cron, payload=payload, owner=owner,
                         missed=missed, enabled=schedule.enabled if enabled is None else enabled,
                         now=now)
        if not changed:
            return schedule, UNCHANGED
        schedule.updated_at = now
        store().schedules.write_in_tx(schedule, [*changed, "updated_at"])
        emit_on_commit(Event.SCHEDULE_UPDATED, schedule=name, fields=sorted(changed))
        return schedule, UPDATED


def _create(*, now: datetime, **fields: Any) -> tuple[PilotSchedule, bool]:
    """Insert in a savepoint; (the existing row locked, False) if another
    transaction created the name first."""
    return store().schedules.insert_in_tx(PilotSchedule(
        **fields, created_at=now, updated_at=now,
        next_slot_at=_first_slot(fields["cron"], fields["name"], now)
        if fields["enabled"] else None))


def _apply(schedule: PilotSchedule, *, workflow: str, cron: str, payload: dict[str, Any],
           owner: Any, missed: str, enabled: bool, now: datetime) -> list[str]:
    """Set the new values on the locked row; returns the names of changed fields."""
    changed = []
    restart = (cron != schedule.cron) or (enabled and not schedule.enabled)
    for field, value in (("workflow", workflow), ("cron", cron), ("payload", payload),
                         ("owner_id", owner.pk), ("missed", missed), ("enabled", enabled)):
        if getattr(schedule, field) != value:
            setattr(schedule, field, value)
            changed.append(field.removesuffix("_id"))
    if not enabled:
        new_next = None
    elif restart or schedule.next_slot_at is None:
        new_next = _first_slot(cron, schedule.name, now)
    else:
        new_next = schedule.next_slot_at
    if new_next != schedule.next_slot_at:
        schedule.next_slot_at = new_next
        changed.append("next_slot_at")
    return changed


def _first_slot(cron: str, name: str, now: datetime) -> datetime:
    return cron_next(cron, now, hash_id=name)


def schedule_set_enabled(*, name: str, enabled: bool,
                         now: datetime | None = None) -> PilotSchedule:
    """Pause or resume a schedule (operator or code-declared). Resuming starts
    from the next slot after now: slots while it was paused never run. Raises
    ValidationFailed for an unknown name."""
    now = now or database_now()
    with transaction.atomic():
        schedule = _locked(name)
        if schedule.enabled == enabled:
            return schedule
        schedule.enabled = enabled
        schedule.next_slot_at = _first_slot(schedule.cron, name, now) if enabled else None
        schedule.updated_at = now
        store().schedules.write_in_tx(schedule, ["enabled", "next_slot_at", "updated_at"])
        emit_on_commit(Event.SCHEDULE_ENABLED if enabled else "schedule_disabled", schedule=name)
        return schedule


def schedule_delete(*, name: str, origin: str = ScheduleOrigin.OPERATOR) -> None:
    """Delete schedule `name`; the runs it started stay. ValidationFailed for an
    unknown name, or for an operator deleting a schedule declared in code (the
    next sync would bring it back)."""
    with transaction.atomic():
        schedule = _locked(name)
        if schedule.origin != origin:
            raise ValidationFailed(f"Schedule {name!r} is declared in code; remove it there",
                                   errors={"name": ["Declared in code."]})
        store().schedules.remove_in_tx(schedule)
        emit_on_commit(Event.SCHEDULE_DELETED, schedule=name)


def _locked(name: str) -> PilotSchedule:
    schedule = store().schedules.lock_by_name_in_tx(name)
    if schedule is None:
        raise ValidationFailed(f"No schedule is named {name!r}",
                               errors={"name": ["No such schedule."]})
    return schedule


def schedules_sync_declared(*, now: datetime | None = None) -> SyncReport:
    """Make the database hold exactly the schedules the code declares: create or
    update each (keeping `enabled`, which operators own) and delete code-declared
    schedules no longer declared. A declaration that cannot be written (its
    owner does not exist, its payload is refused, an operator's schedule has
    the name) is reported in `errors` and the others go on. Idempotent."""
    now = now or database_now()
    report = SyncReport()
    declared = registry.schedules()
    for workflow, spec in declared:
        try:
            owner = scheduler_owner_get(spec.owner)
            # a declared schedule is named by now (registry)
            _, outcome = schedule_save(name=spec.name, workflow=workflow.name, cron=spec.cron,  # type: ignore[arg-type]  # noqa: E501
                                       payload=spec.payload, owner=owner, missed=spec.missed,
                                       origin=ScheduleOrigin.CODE, now=now)
        except LookupError as exc:
            report.errors[spec.name] = f"owner: {exc}"  # type: ignore[index]
            continue
        except PilotError as exc:
            report.errors[spec.name] = f"{exc.detail} {exc.errors or ''}".strip()  # type: ignore[index]
            continue
        getattr(report, outcome).append(spec.name)
    names = {spec.name for _, spec in declared}
    stale = (PilotSchedule.objects.filter(origin=ScheduleOrigin.CODE)
             .exclude(name__in=names).values_list("name", flat=True))
    for name in list(stale):
        schedule_delete(name=name, origin=ScheduleOrigin.CODE)
        report.deleted.append(name)
    return report


def schedules_sync_after_migrate(sender: object = None, using: str = "default",
                                 **kwargs: object) -> None:
    """post_migrate receiver: write the schedules declared in code. Does nothing
    (not even a query) when the code declares none, or when the table is not
    there yet (a migrate to an earlier migration)."""
    from workflows import database

    if not registry.schedules():
        return
    if not database.has_table(PilotSchedule._meta.db_table, using):
        return
    report = schedules_sync_declared()
    emit_on_commit(Event.SCHEDULES_SYNCED, created=report.created, updated=report.updated,
                   deleted=report.deleted, errors=report.errors)
