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


def test_the_cleanup_runs_on_pilots_cluster_not_a_hosts_default_one(monkeypatch):
    """django-q2 gives a schedule without a cluster to the default cluster only
    (a host's): the row names PILOT's, so `run_workers` runs it and a host's
    own qcluster leaves it alone."""
    from django_q import scheduler as q_scheduler
    from django_q.brokers import get_broker
    from django_q.conf import Conf

    from workflows.cluster import cluster_name

    Schedule.objects.filter(name="pilot.cleanup_tasks").delete()
    rebuild("0005_cleanup_schedule", "0023_host_cleanup_on_pilot_cluster")
    schedule = Schedule.objects.get(name="pilot.cleanup_tasks")
    assert schedule.cluster == cluster_name()
    Schedule.objects.filter(pk=schedule.pk).update(
        next_run=timezone.now() - timedelta(minutes=1))
    broker = get_broker(list_key=cluster_name())
    # django-q2's own pass, as qcluster runs it; only its connection recycling is
    # left out (it would close the test's database connection under the test).
    monkeypatch.setattr(q_scheduler, "close_old_django_connections", lambda: None)
    # The host's own cluster, the project's default one: not its schedule.
    monkeypatch.setattr(Conf, "PREFIX", "hostsite")
    monkeypatch.setattr(Conf, "CLUSTER_NAME", "hostsite")
    q_scheduler.scheduler(broker=broker)
    assert Schedule.objects.get(pk=schedule.pk).task is None
    # PILOT's cluster (run_workers: an ALT_CLUSTERS entry of that name) runs it.
    monkeypatch.setattr(Conf, "CLUSTER_NAME", cluster_name())
    q_scheduler.scheduler(broker=broker)
    assert Schedule.objects.get(pk=schedule.pk).task is not None
