"""Waiting (docs/waiting.md): what a parked task costs, how soon a signal
moves it on, how late a timer wakes — on a real `qcluster`, `run_dispatcher`
and gunicorn.

    python -m bench.workloads.waiting --runs 1000 --parked 500 --signals 100 --timers 200

1. Short runs alone, then beside parked tasks: `--runs` runs of `test.noop3`
   (three no-op steps) on the cluster's workers, timed from the first trigger
   to the last finish; then `--parked` runs of `demo.approval` are triggered
   and left parked at their signal wait (an hour's timeout), and the same
   number of short runs is timed again. A parked task holds no worker, so
   the second rate is the first (the ratio is the figure).
2. Signal to next step: `--signals` of the parked tasks are signalled over
   HTTP (`POST /api/v1/tasks/{id}/signals/decision`, one at a time, 20 a
   second): from the 202 to the start of the step after the wait (`apply`).
3. Timer lateness: `--timers` runs of `demo.timer` whose timers fall due
   spread over a few seconds: from each timer's due time (the wait step's
   recorded `until`) to its `wake`, and to the next step's start.

Every time is the database's clock but the 202's, which is this process's —
the same machine's clock. Needs PILOT_DEMO_WORKFLOWS=true (bench/run.py sets it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import urllib.request
import uuid
from datetime import datetime

from bench.common import PILOT_PY, Proc, emit_result, percentile
from bench.common import log as say
from bench.workloads import pilotdb
from bench.workloads.load import Server

TIMEOUT = 300


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--parked", type=int, default=500)
    parser.add_argument("--signals", type=int, default=100)
    parser.add_argument("--timers", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.signals > args.parked:
        raise SystemExit("--signals must be at most --parked (it signals parked tasks)")

    pilotdb.setup()
    from workflows.conf import pilot_settings

    broker, tag, procs = start_cluster("wait", args.workers)
    try:
        with Server(dict(os.environ), name=f"{tag}-gunicorn", workers=1) as server:
            trigger(f"{tag}-warm", "test.noop3", 1)
            finished(f"{tag}-warm", 1, procs)
            alone = short_runs(f"{tag}-alone", args.runs, procs)
            say(f"  {args.runs} short runs alone: {alone:.0f} runs/s")
            park(f"{tag}-parked", args.parked, procs)
            beside = short_runs(f"{tag}-beside", args.runs, procs)
            say(f"  {args.runs} short runs beside {args.parked} parked: {beside:.0f} runs/s")
            signal_ms = signals(server, f"{tag}-parked", args.signals, procs)
            wake_ms, next_ms = timers(f"{tag}-timer", args.timers, procs)
    finally:
        for proc in procs:
            proc.stop(timeout=5)
    emit_result({
        "broker": broker, "workers": args.workers, "runs": args.runs, "parked": args.parked,
        "alone_runs_per_s": round(alone, 1), "beside_parked_runs_per_s": round(beside, 1),
        "signals": args.signals, "signal_to_next_step_p50_ms": _p(signal_ms, 50),
        "signal_to_next_step_p99_ms": _p(signal_ms, 99),
        "timers": args.timers, "timer_wake_late_p50_ms": _p(wake_ms, 50),
        "timer_wake_late_p99_ms": _p(wake_ms, 99),
        "timer_next_step_late_p50_ms": _p(next_ms, 50),
        "timer_next_step_late_p99_ms": _p(next_ms, 99),
        "dispatcher_poll_s": pilot_settings.PILOT_DISPATCHER_POLL_SECONDS,
    })


def start_cluster(kind: str, workers: int) -> tuple[str, str, list[Proc]]:
    """On an emptied bench database: a qcluster of `workers` and a dispatcher,
    started; (broker, a tag naming this run's processes, the processes)."""
    from django.conf import settings

    logging.getLogger("pilot.events").setLevel(logging.WARNING)
    pilotdb.reset()
    broker = "redis" if settings.REDIS_URL else "orm"
    tag = f"{kind}-{broker}-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PILOT_Q_WORKERS=str(workers))
    procs = [Proc(f"{tag}-qcluster", [PILOT_PY, "manage.py", "qcluster"], env),
             Proc(f"{tag}-dispatcher", [PILOT_PY, "manage.py", "run_dispatcher"], env)]
    for proc in procs:
        proc.start()
    return broker, tag, procs


def _p(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value, 1)


def trigger(prefix: str, workflow: str, n: int, payload=lambda i: {}) -> None:
    from workflows.engine.triggers import TriggerRequest, task_trigger_many

    owner = pilotdb.owner()
    for start in range(0, n, 1000):
        outcomes = task_trigger_many(owner=owner, requests=[
            TriggerRequest(workflow, {"run": i} | payload(i) if workflow == "test.noop3"
                           else payload(i), f"{prefix}-{i}")
            for i in range(start, min(n, start + 1000))])
        bad = [o for o in outcomes if getattr(o, "outcome", None) != "created"]
        if bad:
            raise RuntimeError(f"trigger refused: {bad[:3]}")


def _until(condition, procs, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        for proc in procs:
            if not proc.alive:
                raise RuntimeError(f"{proc.name} died; see {proc.log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {TIMEOUT}s")
        time.sleep(0.05)


def finished(prefix: str, n: int, procs) -> float:
    """Wait until the n tasks keyed `prefix-…` succeeded; the last finish (epoch s)."""
    from django.db.models import Max

    from workflows.models import Task

    tasks = Task.objects.filter(idempotency_key__startswith=f"{prefix}-")
    _until(lambda: tasks.filter(state="succeeded").count() >= n, procs,
           f"{prefix}: not all {n} succeeded")
    if tasks.filter(state__in=["failed", "cancelled"]).exists():
        raise RuntimeError(f"{prefix}: some tasks failed; see bench/out/logs")
    return tasks.aggregate(m=Max("finished_at"))["m"].timestamp()


def short_runs(prefix: str, n: int, procs) -> float:
    t0 = time.time()
    trigger(prefix, "test.noop3", n)
    return n / (finished(prefix, n, procs) - t0)


def park(prefix: str, n: int, procs) -> None:
    from workflows.models import Task

    trigger(prefix, "demo.approval", n, payload=lambda i: {"timeout_seconds": 3600})
    tasks = Task.objects.filter(idempotency_key__startswith=f"{prefix}-")
    _until(lambda: tasks.filter(state="waiting").count() >= n, procs,
           f"{prefix}: not all {n} parked")
    held = tasks.exclude(lease_owner="").count()
    if held:
        raise RuntimeError(f"{held} parked task(s) hold a lease")


def signals(server: Server, prefix: str, n: int, procs) -> list[float]:
    """Signal n parked tasks, 20 a second; per task, ms from its 202 to `apply`'s start."""
    from workflows.models import StepCheckpoint, Task

    token = pilotdb.token()
    ids = list(Task.objects.filter(idempotency_key__startswith=f"{prefix}-", state="waiting")
               .order_by("created_at").values_list("pk", flat=True)[:n])
    answered: dict[str, float] = {}
    for task_id in ids:
        started = time.monotonic()
        request = urllib.request.Request(
            f"{server.url}/api/v1/tasks/{task_id}/signals/decision",
            data=json.dumps({"payload": {"approved": True}}).encode(), method="POST",
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json",
                     "Idempotency-Key": f"bench-{task_id}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 202:
                raise RuntimeError(f"signal answered {response.status}")
            answered[str(task_id)] = time.time()
        time.sleep(max(0.0, 0.05 - (time.monotonic() - started)))
    steps = StepCheckpoint.objects.filter(task_id__in=ids, name="apply")
    _until(lambda: steps.filter(state="succeeded").count() >= len(ids), procs,
           f"{prefix}: not every signalled task ran apply")
    return [(started.timestamp() - answered[str(task_id)]) * 1000
            for task_id, started in steps.values_list("task_id", "started_at")]


def timers(prefix: str, n: int, procs) -> tuple[list[float], list[float]]:
    """n timers due over ~4 s from ~2 s on; per timer, ms from its due time to
    its wake, and to its next step's start."""
    from workflows.models import StepCheckpoint, Task, TaskTransition

    trigger(prefix, "demo.timer", n, payload=lambda i: {"seconds": 2 + 4 * i / max(1, n)})
    ids = list(Task.objects.filter(idempotency_key__startswith=f"{prefix}-")
               .values_list("pk", flat=True))
    finished(prefix, n, procs)
    due = {task_id: datetime.fromisoformat(output["until"]) for task_id, output in
           StepCheckpoint.objects.filter(task_id__in=ids, name="wait")
           .values_list("task_id", "output")}
    woke = dict(TaskTransition.objects.filter(task_id__in=ids, transition="wake")
                .values_list("task_id", "at"))
    after = dict(StepCheckpoint.objects.filter(task_id__in=ids, name="after")
                 .values_list("task_id", "started_at"))
    if len(woke) != n or len(due) != n:
        raise RuntimeError(f"{len(woke)} wakes and {len(due)} recorded timers for {n} timers")
    return ([(woke[t] - due[t]).total_seconds() * 1000 for t in ids],
            [(after[t] - due[t]).total_seconds() * 1000 for t in ids])


if __name__ == "__main__":
    main()
