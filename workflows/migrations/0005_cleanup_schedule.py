"""A django-q2 schedule that runs `cleanup_tasks` once a day.

It calls the management command itself, so the schedule does exactly what an
operator's `python manage.py cleanup_tasks` does. `catch_up` is off in
Q_CLUSTER (settings.py): after downtime the schedule runs once, not once per
missed day. Operators may change the time or disable it in the admin
(Django Q → Scheduled tasks); deleting the migration's row is reversible.
"""

from datetime import UTC, datetime, time, timedelta

from django.db import migrations
from django.utils import timezone

NAME = "pilot.cleanup_tasks"


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    # First run: the next 03:17 UTC (off the hour, away from other daily jobs).
    now = timezone.now()
    first = datetime.combine(now.date(), time(3, 17), tzinfo=UTC)
    if first <= now:
        first += timedelta(days=1)
    Schedule.objects.update_or_create(
        name=NAME,
        defaults={
            "func": "django.core.management.call_command",
            "args": "'cleanup_tasks'",
            "schedule_type": "D",  # Schedule.DAILY
            "repeats": -1,  # forever
            "next_run": first,
        },
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0004_cache_table"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
