"""The replay log's folding under concurrency (docs/design.md, "Dispatcher";
workflows/engine/replays.py), on PostgreSQL with real connections: a fold is
exact whatever runs beside it — another fold, replays of the same key, a
cleanup deleting the task — each at the exact window between a fold's writes
and its commit (fault point `before_fold_commit`), and all of them at once."""

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from tests.support.helpers import in_thread, pop_queued, run_at_once, wait_for
from workflows.engine import faults
from workflows.engine.replays import replays_fold
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskReplay
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

AN_HOUR_AGO = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)


def replay(owner, key):
    outcome = task_trigger(owner=owner, key=key, workflow="test.noop3", payload={"n": 1})
    assert outcome.outcome == "replayed", outcome.outcome
    return outcome.task.pilot_replays


def keyed_task(owner, rows: int):
    key = uuid.uuid4().hex
    task = task_trigger(owner=owner, key=key, workflow="test.noop3", payload={"n": 1}).task
    pop_queued()
    TaskReplay.objects.bulk_create([
        TaskReplay(task=task, workflow=task.workflow, count=1,
                   at=AN_HOUR_AGO + timedelta(seconds=i)) for i in range(rows)])
    return task, key


def total(task) -> int:
    return sum(TaskReplay.objects.filter(task=task).values_list("count", flat=True))


def waiting_on_a_lock(query_start: str) -> bool:
    """A backend runs a statement starting so and waits for a lock. (Asked from
    inside a transaction: the statistics snapshot is dropped each time, else
    the first answer would be repeated until the transaction ends.)"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND query LIKE %s", [query_start + "%"])
        return cursor.fetchone()[0] > 0


def test_a_replay_and_a_second_fold_inside_a_folds_window_count_once(owner):
    """Between a fold's writes and its commit: a replay of the key sees the
    rows before the fold and appends its own (nobody waits); a second folder
    finds the group locked and folds nothing. Afterwards every replay is counted
    exactly once."""
    task, key = keyed_task(owner, rows=5)
    seen = {}

    def meanwhile():
        seen["replays"] = in_thread(lambda: replay(owner, key))
        seen["second"] = in_thread(replays_fold)

    with faults.on("before_fold_commit", meanwhile):
        first = replays_fold()

    assert (first.removed, seen["second"].removed) == (4, 0)
    assert seen["replays"] == 6
    assert total(task) == 6
    assert replays_fold().removed == 0  # the replay's row is in the current hour, alone
    assert Task.objects.with_replays().get(pk=task.pk).pilot_replays == 6


def test_a_cleanup_deleting_the_task_inside_a_folds_window_deletes_every_row(owner):
    """The cleanup's DELETE of the task's replay rows (in its one statement,
    sql.py "delete_tasks") waits for the fold's locks; when the fold commits,
    the row it kept (updated, not inserted) is still the task's, so the cleanup
    deletes it and then the task. An inserted row would be invisible to the
    cleanup's statement and fail the task's delete on its foreign key."""
    from workflows.engine.store.postgres import QUERIES, _numbered

    name = _numbered(QUERIES["delete_tasks"])[0]
    task, _ = keyed_task(owner, rows=4)
    Task.objects.filter(pk=task.pk).update(state=S.SUCCEEDED, finished_at=AN_HOUR_AGO,
                                           expires_at=AN_HOUR_AGO)
    done = {}

    def cleanup():
        try:
            with transaction.atomic():
                done["deleted"] = store().delete_tasks_in_tx([task.pk])
        except BaseException as exc:  # noqa: BLE001 - reported below
            done["error"] = exc
        finally:
            from django.db import connections
            connections.close_all()

    cleaner = threading.Thread(target=cleanup)

    def meanwhile():
        cleaner.start()
        wait_for(lambda: waiting_on_a_lock(f"EXECUTE {name}(")
                 or waiting_on_a_lock("WITH steps AS ("),  # PILOT_PG_PREPARED off
                 what="the cleanup to wait for the fold's row locks")

    with faults.on("before_fold_commit", meanwhile):
        assert replays_fold().removed == 3
    cleaner.join(30)
    assert not cleaner.is_alive()
    assert "error" not in done, done.get("error")
    assert done["deleted"] == 1
    assert not Task.objects.filter(pk=task.pk).exists()
    assert not TaskReplay.objects.filter(task_id=task.pk).exists()


def test_folders_and_replays_racing_on_one_key_count_every_replay_once(owner):
    """The race at large: 24 replays of one key and 2 folders folding until the
    replays are done, all released together. Every replay is counted once, each
    answer counts the 30 rows logged before plus itself at least, and a last
    fold leaves one row per hour."""
    task, key = keyed_task(owner, rows=30)
    replays, finished = 24, []

    def act(i):
        if i < 2:
            folded = 0
            while len(finished) < replays:
                folded += replays_fold().removed
            return folded
        try:
            return replay(owner, key)
        finally:
            finished.append(i)

    results = run_at_once(replays + 2, act, timeout=60)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert results[0] + results[1] >= 29  # the folders folded (the 30 old rows at least)
    assert all(31 <= r <= 30 + replays for r in results[2:])
    assert total(task) == 30 + replays
    replays_fold()
    assert total(task) == 30 + replays
    hours = {r.at.replace(minute=0, second=0, microsecond=0)
             for r in TaskReplay.objects.filter(task=task)}
    assert TaskReplay.objects.filter(task=task).count() == len(hours)
