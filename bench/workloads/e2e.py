"""End to end: N runs from trigger to all finished, on a real `qcluster`.

    python -m bench.workloads.e2e --system pilot|raw --runs 2000 --workers 2
                                  [--pace PER_SECOND] [--profile FILE]

`pilot`: N runs of `test.noop3` (three checkpointed no-op steps) triggered
through the engine in batches of 1000 (what POST /tasks/batch calls), a qcluster
with W workers and `run_dispatcher`. `raw`: the same qcluster settings and
broker running `bench.ceiling.rawq.write3`, three rows per run, enqueued with
django-q2's `async_task`. The broker is whatever the environment says
(REDIS_URL set: Redis; else the ORM broker on the bench database).

Both first run one warm-up task (so start-up is not timed), then time from the
first trigger to the last run's final write, read from the database. Reported:
runs/s, peak RSS of every process, queue lag (trigger to first step start),
database transactions, rows and WAL bytes written per run, what the workers'
messages returned, and how many messages the dispatcher sent again for
pending tasks (none is lost here, so each was a duplicate).

`--pace R` triggers one run at a time at R per second instead of all at once:
the queue lag of an unloaded system rather than of a 2000-run backlog.
`--profile FILE` samples the whole cluster with py-spy (bench/.venv) into FILE
(collapsed stacks); that run is for the profile, not for the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid

from bench.common import BENCH_PY, OUT, PILOT_PY, Proc, RssSampler, emit_result, percentile
from bench.common import log as say
from bench.workloads import pilotdb

BATCH = 1000
RUN_TIMEOUT = 600


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=["pilot", "raw", "rawdefault"], required=True)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--profile")
    args = parser.parse_args()

    pilotdb.setup()
    from django.conf import settings

    # This process only triggers and watches; the workers log as in production.
    logging.getLogger("pilot.events").setLevel(logging.WARNING)

    pilotdb.reset()
    broker = "redis" if settings.REDIS_URL else "orm"
    tag = f"{args.system}-{uuid.uuid4().hex[:8]}"
    probe_dir = OUT / "probe" / tag
    probe_dir.mkdir(parents=True)
    system = Pilot() if args.system == "pilot" else Raw()

    env = dict(os.environ, PILOT_Q_WORKERS=str(args.workers), BENCH_PROBE_DIR=str(probe_dir))
    procs = {"qcluster": Proc(f"{tag}-qcluster", [PILOT_PY, "manage.py", "qcluster"], env)}
    if args.system == "pilot":
        procs["dispatcher"] = Proc(f"{tag}-dispatcher", [PILOT_PY, "manage.py", "run_dispatcher"],
                                   env)
    for proc in procs.values():
        proc.start()
    sampler = RssSampler(procs)
    sampler.start()
    profiler = None
    try:
        system.trigger([f"{tag}-w-0"])
        system.wait(f"{tag}-w-", 1, procs, timeout=120)
        counters_before = pilotdb.db_counters()
        if args.profile:
            profiler = _profiler_start(procs["qcluster"].pid, args.profile)
        prefix = f"{tag}-r-"
        keys = [f"{prefix}{i}" for i in range(args.runs)]
        t0 = time.time()
        if args.pace:
            for i, key in enumerate(keys):
                time.sleep(max(0.0, t0 + i / args.pace - time.time()))
                system.trigger([key])
        else:
            for start in range(0, len(keys), BATCH):
                system.trigger(keys[start:start + BATCH])
        t_end = system.wait(prefix, len(keys), procs, timeout=RUN_TIMEOUT)
    finally:
        if profiler:
            _profiler_stop(profiler)
        for proc in procs.values():
            proc.stop()
        peaks = sampler.stop()
    time.sleep(0.5)  # the stopped sessions' statistics reach pg_stat_database
    counters = {k: v - counters_before[k] for k, v in pilotdb.db_counters().items()}
    seconds = t_end - t0
    lags = system.queue_lags(prefix)
    emit_result({
        "system": args.system, "broker": broker, "workers": args.workers, "runs": args.runs,
        "paced": args.pace or None, "seconds": round(seconds, 3),
        "runs_per_s": round(args.runs / seconds, 2),
        "lag_p50_ms": _ms(percentile(lags, 50)), "lag_p99_ms": _ms(percentile(lags, 99)),
        "per_run": {k: round(v / args.runs, 2) for k, v in counters.items()},
        "rss": _rss_report(peaks, probe_dir),
        "deliveries": _deliveries(probe_dir),
        "extra_messages": _resent(procs.get("dispatcher")),
    })
    shutil.rmtree(probe_dir, ignore_errors=True)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class Pilot:
    """PILOT: trigger through the engine, done when every task succeeded."""

    def __init__(self):
        self.owner = pilotdb.owner()

    def trigger(self, keys: list[str]) -> None:
        from workflows.engine.triggers import TriggerRequest, task_trigger_many

        outcomes = task_trigger_many(owner=self.owner, requests=[
            TriggerRequest("test.noop3", {"run": key}, key) for key in keys])
        bad = [o for o in outcomes if getattr(o, "outcome", None) != "created"]
        if bad:
            raise RuntimeError(f"trigger refused: {bad[:3]}")

    def wait(self, prefix: str, n: int, procs: dict, timeout: float) -> float:
        """Block until the n tasks keyed `prefix…` succeeded; return the last finished_at."""
        from django.db.models import Count, Max, Q

        from workflows.models import Task

        deadline = time.monotonic() + timeout
        tasks = Task.objects.filter(idempotency_key__startswith=prefix)
        while True:
            _check_alive(procs)
            row = tasks.aggregate(done=Count("pk", filter=Q(state="succeeded")),
                                  bad=Count("pk", filter=Q(state__in=["failed", "cancelled"])),
                                  last=Max("finished_at"))
            if row["bad"]:
                raise RuntimeError(f"{row['bad']} task(s) failed; see bench/out/logs")
            if row["done"] >= n:
                return row["last"].timestamp()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{row['done']}/{n} runs done after {timeout}s")
            time.sleep(0.2)

    def queue_lags(self, prefix: str) -> list[float]:
        """Per run: from the task's creation to its first step's start."""
        from workflows.models import StepCheckpoint

        rows = StepCheckpoint.objects.filter(
            index=0, task__idempotency_key__startswith=prefix).values_list(
            "started_at", "task__created_at")
        return [(started - created).total_seconds() for started, created in rows]


class Raw:
    """Raw django-q2: async_task per run, done when every run wrote its 3 rows."""

    def __init__(self):
        self.enqueued: dict[str, float] = {}

    def trigger(self, keys: list[str]) -> None:
        from django_q.tasks import async_task

        for key in keys:
            self.enqueued[key] = time.time()
            async_task("bench.ceiling.rawq.write3", key)

    def wait(self, prefix: str, n: int, procs: dict, timeout: float) -> float:
        from django.db.models import Count, Max

        from bench.ceiling.models import BareStep

        rows = BareStep.objects.filter(run__startswith=prefix)
        deadline = time.monotonic() + timeout
        while True:
            _check_alive(procs)
            row = rows.aggregate(n=Count("pk"), last=Max("finished_at"))
            if row["n"] >= 3 * n:
                return row["last"].timestamp()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{row['n'] // 3}/{n} runs done after {timeout}s")
            time.sleep(0.2)

    def queue_lags(self, prefix: str) -> list[float]:
        from bench.ceiling.models import BareStep

        firsts = BareStep.objects.filter(index=0, run__startswith=prefix).values_list(
            "run", "started_at")
        return [started.timestamp() - self.enqueued[run] for run, started in firsts]


def _check_alive(procs: dict) -> None:
    """Fail at once, not at the timeout, when qcluster or the dispatcher died."""
    for name, proc in procs.items():
        if not proc.alive:
            raise RuntimeError(f"{name} exited; see {proc.log_path}")


def _rss_report(peaks: dict, probe_dir) -> dict:
    """Peak RSS (MB): the largest worker, the largest other cluster process, and
    each auxiliary process kind."""
    workers = {int(p.name.split("-")[1]) for p in probe_dir.glob("worker-*")}
    report: dict = {}
    for pid, (label, mb) in peaks.items():
        kind = "worker" if pid in workers else label
        report[kind] = round(max(report.get(kind, 0.0), mb), 1)
    report["workers_seen"] = len(workers)
    return report


def _resent(dispatcher) -> int | None:
    """Messages the dispatcher sent again for pending tasks (its
    `dispatcher_action` events, action `reenqueued`), from its log."""
    if dispatcher is None:
        return None
    total = 0
    for line in dispatcher.log_path.read_text(errors="replace").splitlines():
        if '"dispatcher_action"' in line and '"reenqueued"' in line:
            try:
                total += json.loads(line[line.index("{"):]).get("count", 0)
            except ValueError:
                continue
    return total


def _deliveries(probe_dir) -> dict:
    total: dict = {}
    for path in probe_dir.glob("monitor-*.json"):
        for outcome, n in json.loads(path.read_text()).items():
            total[outcome] = total.get(outcome, 0) + n
    return total


def _profiler_start(pid: int, path: str) -> subprocess.Popen:
    spy = BENCH_PY.parent / "py-spy"
    say(f"profiling qcluster {pid} with py-spy into {path}")
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--subprocesses", "--idle",
                             "--nonblocking", "--rate", "100", "--format", "raw",
                             "--function", "--output", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(1.0)  # py-spy attaches to every process of the cluster
    return proc


def _profiler_stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
