"""The dashboard's activity folded by the dispatcher (workflows/engine/activity.py):
the same chart before and after a fold, from the folded rows once history is gone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.factories import make_task
from workflows.admin.stats import activity_per_hour, workflows_top_failing
from workflows.engine.activity import (
    KEEP,
    MAX_MINUTES,
    MINUTE,
    ActivityFolding,
    activity_fold,
    folded_until,
    minute_of,
)
from workflows.models import ActivityMinute, Task, TaskReplay, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db


def history(owner):
    """Tasks of three states and two workflows, replays, and transitions moved
    back into earlier hours (a day's chart, not one bucket)."""
    tasks = [make_task(owner, state=S.SUCCEEDED), make_task(owner, state=S.FAILED),
             make_task(owner, state=S.RETRYING, workflow="demo.saga", payload={"fail": False}),
             make_task(owner, state=S.SUCCEEDED, workflow="demo.saga", payload={"fail": False})]
    now = timezone.now()
    for hours_back, task in enumerate(tasks):
        at = now - timedelta(hours=hours_back * 3, minutes=7)
        Task.objects.filter(pk=task.pk).update(created_at=at)
        TaskTransition.objects.filter(task=task).update(at=at + timedelta(seconds=5))
        TaskReplay.objects.create(task=task, workflow=task.workflow, count=hours_back + 1,
                                  at=at + timedelta(seconds=9))
    return now


def chart(now):
    return [(b.start, b.triggers, b.replays, b.successes, b.failures, b.retries)
            for b in activity_per_hour(now)]


def test_a_fold_changes_nothing_on_the_chart_and_outlives_cleanup(owner):
    now = history(owner)
    before = chart(now)
    failing = workflows_top_failing(now)
    assert [(r["workflow"], r["failures"]) for r in failing] == [("demo.echo", 1)]
    assert sum(row[1] for row in before) == 4 and sum(row[2] for row in before) == 10
    assert sum(row[3] for row in before) == 2 and sum(row[4] for row in before) == 1
    until = minute_of(now) + MINUTE
    activity_fold(since=until - KEEP, until=until)
    assert chart(now) == before and workflows_top_failing(now) == failing
    activity_fold(since=until - KEEP, until=until)  # a recount: nothing counted twice
    assert chart(now) == before and workflows_top_failing(now) == failing
    TaskTransition.objects.filter(to_state=S.FAILED).delete()  # read from the fold now
    assert workflows_top_failing(now) == failing
    # History gone (cleanup): the folded minutes still answer.
    TaskReplay.objects.all().delete()
    TaskTransition.objects.all().delete()
    Task.objects.all().delete()
    assert chart(now) == before


def test_minutes_after_the_last_mark_come_from_history(owner):
    now = history(owner)
    before = chart(now)
    until = minute_of(now) - timedelta(hours=2)  # the newest two tasks' hours unfolded
    activity_fold(since=until - KEEP, until=until)
    assert folded_until() == until
    assert chart(now) == before


def test_the_loop_folds_from_a_day_back_in_chunks_then_only_the_last_minutes(owner):
    now = history(owner)
    before = chart(now)
    fold = ActivityFolding(every=0)
    passes = 0
    while folded_until() is None or folded_until() < minute_of(timezone.now()):
        assert fold(timezone.now()) is not None
        passes += 1
        assert passes <= KEEP // (MAX_MINUTES * MINUTE) + 1
    assert passes >= KEEP // (MAX_MINUTES * MINUTE)
    marks = ActivityMinute.objects.filter(workflow="").count()
    assert marks >= KEEP // MINUTE
    fold(timezone.now())  # caught up: re-folds the late minutes only
    assert ActivityMinute.objects.filter(workflow="").count() <= marks + 2
    assert chart(now) == before


def test_a_fold_refuses_times_off_the_minute():
    with pytest.raises(ValueError):
        activity_fold(since=timezone.now(), until=minute_of(timezone.now()))
