"""`run_scheduler --once`: one pass, its report as JSON (the loop itself runs in
real processes in tests/acceptance/test_schedulers.py)."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from workflows.engine.schedule_definitions import schedule_save
from workflows.engine.schedules import database_now
from workflows.models import Task

pytestmark = pytest.mark.django_db


def test_once_fires_what_is_due_and_prints_what_it_did(owner):
    schedule_save(name="tick", workflow="demo.echo", cron="* * * * * *", payload={}, owner=owner,
                  missed="catch_up", now=database_now() - timedelta(seconds=2.5))
    out = StringIO()
    call_command("run_scheduler", "--once", stdout=out)
    report = json.loads(out.getvalue())
    assert report["created"] >= 2 and report["schedules"] == 1 and report["errors"] == 0
    assert Task.objects.count() == report["created"]
    assert all(k.startswith("schedule:tick:") for k in
               Task.objects.values_list("idempotency_key", flat=True))


def test_a_poll_that_is_not_positive_is_refused():
    with pytest.raises(CommandError, match="--poll must be a positive number"):
        call_command("run_scheduler", "--poll", "0")
