import pytest
from django.contrib.auth.models import Group

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
