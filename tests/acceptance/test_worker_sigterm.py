"""SIGTERM to a worker with tasks running, on real processes (docs/operations.md,
"Stopping a deployment: the same bound"): `run_workers` — PILOT's qcluster, as
deployed — lets the running deliveries go on for PILOT_STOP_SECONDS, then ends the
cluster with SIGKILL. A task that finishes in that grace is done once; one that
does not resumes from its last checkpoint on the next workers once its lease
expires, its lost attempt counted. Either way no checkpointed step runs again, and
every process of the cluster is gone within the bound.

(A delivery killed by django-q2's own `timeout` is
tests/faults/test_worker_faults.py::test_a_delivery_killed_by_the_django_q2_timeout_resumes_from_its_checkpoint.)"""

import os
import signal
import time

import pytest

from tests.faults.invariants import violations
from tests.support.procs import Fleet, wait_until
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition
from workflows.processes import descendants
from workflows.rules.states import FINISHED_STATES
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASE, POLL, GRACE = 3.0, 0.2, 3.0


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            args = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid}: gone"
    return f"{pid}: {args}"


def in_step(task, name):
    return lambda: StepCheckpoint.objects.filter(task_id=task.pk, name=name,
                                                 state="running").exists()


def steps(task) -> dict:
    return dict(StepCheckpoint.objects.filter(task_id=task.pk).values_list("name", "attempts"))


def test_sigterm_lets_running_work_finish_or_resume_and_stops_within_the_bound(owner):
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_DISPATCHER_POLL_SECONDS=POLL,
                  PILOT_STOP_SECONDS=GRACE, PILOT_Q_WORKERS=2)
    try:
        fleet.dispatcher()
        workers = fleet.start("run_workers")
        # Two deliveries at once: `short` has ~1 s left of its last step when the signal
        # comes (it ends inside the grace), `long` ~6 s of its first (it cannot). (A step
        # that ends inside the grace with more to come releases its task instead:
        # tests/local/test_stop.py, tests/engine/test_shutdown.py.)
        short = task_trigger(owner=owner, key="short", workflow="demo.slow",
                             payload={"steps": 2, "seconds": 1}).task
        long = task_trigger(owner=owner, key="long", workflow="demo.slow",
                            payload={"steps": 2, "seconds": 6}).task
        wait_until(lambda: in_step(short, "s1")() and in_step(long, "s0")(), 60,
                   interval=0.02, what="both tasks running")
        cluster = [workers.popen.pid, *descendants(workers.popen.pid)]
        # run_workers' main process alone, as systemd's KillMode=mixed signals it.
        os.kill(workers.popen.pid, signal.SIGTERM)
        sent = time.monotonic()
        # The cluster is gone at the grace (a second for run_workers' 0.2 s watch and
        # the kill), and run_workers within the 10 s every PILOT process promises.
        try:
            wait_until(lambda: not any(alive(pid) for pid in cluster[1:]), GRACE + 1,
                       interval=0.05, what="every process of the cluster to exit")
            cluster_gone = time.monotonic() - sent
            wait_until(lambda: workers.popen.poll() is not None, 10 - cluster_gone,
                       interval=0.05, what="run_workers to exit")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; still running: {[describe(p) for p in cluster if alive(p)]}\n"
                f"{workers.log()[-3000:]}") from None
        print(f"\nSIGTERM -> cluster gone {cluster_gone:.2f} s, "
              f"run_workers exited {time.monotonic() - sent:.2f} s")
        assert workers.popen.returncode == 0, workers.log()[-3000:]
        # The bound was kept by ending the cluster while `long` ran: its worker was
        # SIGKILLed, not waited for.
        assert f"workers had not stopped after {GRACE:g} s: ended them (SIGKILL)" in workers.log()

        # `short` finished inside the grace, once.
        short.refresh_from_db()
        assert (short.state, short.attempts) == (S.SUCCEEDED, 1)
        assert steps(short) == {"s0": 1, "s1": 1}
        # `long` was cut short: what it had checkpointed then must not run again.
        checkpointed = {name for name, state in StepCheckpoint.objects.filter(
            task_id=long.pk).values_list("name", "state") if state == "succeeded"}

        fleet.workers()  # the next workers
        wait_until(lambda: Task.objects.get(pk=long.pk).state in FINISHED_STATES, 60,
                   interval=0.2, what="the interrupted task to finish")
        long.refresh_from_db()
        assert (long.state, long.result) == (S.SUCCEEDED, {"completed_steps": 2})
        # Recovered as a lost worker, the attempt counted; what was checkpointed before
        # the kill did not run again, only the step the kill cut short did.
        assert long.attempts == 2
        assert TaskTransition.objects.filter(task_id=long.pk, transition="recover").count() == 1
        attempts = steps(long)
        assert all(attempts[name] == 1 for name in checkpointed), (checkpointed, attempts)
        assert attempts == {"s0": 2, "s1": 1}, attempts
        assert violations(tasks=Task.objects.filter(pk__in=[short.pk, long.pk])) == []
    finally:
        fleet.stop_all()
