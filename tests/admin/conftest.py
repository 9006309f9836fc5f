"""People of the operator console tests: an operator (a member of the "operators" group
as the migrations build it), a viewer who may see every task
but not act, and logged-in clients for each."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client

from tests.support.migrated import OPERATORS_MIGRATIONS, rebuild


def operators_group() -> Group:
    """The group as the data migrations build it; rebuilt with their own functions
    when a transactional test's flush emptied it (tests/support/migrated.py)."""
    if not Group.objects.filter(name="operators").exists():
        rebuild(*OPERATORS_MIGRATIONS)
    return Group.objects.get(name="operators")


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


@pytest.fixture
def resender(django_user_model):
    user = _staff(django_user_model, "resender", perms=(
        "view_task", "view_all_tasks", "resend_webhook"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def looker(django_user_model):
    user = _staff(django_user_model, "looker", perms=("view_task", "view_all_tasks"))
    client = Client()
    client.force_login(user)
    return client


def task_url(task, suffix: str = "change/") -> str:
    return f"/admin/workflows/task/{task.pk}/{suffix}"


LIST_URL = "/admin/workflows/task/"
