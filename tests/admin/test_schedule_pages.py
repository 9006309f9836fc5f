"""A schedule's page drives it (workflows/admin/schedule_pages.py): its next
slots in ISO, a link to its runs (and to those waiting for a signal), Run now
through the normal trigger path with a key of its own (confirmed, audited, a
second send of one confirmation replays), pause and resume; the add form
chooses no workflow and offers owners by name."""

from __future__ import annotations

import re
import uuid

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.test import Client

from tests.admin.conftest import _staff
from workflows.accounts import scheduler_owner_get
from workflows.engine.schedule_definitions import schedule_save
from workflows.models import PilotSchedule, Task
from workflows.rules.states import Source

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/workflows/pilotschedule/"
ISO = re.compile(r"<li><code>(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)</code></li>")


@pytest.fixture
def operator_client(operator):
    client = Client()
    client.force_login(operator)
    return client


def nightly(workflow="demo.echo", payload=None, owner=None, name="nightly"):
    schedule, _ = schedule_save(name=name, workflow=workflow, cron="0 3 * * *",
                                payload={"msg": "hi"} if payload is None else payload,
                                owner=owner or scheduler_owner_get(), missed="skip",
                                enabled=True)
    return schedule


def page(schedule) -> str:
    return f"{LIST_URL}{schedule.pk}/change/"


def test_the_page_shows_the_next_five_slots_in_iso_and_links_its_runs(operator_client):
    schedule = nightly()
    html = operator_client.get(page(schedule)).content.decode()
    slots = ISO.findall(html)
    assert len(slots) == 5 and all(slot.endswith("T03:00:00Z") for slot in slots)
    assert slots == sorted(slots) and len(set(slots)) == 5
    assert "a.m." not in html and "p.m." not in html  # no Django date format anywhere
    runs = f"q=schedule%3Anightly%3A&amp;owner={schedule.owner_id}"
    assert runs in html and 'id="pilot-run-now"' in html
    assert 'id="pilot-schedule-waiting"' not in html  # demo.echo waits for nothing
    listing = operator_client.get(LIST_URL).content.decode()
    assert runs in listing and "T03:00:00.000Z" in listing


def test_run_now_confirms_then_triggers_one_run_under_its_own_key(operator_client, operator):
    schedule = nightly()
    before = PilotSchedule.objects.get(pk=schedule.pk)
    confirm = operator_client.get(f"{LIST_URL}{schedule.pk}/run-now/")
    assert confirm.status_code == 200 and not Task.objects.exists()  # GET changes nothing
    token = confirm.context["token"]
    key = f"schedule:nightly:now-{token}"
    assert key in confirm.content.decode() and "scheduler" in confirm.content.decode()
    response = operator_client.post(f"{LIST_URL}{schedule.pk}/run-now/",
                                    {"token": token, "reason": "backfill the report"})
    task = Task.objects.get()
    assert response.status_code == 302 and response.url.endswith(f"/{task.pk}/change/")
    assert (task.idempotency_key, task.owner.username, task.workflow, task.payload,
            task.source) == (key, "scheduler", "demo.echo", {"msg": "hi"}, Source.SCHEDULE)
    on_schedule = LogEntry.objects.get(object_id=str(schedule.pk))
    assert on_schedule.user == operator and str(task.pk) in on_schedule.get_change_message()
    assert "backfill the report" in on_schedule.get_change_message()
    on_task = LogEntry.objects.get(object_id=str(task.pk))
    assert on_task.action_flag == ADDITION and "Run now of schedule nightly" in \
        on_task.get_change_message()
    # The same confirmation sent again replays its task: still one run.
    again = operator_client.post(f"{LIST_URL}{schedule.pk}/run-now/",
                                 {"token": token, "reason": ""}, follow=True)
    assert Task.objects.count() == 1 and "replayed" in again.content.decode()
    # The schedule's own place is untouched, and its runs link lists the run.
    after = PilotSchedule.objects.get(pk=schedule.pk)
    assert (after.next_slot_at, after.fired_count, after.last_task_id) == (
        before.next_slot_at, before.fired_count, before.last_task_id)
    runs = operator_client.get("/admin/workflows/task/",
                               {"q": "schedule:nightly:", "owner": str(schedule.owner_id)})
    assert str(task.pk)[:8] in runs.content.decode()


@pytest.mark.parametrize("token", ["", "x" * 32, "../../etc", "A" * 32, "0" * 31 + "\x00"])
def test_a_hostile_token_is_refused_and_runs_nothing(operator_client, token):
    schedule = nightly()
    response = operator_client.post(f"{LIST_URL}{schedule.pk}/run-now/",
                                    {"token": token, "reason": ""}, follow=True)
    assert response.status_code == 200
    assert "Run now refused — validation_error: Not a run-now token" in \
        response.content.decode()
    assert not Task.objects.exists()


def test_pause_and_resume_from_the_page_are_logged(operator_client):
    schedule = nightly()
    url = f"{LIST_URL}{schedule.pk}/enabled/"
    assert operator_client.get(url).status_code == 405
    operator_client.post(url, {"enabled": "off"})
    paused = PilotSchedule.objects.get(pk=schedule.pk)
    assert not paused.enabled and paused.next_slot_at is None
    html = operator_client.get(page(schedule)).content.decode()
    assert "Resume this schedule" in html and not ISO.findall(html)
    operator_client.post(url, {"enabled": "on"})
    assert PilotSchedule.objects.get(pk=schedule.pk).enabled
    assert [e.get_change_message() for e in LogEntry.objects.order_by("pk")] == [
        "Paused through the console", "Resumed through the console"]


def test_a_schedule_whose_workflow_waits_for_a_signal_links_its_waiting_runs(operator_client):
    schedule = nightly(workflow="demo.approval", payload={}, name="approvals")
    html = operator_client.get(page(schedule)).content.decode()
    assert "waiting_for=signal" in html and 'id="pilot-schedule-waiting"' in html


def test_without_the_change_permission_run_now_and_pause_are_403(django_user_model):
    viewer = _staff(django_user_model, "viewer", perms=("view_pilotschedule", "add_task"))
    client = Client()
    client.force_login(viewer)
    schedule = nightly()
    assert 'id="pilot-run-now"' not in client.get(page(schedule)).content.decode()
    assert client.get(f"{LIST_URL}{schedule.pk}/run-now/").status_code == 403
    assert client.post(f"{LIST_URL}{schedule.pk}/run-now/",
                       {"token": uuid.uuid4().hex}).status_code == 403
    assert client.post(f"{LIST_URL}{schedule.pk}/enabled/", {"enabled": "off"}).status_code == 403
    assert not Task.objects.exists() and PilotSchedule.objects.get().enabled
    assert client.get(f"{LIST_URL}999999/run-now/").status_code in (302, 404)


def test_a_schedule_running_as_a_client_is_not_run_by_an_operator_without_the_owner_permission(
        operator_client, django_user_model):
    client_user = django_user_model.objects.create_user("acme")
    schedule = nightly(owner=client_user)
    assert operator_client.get(f"{LIST_URL}{schedule.pk}/run-now/").status_code == 403
    assert not Task.objects.exists()


def test_the_add_form_chooses_no_workflow_prefills_from_the_schema_and_names_owners(
        django_user_model):
    boss = _staff(django_user_model, "boss", operators=True, perms=("schedule_as_owner",))
    django_user_model.objects.create_user("acme-billing")
    client = Client()
    client.force_login(boss)
    html = client.get(f"{LIST_URL}add/").content.decode()
    workflow = html.split('name="workflow"')[1].split("</select>")[0]
    assert re.search(r'<option value="" selected>', workflow)
    assert 'value="demo.crash" selected' not in workflow
    assert 'id="pilot-payload-examples"' in html and '"demo.sync_orders"' in html
    owner = html.split('name="owner"')[1].split("</select>")[0]
    assert ">acme-billing</option>" in owner and "the scheduler user" in owner
    assert 'class="vForeignKeyRawIdAdminField"' not in html
