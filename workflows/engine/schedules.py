"""Firing schedules: one pass, `schedules_fire_due`, safe on any number of
schedulers at once and across restarts.

For every enabled schedule whose `next_slot_at` has come (by the database
clock, never a machine's), in its own short transaction:

1. lock the schedule row with SELECT … FOR UPDATE SKIP LOCKED, so two
   schedulers never work on one schedule at the same time (the second one
   passes it by and takes the next);
2. list the slots from `next_slot_at` up to now (croniter; the latest 100 at
   most) and pick the ones to run by the schedule's `missed` policy:

       skip      the latest slot, if it is at most PILOT_SCHEDULE_GRACE_SECONDS
                 old (on time); slots older than that do not run
       run_once  the latest slot, however late: every missed slot collapses
                 into one run
       catch_up  every slot, oldest first (at most 100: the latest 100)

   While a scheduler keeps up there is one slot per pass and all three agree;
   they differ only after an outage;
3. trigger each through the engine (`task_trigger_many`) with the key
   `schedule:<name>:<slot, ISO 8601 UTC>` owned by the schedule's owner — the
   trigger's idempotency is the arbiter: a slot fired again (a scheduler that
   died after its commit was lost, a schedule deleted and re-created) replays
   its task instead of starting another;
4. move `next_slot_at` past the latest slot and record what happened, in the
   same transaction as the tasks it created.

A slot that the engine refuses (workflow no longer registered, payload no
longer valid) is recorded on the schedule (`last_error`) and logged; the
schedule moves on to its next slot and the other schedules are not held up.
A schedule whose own data breaks the pass (a stored cron croniter cannot read)
is paused (`next_slot_at` cleared) with its error recorded. Only a lost
database connection stops the pass (the caller's loop waits and reconnects).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Min

from workflows.accounts import schedule_owner_problem
from workflows.conf import pilot_settings
from workflows.engine.store import database_now, store
from workflows.engine.triggers import (
    CREATED,
    REPLAYED,
    TriggerOutcome,
    TriggerRequest,
    task_trigger,
    task_trigger_many,
)
from workflows.models import MissedPolicy, PilotSchedule
from workflows.observability.events import Event, emit, emit_on_commit
from workflows.rules.cron import cron_latest_slots, cron_next, slot_text
from workflows.rules.errors import PilotError, TaskNotFound, ValidationFailed
from workflows.rules.states import Source

log = logging.getLogger("pilot.schedules")

BATCH = 100  # schedules handled per pass at most (then `full`: run again at once)
MAX_CATCH_UP = 100  # slots one schedule fires in one pass at most
MAX_ERROR_LENGTH = 2000
# Scheduled runs (and a Run now) are recorded with the source `schedule`; the
# key `schedule:<name>:<slot>` (or `…:now-<token>`) says which schedule and slot.
SCHEDULE_SOURCE = Source.SCHEDULE


@dataclasses.dataclass
class ScheduleFireReport:
    """What one pass did. `next_due` is the earliest `next_slot_at` of any
    enabled schedule (when the caller should look again); `full` says the pass
    stopped at its batch limit with more schedules due."""

    now: datetime
    schedules: int = 0
    created: int = 0
    replayed: int = 0
    restarted: int = 0
    skipped: int = 0
    refused: int = 0
    errors: int = 0
    next_due: datetime | None = None
    full: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"now": self.now.isoformat(), "schedules": self.schedules,
                "created": self.created, "replayed": self.replayed,
                "restarted": self.restarted, "skipped": self.skipped,
                "refused": self.refused, "errors": self.errors,
                "next_due": self.next_due.isoformat() if self.next_due else None,
                "full": self.full}


def schedule_key(name: str, slot: datetime) -> str:
    """The idempotency key of one slot of schedule `name`."""
    return f"schedule:{name}:{slot_text(slot)}"


def schedule_run_now_key(name: str, token: str) -> str:
    """The key of an operator's "Run now" of schedule `name`: under the
    schedule's own prefix (`schedule:<name>:`, so its runs list shows it),
    never a slot's (`now-…` is no ISO time), so it neither replays nor blocks
    a slot. `token` (32 hex digits) is chosen once per confirmation page: the
    same confirmation sent twice replays its task instead of starting two."""
    return f"schedule:{name}:now-{token}"


def schedule_run_now(*, name: str, token: str, actor: Any,
                     trace_id: str = "") -> TriggerOutcome:
    """Trigger one run of schedule `name` now, outside its slots: its workflow
    and payload, as its owner, through the normal trigger path
    (`task_trigger`, source `schedule`) with `schedule_run_now_key`. The
    schedule row is not changed (its next slot, last fired slot and count
    are the scheduler's); enabled or paused alike. Raises TaskNotFound (no
    such schedule), ValidationFailed (a bad token, or an owner deactivated or
    made superuser since) and whatever the trigger refuses (the workflow no
    longer registered, the payload no longer valid)."""
    if not (isinstance(token, str) and len(token) == 32
            and all(c in "0123456789abcdef" for c in token)):
        raise ValidationFailed("Not a run-now token (32 hex digits)",
                               errors={"token": ["32 hex digits"]})
    schedule = PilotSchedule.objects.select_related("owner").filter(name=name).first()
    if schedule is None:
        raise TaskNotFound(f"No schedule is named {name!r}")
    problem = schedule_owner_problem(schedule.owner)
    if problem:
        raise ValidationFailed(problem, errors={"owner": [problem]})
    trace_id = trace_id or uuid.uuid4().hex
    outcome = task_trigger(owner=schedule.owner, workflow=schedule.workflow,
                           payload=schedule.payload, key=schedule_run_now_key(name, token),
                           source=SCHEDULE_SOURCE, trace_id=trace_id)
    emit(Event.SCHEDULE_FIRED, schedule=name, workflow=schedule.workflow, slot="now",
         outcome=outcome.outcome, task_id=str(outcome.task.pk), trace_id=trace_id,
         actor=getattr(actor, "get_username", lambda: str(actor))())
    return outcome


def slots_to_fire(missed: str, slots: list[datetime], *, now: datetime,
                  grace: float) -> list[datetime]:
    """Which of the due `slots` (oldest first) run under policy `missed`; see the
    module docstring. Pure."""
    if not slots:
        return []
    latest = slots[-1]
    if missed == MissedPolicy.CATCH_UP:
        return list(slots)
    if missed == MissedPolicy.RUN_ONCE:
        return [latest]
    return [latest] if (now - latest).total_seconds() <= grace else []


def schedules_fire_due(*, now: datetime | None = None, batch: int = BATCH,
                       grace: float | None = None) -> ScheduleFireReport:
    """One pass over the due schedules (see the module docstring); returns what
    it did. `now` defaults to the database clock; `grace` to
    PILOT_SCHEDULE_GRACE_SECONDS. Each schedule is one transaction holding its
    row lock (SKIP LOCKED) and the task rows its trigger locks, never anything
    across schedules. Calling it again at once does nothing more: the slots it
    handled are behind every schedule's `next_slot_at`. Raises only what the
    scan itself meets (the database unreachable: OperationalError); a failure
    inside one schedule's transaction pauses that schedule and the pass goes on."""
    now = now or database_now()
    grace = pilot_settings.PILOT_SCHEDULE_GRACE_SECONDS if grace is None else grace
    report = ScheduleFireReport(now=now)
    tried: set[int] = set()
    while True:
        if len(tried) >= batch:
            report.full = True
            break
        current, before = None, dataclasses.replace(report)
        try:
            with transaction.atomic():
                schedule = _lock_next_due(now, tried)
                if schedule is None:
                    break
                current = schedule.pk
                tried.add(current)
                _fire(schedule, now, grace, report)
        except (OperationalError, InterfaceError):
            raise  # the database is unreachable: nothing else can work either
        except Exception as exc:  # one broken schedule must not stop the others
            if current is None:
                raise
            report = before  # what that schedule's rolled-back transaction counted is void
            _pause_after_error(current, now, exc, report)
    report.next_due = (PilotSchedule.objects.filter(enabled=True, next_slot_at__isnull=False)
                       .aggregate(m=Min("next_slot_at"))["m"])
    return report


def _lock_next_due(now: datetime, tried: set[int]) -> PilotSchedule | None:
    return store().schedules.lock_next_due_in_tx(now, tried)


def _fire(schedule: PilotSchedule, now: datetime, grace: float,
          report: ScheduleFireReport) -> None:
    """Decide and fire the due slots of one locked schedule, then save it."""
    report.schedules += 1
    # a due schedule has its next slot (the query filters on it)
    slots, older_dropped = cron_latest_slots(schedule.cron, since=schedule.next_slot_at, now=now,  # type: ignore[arg-type]  # noqa: E501
                                             limit=MAX_CATCH_UP, hash_id=schedule.name)
    chosen = slots_to_fire(schedule.missed, slots, now=now, grace=grace)
    fields = ["next_slot_at", "updated_at"]
    schedule.next_slot_at = cron_next(schedule.cron, slots[-1] if slots else now,
                                      hash_id=schedule.name)
    schedule.updated_at = now
    skipped = [slot for slot in slots if slot not in chosen]
    if skipped or older_dropped:
        report.skipped += len(skipped)
        emit_on_commit(Event.SCHEDULE_SLOTS_SKIPPED, schedule=schedule.name, missed=schedule.missed,
                       count=len(skipped), more_before=older_dropped,
                       first=slot_text(skipped[0]) if skipped else None,
                       last=slot_text(skipped[-1]) if skipped else None)
    if chosen:
        fields += _trigger_slots(schedule, chosen, now, report)
    store().schedules.write_in_tx(schedule, fields)


def _trigger_slots(schedule: PilotSchedule, chosen: list[datetime], now: datetime,
                   report: ScheduleFireReport) -> list[str]:
    """Trigger the chosen slots of `schedule`; returns the fields it set."""
    trace_id = uuid.uuid4().hex
    requests = [TriggerRequest(schedule.workflow, schedule.payload,
                               schedule_key(schedule.name, slot)) for slot in chosen]
    # An owner deactivated (or made superuser) since the schedule was saved:
    # its slots are refused, not run as it.
    owner_problem = schedule_owner_problem(schedule.owner)
    outcomes: list[Any] = (
        [ValidationFailed(owner_problem, errors={"owner": [owner_problem]})] * len(chosen)
        if owner_problem else
        task_trigger_many(owner=schedule.owner, requests=requests, source=SCHEDULE_SOURCE,
                          trace_id=trace_id))
    errors = []
    for slot, outcome in zip(chosen, outcomes, strict=True):
        if isinstance(outcome, PilotError):
            report.refused += 1
            errors.append(f"{slot_text(slot)}: {outcome.code}: {outcome.detail}")
            emit_on_commit(Event.SCHEDULE_FIRE_REFUSED, level=logging.WARNING,
                           schedule=schedule.name, workflow=schedule.workflow,
                           slot=slot_text(slot), code=outcome.code, detail=outcome.detail)
            continue
        kind = outcome.outcome
        if kind == CREATED:
            report.created += 1
            schedule.fired_count += 1
        elif kind == REPLAYED:
            report.replayed += 1
        else:
            report.restarted += 1
        schedule.last_fired_slot = slot
        schedule.last_task_id = outcome.task.pk
        emit_on_commit(Event.SCHEDULE_FIRED, schedule=schedule.name, workflow=schedule.workflow,
                       slot=slot_text(slot), outcome=kind, task_id=str(outcome.task.pk),
                       trace_id=trace_id)
    schedule.last_fired_at = now
    if errors:
        schedule.last_error = "\n".join(errors)[:MAX_ERROR_LENGTH]
        schedule.last_error_at = now
    else:
        schedule.last_error = ""
    return ["last_fired_slot", "last_task_id", "last_fired_at", "fired_count", "last_error",
            "last_error_at"]


def _pause_after_error(pk: int, now: datetime, exc: BaseException,
                       report: ScheduleFireReport) -> None:
    """Record an unexpected failure of schedule `pk` and pause it (its
    `next_slot_at` cleared: never due until it is saved again), so the next
    pass does not fail on it the same way. Its transaction was rolled back."""
    report.errors += 1
    log.exception("schedule %s failed; paused", pk, exc_info=exc)
    detail = f"paused after an unexpected error: {type(exc).__name__}: {exc}"
    store().schedules.pause_after_error(pk, now=now, error=detail[:MAX_ERROR_LENGTH])
    emit(Event.SCHEDULE_PAUSED, level=logging.ERROR, schedule_id=pk, error=detail[:200])
