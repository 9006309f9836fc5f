"""Firing schedules (workflows/engine/schedules.py), one pass at a time, with an
injected `now` so every slot is known in advance."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone
from rest_framework import serializers

from tests.support.helpers import run_at_once
from workflows.engine.schedule_definitions import schedule_save
from workflows.engine.schedules import (
    MAX_CATCH_UP,
    database_now,
    schedule_key,
    schedule_run_now,
    schedule_run_now_key,
    schedules_fire_due,
    slots_to_fire,
)
from workflows.models import PilotSchedule, Task
from workflows.rules.errors import TaskNotFound, ValidationFailed
from workflows.rules.states import Source

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 10, 0, 7, tzinfo=UTC)  # schedules below are created at T0


def at(seconds: float) -> datetime:
    """10:00:00 UTC plus `seconds`."""
    return datetime(2026, 3, 1, 10, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)


def keys() -> list[str]:
    return sorted(Task.objects.values_list("idempotency_key", flat=True))


@pytest.fixture
def make(owner):
    def create(name="every5", *, cron="*/5 * * * * *", missed="skip", workflow="demo.echo",
               payload=None):
        schedule, outcome = schedule_save(name=name, workflow=workflow, cron=cron,
                                          payload=payload or {"n": 1}, owner=owner,
                                          missed=missed, now=T0)
        assert outcome == "created"
        return schedule

    return create


# --- the policy, pure ------------------------------------------------------------------

def test_the_policies_pick_none_the_latest_or_every_slot():
    slots = [at(10), at(15), at(20)]
    now = at(22)
    assert slots_to_fire("catch_up", slots, now=now, grace=1) == slots
    assert slots_to_fire("run_once", slots, now=now, grace=1) == [at(20)]
    assert slots_to_fire("skip", slots, now=now, grace=1) == []
    assert slots_to_fire("skip", slots, now=now, grace=2) == [at(20)]  # on time: 2 s late
    for policy in ("skip", "run_once", "catch_up"):
        assert slots_to_fire(policy, [], now=now, grace=60) == []


# --- one pass ----------------------------------------------------------------------------

def test_a_new_schedule_waits_for_its_first_slot_after_now(make):
    schedule = make()
    assert schedule.next_slot_at == at(10)
    report = schedules_fire_due(now=at(9.9))
    assert (report.schedules, report.created, report.next_due) == (0, 0, at(10))
    assert Task.objects.count() == 0


def test_a_due_slot_triggers_one_task_keyed_by_schedule_and_slot(make, owner):
    make()
    report = schedules_fire_due(now=at(10.3))
    assert (report.schedules, report.created, report.next_due) == (1, 1, at(15))
    task = Task.objects.get()
    assert task.idempotency_key == "schedule:every5:2026-03-01T10:00:10Z"
    assert (task.owner, task.workflow, task.payload, task.source) == (
        owner, "demo.echo", {"n": 1}, Source.SCHEDULE)
    schedule = PilotSchedule.objects.get()
    assert (schedule.last_fired_slot, schedule.next_slot_at, schedule.fired_count,
            schedule.last_task_id, schedule.last_fired_at) == (at(10), at(15), 1, task.pk, at(10.3))


def test_a_second_pass_at_the_same_time_does_nothing_more(make):
    make()
    schedules_fire_due(now=at(10.3))
    again = schedules_fire_due(now=at(10.3))
    assert (again.schedules, again.created, again.replayed) == (0, 0, 0)
    assert Task.objects.count() == 1


def test_passes_every_second_make_one_task_per_slot(make):
    make()
    for second in range(8, 41):
        schedules_fire_due(now=at(second + 0.2))
    assert keys() == [f"schedule:every5:2026-03-01T10:00:{s:02d}Z" for s in (10, 15, 20, 25, 30,
                                                                             35, 40)]


def test_a_slot_fired_again_replays_its_task_instead_of_starting_another(make):
    make()
    schedules_fire_due(now=at(10.3))
    # As if the schedule's update had been lost (a scheduler that died after
    # triggering, a schedule deleted and re-created): the slot comes round again.
    PilotSchedule.objects.update(next_slot_at=at(10))
    report = schedules_fire_due(now=at(11))
    assert (report.created, report.replayed) == (0, 1)
    assert Task.objects.get().replays == 1


def test_seconds_and_minutes_crons_use_their_own_slots(make):
    make("minutely", cron="* * * * *")
    make("every5")
    schedules_fire_due(now=at(60.5))
    assert keys() == ["schedule:every5:2026-03-01T10:01:00Z",
                      "schedule:minutely:2026-03-01T10:01:00Z"]


# --- after an outage: the missed-slot policies -----------------------------------------------

def down_for_five_slots(make, missed: str, grace: float = 1.0):
    """The schedule's slots 10, 15, 20, 25 and 30 pass with no scheduler; one runs
    at 10:00:32.5, when the latest (10:00:30) is 2.5 s old."""
    make(missed=missed)
    return schedules_fire_due(now=at(32.5), grace=grace)


def test_skip_runs_none_of_the_missed_slots(make):
    report = down_for_five_slots(make, "skip")
    assert (report.created, report.skipped) == (0, 5)
    assert keys() == []
    assert PilotSchedule.objects.get().next_slot_at == at(35)
    schedules_fire_due(now=at(35.2), grace=1.0)  # back on time: the next slot runs
    assert keys() == ["schedule:every5:2026-03-01T10:00:35Z"]


def test_skip_still_runs_the_latest_slot_while_it_is_within_the_grace(make):
    report = down_for_five_slots(make, "skip", grace=3.0)
    assert (report.created, report.skipped) == (1, 4)
    assert keys() == ["schedule:every5:2026-03-01T10:00:30Z"]


def test_run_once_runs_one_catch_up_for_the_latest_missed_slot(make):
    report = down_for_five_slots(make, "run_once")
    assert (report.created, report.skipped) == (1, 4)
    assert keys() == ["schedule:every5:2026-03-01T10:00:30Z"]
    assert PilotSchedule.objects.get().last_fired_slot == at(30)


def test_catch_up_runs_every_missed_slot_once(make):
    report = down_for_five_slots(make, "catch_up")
    assert (report.created, report.skipped) == (5, 0)
    assert keys() == [f"schedule:every5:2026-03-01T10:00:{s}Z" for s in (10, 15, 20, 25, 30)]
    assert schedules_fire_due(now=at(33), grace=1.0).created == 0


def test_catch_up_is_capped_at_the_latest_100_slots(make):
    make("every-second", cron="* * * * * *", missed="catch_up")
    report = schedules_fire_due(now=at(1007.5))  # slots 8..1007 missed: 1000 of them
    assert report.created == MAX_CATCH_UP == 100
    fired = keys()
    assert fired[0] == schedule_key("every-second", at(908))
    assert fired[-1] == schedule_key("every-second", at(1007))
    assert PilotSchedule.objects.get().next_slot_at == at(1008)


def test_a_disabled_schedule_does_not_fire(make):
    from workflows.engine.schedule_definitions import schedule_set_enabled

    make()
    schedule_set_enabled(name="every5", enabled=False, now=T0)
    assert schedules_fire_due(now=at(30)).created == 0
    assert keys() == []


# --- one broken schedule does not stop the others ---------------------------------------------

def test_an_unregistered_workflow_is_recorded_and_the_other_schedules_fire(make, temp_workflow):
    temp_workflow("t.gone").step(lambda ctx: None, name="only")
    make("broken", workflow="t.gone")
    make("healthy")
    from workflows.registry import registry

    registry.unregister("t.gone")
    report = schedules_fire_due(now=at(10.5))
    assert (report.created, report.refused) == (1, 1)
    assert keys() == ["schedule:healthy:2026-03-01T10:00:10Z"]
    broken = PilotSchedule.objects.get(name="broken")
    assert "unknown_workflow" in broken.last_error and broken.last_error_at == at(10.5)
    assert broken.next_slot_at == at(15)  # it goes on: fixed code resumes at the next slot
    assert PilotSchedule.objects.get(name="healthy").last_error == ""


def test_a_payload_that_no_longer_validates_is_recorded_and_the_others_fire(make, temp_workflow):
    temp_workflow("t.strict").step(lambda ctx: None, name="only")
    make("stale", workflow="t.strict", payload={"old": True})
    make("healthy")
    from workflows.registry import registry

    class NowStricter(serializers.Serializer):
        region = serializers.CharField()

    registry.unregister("t.strict")  # a deploy: the workflow now requires `region`
    temp_workflow("t.strict", payload_serializer=NowStricter).step(lambda ctx: None, name="only")
    report = schedules_fire_due(now=at(10.5))
    assert (report.created, report.refused) == (1, 1)
    assert "validation_error" in PilotSchedule.objects.get(name="stale").last_error
    # Once it fires again, the error is cleared.
    PilotSchedule.objects.filter(name="stale").update(payload={"region": "eu"})
    assert schedules_fire_due(now=at(15.5)).created == 2
    assert PilotSchedule.objects.get(name="stale").last_error == ""


def test_a_schedule_whose_cron_cannot_be_read_is_paused_and_the_others_fire(make):
    make("garbled")
    make("healthy")
    PilotSchedule.objects.filter(name="garbled").update(cron="not a cron at all")
    report = schedules_fire_due(now=at(10.5))
    assert (report.created, report.errors) == (1, 1)
    garbled = PilotSchedule.objects.get(name="garbled")
    assert garbled.next_slot_at is None and "paused after an unexpected error" in \
        garbled.last_error
    assert schedules_fire_due(now=at(20.5)).errors == 0  # paused: not tried again


# --- the database clock ---------------------------------------------------------------------

def test_slots_are_compared_with_the_database_clock():
    db_now = database_now()
    assert db_now.tzinfo is not None
    assert abs((db_now - timezone.now()).total_seconds()) < 5


def test_a_pass_without_now_reads_the_database_clock(owner):
    schedule_save(name="now", workflow="demo.echo", cron="* * * * * *", payload={}, owner=owner,
                  missed="catch_up", now=database_now() - timedelta(seconds=3))
    report = schedules_fire_due()
    assert report.created >= 2 and abs((report.now - timezone.now()).total_seconds()) < 5


# --- several schedulers at once (PostgreSQL: real row locks) -----------------------------------

@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_schedule_locked_by_another_scheduler_is_passed_by_not_waited_for(make):
    make("held")
    make("free")
    locked, release = threading.Event(), threading.Event()

    def other_scheduler():
        try:
            with transaction.atomic():
                PilotSchedule.objects.select_for_update().get(name="held")
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_scheduler)
    thread.start()
    try:
        assert locked.wait(10)
        report = schedules_fire_due(now=at(10.5))  # returns at once: SKIP LOCKED
        assert (report.schedules, report.created) == (1, 1)
        assert keys() == ["schedule:free:2026-03-01T10:00:10Z"]
    finally:
        release.set()
        thread.join(10)
    assert schedules_fire_due(now=at(10.6)).created == 1
    assert len(keys()) == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_eight_schedulers_at_once_make_one_task_per_slot(make):
    for name in ("a", "b", "c"):
        make(name, missed="catch_up")
    results = run_at_once(8, lambda i: schedules_fire_due(now=at(32.5)))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(r.created for r in results) == 15
    assert sum(r.schedules for r in results) == 3  # each schedule handled by one of them
    assert len(keys()) == len(set(keys())) == 15


@pytest.mark.postgres
def test_a_failure_after_triggering_rolls_the_slot_back_and_pauses_only_that_schedule(make):
    make("overflowing")
    make("healthy")
    # A write PostgreSQL refuses after the trigger ran (integer out of range): the
    # schedule's transaction — its new task included — rolls back as a whole.
    PilotSchedule.objects.filter(name="overflowing").update(fired_count=2**31 - 1)
    report = schedules_fire_due(now=at(10.5))
    assert (report.schedules, report.created, report.errors) == (1, 1, 1)
    assert keys() == ["schedule:healthy:2026-03-01T10:00:10Z"]
    broken = PilotSchedule.objects.get(name="overflowing")
    assert broken.next_slot_at is None and "DataError" in broken.last_error


# --- run now ----------------------------------------------------------------------------

def test_run_now_triggers_one_run_beside_the_slots_and_a_second_call_replays_it(make, owner):
    make()
    token = "ab" * 16
    first = schedule_run_now(name="every5", token=token, actor=owner)
    again = schedule_run_now(name="every5", token=token, actor=owner)
    assert (first.outcome, again.outcome, again.task.pk) == ("created", "replayed", first.task.pk)
    assert first.task.idempotency_key == schedule_run_now_key("every5", token) == \
        f"schedule:every5:now-{token}"
    assert (first.task.owner, first.task.source, first.task.payload) == (
        owner, Source.SCHEDULE, {"n": 1})
    # The slots are the scheduler's: the next one still fires, under its own key.
    assert PilotSchedule.objects.get().next_slot_at == at(10)
    schedules_fire_due(now=at(10.3))
    assert keys() == sorted([first.task.idempotency_key, schedule_key("every5", at(10))])


def test_run_now_refuses_a_bad_token_an_unknown_schedule_and_an_inactive_owner(make, owner):
    make()
    with pytest.raises(ValidationFailed, match="run-now token"):
        schedule_run_now(name="every5", token="nope", actor=owner)
    with pytest.raises(TaskNotFound):
        schedule_run_now(name="missing", token="ab" * 16, actor=owner)
    owner.is_active = False
    owner.save()
    with pytest.raises(ValidationFailed, match="inactive"):
        schedule_run_now(name="every5", token="ab" * 16, actor=owner)
    assert not Task.objects.exists()
