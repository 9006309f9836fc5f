"""Real processes on PostgreSQL: `qcluster` and `run_dispatcher` as
subprocesses, the whole worker process group SIGKILLed mid-run and restarted.
Every task must succeed, every atomic write land exactly once, no step that had
succeeded before a kill run again, and no task stay `running` past its lease
plus a poll."""

import json
import random
import time
import uuid

import pytest
from django.db.models import Q
from django.utils import timezone

from tests.procs import ARTIFACTS, Fleet, wait_until
from workflows.engine.triggers import task_trigger
from workflows.models import DemoOrder, StepCheckpoint, Task
from workflows.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE, POLL = 3.0, 0.2


@pytest.fixture
def fleet():
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_DISPATCHER_POLL_SECONDS=POLL)
    yield fleet
    fleet.stop_all()


def overdue_running() -> list:
    """Tasks `running` whose lease ran out more than a poll (+2 s slack) ago."""
    limit = timezone.now() - timezone.timedelta(seconds=POLL + 2)
    return list(Task.objects.filter(state=S.RUNNING, lease_expires_at__lt=limit)
                .values_list("pk", flat=True))


def test_sigkilled_workers_lose_nothing_and_repeat_no_finished_step(owner, fleet):
    rng = random.Random(20261129)
    fleet.dispatcher()
    workers = fleet.workers()
    tasks = []
    for i in range(4):
        tasks.append(task_trigger(owner=owner, key=f"slow-{i}", workflow="demo.slow",
                                  payload={"steps": 6, "seconds": 0.3}).task)
        batch = f"kill-{i}-{uuid.uuid4().hex[:6]}"
        tasks.append(task_trigger(owner=owner, key=batch, workflow="demo.sync_orders",
                                  payload={"batch": batch, "count": 1500,
                                           "step_seconds": 0.4}).task)
    ids = [t.pk for t in tasks]
    frozen: dict = {}  # (task, index) -> attempts of steps succeeded before some kill
    recoveries = []
    for _ in range(3):
        wait_until(lambda: Task.objects.filter(pk__in=ids, state=S.RUNNING).exists(), 30,
                   what="a running task to kill")
        time.sleep(rng.uniform(0.2, 1.0))
        for task_id, index, attempts in StepCheckpoint.objects.filter(
                task_id__in=ids, state="succeeded").values_list("task_id", "index", "attempts"):
            frozen[(task_id, index)] = attempts
        running = dict(Task.objects.filter(pk__in=ids, state=S.RUNNING)
                       .values_list("pk", "lease_token"))
        workers.kill()
        killed_at = time.monotonic()
        workers = fleet.workers()

        def reclaimed(running=running):
            assert overdue_running() == []
            now_tokens = dict(Task.objects.filter(pk__in=running).values_list(
                "pk", "lease_token"))
            states = dict(Task.objects.filter(pk__in=running).values_list("pk", "state"))
            return all(now_tokens[pk] > token or states[pk] in (S.SUCCEEDED, S.FAILED)
                       for pk, token in running.items())

        wait_until(reclaimed, LEASE + POLL + 20, what="the killed tasks to be claimed again")
        recoveries.append(round(time.monotonic() - killed_at, 2))

    def all_done():
        assert overdue_running() == []
        return not Task.objects.filter(pk__in=ids).exclude(
            state__in=[S.SUCCEEDED, S.FAILED, S.CANCELLED]).exists()

    wait_until(all_done, 120, interval=0.2, what="every task to finish")
    states = dict(Task.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert set(states.values()) == {S.SUCCEEDED}, workers.log()[-3000:]
    for task in Task.objects.filter(pk__in=ids, workflow="demo.sync_orders"):
        assert DemoOrder.objects.filter(batch=task.payload["batch"]).count() == 1500
        assert task.result == {"written": 1500}
    for task in Task.objects.filter(pk__in=ids, workflow="demo.slow"):
        assert task.result == {"completed_steps": 6}
    final = {(t, i): (a, s) for t, i, a, s in StepCheckpoint.objects.filter(
        task_id__in=ids).values_list("task_id", "index", "attempts", "state")}
    rerun = {key: (attempts, final[key]) for key, attempts in frozen.items()
             if final[key] != (attempts, "succeeded")}
    assert rerun == {}
    assert Task.objects.filter(pk__in=ids).filter(~Q(attempts__lte=5)).count() == 0
    (ARTIFACTS / "worker-kill-recovery.json").write_text(json.dumps(
        {"lease_seconds": LEASE, "poll_seconds": POLL, "recovery_seconds": recoveries}))
    print(f"\nrecovery after SIGKILL (lease {LEASE}s, poll {POLL}s): {recoveries} s")


def test_a_poison_task_ends_failed_while_others_complete(owner, fleet):
    fleet.dispatcher()
    fleet.workers()
    poison = task_trigger(owner=owner, key="poison", workflow="test.poison", payload={}).task
    healthy = [task_trigger(owner=owner, key=f"ok-{i}", workflow="demo.echo",
                            payload={"i": i}).task for i in range(10)]
    wait_until(lambda: Task.objects.get(pk=poison.pk).is_finished, 90, interval=0.2,
               what="the poison task to end")
    poison.refresh_from_db()
    assert (poison.state, poison.attempts, poison.max_attempts) == (S.FAILED, 3, 3)
    assert poison.error_type == "LeaseExpired"
    wait_until(lambda: all(Task.objects.get(pk=t.pk).state == S.SUCCEEDED for t in healthy),
               60, what="the healthy tasks")
