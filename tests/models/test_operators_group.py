import pytest
from django.contrib.auth.models import Group, Permission

from tests.support.migrated import OPERATORS_MIGRATIONS, rebuild

pytestmark = pytest.mark.django_db


def test_the_operators_group_can_view_cancel_retry_trigger_schedule_resend_and_signal(
        django_user_model):
    Group.objects.filter(name="operators").delete()
    rebuild(*OPERATORS_MIGRATIONS)
    group = Group.objects.get(name="operators")
    assert set(group.permissions.values_list("codename", flat=True)) == {
        "view_task", "view_all_tasks", "cancel_task", "retry_task", "view_stepcheckpoint",
        "view_tasktransition", "add_task", "view_pilotschedule", "add_pilotschedule",
        "change_pilotschedule", "delete_pilotschedule", "resend_webhook", "signal_task"}
    user = django_user_model.objects.create_user("op")
    user.groups.add(group)
    user = django_user_model.objects.get(pk=user.pk)
    assert user.has_perms(["workflows.cancel_task", "workflows.retry_task",
                           "workflows.view_all_tasks", "workflows.resend_webhook",
                           "workflows.signal_task"])
    assert not user.has_perm("workflows.change_task")


def test_reversing_the_migrations_keeps_a_hosts_own_operators_group_and_its_members(
        django_user_model):
    """A host that had an `operators` group before PILOT: `migrate workflows zero`
    takes back PILOT's permissions only; the group, its member and its own
    permission stay (docs/embedding.md, "Uninstalling")."""
    from tests.support.migrated import unbuild

    Group.objects.filter(name="operators").delete()
    own = Permission.objects.get(codename="change_user", content_type__app_label="auth")
    group = Group.objects.create(name="operators")
    group.permissions.add(own)
    member = django_user_model.objects.create_user("host-op")
    member.groups.add(group)
    rebuild(*OPERATORS_MIGRATIONS)
    assert group.permissions.count() == 14  # PILOT's thirteen were added to it
    unbuild(*OPERATORS_MIGRATIONS)
    group = Group.objects.get(pk=group.pk)
    assert list(group.permissions.all()) == [own]
    assert list(group.user_set.all()) == [member]


def test_reversing_the_migrations_deletes_the_operators_group_pilot_created():
    from tests.support.migrated import unbuild

    Group.objects.filter(name="operators").delete()
    rebuild(*OPERATORS_MIGRATIONS)
    group = Group.objects.get(name="operators")
    group.permissions.add(Permission.objects.get(codename="view_user"))  # an operator's own grant
    unbuild(*OPERATORS_MIGRATIONS)
    assert not Group.objects.filter(name="operators").exists()
