"""Worker faults with real processes on PostgreSQL: the whole worker process
group SIGKILLed again and again, a step longer than three leases, and a worker
paused (SIGSTOP) past its lease whose late writes must be refused."""

import os
import random
import signal
import socket
import time
import uuid
from collections import Counter, defaultdict

import pytest

from tests.faults.invariants import violations
from tests.support.procs import Fleet, group_pids, wait_until
from workflows.engine.triggers import TriggerRequest, task_trigger, task_trigger_many
from workflows.models import DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.states import FINISHED_STATES
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE, POLL = 3.0, 0.2
LONG = os.environ.get("PILOT_LONG") == "1"


@pytest.fixture
def fleet():
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_DISPATCHER_POLL_SECONDS=POLL)
    yield fleet
    fleet.stop_all()


def finished(ids):
    return lambda: not Task.objects.filter(pk__in=ids).exclude(
        state__in=FINISHED_STATES).exists()


def mixed_requests(n: int) -> list[TriggerRequest]:
    """Half of the runs take ~0.6-0.9 s, so the kills land in the middle of work."""
    requests = []
    for i in range(n):
        kind = i % 4
        key = f"mix-{i}-{uuid.uuid4().hex[:6]}"
        if kind == 0:
            requests.append(TriggerRequest("demo.sync_orders", {
                "batch": key, "count": 50, "step_seconds": 0.2}, key))
        elif kind == 1:
            requests.append(TriggerRequest("demo.slow", {"steps": 3, "seconds": 0.3}, key))
        elif kind == 2:
            requests.append(TriggerRequest("demo.flaky", {"fail_times": 1}, key))
        else:
            requests.append(TriggerRequest("demo.echo", {"i": i}, key))
    return requests


LONG_RUNS = ("demo.slow", "demo.sync_orders")  # ~0.6-0.9 s: a kill cannot miss them by luck


def running_under(group, ids) -> dict:
    """{task id: lease owner} of the tasks running on a lease held by a process of
    `group` (a worker's lease owner is "host:pid", workflows.engine.leases.worker_id),
    when one of them is a long run (an echo may end in the instant before the kill)."""
    owners = {f"{socket.gethostname()}:{pid}" for pid in group_pids(group.popen.pid)}
    running = dict(Task.objects.filter(pk__in=ids, state=S.RUNNING, lease_owner__in=owners)
                   .values_list("pk", "lease_owner"))
    if not Task.objects.filter(pk__in=list(running), workflow__in=LONG_RUNS).exists():
        return {}
    return running


def lease_endings(running: dict, mark: int) -> dict:
    """For each task of `running` (snapshotted before transition id `mark`), the
    transition that ended the lease it was running on then: the first edge out of
    `running` after its last claim up to `mark`. Missing while the lease has not ended."""
    endings = {}
    chains = defaultdict(list)
    for row in (TaskTransition.objects.filter(task_id__in=list(running)).order_by("id")
                .values("id", "task_id", "transition", "from_state", "actor")):
        chains[row["task_id"]].append(row)
    for pk, chain in chains.items():
        claims = [i for i, row in enumerate(chain)
                  if row["transition"] == "claim" and row["id"] <= mark]
        after = chain[claims[-1] + 1:] if claims else []
        ending = next((row for row in after if row["from_state"] == S.RUNNING), None)
        if ending is not None:
            endings[pk] = ending
    return endings


def test_repeated_sigkills_lose_nothing_and_every_interrupted_task_is_recovered(owner, fleet):
    """How long recovery takes is a benchmark figure (bench/kill_recovery.py, on the
    database's clock), not an assertion here: this test holds the behaviour — each
    kill interrupted running work, each interrupted task was recovered with its lost
    attempt counted and claimed again, and nothing ran twice."""
    runs, kills = (500, 20) if LONG else (200, 8)
    rng = random.Random(1129)
    fleet.dispatcher()
    workers = fleet.workers()
    requests = mixed_requests(runs)
    # A kill whose tasks all committed their end in the instant before it (the
    # statement was in flight) interrupted nothing: it does not count, and another
    # is made — at most MISSES times.
    MISSES = 3  # noqa: N806
    wave = runs // (kills + MISSES + 1)  # fresh work before every kill, so none finds none
    ids = []
    interrupted_per_kill, all_interrupted, misses = [], set(), 0
    n = 0
    while len(interrupted_per_kill) < kills:
        n += 1
        assert n <= kills + MISSES, f"{misses} kills of {n - 1} interrupted nothing"
        ids.extend(r.task.pk for r in task_trigger_many(
            owner=owner, requests=requests[(n - 1) * wave:n * wave]))
        time.sleep(rng.uniform(0.1, 1.0))
        # Every kill lands on running work: wait (polling fast) until the group about to
        # be killed holds a task, then kill at once.
        group = workers
        running = wait_until(lambda group=group: running_under(group, ids), 60,
                             interval=0.01, what=f"kill {n}: work running under the group")
        mark = TaskTransition.objects.order_by("-id").values_list("id", flat=True).first()
        group.kill()
        workers = fleet.workers()
        # Each of those leases ends: `recover` by the dispatcher (the kill interrupted
        # it), or its own worker's edge (it finished in the instant before the kill).
        endings = wait_until(
            lambda running=running, mark=mark: (
                e if len(e := lease_endings(running, mark)) == len(running) else None),
            LEASE + POLL + 10, interval=0.05, what=f"kill {n}: the dispatcher to recover")
        interrupted = {pk for pk, e in endings.items() if e["transition"] == "recover"}
        for pk, ending in endings.items():
            if pk not in interrupted:
                assert ending["actor"] == f"worker:{running[pk]}", (n, pk, ending)
        # Live: while the new group works and the dispatcher recovers, every invariant
        # that holds at any moment holds now.
        assert violations(require_terminal=False, tasks=Task.objects.filter(pk__in=ids)) == []
        if not interrupted:
            misses += 1
            continue
        interrupted_per_kill.append(len(interrupted))
        all_interrupted |= interrupted
        wait_until(lambda endings=endings, interrupted=interrupted: interrupted <= {
            pk for pk, at in TaskTransition.objects.filter(
                task_id__in=interrupted, transition="claim").values_list("task_id", "id")
            if at > endings[pk]["id"]}, 60,
            interval=0.05, what=f"kill {n}: the interrupted tasks to be claimed again")
    ids += [r.task.pk for r in task_trigger_many(owner=owner,
                                                 requests=requests[n * wave:])]
    assert len(ids) == runs
    wait_until(finished(ids), 240, interval=0.5, what="every task to finish")
    assert violations(tasks=Task.objects.filter(pk__in=ids)) == []
    assert set(Task.objects.filter(pk__in=ids).values_list("state", flat=True)) == {
        S.SUCCEEDED}
    # Each lost attempt counted: an interrupted task was claimed once per attempt, its
    # recoveries among them, and it took at least one more attempt than it lost.
    claims = Counter(TaskTransition.objects.filter(task_id__in=all_interrupted,
                                                   transition="claim")
                     .values_list("task_id", flat=True))
    recovers = Counter(TaskTransition.objects.filter(task_id__in=all_interrupted,
                                                     transition="recover")
                       .values_list("task_id", flat=True))
    for pk, attempts in Task.objects.filter(pk__in=all_interrupted).values_list("pk",
                                                                               "attempts"):
        assert recovers[pk] >= 1 and attempts == claims[pk] >= recovers[pk] + 1, (
            pk, attempts, claims[pk], recovers[pk])
    print(f"\n{kills} kills over {runs} runs ({misses} more that came too late), "
          f"interrupting {interrupted_per_kill} tasks")


def test_a_step_longer_than_three_leases_that_heartbeats_runs_once(owner, fleet):
    fleet.dispatcher()
    fleet.workers()
    task = task_trigger(owner=owner, key="long", workflow="demo.slow",
                        payload={"steps": 1, "seconds": LEASE * 3.5}).task
    wait_until(finished([task.pk]), 60, interval=0.2, what="the long step")
    task.refresh_from_db()
    assert (task.state, task.attempts) == (S.SUCCEEDED, 1)
    assert StepCheckpoint.objects.get(task_id=task.pk).attempts == 1
    assert not TaskTransition.objects.filter(task_id=task.pk, transition="recover").exists()


def test_a_paused_worker_has_its_late_writes_refused_after_a_takeover(owner, fleet):
    fleet.dispatcher()
    paused = fleet.workers()
    task = task_trigger(owner=owner, key="paused", workflow="demo.sync_orders",
                        payload={"batch": "paused", "count": 300, "step_seconds": 1.5}).task
    wait_until(lambda: StepCheckpoint.objects.filter(task_id=task.pk, name="transform",
                                                     state="running").exists(), 30,
               what="the worker to be mid-run")
    first_token = Task.objects.get(pk=task.pk).lease_token
    paused.signal_group(signal.SIGSTOP)
    try:
        wait_until(lambda: Task.objects.get(pk=task.pk).lease_token > first_token or
                   Task.objects.get(pk=task.pk).state == S.RETRYING, LEASE + 10,
                   what="the dispatcher to recover the task")
        fleet.workers()  # a healthy worker takes over
        wait_until(finished([task.pk]), 60, interval=0.2, what="the takeover to finish")
    finally:
        paused.signal_group(signal.SIGCONT)
    # The zombie, resumed, tries its late write and is refused: wait for that (its
    # log line), not for a guessed time.
    wait_until(lambda: "lease_lost" in paused.log(), LEASE + 30, interval=0.2,
               what="the resumed worker's late write to be refused")
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.result == {"written": 300}
    assert DemoOrder.objects.filter(batch="paused").count() == 300
    assert violations(tasks=Task.objects.filter(pk=task.pk)) == []


def test_a_delivery_killed_by_the_django_q2_timeout_resumes_from_its_checkpoint(owner):
    """PILOT_TASK_TIMEOUT is django-q2's `timeout`: a delivery running longer has its
    worker process killed by the cluster. Four steps of 1 s under a 3 s timeout: the
    first delivery gets two or three steps done before the kill, the lease runs out, the
    dispatcher recovers the task, and the next attempt resumes after the last
    checkpoint — the task succeeds, no checkpointed step runs again."""
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_DISPATCHER_POLL_SECONDS=POLL,
                  PILOT_TASK_TIMEOUT=3)
    try:
        fleet.dispatcher()
        workers = fleet.workers()
        task = task_trigger(owner=owner, key="timed-out", workflow="demo.slow",
                            payload={"steps": 4, "seconds": 1}).task
        wait_until(finished([task.pk]), 90, interval=0.2, what="the timed-out task")
        task.refresh_from_db()
        assert task.state == S.SUCCEEDED and task.result == {"completed_steps": 4}
        recovers = TaskTransition.objects.filter(task_id=task.pk, transition="recover")
        assert task.attempts >= 2 and recovers.count() == task.attempts - 1
        attempts = dict(StepCheckpoint.objects.filter(task_id=task.pk)
                        .values_list("name", "attempts"))
        assert attempts["s0"] == 1  # done before the first kill, never again
        assert sum(attempts.values()) <= 4 + (task.attempts - 1)  # one redo per kill at most
        assert violations(tasks=Task.objects.filter(pk=task.pk)) == []
        log = workers.log()  # the cluster's own doing, not a crash of ours
        assert "Task exceeded maximum timeout value (3 seconds)" in log
        assert log.count("after timeout") >= task.attempts - 1  # worker reincarnated
    finally:
        fleet.stop_all()
