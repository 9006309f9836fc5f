"""The dispatcher loop around `dispatch_once` (and the schedules' firing pass,
`schedules_fire_due`, and the replay log's folding, `replays.Folding`: any number
of dispatchers may run all three), with a clean stop."""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, close_old_connections, connections

from workflows.conf import pilot_settings
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.replays import Folding
from workflows.engine.scheduler_loop import scheduler_wait
from workflows.engine.schedules import schedules_fire_due
from workflows.observability.events import emit

log = logging.getLogger("pilot.dispatcher")


def dispatcher_loop(stop: threading.Event, *, poll: float | None = None,
                    max_passes: int | None = None) -> int:
    """Run passes until `stop` is set (or `max_passes` ran). Sleeps `poll`
    seconds when idle, less when a retry falls due sooner (both times are the
    database's), not at all when a scan was full. Survives anything a pass
    raises — a database outage (logs, backs off, reconnects) or a bug — so one
    bad pass never stops recovery for every task. Returns the number of passes."""
    poll = pilot_settings.PILOT_DISPATCHER_POLL_SECONDS if poll is None else poll
    passes, outage_wait = 0, poll
    fold = Folding()
    emit("dispatcher_started", poll_seconds=poll)
    while not stop.is_set() and (max_passes is None or passes < max_passes):
        started = time.monotonic()
        try:
            close_old_connections()
            report = dispatch_once()
            fired = schedules_fire_due()
            fold(report.db_now)  # type: ignore[arg-type]  # db_now: set by every pass
            outage_wait = poll
        except DatabaseError as exc:
            emit("dispatcher_db_unavailable", level=logging.WARNING, error=str(exc)[:200])
            connections.close_all()
            stop.wait(outage_wait)
            outage_wait = min(outage_wait * 2, 10.0)
            continue
        except Exception as exc:  # noqa: BLE001 - the loop outlives any one pass
            log.exception("dispatcher pass failed")
            emit("dispatcher_error", level=logging.ERROR,
                 error=f"{type(exc).__name__}: {exc}"[:300])
            stop.wait(outage_wait)
            outage_wait = min(outage_wait * 2, 10.0)
            continue
        passes += 1
        # For the metrics' dispatcher liveness (pilot_dispatcher_last_pass_age_seconds).
        emit("dispatcher_pass", level=logging.DEBUG)
        if report.full or fired.full:
            continue
        # A wait for something due counts from the pass's start (db_now is read
        # there): the time the pass itself took — its scans, the schedules, a
        # fold — is not added to a due retry's lateness.
        elapsed = time.monotonic() - started
        wait = poll
        if report.next_due is not None:
            # db_now: set by every pass
            wait = min(wait, max(0.0, (report.next_due - report.db_now).total_seconds() - elapsed))  # type: ignore[operator]  # noqa: E501
        wait = min(wait, scheduler_wait(fired, poll=poll, elapsed=elapsed))
        stop.wait(wait)
    emit("dispatcher_stopped", passes=passes)
    return passes


