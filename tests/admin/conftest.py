"""People of the operator console tests: an operator (the "operators" group of
migration 0003, plus the trigger permission), a viewer who may see every task
but not act, and logged-in clients for each."""

from __future__ import annotations

import importlib

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client


def operators_group() -> Group:
    """The group exactly as migrations 0003 and 0006 define it. A transactional
    test's flush empties auth_group (post_migrate brings back permissions, not
    data migrations), so it is rebuilt from the migrations' own lists."""
    created_by = importlib.import_module("workflows.migrations.0003_operators_group")
    extended_by = importlib.import_module("workflows.migrations.0006_operators_trigger")
    group, created = Group.objects.get_or_create(name="operators")
    if created:
        group.permissions.add(*[
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
            for app_label, codename in [*created_by.OPERATOR_PERMISSIONS,
                                        *extended_by.ADDED_PERMISSIONS]])
    return group


def _staff(django_user_model, username: str, *, operators: bool = False,
           perms: tuple[str, ...] = ()):
    user = django_user_model.objects.create_user(username, password=f"pw-{username}",
                                                 is_staff=True)
    if operators:
        user.groups.add(operators_group())
    if perms:
        user.user_permissions.add(*Permission.objects.filter(
            content_type__app_label="workflows", codename__in=perms))
    return django_user_model.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def operator(django_user_model):
    """A member of the operators group as migrated (which includes add_task)."""
    return _staff(django_user_model, "operator", operators=True)


@pytest.fixture
def viewer(django_user_model):
    """Sees every task, its steps and history; may neither cancel, retry nor trigger."""
    return _staff(django_user_model, "viewer", perms=(
        "view_task", "view_all_tasks", "view_stepcheckpoint", "view_tasktransition"))


@pytest.fixture
def operator_client(operator):
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(viewer):
    client = Client()
    client.force_login(viewer)
    return client


def task_url(task, suffix: str = "change/") -> str:
    return f"/admin/workflows/task/{task.pk}/{suffix}"


LIST_URL = "/admin/workflows/task/"
