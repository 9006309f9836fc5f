"""The long-running loops, with a clean stop (docs/design.md, "Dispatcher"):
the dispatcher's (`dispatch_once`, the schedules' firing pass and the replay
log's folding — any number of dispatchers may run all three) and the
scheduler's (`schedules_fire_due` alone, `manage.py run_scheduler`).

Both are `pass_loop`: a pass, then a sleep until what the pass saw next due
(never longer than the poll interval); a database outage is logged and waited
out with a doubling backoff, and the loop reconnects by itself; it outlives
anything a pass raises, so one bad pass never stops the work for every task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError

from workflows import database
from workflows.conf import pilot_settings
from workflows.engine.activity import ActivityFolding
from workflows.engine.dispatcher import DatabaseWatch, dispatch_once
from workflows.engine.replays import Folding
from workflows.engine.schedules import ScheduleFireReport, schedules_fire_due
from workflows.observability.events import Event, emit

log = logging.getLogger("pilot.dispatcher")

# A due schedule that another scheduler holds locked is looked at again this
# soon (it is done within milliseconds), instead of spinning.
MIN_WAIT = 0.05
OUTAGE_MAX_WAIT = 10.0


# What a pass returns: whether a scan was full (run again at once), and the
# things it saw due next, each as (seconds from the pass's start, the least
# sleep it may cause).
PassResult = tuple[bool, list[tuple[float, float]]]


def pass_loop(name: str, run_pass: Callable[[], PassResult], stop: threading.Event, *,
              poll: float, max_passes: int | None = None) -> int:
    """Run `run_pass()` until `stop` is set (or `max_passes` ran); returns the
    number of passes. After a full pass the next runs at once; otherwise the
    loop sleeps until the first thing due, counted from the pass's start, at
    most `poll`. The pass in progress when `stop` is set finishes first.
    Events: `<name>_started`, `<name>_pass`, `<name>_db_unavailable`,
    `<name>_error`, `<name>_stopped`."""
    passes, outage_wait = 0, poll
    emit(Event(f"{name}_started"), poll_seconds=poll)
    while not stop.is_set() and (max_passes is None or passes < max_passes):
        started = time.monotonic()
        try:
            database.refresh_connections()
            full, due = run_pass()
            outage_wait = poll
        except DatabaseError as exc:
            emit(Event(f"{name}_db_unavailable"), level=logging.WARNING, error=str(exc)[:200])
            database.close_connections()
            stop.wait(outage_wait)
            outage_wait = min(outage_wait * 2, OUTAGE_MAX_WAIT)
            continue
        except Exception as exc:  # noqa: BLE001 - the loop outlives any one pass
            log.exception("%s pass failed", name)
            emit(Event(f"{name}_error"), level=logging.ERROR,
                 error=f"{type(exc).__name__}: {exc}"[:300])
            stop.wait(outage_wait)
            outage_wait = min(outage_wait * 2, OUTAGE_MAX_WAIT)
            continue
        passes += 1
        # For the metrics' liveness gauges (pilot_dispatcher_last_pass_age_seconds).
        emit(Event(f"{name}_pass"), level=logging.DEBUG)
        if full:
            continue
        # A wait for something due counts from the pass's start: the time the pass
        # itself took — its scans, the schedules, a fold — is not added to a due
        # retry's lateness.
        elapsed = time.monotonic() - started
        stop.wait(min([poll, *(max(floor, due_in - elapsed) for due_in, floor in due)]))
    emit(Event(f"{name}_stopped"), passes=passes)
    return passes


def _until(due: datetime | None, now: datetime | None) -> float | None:
    """Seconds from `now` until `due` (both the database's), None if nothing is due."""
    if due is None or now is None:
        return None
    return (due - now).total_seconds()


def scheduler_wait(report: ScheduleFireReport, *, poll: float, elapsed: float) -> float:
    """Seconds to sleep after a scheduler pass: until the next due slot (by the
    database clock the pass read), at most `poll`, at least MIN_WAIT."""
    until_due = _until(report.next_due, report.now)
    if until_due is None:
        return poll
    return max(MIN_WAIT, min(poll, until_due - elapsed))


def _slots_due(report: ScheduleFireReport) -> list[tuple[float, float]]:
    until_due = _until(report.next_due, report.now)
    return [] if until_due is None else [(until_due, MIN_WAIT)]


def dispatcher_loop(stop: threading.Event, *, poll: float | None = None,
                    max_passes: int | None = None) -> int:
    """The dispatcher's loop: each pass recovers, enqueues and re-sends
    (`dispatch_once`), fires due schedules, folds the replay log and the
    dashboard's activity; it sleeps
    until the earliest due retry or slot it saw, at most the poll interval."""
    poll = pilot_settings.PILOT_DISPATCHER_POLL_SECONDS if poll is None else poll
    fold = Folding()
    watch = DatabaseWatch()  # a failover seen between two passes (docs/design.md, "Dispatcher")
    fold_activity = ActivityFolding()

    def run_pass() -> PassResult:
        report = dispatch_once(watch=watch)
        fired = schedules_fire_due()
        fold(report.db_now)  # type: ignore[arg-type]  # db_now: set by every pass
        fold_activity(report.db_now)  # type: ignore[arg-type]
        retry = _until(report.next_due, report.db_now)
        due = _slots_due(fired) + ([] if retry is None else [(retry, 0.0)])
        return report.full or fired.full, due

    return pass_loop("dispatcher", run_pass, stop, poll=poll, max_passes=max_passes)


def scheduler_loop(stop: threading.Event, *, poll: float | None = None,
                   max_passes: int | None = None) -> int:
    """The scheduler's loop (`manage.py run_scheduler`): one firing pass, then a
    sleep until the next slot is due (never longer than the poll interval, so
    new and changed schedules are seen)."""
    poll = pilot_settings.PILOT_SCHEDULER_POLL_SECONDS if poll is None else poll

    def run_pass() -> PassResult:
        report = schedules_fire_due()
        return report.full, _slots_due(report)

    return pass_loop("scheduler", run_pass, stop, poll=poll, max_passes=max_passes)
