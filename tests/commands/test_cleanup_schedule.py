"""The daily django-q2 schedule that migration 0004 creates for cleanup_tasks."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from django_q.models import Schedule

from tests.support.migrated import rebuild

# Not transactional: the schedule row comes from a data migration, which a
# transactional test's flush would have removed.
pytestmark = pytest.mark.django_db


def test_a_daily_schedule_runs_cleanup_tasks_without_catching_up():
    Schedule.objects.filter(name="pilot.cleanup_tasks").delete()
    rebuild("0005_cleanup_schedule")  # as migrated (tests.support.migrated says why)
    schedule = Schedule.objects.get(name="pilot.cleanup_tasks")
    assert (schedule.func, schedule.args, schedule.schedule_type, schedule.repeats) == \
        ("django.core.management.call_command", "'cleanup_tasks'", Schedule.DAILY, -1)
    assert timezone.now() - timedelta(days=1) < schedule.next_run
    assert (schedule.next_run.hour, schedule.next_run.minute) == (3, 17)
    # After downtime it runs once, not once per missed day.
    assert settings.Q_CLUSTER["catch_up"] is False
