import importlib

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.db.migrations.loader import MigrationLoader

pytestmark = pytest.mark.django_db

# The data migrations that build the group, in order, with their forward functions.
GROUP_MIGRATIONS = [("0003_operators_group", "create_operators"),
                    ("0006_operators_trigger", "grant"),
                    ("0009_pilot_schedule", "grant"),
                    ("0013_webhooks_and_trace_context", "grant")]


def migrated_operators_group() -> Group:
    """The group as the data migrations build it. Migrating the test database built it
    once, but a transactional test's flush empties auth_group (post_migrate brings back
    permissions, not data migrations), and which tests ran before this one on the same
    database depends on how the suite is split over workers: so the migrations' own
    forward functions run again here, with the models as of the last of them (auth's
    and contenttypes' models, all they touch, are the same at each)."""
    Group.objects.filter(name="operators").delete()
    apps = MigrationLoader(connection).project_state(("workflows", GROUP_MIGRATIONS[-1][0])).apps
    for name, forward in GROUP_MIGRATIONS:
        getattr(importlib.import_module(f"workflows.migrations.{name}"), forward)(apps, None)
    return Group.objects.get(name="operators")


def test_the_operators_group_can_view_cancel_retry_trigger_manage_schedules_and_resend(
        django_user_model):
    group = migrated_operators_group()
    assert set(group.permissions.values_list("codename", flat=True)) == {
        "view_task", "view_all_tasks", "cancel_task", "retry_task", "view_stepcheckpoint",
        "view_tasktransition", "add_task", "view_pilotschedule", "add_pilotschedule",
        "change_pilotschedule", "delete_pilotschedule", "resend_webhook"}
    user = django_user_model.objects.create_user("op")
    user.groups.add(group)
    user = django_user_model.objects.get(pk=user.pk)
    assert user.has_perms(["workflows.cancel_task", "workflows.retry_task",
                           "workflows.view_all_tasks", "workflows.resend_webhook"])
    assert not user.has_perm("workflows.change_task")
