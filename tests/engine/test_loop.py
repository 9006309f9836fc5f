"""The scheduler loop (workflows/engine/loop.py): passes, sleeps, stop."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

from workflows.engine.loop import MIN_WAIT, scheduler_loop, scheduler_wait
from workflows.engine.schedule_definitions import schedule_save
from workflows.engine.schedules import ScheduleFireReport, database_now
from workflows.models import Task

NOW = datetime(2026, 3, 1, 10, 0, 0, tzinfo=UTC)


def report(next_due_in: float | None) -> ScheduleFireReport:
    due = None if next_due_in is None else NOW + timedelta(seconds=next_due_in)
    return ScheduleFireReport(now=NOW, next_due=due)


def test_it_sleeps_until_the_next_slot_but_never_longer_than_the_poll():
    assert scheduler_wait(report(0.4), poll=1.0, elapsed=0.1) == pytest.approx(0.3)
    assert scheduler_wait(report(30), poll=1.0, elapsed=0.1) == 1.0
    assert scheduler_wait(report(None), poll=1.0, elapsed=0.1) == 1.0


def test_a_due_schedule_another_scheduler_holds_is_looked_at_again_soon_not_in_a_spin():
    assert scheduler_wait(report(-2), poll=1.0, elapsed=0.0) == MIN_WAIT


@pytest.mark.django_db(transaction=True)
def test_the_loop_fires_slots_as_they_come_and_stops_when_asked(owner):
    schedule_save(name="tick", workflow="demo.echo", cron="* * * * * *", payload={},
                  owner=owner, missed="skip", now=database_now())
    stop = threading.Event()
    passes: list[int] = []

    def scheduler():
        try:
            passes.append(scheduler_loop(stop, poll=0.2))
        finally:
            connections.close_all()

    thread = threading.Thread(target=scheduler)
    thread.start()
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while Task.objects.count() < 2 and datetime.now(UTC) < deadline:
            stop.wait(0.1)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and passes and passes[0] >= 2
    keys = list(Task.objects.values_list("idempotency_key", flat=True))
    assert len(keys) >= 2 and len(set(keys)) == len(keys)


@pytest.mark.django_db(transaction=True)  # the loop manages its own connection
def test_max_passes_bounds_the_loop():
    assert scheduler_loop(threading.Event(), poll=0.05, max_passes=3) == 3
