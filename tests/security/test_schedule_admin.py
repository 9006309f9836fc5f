"""django-q2's Schedule admin cannot run arbitrary code (workflows/admin/django_q.py):
no superuser can add a schedule or change what one runs; PILOT's own cleanup
schedule stays, and its timing can still be changed."""

from datetime import timedelta

import pytest
from django.contrib import admin
from django.test import Client
from django.utils import timezone
from django_q.models import Schedule

from tests.support.migrated import rebuild
from workflows.admin.django_q import LockedScheduleAdmin

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", "r@x", "pw-root-1"))
    return client


def cleanup_schedule() -> Schedule:
    """The schedule as migration 0005 writes it (tests.support.migrated says why)."""
    Schedule.objects.filter(name="pilot.cleanup_tasks").delete()
    rebuild("0005_cleanup_schedule")
    return Schedule.objects.get(name="pilot.cleanup_tasks")


def test_a_superuser_cannot_schedule_a_shell_command(root):
    assert isinstance(admin.site._registry[Schedule], LockedScheduleAdmin)
    assert root.get("/admin/django_q/schedule/add/").status_code == 403
    before = Schedule.objects.count()
    answer = root.post("/admin/django_q/schedule/add/", {
        "name": "pwn", "func": "os.system", "args": "'touch /tmp/pwned'",
        "schedule_type": "O", "repeats": "-1", "next_run_0": "2030-01-01",
        "next_run_1": "00:00:00"})
    assert answer.status_code == 403
    assert Schedule.objects.count() == before
    assert not Schedule.objects.filter(func="os.system").exists()


def test_what_a_schedule_runs_is_read_only_and_its_timing_is_not(root):
    schedule = cleanup_schedule()
    url = f"/admin/django_q/schedule/{schedule.pk}/change/"
    page = root.get(url)
    assert page.status_code == 200
    assert 'name="func"' not in page.content.decode()
    later = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    answer = root.post(url, {
        "func": "os.system", "args": "'id'", "hook": "os.system", "kwargs": "{}",
        "name": "pwn", "cluster": "elsewhere",
        "schedule_type": "D", "minutes": "", "repeats": "-1", "cron": "",
        "next_run_0": later.strftime("%Y-%m-%d"), "next_run_1": later.strftime("%H:%M:%S")})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.func, schedule.args, schedule.hook, schedule.name) == \
        ("django.core.management.call_command", "'cleanup_tasks'", None, "pilot.cleanup_tasks")
    assert schedule.next_run == later


def test_the_cleanup_schedule_can_still_be_deleted_by_an_operator_who_prefers_cron(root):
    schedule = cleanup_schedule()
    root.post(f"/admin/django_q/schedule/{schedule.pk}/delete/", {"post": "yes"})
    assert not Schedule.objects.filter(pk=schedule.pk).exists()
