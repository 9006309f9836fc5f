"""An operator cannot act as a client through schedules (issue 31, N3/N8).

The reported attack: an operator (the operators group as migrated) added a
schedule with `owner=<alpha's id>`; its runs appeared in alpha's own API task
list and alpha's receiver got webhooks signed with alpha's secret, carrying
the operator's payload. Now who a schedule runs as is the permission
`workflows.schedule_as_owner`, each save is in the admin log naming the owner,
superusers and inactive users are never owners (at save and at fire time),
and PILOT's own owners get no API token."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from tests.admin.conftest import _staff
from workflows.accounts import (
    SCHEDULER_OWNER,
    ApiClientRefused,
    api_client_create,
    api_token_issue,
    cli_owner_get,
    scheduler_owner_get,
)
from workflows.engine.schedule_definitions import schedule_save
from workflows.engine.schedules import schedules_fire_due
from workflows.models import PilotSchedule, Task

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/workflows/pilotschedule/"
ADD_URL = LIST_URL + "add/"


def form(**changes) -> dict:
    return {"name": "op-as-alpha", "workflow": "demo.echo", "cron": "* * * * * *",
            "payload": '{"refund_to": "attacker-iban", "amount": 1000000}',
            "missed": "run_once", "owner": "", "enabled": "on", **changes}


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alpha():
    user, token = api_client_create("alpha")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return user, api


@pytest.fixture
def oper(django_user_model):
    return logged_in(_staff(django_user_model, "oper", operators=True))


@pytest.fixture
def owner_admin(django_user_model):
    """An operator who was also given workflows.schedule_as_owner."""
    user = _staff(django_user_model, "oper2", operators=True)
    user.user_permissions.add(Permission.objects.get(codename="schedule_as_owner"))
    return logged_in(django_user_model.objects.get(pk=user.pk))


def fire_all():
    schedules_fire_due(now=timezone.now() + timedelta(seconds=2))


def test_an_operators_schedule_runs_as_the_scheduler_whatever_owner_it_posts(oper, alpha):
    user, api = alpha
    response = oper.post(ADD_URL, form(owner=str(user.pk)))
    assert response.status_code == 302
    schedule = PilotSchedule.objects.get(name="op-as-alpha")
    assert schedule.owner.username == SCHEDULER_OWNER
    fire_all()
    assert Task.objects.filter(owner=schedule.owner).exists()  # it did fire
    assert not Task.objects.filter(owner=user).exists()
    assert api.get("/api/v1/tasks").json()["results"] == []  # nothing in alpha's own list


def test_a_schedule_that_runs_as_a_client_is_read_only_to_an_operator(oper, alpha):
    user, _ = alpha
    schedule, _ = schedule_save(name="alpha-nightly", workflow="demo.echo", cron="0 3 * * *",
                                payload={}, owner=user, missed="skip", enabled=True)
    change = f"{LIST_URL}{schedule.pk}/change/"
    assert oper.get(change).status_code == 200  # view only
    assert oper.post(change, form(name="alpha-nightly", payload='{"x": 1}')).status_code == 403
    oper.post(LIST_URL, {"action": "disable_selected", "_selected_action": [schedule.pk]})
    schedule.refresh_from_db()
    assert schedule.payload == {} and schedule.enabled


def test_with_the_permission_an_owner_is_chosen_and_the_admin_log_names_it(owner_admin, alpha):
    user, api = alpha
    response = owner_admin.post(ADD_URL, form(name="alpha-sync", owner=str(user.pk)))
    assert response.status_code == 302
    schedule = PilotSchedule.objects.get(name="alpha-sync")
    assert schedule.owner == user
    entry = LogEntry.objects.get(object_id=str(schedule.pk))
    assert entry.user.username == "oper2"
    assert entry.get_change_message() == "Added; runs as alpha (saved by oper2)"
    fire_all()
    assert [t["idempotency_key"][:20] for t in api.get("/api/v1/tasks").json()["results"]] \
        and Task.objects.filter(owner=user).exists()


@pytest.mark.parametrize("kind", ["superuser", "inactive"])
def test_a_superuser_or_an_inactive_user_is_never_an_owner(owner_admin, django_user_model,
                                                           kind):
    if kind == "superuser":
        target = django_user_model.objects.create_superuser("root", password="pw")
    else:
        target = django_user_model.objects.create_user("gamma", is_active=False)
    response = owner_admin.post(ADD_URL, form(owner=str(target.pk)))
    assert response.status_code == 200
    problem = " ".join(response.context["adminform"].form.errors["owner"])
    assert ("is a superuser" if kind == "superuser" else "is inactive") in problem
    assert not PilotSchedule.objects.exists()
    with pytest.raises(CommandError, match=r"superuser|inactive"):
        call_command("schedule_workflow", "demo.echo", "--name", "cli-as", "--cron",
                     "0 3 * * *", "--owner", target.username, stdout=io.StringIO())


def test_a_schedule_whose_owner_was_deactivated_stops_firing(alpha):
    user, _ = alpha
    schedule, _ = schedule_save(name="alpha-often", workflow="demo.echo", cron="* * * * * *",
                                payload={}, owner=user, missed="run_once", enabled=True)
    user.is_active = False
    user.save()
    fire_all()
    assert not Task.objects.filter(owner=user).exists()
    schedule.refresh_from_db()
    assert "alpha is inactive" in schedule.last_error


def test_the_system_owners_get_no_api_token(db):
    for name in ("scheduler", "cli"):
        with pytest.raises(ApiClientRefused, match="PILOT's own owners"):
            api_client_create(name)
        with pytest.raises(CommandError, match="PILOT's own owners"):
            call_command("create_api_client", name, stdout=io.StringIO())
    # A token issued to one before (an older release): refused.
    for user in (scheduler_owner_get(), cli_owner_get()):
        key = api_token_issue(user)
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert api.get("/api/v1/tasks").status_code == 401
