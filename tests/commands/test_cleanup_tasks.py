"""`cleanup_tasks` and the engine's `tasks_cleanup` behind it."""

import logging
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.utils import timezone
from django_q.models import Task as QResult

from tests.factories import make_finished_tasks, make_task
from tests.support.helpers import drain, run_at_once
from workflows.engine.cleanup import tasks_cleanup
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskReplay, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

UNFINISHED = [S.PENDING, S.RUNNING, S.RETRYING, S.CANCELLING]


def cleanup(*args) -> str:
    out = StringIO()
    call_command("cleanup_tasks", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def counts() -> tuple:
    return (Task.objects.count(), StepCheckpoint.objects.count(),
            TaskTransition.objects.count(), TaskReplay.objects.count())


def test_a_dry_run_counts_and_changes_nothing(owner):
    make_finished_tasks(owner, 5)
    make_finished_tasks(owner, 2, finished_ago=timedelta(minutes=5), key_prefix="fresh")
    before = counts()
    out = cleanup("--dry-run", "--batch-size", "2")
    assert "would delete 5 finished task(s)" in out and "in 3 batch(es)" in out
    assert counts() == before


def test_expired_tasks_go_with_their_steps_history_and_replays(owner):
    done = task_trigger(owner=owner, key="real", workflow="demo.echo", payload={"a": 1}).task
    task_trigger(owner=owner, key="real", workflow="demo.echo", payload={"a": 1})  # a replay
    drain()
    Task.objects.filter(pk=done.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    kept = make_finished_tasks(owner, 3, finished_ago=timedelta(hours=1), key_prefix="kept")
    assert StepCheckpoint.objects.filter(task_id=done.pk).exists()
    assert TaskReplay.objects.filter(task_id=done.pk).exists()
    out = cleanup()
    assert "deleted 1 finished task(s)" in out
    assert not Task.objects.filter(pk=done.pk).exists()
    for model in (StepCheckpoint, TaskTransition, TaskReplay):
        assert not model.objects.filter(task_id=done.pk).exists()
    assert set(Task.objects.values_list("pk", flat=True)) == set(kept)


def test_batches_commit_one_by_one_with_progress_and_an_event_each(owner, caplog):
    make_finished_tasks(owner, 7)
    caplog.set_level(logging.INFO, logger="pilot.events")
    out = cleanup("--batch-size", "3", "-v", "2")
    assert "deleted 7 finished task(s)" in out and "in 3 batch(es) of up to 3" in out
    assert [line.split(":")[0].strip() for line in out.splitlines()[:3]] == \
        ["batch 1", "batch 2", "batch 3"]
    batches = [r.pilot for r in caplog.records if r.msg == "cleanup_batch"]
    assert [(b["batch"], b["deleted"]) for b in batches] == [(1, 3), (2, 3), (3, 1)]
    assert all(b["duration_ms"] >= 0 for b in batches)
    assert Task.objects.count() == 0


def test_each_batch_takes_exactly_its_tasks_with_all_their_rows_and_spares_the_rest(owner):
    """Both stores (PostgreSQL: one statement a batch). After every batch the
    tasks it deleted have no step, transition, replay or signal left and every
    other task keeps all of its rows; a task whose key expires a minute from
    now is never touched, nor its rows; batch boundaries: 5 expired in batches
    of 2 are 2 + 2 + 1."""
    from workflows.models import TaskSignal

    expired = make_finished_tasks(owner, 5)
    live = make_finished_tasks(owner, 2, finished_ago=timedelta(days=1) - timedelta(minutes=1),
                               key_prefix="live")
    now = timezone.now()
    TaskSignal.objects.bulk_create(
        TaskSignal(task_id=pk, name="go", idempotency_key="s", fingerprint="f", actor="test",
                   received_at=now) for pk in expired + live)
    models = (StepCheckpoint, TaskTransition, TaskReplay, TaskSignal)

    def rows_of(ids) -> list[int]:
        return [m.objects.filter(task_id__in=ids).count() for m in models]

    full = rows_of(expired[:1])
    assert full == [1, 2, 1, 1]
    seen = []

    def progress(report):
        gone = [pk for pk in expired if not Task.objects.filter(pk=pk).exists()]
        assert len(gone) == report.tasks and rows_of(gone) == [0, 0, 0, 0]
        kept = [pk for pk in expired if pk not in gone] + live
        assert rows_of(kept) == [n * len(kept) for n in full]
        seen.append(report.tasks)

    report = tasks_cleanup(batch_size=2, progress=progress)
    assert (report.tasks, report.batches, seen) == (5, 3, [2, 4, 5])
    assert set(Task.objects.values_list("pk", flat=True)) == set(live)
    assert rows_of(live) == [n * 2 for n in full]


def test_a_short_run_prints_only_its_summary(owner):
    make_finished_tasks(owner, 5)
    lines = cleanup("--batch-size", "2").splitlines()
    assert len(lines) == 1 and lines[0].startswith("deleted 5 finished task(s)")


@pytest.mark.parametrize("state", UNFINISHED)
def test_unfinished_tasks_are_never_deleted_whatever_their_dates(owner, state):
    task = make_task(owner, state=state)
    long_ago = timezone.now() - timedelta(days=30)
    # Dates an unfinished task never has; cleanup must look at the state.
    Task.objects.filter(pk=task.pk).update(expires_at=long_ago, finished_at=long_ago,
                                           created_at=long_ago)
    make_finished_tasks(owner, 2)
    cleanup()
    cleanup("--older-than", "0s")
    assert list(Task.objects.values_list("pk", flat=True)) == [task.pk]


def test_older_than_deletes_by_finish_time_and_workflow_narrows_it(owner):
    recent = make_finished_tasks(owner, 2, finished_ago=timedelta(minutes=10), key_prefix="r")
    old_echo = make_finished_tasks(owner, 2, finished_ago=timedelta(hours=2), key_prefix="e")
    old_flaky = make_finished_tasks(owner, 2, finished_ago=timedelta(hours=2), key_prefix="f",
                                    workflow="demo.flaky", state=S.FAILED)
    assert "deleted 0" in cleanup()  # none has expired (24 h TTL)
    out = cleanup("--older-than", "1h", "--workflow", "demo.flaky")
    assert "deleted 2 finished task(s)" in out
    assert set(Task.objects.values_list("pk", flat=True)) == {*recent, *old_echo}
    cleanup("--older-than", "15m")
    assert set(Task.objects.values_list("pk", flat=True)) == set(recent)
    assert not set(old_flaky) & set(Task.objects.values_list("pk", flat=True))


def test_the_freed_key_creates_a_new_task(owner):
    [old] = make_finished_tasks(owner, 1, key_prefix="reuse")
    cleanup()
    outcome = task_trigger(owner=owner, key="reuse-0", workflow="demo.echo", payload={"n": 1})
    assert outcome.outcome == "created" and outcome.task.pk != old
    drain()
    assert Task.objects.get(pk=outcome.task.pk).state == S.SUCCEEDED


def test_old_django_q_results_are_pruned(owner):
    now = timezone.now()
    for i, age in enumerate([timedelta(days=8), timedelta(days=9), timedelta(hours=1)]):
        QResult.objects.create(id=f"q{i}", name=f"q{i}", func="x", started=now - age,
                               stopped=now - age, success=i != 1)
    assert "would delete 2 django-q2 result row(s)" in cleanup("--dry-run")
    assert QResult.objects.count() == 3
    assert "deleted 2 django-q2 result row(s) older than 7d" in cleanup()
    assert list(QResult.objects.values_list("id", flat=True)) == ["q2"]
    cleanup("--q-results-older-than", "0s")
    assert QResult.objects.count() == 0


@pytest.mark.parametrize("args, message", [
    (["--older-than", "7x"], "is not a duration"),
    (["--older-than=-1d"], "is not a duration"),
    (["--q-results-older-than", "week"], "is not a duration"),
    (["--batch-size", "0"], "--batch-size must be between 1 and 10000"),
])
def test_bad_arguments_are_clear_errors(args, message):
    with pytest.raises(CommandError, match=message):
        cleanup(*args)


# --- real concurrency: PostgreSQL row locks -----------------------------------------------


@pytest.mark.postgres
def test_two_cleanups_at_once_share_the_work_and_delete_each_task_once(owner):
    make_finished_tasks(owner, 600)
    reports = run_at_once(2, lambda i: tasks_cleanup(batch_size=50))
    assert not [r for r in reports if isinstance(r, BaseException)], reports
    assert sum(r.tasks for r in reports) == 600
    assert counts() == (0, 0, 0, 0)


@pytest.mark.postgres
def test_cleanup_skips_a_row_that_another_transaction_holds_instead_of_waiting(owner):
    held, *_others = make_finished_tasks(owner, 4)
    locked, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=held)
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        report = tasks_cleanup(batch_size=10)  # would block forever without SKIP LOCKED
    finally:
        release.set()
        holder.join(10)
    assert report.tasks == 3
    assert list(Task.objects.values_list("pk", flat=True)) == [held]
    assert tasks_cleanup().tasks == 1  # once released, the next run takes it


@pytest.mark.postgres
def test_triggers_for_expired_keys_during_cleanups_all_create_fresh_tasks(owner):
    make_finished_tasks(owner, 300, key_prefix="k")

    def act(i):
        if i < 2:
            return tasks_cleanup(batch_size=20)
        return [task_trigger(owner=owner, key=f"k-{n}", workflow="demo.echo",
                             payload={"n": 1}).outcome for n in range(i - 2, 300, 10)]

    results = run_at_once(12, act)
    assert not [r for r in results if isinstance(r, BaseException)], results
    outcomes = [o for r in results[2:] for o in r]
    assert len(outcomes) == 300 and set(outcomes) == {"created"}
    # Every key now has exactly one task: the fresh, pending one.
    assert Task.objects.count() == 300
    assert set(Task.objects.values_list("state", flat=True)) == {S.PENDING}
    assert TaskReplay.objects.count() == 0


def test_the_yield_ratio_is_validated_and_still_deletes_everything(owner):
    with pytest.raises(CommandError, match="yield-ratio"):
        call_command("cleanup_tasks", "--yield-ratio", "-1")
    for i in range(5):
        make_task(owner, state=S.SUCCEEDED, key=f"y{i}")
    call_command("cleanup_tasks", "--older-than", "0s", "--batch-size", "2",
                 "--yield-ratio", "0.5")
    assert Task.objects.count() == 0
