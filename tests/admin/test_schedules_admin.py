"""Schedules in the operator console (workflows/admin/schedules.py): every
change goes through the engine's schedule services; code-declared schedules
may only be paused or resumed."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from tests.admin.conftest import _staff
from workflows.accounts import scheduler_owner_get
from workflows.engine.schedule_definitions import schedule_save
from workflows.models import PilotSchedule

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/workflows/pilotschedule/"
ADD_URL = LIST_URL + "add/"
MIGRATION = importlib.import_module("workflows.migrations.0009_pilot_schedule")


@pytest.fixture
def scheduler_admin(django_user_model):
    """An operator with the schedule permissions the migration grants the group."""
    user = _staff(django_user_model, "sched-op", perms=tuple(MIGRATION.SCHEDULE_PERMISSIONS))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def scheduler(db):
    """The scheduler user: what an operator's schedules run as (an operator
    without workflows.schedule_as_owner changes no other: test_schedule_owners)."""
    return scheduler_owner_get()


def form(**changes) -> dict:
    return {"name": "nightly", "workflow": "demo.echo", "cron": "0 3 * * *",
            "payload": '{"msg": "hi"}', "missed": "run_once", "owner": "", "enabled": "on",
            **changes}


def url_of(schedule) -> str:
    return f"{LIST_URL}{schedule.pk}/change/"


def test_an_operator_adds_a_schedule_owned_by_the_scheduler_user(scheduler_admin):
    response = scheduler_admin.post(ADD_URL, form(), follow=True)
    assert response.status_code == 200
    schedule = PilotSchedule.objects.get()
    assert (schedule.workflow, schedule.cron, schedule.payload, schedule.missed,
            schedule.owner.username, schedule.origin) == (
        "demo.echo", "0 3 * * *", {"msg": "hi"}, "run_once", "scheduler", "operator")
    assert schedule.next_slot_at is not None and schedule.next_slot_at.hour == 3
    assert LogEntry.objects.get().object_id == str(schedule.pk)
    listing = scheduler_admin.get(LIST_URL).content.decode()
    assert "nightly" in listing and "0 3 * * *" in listing


def test_the_add_form_offers_the_registered_workflows(scheduler_admin):
    html = scheduler_admin.get(ADD_URL).content.decode()
    for name in ("demo.echo", "demo.sync_orders", "demo.saga"):
        assert f'<option value="{name}"' in html


@pytest.mark.parametrize(("changes", "field", "message"), [
    ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
    ({"cron": "R * * * *"}, "cron", "random field"),
    ({"name": "no:colons"}, "name", "letters, digits"),
    ({"workflow": "demo.sync_orders", "payload": '{"batch": "b"}'}, "payload",
     "Not valid for demo.sync_orders"),
    ({"payload": "{not json"}, "payload", "Not valid JSON: Expecting property name"),
])
def test_a_bad_definition_is_shown_on_its_field_and_nothing_is_written(
        scheduler_admin, changes, field, message):
    response = scheduler_admin.post(ADD_URL, form(**changes))
    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors[field])
    assert PilotSchedule.objects.count() == 0


def test_changing_the_payload_keeps_the_name_and_the_next_slot(scheduler_admin, scheduler):
    schedule, _ = schedule_save(name="nightly", workflow="demo.echo", cron="0 3 * * *",
                                payload={"v": 1}, owner=scheduler, missed="skip")
    next_slot = schedule.next_slot_at
    response = scheduler_admin.post(url_of(schedule), form(name="renamed", payload='{"v": 2}',
                                                           owner=str(scheduler.pk)), follow=True)
    assert response.status_code == 200
    schedule.refresh_from_db()
    assert (schedule.name, schedule.payload, schedule.missed, schedule.next_slot_at) == (
        "nightly", {"v": 2}, "run_once", next_slot)


def test_a_schedule_declared_in_code_can_only_be_paused(scheduler_admin, scheduler):
    schedule, _ = schedule_save(name="coded", workflow="demo.echo", cron="0 3 * * *",
                                payload={}, owner=scheduler, origin="code")
    page = scheduler_admin.get(url_of(schedule))
    assert list(page.context["adminform"].form.fields) == ["enabled"]
    scheduler_admin.post(url_of(schedule), {"payload": '{"hacked": true}'}, follow=True)
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.payload, schedule.next_slot_at) == (False, {}, None)
    assert scheduler_admin.get(f"{LIST_URL}{schedule.pk}/delete/").status_code == 403


def test_bulk_pause_and_resume_and_delete(scheduler_admin, scheduler):
    for name in ("a", "b"):
        schedule_save(name=name, workflow="demo.echo", cron="0 3 * * *", payload={},
                      owner=scheduler)
    schedule_save(name="coded", workflow="demo.echo", cron="0 3 * * *", payload={},
                  owner=scheduler, origin="code")
    ids = [str(pk) for pk in PilotSchedule.objects.values_list("pk", flat=True)]
    scheduler_admin.post(LIST_URL, {"action": "disable_selected", "_selected_action": ids})
    assert set(PilotSchedule.objects.values_list("enabled", flat=True)) == {False}
    scheduler_admin.post(LIST_URL, {"action": "enable_selected", "_selected_action": ids})
    assert set(PilotSchedule.objects.values_list("enabled", flat=True)) == {True}
    refused = scheduler_admin.post(LIST_URL, {"action": "delete_selected",
                                              "_selected_action": ids, "post": "yes"})
    assert refused.status_code == 403  # one of them is declared in code: pause it instead
    operator_ids = [str(pk) for pk in PilotSchedule.objects.filter(origin="operator")
                    .values_list("pk", flat=True)]
    scheduler_admin.post(LIST_URL, {"action": "delete_selected",
                                    "_selected_action": operator_ids, "post": "yes"})
    assert list(PilotSchedule.objects.values_list("name", flat=True)) == ["coded"]


def test_staff_without_the_schedule_permissions_cannot_see_them(django_user_model):
    client = Client()
    client.force_login(_staff(django_user_model, "task-viewer", perms=("view_task",)))
    assert client.get(LIST_URL).status_code == 403


def test_the_schedules_admin_never_writes_a_model_itself():
    source = Path(__file__).resolve().parents[2] / "workflows" / "admin" / "schedules.py"
    forbidden = re.compile(r"\.save\(|\.update\(|select_for_update|\.delete\(")
    assert [line for line in source.read_text().splitlines() if forbidden.search(line)] == []
