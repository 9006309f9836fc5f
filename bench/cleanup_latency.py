"""How long `cleanup_tasks` takes for N expired tasks, and what it does to the
latency of triggers that run at the same time (issue 6, "Measure").

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pilot_bench \\
        .venv/bin/python bench/cleanup_latency.py [--tasks 100000] [--threads 4]

Uses its own database (created if missing, migrated, emptied first; the name
in DATABASE_URL must contain "bench"). Three phases, bounded in time and calls:

1. N expired finished tasks (each with a step, two transitions and a replay
   row, as real runs leave them) are bulk-inserted; `manage.py cleanup_tasks`
   runs alone as a subprocess and is timed.
2. Baseline: THREADS threads call `task_trigger` (new keys, each on its own
   connection) for --baseline-seconds; per-call latency is recorded.
3. N expired tasks again; the same trigger load runs while `cleanup_tasks`
   runs as a subprocess; latency during the cleanup, and the cleanup's time
   under load, are recorded.

Prints medians and p99s and the ratios between phases 2 and 3, and writes
bench/out/cleanup_latency.json. Absolute numbers depend on the machine; the
ratios are the point.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-secret-key-" + "x" * 40)
os.environ.setdefault("PILOT_LOG_LEVEL", "warning")
os.environ.setdefault("PILOT_Q_CLUSTER_NAME", "pilot-bench")
os.environ.setdefault("PILOT_DEMO_WORKFLOWS", "true")  # the load triggers demo.echo

MAX_CALLS_PER_THREAD = 50_000


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    if "bench" not in name:
        sys.exit(f"refusing to use database {name!r}: its name must contain 'bench'")
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def standalone_database() -> None:
    """The standalone benches' database: DATABASE_URL, a PostgreSQL database whose
    name contains "bench", created if missing; Django set up; migrated."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        sys.exit("set DATABASE_URL to a PostgreSQL database whose name contains 'bench'")
    ensure_database(url)

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(latencies: list[float]) -> dict:
    ms = [v * 1000 for v in latencies]
    return {"calls": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(percentile(ms, 0.99), 2), "max_ms": round(max(ms), 2)}


def trigger_load(owner, threads: int, stop: threading.Event, prefix: str) -> list[float]:
    """THREADS threads triggering demo.echo with fresh keys until `stop` is set."""
    from django.db import connections

    from workflows.engine.triggers import task_trigger

    results: list[list[float]] = [[] for _ in range(threads)]

    def body(i: int):
        try:
            for n in range(MAX_CALLS_PER_THREAD):
                if stop.is_set():
                    break
                started = time.perf_counter()
                task_trigger(owner=owner, key=f"{prefix}-{i}-{n}", workflow="demo.echo",
                             payload={"n": n})
                results[i].append(time.perf_counter() - started)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    return workers, results


def run_cleanup() -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "manage.py", "cleanup_tasks", "-v0"], cwd=ROOT,
                          env={**os.environ, "PILOT_LOG_LEVEL": "warning"},
                          capture_output=True, text=True, timeout=1800, check=True)
    return time.perf_counter() - started, done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--baseline-seconds", type=float, default=15.0)
    args = parser.parse_args()
    standalone_database()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from tests.factories import make_finished_tasks
    from workflows.engine.enqueue import broker, uses_orm_broker
    from workflows.models import Task

    call_command("createcachetable", verbosity=0)
    call_command("cleanup_tasks", "--older-than", "0s", verbosity=0, stdout=io.StringIO())
    Task.objects.all().delete()
    owner, _ = get_user_model().objects.get_or_create(username="bench")
    report: dict = {"tasks": args.tasks, "threads": args.threads,
                    "broker": "orm" if uses_orm_broker() else "redis"}

    def fill(tag: str) -> float:
        started = time.perf_counter()
        make_finished_tasks(owner, args.tasks, key_prefix=f"{tag}-{uuid.uuid4().hex[:6]}")
        return time.perf_counter() - started

    # 1. cleanup alone
    report["insert_seconds"] = round(fill("alone"), 1)
    seconds, line = run_cleanup()
    report["cleanup_alone_seconds"] = round(seconds, 2)
    report["cleanup_alone_output"] = line
    print(f"cleanup_tasks alone, {args.tasks} expired tasks: {seconds:.1f}s  ({line})")

    # 2. trigger latency without cleanup
    stop = threading.Event()
    workers, results = trigger_load(owner, args.threads, stop, "base")
    time.sleep(args.baseline_seconds)
    stop.set()
    for w in workers:
        w.join()
    baseline = summary([v for r in results for v in r])
    baseline["per_second"] = round(baseline["calls"] / args.baseline_seconds, 1)
    report["triggers_without_cleanup"] = baseline
    print(f"triggers without cleanup: {baseline}")

    # 3. trigger latency during cleanup
    fill("loaded")
    stop = threading.Event()
    workers, results = trigger_load(owner, args.threads, stop, "during")
    seconds, line = run_cleanup()
    stop.set()
    for w in workers:
        w.join()
    during = summary([v for r in results for v in r])
    during["per_second"] = round(during["calls"] / seconds, 1)
    report["cleanup_under_load_seconds"] = round(seconds, 2)
    report["triggers_during_cleanup"] = during
    report["ratio_p50"] = round(during["p50_ms"] / baseline["p50_ms"], 2)
    report["ratio_p99"] = round(during["p99_ms"] / baseline["p99_ms"], 2)
    print(f"cleanup_tasks under trigger load: {seconds:.1f}s  ({line})")
    print(f"triggers during cleanup: {during}")
    print(f"latency ratio during/without cleanup: p50 x{report['ratio_p50']}, "
          f"p99 x{report['ratio_p99']}")

    # leave nothing queued behind
    if not uses_orm_broker():
        broker().connection.delete(broker().list_key)
    Task.objects.all().delete()
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cleanup_latency.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
