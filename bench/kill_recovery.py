"""How long PILOT takes to recover work from a worker group SIGKILLed mid-run, on
the database's clock: the figure tests/faults/test_worker_faults.py used to assert
(issue 18, item 12: timing is a benchmark figure, the test asserts behaviour).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pilot_bench \\
    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/kill_recovery.py [--kills 5]

Real `qcluster` and `run_dispatcher` processes (tests/support/procs.py) on the database
named by DATABASE_URL (migrated; its tasks are left for inspection under the
user `bench-kill-recovery`). Lease 3 s, dispatcher poll 0.2 s, as in the fault test.
For each kill: four `demo.slow` runs, wait until the group holds one, note the
database's `now()`, SIGKILL the whole group, start a fresh one. Prints, per kill,
seconds from the kill to each interrupted task's `recover` and to its next `claim`
(both audit rows' `at`, the database's time). The design's bound for the first is
lease + poll (docs/design.md, "Dispatcher"): a lease lasts until its last
heartbeat + PILOT_LEASE_SECONDS, and the dispatcher looks every poll interval.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

LEASE, POLL = 3.0, 0.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("DATABASE_URL must name a PostgreSQL database")

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from tests.support.procs import Fleet, group_pids, wait_until
    from workflows.engine.store import store
    from workflows.engine.triggers import TriggerRequest, task_trigger_many
    from workflows.models import Task, TaskTransition
    from workflows.rules.states import TaskState as S

    call_command("migrate", verbosity=0)
    owner, _ = get_user_model().objects.get_or_create(username="bench-kill-recovery")
    fleet = Fleet(PILOT_LEASE_SECONDS=LEASE, PILOT_DISPATCHER_POLL_SECONDS=POLL)
    to_recover, to_reclaim = [], []
    try:
        fleet.dispatcher()
        workers = fleet.workers()
        for n in range(1, args.kills + 1):
            ids = [r.task.pk for r in task_trigger_many(owner=owner, requests=[
                TriggerRequest("demo.slow", {"steps": 3, "seconds": 0.5}, uuid.uuid4().hex)
                for _ in range(4)])]
            group = workers.popen.pid
            running = wait_until(lambda ids=ids, group=group: list(Task.objects.filter(
                pk__in=ids, state=S.RUNNING, lease_owner__in=[
                    f"{socket.gethostname()}:{pid}" for pid in group_pids(group)])
                .values_list("pk", flat=True)), 60, interval=0.01,
                what="work running under the group")
            killed_at = store().db_now()
            workers.kill()
            workers = fleet.workers()
            wait_until(lambda ids=ids: not Task.objects.filter(pk__in=ids).exclude(
                state=S.SUCCEEDED).exists(), 120, interval=0.2, what="the runs to finish")
            this_kill = []
            for pk in running:
                rows = TaskTransition.objects.filter(task_id=pk, at__gt=killed_at)
                recover = rows.filter(transition="recover").order_by("id").first()
                if recover is None:  # it committed its end in the instant before the kill
                    continue
                claim = rows.filter(transition="claim", id__gt=recover.id).order_by("id").first()
                this_kill.append((recover.at - killed_at).total_seconds())
                to_reclaim.append((claim.at - killed_at).total_seconds())
            to_recover += this_kill
            print(f"kill {n}: {len(running)} running, {len(this_kill)} interrupted; "
                  f"recovered after {[round(s, 2) for s in this_kill]} s")
    finally:
        fleet.stop_all()
    if not to_recover:
        sys.exit("no kill interrupted anything")
    print(f"\n{args.kills} SIGKILLs, {len(to_recover)} interrupted tasks; lease {LEASE:g} s, "
          f"poll {POLL:g} s (bound for recovery: {LEASE + POLL:g} s + a heartbeat)")
    for name, values in (("kill -> recover", to_recover), ("kill -> claimed again", to_reclaim)):
        print(f"  {name:22} median {statistics.median(values):5.2f} s   "
              f"max {max(values):5.2f} s")


if __name__ == "__main__":
    main()
