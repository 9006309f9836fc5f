"""The replay log's folding (workflows/engine/replays.py): each task's rows of
one UTC hour become one row, and everything read from the log — the task's
`replays` and `last_replayed_at`, the console's replays per hour — answers the
same before and after. SQLite and PostgreSQL; the races are in
tests/windows/test_replay_fold_windows.py."""

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.helpers import pop_queued
from workflows.admin.stats import activity_per_hour
from workflows.engine import faults
from workflows.engine.loop import dispatcher_loop
from workflows.engine.replays import Folding, fold_since, replays_fold
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskReplay

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime.now(UTC)
HOUR = fold_since(NOW, hours_back=0)  # the start of the current UTC hour


def trigger(owner, key=None):
    task = task_trigger(owner=owner, key=key or uuid.uuid4().hex, workflow="test.noop3",
                        payload={"n": 1}).task
    pop_queued()
    return task


def log(task, *entries):
    """Replay rows for `task`: (hours before the current hour, minute, count)."""
    TaskReplay.objects.bulk_create([
        TaskReplay(task=task, workflow=task.workflow, count=count,
                   at=HOUR - timedelta(hours=back) + timedelta(minutes=minute))
        for back, minute, count in entries])


def reads(*tasks):
    """What the log answers: per task (replays, last_replayed_at), and the chart."""
    per_task = {t.pk: (t.pilot_replays, t.pilot_last_replayed_at)
                for t in Task.objects.with_replays().filter(pk__in=[t.pk for t in tasks])}
    chart = [(b.start, b.replays) for b in activity_per_hour(NOW)]
    return per_task, chart


def rows(task):
    return sorted((r.at, r.count) for r in TaskReplay.objects.filter(task=task))


def test_a_fold_leaves_one_row_per_task_and_hour_and_every_read_unchanged(owner):
    a, b, c = trigger(owner), trigger(owner), trigger(owner)
    log(a, (3, 5, 1), (3, 17, 1), (3, 40, 3), (3, 59, 1), (3, 20, 2),  # 5 rows, one hour
        (2, 0, 1), (2, 30, 4), (2, 31, 1),                             # 3 rows, the next
        (1, 10, 7))                                                     # alone in its hour
    log(b, (3, 1, 1), (3, 2, 1))
    log(c, (2, 10, 1))
    before = reads(a, b, c)
    assert before[0][a.pk][0] == 21

    report = replays_fold()

    assert (report.groups, report.removed, report.full) == (3, 7, False)
    assert reads(a, b, c) == before
    start = HOUR - timedelta(hours=3)
    assert rows(a) == [(start + timedelta(minutes=59), 8),
                       (start + timedelta(hours=1, minutes=31), 6),
                       (start + timedelta(hours=2, minutes=10), 7)]
    assert rows(b) == [(start + timedelta(minutes=2), 2)]
    assert rows(c) == [(start + timedelta(hours=1, minutes=10), 1)]
    assert replays_fold().removed == 0  # nothing left to fold


def test_a_replay_after_a_fold_counts_on_from_the_folded_total(owner):
    task = trigger(owner, key="folded")
    log(task, (1, 0, 1), (1, 1, 1), (1, 2, 1))
    replays_fold()
    again = task_trigger(owner=owner, key="folded", workflow="test.noop3", payload={"n": 1})
    assert again.outcome == "replayed"
    assert again.task.pilot_replays == 4


def test_since_folds_only_the_hours_from_it(owner):
    task = trigger(owner)
    log(task, (3, 0, 1), (3, 1, 1), (1, 0, 1), (1, 1, 1))
    report = replays_fold(since=HOUR - timedelta(hours=1))
    assert (report.groups, report.removed) == (1, 1)
    assert len(rows(task)) == 3  # the older hour is untouched
    with pytest.raises(ValueError, match="hour boundary"):
        replays_fold(since=HOUR - timedelta(minutes=30))


def test_a_fold_stops_at_its_batch_and_says_so(owner):
    first, second = trigger(owner), trigger(owner)
    log(first, (1, 0, 1), (1, 1, 1))
    log(second, (1, 0, 1), (1, 1, 1))
    assert (replays_fold(batch=1).full, replays_fold(batch=1).full) == (True, True)
    report = replays_fold(batch=1)
    assert (report.removed, report.full) == (0, False)
    assert len(rows(first)) == len(rows(second)) == 1


def test_the_dispatcher_loop_folds_the_whole_log_at_once_then_every_minute(owner):
    task = trigger(owner)
    log(task, (30, 0, 1), (30, 1, 1), (0, 0, 1), (0, 1, 1))  # 30 h ago: still folded
    assert dispatcher_loop(threading.Event(), poll=0, max_passes=1) == 1
    assert [n for _, n in rows(task)] == [2, 2]

    folding = Folding(every=3600)
    assert folding(NOW).removed == 0  # due at once; nothing left
    log(task, (0, 2, 1))
    assert folding(NOW) is None  # not due again within the hour
    assert folding.since == HOUR - timedelta(hours=1)


def test_a_fold_that_fails_never_stops_the_dispatcher_and_is_tried_again_later(owner, caplog):
    task = trigger(owner)
    log(task, (1, 0, 1), (1, 1, 1))
    with (faults.armed("before_fold_commit", error=RuntimeError("disk on fire")),
          caplog.at_level("ERROR", logger="pilot.events")):
        assert dispatcher_loop(threading.Event(), poll=0, max_passes=3) == 3
    errors = [r.pilot["error"] for r in caplog.records if r.getMessage() == "dispatcher_error"]
    assert errors == ["replay fold: RuntimeError: disk on fire"]
    assert len(rows(task)) == 2  # rolled back whole; tried again a minute later
    folding = Folding(every=0)
    assert folding(NOW).removed == 1
