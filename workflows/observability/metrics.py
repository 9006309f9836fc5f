"""Prometheus metrics, fed by the engine's events (docs/design.md, "Observability").

`install()` (called once per process by the app config) hooks `on_event` into
`events.add_listener`, so every process that runs engine code — gunicorn
workers (triggers), `qcluster` workers (claims, steps, transitions), the
dispatcher, commands — counts what it did. The engine knows nothing of
Prometheus.

Multiprocess mode: when PROMETHEUS_MULTIPROC_DIR is set in a process's
environment *before it starts*, prometheus-client writes its counters and
histograms to per-process files in that directory, and `/metrics` (any web
process on the machine) merges them all. Every PILOT process on a machine
must share one such directory, empty when the machine boots. Without it each
process only sees its own counts (fine for tests and `make run` in one
process; bin/run-local sets one up).

Processes come and go (django-q2 recycles its workers): the files of dead
ones are compacted into archives before a scrape reads the directory, so the
scrape costs the same after weeks (observability.multiproc).

Read at scrape time rather than counted (each cached for
PILOT_METRICS_TASKS_TTL seconds in the shared cache, so many web processes and
scrapers cost one read per TTL):

- `pilot_tasks{state}`: exact for the unfinished states (few whatever the
  retention), and for a finished state up to 10 000 tasks, the planner's
  estimate beyond (`task_counts_by_state`: no read of history);
- `pilot_backlog_tasks` and `pilot_oldest_pending_age_seconds`: tasks waiting
  for a worker (pending, or retrying and due) and how long the oldest has;
- `pilot_dispatcher_last_pass_age_seconds`: since any dispatcher last finished
  a pass. Each dispatcher process notes its passes (`dispatcher_pass` events)
  in the shared cache, at most every DISPATCHER_BEAT_SECONDS.
"""

from __future__ import annotations

import logging
import os
import time

from django.db import DatabaseError
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from workflows.conf import pilot_settings
from workflows.observability import events
from workflows.observability.events import Event
from workflows.observability.multiproc import compact, scrape_lock
from workflows.observability.shared_cache import cache, cache_soft

log = logging.getLogger("pilot.metrics")

TRIGGER_EVENTS = {Event.TASK_TRIGGERED, Event.TASK_REPLAYED, Event.TASK_RESTARTED}

TRIGGERS = Counter("pilot_triggers", "Trigger calls by outcome: created, replayed, restarted, "
                   "or the error code of a refusal", ["workflow", "outcome"])
TRANSITIONS = Counter("pilot_transitions", "Task state changes",
                      ["workflow", "from", "to"])
STEP_DURATION = Histogram(
    "pilot_step_duration_seconds", "Wall time of succeeded step bodies (with checkpoint)",
    ["workflow", "step"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900))
QUEUE_LAG = Histogram(
    "pilot_queue_lag_seconds", "From a task's enqueue to its claim by a worker",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
DISPATCHER_ACTIONS = Counter("pilot_dispatcher_actions", "What dispatcher passes did",
                             ["action"])
DISPATCHER_ERRORS = Counter("pilot_dispatcher_errors", "Tasks (or whole passes) the dispatcher "
                            "could not handle; each was logged and skipped")
# Completion webhooks (docs/webhooks.md): each attempt's outcome — delivered (a
# 2xx), retrying, gave_up (failed for good), claim_lost (a stalled sender's late
# outcome, refused) — and how long attempts took.
WEBHOOK_ATTEMPTS = Counter("pilot_webhook_attempts", "Completion webhook attempts by outcome",
                           ["outcome"])
WEBHOOK_DURATION = Histogram(
    "pilot_webhook_attempt_seconds", "Wall time of completion webhook attempts",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
WEBHOOK_EVENTS = {Event.WEBHOOK_DELIVERED: "delivered", Event.WEBHOOK_FAILED: "retrying",
                  Event.WEBHOOK_GAVE_UP: "gave_up", Event.WEBHOOK_CLAIM_LOST: "claim_lost"}


def _trigger(event: str, fields: dict) -> None:
    TRIGGERS.labels(fields.get("workflow") or "", fields.get("outcome") or event).inc()


def _refused(event: str, fields: dict) -> None:
    # No workflow label: a refused name may be anything a client typed.
    TRIGGERS.labels("", fields.get("code") or "refused").inc()


def _transition(event: str, fields: dict) -> None:
    TRANSITIONS.labels(fields.get("workflow") or "", fields.get("from_state") or "",
                       fields.get("to_state") or "").inc()


def _step(event: str, fields: dict) -> None:
    if fields.get("duration_ms") is not None:
        STEP_DURATION.labels(fields.get("workflow") or "", fields.get("step") or "") \
            .observe(fields["duration_ms"] / 1000)


def _claim(event: str, fields: dict) -> None:
    if fields.get("queue_lag_seconds") is not None:
        QUEUE_LAG.observe(max(0.0, fields["queue_lag_seconds"]))


def _webhook(event: str, fields: dict) -> None:
    WEBHOOK_ATTEMPTS.labels(WEBHOOK_EVENTS[Event(event)]).inc()
    if fields.get("duration_ms") is not None:
        WEBHOOK_DURATION.observe(fields["duration_ms"] / 1000)


# Which events move which metric: one handler an event, none for the others.
HANDLERS = {
    **dict.fromkeys(TRIGGER_EVENTS, _trigger),
    Event.TRIGGER_REFUSED: _refused,
    Event.TASK_TRANSITIONED: _transition,
    Event.STEP_FINISHED: _step,
    Event.TASK_CLAIMED: _claim,
    Event.DISPATCHER_ACTION: lambda event, fields: DISPATCHER_ACTIONS.labels(
        fields.get("action") or "").inc(fields.get("count") or 0),
    Event.DISPATCHER_ERROR: lambda event, fields: DISPATCHER_ERRORS.inc(),
    **dict.fromkeys(WEBHOOK_EVENTS, _webhook),
    Event.DISPATCHER_PASS: lambda event, fields: _dispatcher_beat(),
}


def on_event(event: str, fields: dict) -> None:
    """The events.add_listener hook: one event → at most one metric update."""
    handler = HANDLERS.get(event)  # type: ignore[call-overload]  # an Event is its name
    if handler is not None:
        handler(event, fields)


DISPATCHER_BEAT_SECONDS = 5.0
_DISPATCHER_KEY = "pilot:metrics:dispatcher_last_pass"
_last_beat = 0.0


def _dispatcher_beat() -> None:
    """Note in the shared cache that a dispatcher pass just finished (at most
    every DISPATCHER_BEAT_SECONDS per process: one cache write, not one per pass)."""
    global _last_beat
    now = time.time()
    if now - _last_beat < DISPATCHER_BEAT_SECONDS:
        return
    _last_beat = now
    cache_soft("dispatcher beat", lambda: cache.set(_DISPATCHER_KEY, now, timeout=None), None)


def install() -> None:
    events.add_listener(on_event)


# --- scrape time ----------------------------------------------------------------------------

_CACHE_KEY = "pilot:metrics:task_counts"


class TaskStateCollector:
    """`pilot_tasks{state}` from the database, and `pilot_database_up` saying
    whether that read worked (a scrape during a database outage still answers)."""

    def collect(self):
        from workflows.selectors import task_counts_by_state

        counts, up = None, 1
        ttl = pilot_settings.PILOT_METRICS_TASKS_TTL
        try:
            counts = cache_soft("metrics read", lambda: cache.get(_CACHE_KEY), None) \
                if ttl else None
            if counts is None:
                counts = task_counts_by_state(timeout_ms=2000)
                if ttl:
                    cache_soft("metrics write", lambda: cache.set(_CACHE_KEY, counts, ttl), None)
        except DatabaseError as exc:
            log.warning("pilot_tasks not available: %s", str(exc)[:200])
            counts, up = None, 0
        if counts is not None:
            gauge = GaugeMetricFamily("pilot_tasks", "Tasks by state (read at scrape time)",
                                      labels=["state"])
            for state, n in sorted(counts.items()):
                gauge.add_metric([state], n)
            yield gauge
        yield GaugeMetricFamily("pilot_database_up",
                                "1 if the last scrape could read the task table", value=up)


class WorkCollector:
    """`pilot_backlog_tasks`, `pilot_oldest_pending_age_seconds`,
    `pilot_clients_at_cap` (database) and
    `pilot_dispatcher_last_pass_age_seconds` (shared cache); a read that fails
    leaves its gauge out of this scrape (pilot_database_up says why)."""

    def collect(self):
        from workflows.selectors import task_backlog

        ttl = pilot_settings.PILOT_METRICS_TASKS_TTL
        backlog = cache_soft("metrics read", lambda: cache.get(_BACKLOG_KEY), None) \
            if ttl else None
        if backlog is None:
            try:
                backlog = task_backlog()
            except DatabaseError as exc:
                log.warning("pilot_backlog_tasks not available: %s", str(exc)[:200])
            else:
                if ttl:
                    cache_soft("metrics write",
                               lambda: cache.set(_BACKLOG_KEY, backlog, ttl), None)
        now = time.time()
        if backlog is not None:
            count, oldest = backlog
            yield GaugeMetricFamily("pilot_backlog_tasks", "Tasks waiting for a worker: "
                                    "pending, or retrying and due", value=count)
            yield GaugeMetricFamily(
                "pilot_oldest_pending_age_seconds", "How long the task waiting longest for a "
                "worker has waited (0 when none waits)",
                value=max(0.0, now - oldest) if oldest is not None else 0.0)
        at_cap = _clients_at_cap(ttl)
        if at_cap is not None:
            yield GaugeMetricFamily(
                "pilot_clients_at_cap", "Clients (and workflows' own max_running shares) whose "
                "tasks hold every worker their cap allows: their due tasks wait for their "
                "share, not for a worker", value=at_cap)
        last = cache_soft("metrics read", lambda: cache.get(_DISPATCHER_KEY), None)
        if last is not None:
            yield GaugeMetricFamily(
                "pilot_dispatcher_last_pass_age_seconds", "Seconds since any dispatcher last "
                f"finished a pass (noted at most every {DISPATCHER_BEAT_SECONDS:g} s)",
                value=max(0.0, now - float(last)))


_BACKLOG_KEY = "pilot:metrics:backlog"
_AT_CAP_KEY = "pilot:metrics:clients_at_cap"


def _clients_at_cap(ttl: float) -> int | None:
    """How many (client, cap group) pairs are at their cap, as the claim counts
    them (engine/caps.py, through engine/why.py); None when it cannot be read."""
    from workflows.engine import client_shares

    found = cache_soft("metrics read", lambda: cache.get(_AT_CAP_KEY), None) if ttl else None
    if found is None:
        try:
            found = sum(1 for *_, held, cap in client_shares() if cap and held >= cap)
        except DatabaseError as exc:
            log.warning("pilot_clients_at_cap not available: %s", str(exc)[:200])
            return None
        if ttl:
            cache_soft("metrics write", lambda: cache.set(_AT_CAP_KEY, found, ttl), None)
    return found


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def exposition() -> bytes:
    """The Prometheus text exposition for a scrape: every process's event
    metrics (merged from PROMETHEUS_MULTIPROC_DIR after compacting the dead
    processes' files, or this process's own), then the gauges read now."""
    directory = multiprocess_dir()
    if directory:
        compact(directory)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
        with scrape_lock(directory):
            events_part = generate_latest(registry)
    else:
        events_part = generate_latest(REGISTRY)
    scrape = CollectorRegistry()
    scrape.register(TaskStateCollector())
    scrape.register(WorkCollector())
    return events_part + generate_latest(scrape)
