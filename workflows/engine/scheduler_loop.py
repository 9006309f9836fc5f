"""The scheduler loop around `schedules_fire_due`, with a clean stop.

Mirrors the dispatcher's loop (workflows.engine.loop): one pass, then sleep
until the next slot is due (never longer than the poll interval, so new and
changed schedules are seen); a database outage is logged and waited out with
backoff, and the loop reconnects by itself.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, close_old_connections, connections

from workflows.conf import pilot_settings
from workflows.engine.schedules import ScheduleFireReport, schedules_fire_due
from workflows.observability.events import emit

# A due schedule that another scheduler holds locked is looked at again this
# soon (it is done within milliseconds), instead of spinning.
MIN_WAIT = 0.05


def scheduler_loop(stop: threading.Event, *, poll: float | None = None,
                   max_passes: int | None = None) -> int:
    """Run passes until `stop` is set (or `max_passes` ran); returns the number
    of passes. The pass in progress when `stop` is set finishes first."""
    poll = pilot_settings.PILOT_SCHEDULER_POLL_SECONDS if poll is None else poll
    passes, outage_wait = 0, poll
    emit("scheduler_started", poll_seconds=poll)
    while not stop.is_set() and (max_passes is None or passes < max_passes):
        started = time.monotonic()
        try:
            close_old_connections()
            report = schedules_fire_due()
            outage_wait = poll
        except DatabaseError as exc:
            emit("scheduler_db_unavailable", level=logging.WARNING, error=str(exc)[:200])
            connections.close_all()
            stop.wait(outage_wait)
            outage_wait = min(outage_wait * 2, 10.0)
            continue
        passes += 1
        if report.full:
            continue
        stop.wait(scheduler_wait(report, poll=poll, elapsed=time.monotonic() - started))
    emit("scheduler_stopped", passes=passes)
    return passes


def scheduler_wait(report: ScheduleFireReport, *, poll: float, elapsed: float) -> float:
    """Seconds to sleep after a pass: until the next due slot (by the database
    clock the pass read), at most `poll`, at least MIN_WAIT."""
    if report.next_due is None:
        return poll
    until_due = (report.next_due - report.now).total_seconds() - elapsed
    return max(MIN_WAIT, min(poll, until_due))
