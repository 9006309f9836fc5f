"""Writing schedules (workflows/engine/schedule_definitions.py): validation,
where the next slot starts, who may change what, and the code-declared sync."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from tests.support.helpers import run_at_once
from workflows.engine.schedule_definitions import (
    schedule_delete,
    schedule_save,
    schedule_set_enabled,
    schedules_sync_declared,
)
from workflows.engine.schedules import schedules_fire_due
from workflows.models import PilotSchedule, Task
from workflows.registry import Schedule
from workflows.rules.errors import ValidationFailed

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 10, 0, 7, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return datetime(2026, 3, 1, 10, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)


def save(owner, name="s", **changes):
    values = {"workflow": "demo.echo", "cron": "*/5 * * * * *", "payload": {"n": 1},
              "missed": "skip", "now": NOW} | changes
    return schedule_save(name=name, owner=owner, **values)


def test_every_bad_field_is_reported_at_once_and_nothing_is_written(owner):
    with pytest.raises(ValidationFailed) as caught:
        schedule_save(name="no:colons", workflow="acme.nope", cron="61 * * * *",
                      payload=["not", "an", "object"], owner=None, missed="sometimes")
    assert set(caught.value.errors) == {"name", "workflow", "cron", "payload", "owner", "missed"}
    assert "No workflow is registered as 'acme.nope'" in caught.value.errors["workflow"][0]
    assert PilotSchedule.objects.count() == 0


def test_a_payload_the_workflow_refuses_is_refused_when_the_schedule_is_written(owner):
    with pytest.raises(ValidationFailed) as caught:
        save(owner, workflow="demo.sync_orders", payload={"batch": "b"})  # count is required
    assert "Not valid for demo.sync_orders" in caught.value.errors["payload"][0]
    with pytest.raises(ValidationFailed, match="not valid"):
        save(owner, payload={"x": float("inf")})


def test_a_new_schedule_starts_at_the_first_slot_after_now(owner):
    schedule, outcome = save(owner)
    assert outcome == "created" and schedule.next_slot_at == at(10)
    assert (schedule.enabled, schedule.origin, schedule.created_at) == (True, "operator", NOW)


def test_saving_the_same_definition_again_changes_nothing(owner):
    save(owner)
    schedule, outcome = save(owner, now=at(40))
    assert outcome == "unchanged" and schedule.updated_at == NOW


def test_changing_the_payload_keeps_the_next_slot(owner):
    save(owner)
    schedule, outcome = save(owner, payload={"n": 2}, now=at(40))
    assert outcome == "updated"
    assert (schedule.payload, schedule.next_slot_at) == ({"n": 2}, at(10))


def test_changing_the_cron_starts_from_its_next_slot_after_now(owner):
    save(owner)
    schedule, _ = save(owner, cron="*/7 * * * * *", now=at(40))
    assert schedule.next_slot_at == at(42)


def test_a_paused_schedule_resumes_at_the_next_slot_not_with_what_it_missed(owner):
    save(owner, missed="catch_up")
    paused = schedule_set_enabled(name="s", enabled=False, now=at(8))
    assert (paused.enabled, paused.next_slot_at) == (False, None)
    resumed = schedule_set_enabled(name="s", enabled=True, now=at(61))
    assert resumed.next_slot_at == at(65)
    assert schedules_fire_due(now=at(66)).created == 1  # 65 only, not 10..60


def test_an_operator_may_not_change_or_delete_a_schedule_declared_in_code(owner):
    save(owner, origin="code")
    with pytest.raises(ValidationFailed, match="declared in code"):
        save(owner, payload={"n": 2})
    with pytest.raises(ValidationFailed, match="declared in code"):
        schedule_delete(name="s")
    assert schedule_set_enabled(name="s", enabled=False).enabled is False  # pausing is fine


def test_code_does_not_take_over_an_operators_schedule(owner):
    save(owner)
    with pytest.raises(ValidationFailed, match="created by an operator"):
        save(owner, origin="code", payload={"n": 2})


def test_deleting_a_schedule_keeps_the_runs_it_started(owner):
    save(owner)
    schedules_fire_due(now=at(10.5))
    schedule_delete(name="s")
    assert PilotSchedule.objects.count() == 0 and Task.objects.count() == 1
    with pytest.raises(ValidationFailed, match="No schedule is named 's'"):
        schedule_delete(name="s")


# --- schedules declared in code --------------------------------------------------------------

@pytest.fixture
def declared(temp_workflow):
    def declare(name, schedule):
        workflow = temp_workflow(name, schedule=schedule)
        workflow.step(lambda ctx: None, name="only")
        return workflow

    return declare


def test_sync_creates_updates_and_deletes_what_the_code_declares(declared, temp_workflow):
    from workflows.registry import registry

    declared("t.nightly", "0 3 * * *")
    declared("t.sync", [Schedule("*/15 * * * *", payload={"scope": "delta"}, name="t.delta")])
    first = schedules_sync_declared(now=NOW)
    assert (first.created, first.updated, first.deleted, first.errors) == (
        ["t.delta", "t.nightly"], [], [], {})
    nightly = PilotSchedule.objects.get(name="t.nightly")
    assert (nightly.workflow, nightly.cron, nightly.payload, nightly.origin,
            nightly.owner.username) == ("t.nightly", "0 3 * * *", {}, "code", "scheduler")
    assert schedules_sync_declared(now=NOW).unchanged == ["t.delta", "t.nightly"]

    registry.unregister("t.sync")  # a deploy drops one schedule and changes the other
    registry.unregister("t.nightly")
    declared("t.nightly", Schedule("0 4 * * *", missed="run_once"))
    schedule_set_enabled(name="t.nightly", enabled=False)  # an operator paused it
    again = schedules_sync_declared(now=NOW)
    assert (again.updated, again.deleted) == (["t.nightly"], ["t.delta"])
    nightly.refresh_from_db()
    assert (nightly.cron, nightly.missed, nightly.enabled) == ("0 4 * * *", "run_once", False)


def test_a_declaration_that_cannot_be_written_is_reported_and_the_others_are(declared):
    declared("t.owned", Schedule("0 3 * * *", owner="nobody-by-that-name"))
    declared("t.fine", "0 3 * * *")
    report = schedules_sync_declared(now=NOW)
    assert report.created == ["t.fine"]
    assert "no user named 'nobody-by-that-name'" in report.errors["t.owned"]


@pytest.mark.django_db(transaction=True)
def test_migrate_writes_the_declared_schedules(declared):
    declared("t.migrated", "*/10 * * * *")
    call_command("migrate", verbosity=0)
    assert PilotSchedule.objects.get(name="t.migrated").origin == "code"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_creates_of_one_name_make_one_schedule(owner):
    results = run_at_once(6, lambda i: save(owner, now=NOW)[1])
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(results) == ["created"] + ["unchanged"] * 5
    assert PilotSchedule.objects.count() == 1
