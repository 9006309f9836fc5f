"""Schedules with real scheduler processes on PostgreSQL.

Three schedules fire every 5 seconds (`*/5 * * * * *`), one per missed-slot
policy. Two `run_scheduler` processes run side by side for three slots: each
schedule gets exactly one task per slot, whoever fired it. Then both stop for
five slots, and one scheduler comes back (`run_scheduler --once`, a real
process): `skip` runs none of the five, `run_once` one (the latest),
`catch_up` each of them once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from tests.support.procs import ROOT, Fleet, wait_until
from workflows.engine.schedule_definitions import schedule_save
from workflows.engine.schedules import database_now, schedule_key
from workflows.models import PilotSchedule, Task
from workflows.rules.cron import cron_latest_slots, cron_next

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CRON = "*/5 * * * * *"
INTERVAL = timedelta(seconds=5)
POLICIES = ("skip", "run_once", "catch_up")


def keys_of(name: str) -> list[str]:
    return sorted(Task.objects.filter(idempotency_key__startswith=f"schedule:{name}:")
                  .values_list("idempotency_key", flat=True))


def latest_slot(now: datetime) -> datetime:
    return cron_latest_slots(CRON, since=now - INTERVAL, now=now, limit=1)[0][0]


@pytest.fixture
def fleet():
    fleet = Fleet(PILOT_LOG_LEVEL="warning")
    yield fleet
    fleet.stop_all()


def test_two_schedulers_make_one_task_per_slot_and_a_restart_follows_each_policy(owner, fleet):
    created_at = database_now()
    for missed in POLICIES:
        schedule_save(name=f"every5-{missed}", workflow="demo.echo", cron=CRON,
                      payload={"missed": missed}, owner=owner, missed=missed, now=created_at)
    first = cron_next(CRON, created_at)
    third = first + 2 * INTERVAL
    schedulers = [fleet.start("run_scheduler", "--poll", "0.5") for _ in range(2)]

    def fired(slot):
        assert all(p.alive for p in schedulers), [p.log()[-2000:] for p in schedulers]
        return PilotSchedule.objects.filter(last_fired_slot=slot).count() == len(POLICIES)

    wait_until(lambda: fired(third), 40, interval=0.1, what="three slots to fire")
    for proc in schedulers:
        assert proc.stop(timeout=10) == 0, proc.log()[-2000:]  # SIGTERM: a clean stop
        assert "scheduler stopped after" in proc.log()
    for missed in POLICIES:
        name = f"every5-{missed}"
        assert keys_of(name) == [schedule_key(name, first + i * INTERVAL) for i in range(3)]
    assert Task.objects.count() == 3 * len(POLICIES)
    assert all(t.replays == 0 for t in Task.objects.all())  # nobody fired a slot twice

    # Down for five slots (third + 5 s ... third + 25 s), then one scheduler comes back
    # right after the fifth, when that slot is already later than the grace allows.
    fifth = third + 5 * INTERVAL
    wait_until(lambda: database_now() >= fifth + timedelta(seconds=0.05), 40, interval=0.05,
               what="five slots to pass")
    restarted = subprocess.run(
        [sys.executable, "manage.py", "run_scheduler", "--once"], cwd=ROOT, timeout=60,
        env={**fleet.env, "PILOT_SCHEDULE_GRACE_SECONDS": "0.5", "PILOT_LOG_STREAM": "stderr"},
        capture_output=True, text=True)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    report = json.loads(restarted.stdout)
    pass_time = datetime.fromisoformat(report["now"])
    assert latest_slot(pass_time) == fifth, "the pass must run before the next slot"
    assert (pass_time - fifth).total_seconds() > 0.5, "the fifth slot must be late for skip"
    missed_slots = [third + i * INTERVAL for i in range(1, 6)]

    def after_outage(name):
        return [k for k in keys_of(name) if k > schedule_key(name, third)]

    assert after_outage("every5-skip") == []
    assert after_outage("every5-run_once") == [schedule_key("every5-run_once", fifth)]
    assert after_outage("every5-catch_up") == [schedule_key("every5-catch_up", s)
                                               for s in missed_slots]
    assert (report["created"], report["skipped"]) == (1 + 5, 5 + 4)
    for missed in POLICIES:
        assert PilotSchedule.objects.get(name=f"every5-{missed}").next_slot_at == \
            fifth + INTERVAL
