"""PILOT with a day of retained history (issue 34): one size per process.

    python -m bench.workloads.scale --tasks 1000000 [--reps 7]

Recreates its own database (BENCH_SCALE_DB, default pilot_bench_scale), migrates
it, fills it with the scale study's generator (tests/support/history.py:
`--tasks` tasks, 3 steps and 4 transitions each, 10 % expired, an active set of
3 000) ending now, then measures in this process, with production settings
(bench.settings: DEBUG off), the ORM broker and the database cache, and
`PILOT_METRICS_TASKS_TTL=0` so every scrape reads the database:

- trigger p50/p99 (`task_trigger`, in process): new keys, then replays of
  succeeded demo.echo tasks spread over the history;
- claim p50/p99 (`PostgresStore.claim_next`, the worker's call) over the 2 000
  due tasks;
- the console (Django's test client, signed in as a superuser): task list
  default, key search, failed + demo.saga, page 100 (the keyset position of
  row 4 951), the dashboard, Workers & queue; `--reps` renders after one
  warm-up (3 when the warm-up took over 2 s), the median;
- /metrics, the same way;
- the dispatcher's activity fold (engine/activity.py) of the day, first, as it
  would have folded it, then one pass once caught up;
- baseline, in the same run: Django's own admin list of users;
- `cleanup_tasks` (its defaults) over the expired 10 % while another process
  triggers `--load-rate` new keys a second: tasks/s, and that load's trigger
  p50/p99 in the 10 s before against while the cleanup ran;
- what that churn left: per hot table heap and index bytes, live and dead
  tuples, pgstattuple_approx's dead and free share, after the fill, after the
  churn and after a timed VACUUM (ANALYZE).

Emits one JSON result (bench.common.emit_result); bench/scale.py runs it per
size and writes the section of bench/results.md. Drops its database at the end
unless --keep.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from datetime import timedelta

from bench.common import OUT, db_url, emit_result
from bench.common import log as say

DB_NAME = os.environ.get("BENCH_SCALE_DB", "pilot_bench_scale")


def percentiles(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
            "n": len(ordered)}


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def triggers(owners, n: int, tasks: int) -> dict:
    from workflows.engine.triggers import task_trigger
    from workflows.models import Task

    def new(i):
        outcome = task_trigger(owner=owners[i % len(owners)], key=f"bench-new-{i}",
                               workflow="demo.echo", payload={"i": i})
        assert outcome.outcome == "created", outcome.outcome

    for i in range(20):
        new(-1 - i)
    created = [timed(lambda i=i: new(i)) for i in range(n)]
    # Replays: succeeded, unexpired demo.echo tasks spread evenly over the history
    # (keys ord-<i>; the unexpired ones are i > tasks / 10).
    first, last = tasks // 10 + 1, tasks - 3000
    keys = [f"ord-{i:09d}" for i in range(first, last, max(1, (last - first) // (8 * n)))]
    olds = list(Task.objects.filter(idempotency_key__in=keys, state="succeeded",
                                    workflow="demo.echo")
                .select_related("owner").only("idempotency_key", "payload", "owner")[:n])
    assert len(olds) == n, len(olds)

    def replay(task):
        outcome = task_trigger(owner=task.owner, key=task.idempotency_key,
                               workflow="demo.echo", payload=task.payload)
        assert outcome.outcome == "replayed", outcome.outcome

    replayed = [timed(lambda t=t: replay(t)) for t in olds]
    return {"new": percentiles(created), "replay": percentiles(replayed)}


def claims(n: int) -> dict:
    from workflows.engine.store.postgres import PostgresStore

    store = PostgresStore()
    times = []
    for i in range(n + 20):
        started = time.perf_counter()
        claimed = store.claim_next(worker=f"bench-scale:{i % 4}", lease=timedelta(minutes=5))
        elapsed = (time.perf_counter() - started) * 1000
        assert claimed is not None, "no due task left to claim"
        if i >= 20:
            times.append(elapsed)
    return percentiles(times)


def page(client, url: str, reps: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    warm = timed(lambda: client.get(url))
    if warm > 2000:
        reps = 3
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    return {"url": url, "median_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1), "queries": len(queries)}


def trigger_load(rate: float) -> None:
    """`--trigger-load RATE`: trigger new demo.echo keys at a fixed RATE per
    second (a schedule, not as fast as it can: a web tier's traffic) until
    SIGTERM, then emit each trigger's wall-clock start and milliseconds."""
    import signal

    from django.contrib.auth import get_user_model

    from workflows.engine.triggers import task_trigger

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    owners = list(get_user_model().objects.filter(username__startswith="scale-client-"))
    samples, i, started = [], 0, time.monotonic()
    while not stop:
        due = started + i / rate
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        at = time.time()
        outcome = task_trigger(owner=owners[i % len(owners)], key=f"bench-load-{os.getpid()}-{i}",
                               workflow="demo.echo", payload={"i": i})
        samples.append((at, (time.time() - at) * 1000))
        assert outcome.outcome == "created", outcome.outcome
        i += 1
    emit_result({"samples": samples})


def cleanup(argv: list[str], rate: float, baseline_s: float) -> dict:
    """`cleanup_tasks` (its defaults) over the expired 10 %, with a trigger load
    of `rate`/s running beside it in its own process (its own connection, as a
    web worker): tasks/s, and the load's p99 in the `baseline_s` before the
    cleanup against its p99 while the cleanup ran."""
    import subprocess
    import sys
    from io import StringIO

    from django.core.management import call_command

    from bench.common import parse_result

    load = subprocess.Popen([sys.executable, "-m", "bench.workloads.scale", *argv,
                             "--trigger-load", str(rate)], stdout=subprocess.PIPE, text=True)
    time.sleep(baseline_s + 2)  # its warm-up, then the baseline window
    out = StringIO()
    started_at, started = time.time(), time.perf_counter()
    call_command("cleanup_tasks", stdout=out)
    seconds = time.perf_counter() - started
    ended_at = time.time()
    deleted = int(re.search(r"deleted (\d+) finished task", out.getvalue()).group(1))
    load.terminate()
    samples = parse_result(load.communicate(timeout=60)[0])["samples"]
    baseline = [ms for at, ms in samples if started_at - baseline_s <= at < started_at]
    during = [ms for at, ms in samples if started_at <= at < ended_at]
    return {"deleted": deleted, "seconds": round(seconds, 2),
            "tasks_per_s": round(deleted / seconds) if seconds else None,
            "load_per_s": rate, "trigger_baseline": percentiles(baseline),
            "trigger_during": percentiles(during)}


HOT_TABLES = ("workflows_task", "workflows_stepcheckpoint", "workflows_tasktransition",
              "workflows_taskreplay", "workflows_webhookdelivery", "workflows_activityminute")


def sizes() -> dict:
    """Per hot table: heap and index bytes, live and dead tuples (the statistics
    collector's), the share of the heap dead and free (pgstattuple_approx, when
    the extension can be created here)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            approx = True
        except Exception:  # noqa: BLE001 - not installed, or no right to: estimate only
            approx = False
        out = {}
        for table in HOT_TABLES:
            cursor.execute("""
                SELECT pg_relation_size(relid), pg_indexes_size(relid), n_live_tup, n_dead_tup
                  FROM pg_stat_user_tables WHERE relname = %s""", [table])
            heap, indexes, live, dead = cursor.fetchone()
            row = {"heap": heap, "indexes": indexes, "live": live, "dead": dead}
            if approx:
                cursor.execute("SELECT dead_tuple_percent, approx_free_percent "
                               "FROM pgstattuple_approx(%s::regclass)", [table])
                row["dead_pct"], row["free_pct"] = (round(v, 1) for v in cursor.fetchone())
            out[table] = row
    return out


def vacuum() -> dict:
    """VACUUM (ANALYZE) each hot table, timed (seconds)."""
    from django.db import connection

    times = {}
    with connection.cursor() as cursor:
        for table in HOT_TABLES:
            started = time.perf_counter()
            cursor.execute(f"VACUUM (ANALYZE) {table}")
            times[table] = round(time.perf_counter() - started, 2)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--triggers", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the filled database")
    parser.add_argument("--load-rate", type=float, default=50,
                        help="triggers/s beside the cleanup")
    parser.add_argument("--trigger-load", type=float, metavar="RATE",
                        help=argparse.SUPPRESS)  # the load process cleanup() starts
    args = parser.parse_args()
    if args.trigger_load:
        os.environ["DATABASE_URL"] = db_url(DB_NAME)
        os.environ.pop("REDIS_URL", None)
        os.environ.setdefault("PILOT_DEMO_WORKFLOWS", "true")
        os.environ["PILOT_MAX_RUNNING_PER_CLIENT"] = "0"
        from bench.workloads import pilotdb

        pilotdb.setup()
        import logging

        logging.getLogger("pilot.events").setLevel(logging.WARNING)
        trigger_load(args.trigger_load)
        return

    from bench.workloads.prepare import recreate_database

    recreate_database(DB_NAME)
    os.environ["DATABASE_URL"] = db_url(DB_NAME)
    os.environ.pop("REDIS_URL", None)  # the embedded default: ORM broker, database cache
    os.environ.setdefault("PILOT_DEMO_WORKFLOWS", "true")
    os.environ["PILOT_METRICS_TASKS_TTL"] = "0"
    os.environ["PILOT_METRICS_PUBLIC"] = "true"
    os.environ["PILOT_MAX_RUNNING_PER_CLIENT"] = "0"
    hosts = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1")
    os.environ["DJANGO_ALLOWED_HOSTS"] = f"{hosts},testserver"
    os.environ["DJANGO_STATIC_ROOT"] = str(OUT / "static-scale")
    from bench.workloads import pilotdb

    pilotdb.setup()
    import logging

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from tests.support.history import history_fill
    from workflows.admin.paging import cursor_text
    from workflows.models import Task

    logging.getLogger("pilot.events").setLevel(logging.WARNING)
    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    started = time.monotonic()
    history_fill(args.tasks, timezone.now())
    filled = time.monotonic() - started
    say(f"  filled {args.tasks} tasks in {filled:.0f} s")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        size_bytes = cursor.fetchone()[0]
        # Write the fill's dirty pages out now: otherwise the checkpoint they
        # cause runs under the engine rows and every commit waits on its I/O
        # (the claim at 1 M once measured 12.7 ms, 6 of them in COMMIT).
        cursor.execute("CHECKPOINT")

    owners = list(get_user_model().objects.filter(username__startswith="scale-client-"))
    result = {"tasks": args.tasks, "fill_seconds": round(filled), "database_bytes": size_bytes}
    result["sizes_filled"] = sizes()
    result["trigger"] = triggers(owners, args.triggers, args.tasks)
    say(f"  trigger {result['trigger']}")
    result["claim"] = claims(300)
    say(f"  claim {result['claim']}")

    # The dashboard reads the minutes a running dispatcher has folded: fold the
    # day as its loop would (a first fold, in 10-minute chunks), timed.
    from workflows.engine.activity import ActivityFolding, folded_until, minute_of

    fold, started = ActivityFolding(every=0), time.perf_counter()
    while folded_until() is None or folded_until() < minute_of(timezone.now()):
        assert fold(timezone.now()) is not None, "the activity fold failed"
    result["first_fold_seconds"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    fold(timezone.now())
    result["fold_pass_ms"] = round((time.perf_counter() - started) * 1000, 1)
    say(f"  activity folded: first {result['first_fold_seconds']} s, "
        f"then {result['fold_pass_ms']} ms a pass")

    operator = get_user_model().objects.create_superuser("bench-operator", password="x" * 12)
    client = Client()
    client.force_login(operator)
    base = "/admin/workflows/task/"
    row_4951 = Task.objects.order_by("-created_at", "-pk")[99 * 50 - 1]
    key = f"ord-{args.tasks // 2:09d}"
    pages = {
        "list default": base,
        "key search": f"{base}?q={key}",
        "failed + workflow": f"{base}?state__exact=failed&workflow=demo.saga",
        "page 100": f"{base}?before={cursor_text(row_4951).replace('+', '%2B')}",
        "task page": f"{base}{row_4951.pk}/change/",
        "dashboard": f"{base}dashboard/",
        "dashboard live": f"{base}live/?view=dashboard",
        "workers & queue": f"{base}workers/",
        "metrics": "/metrics",
        "baseline: Django's admin list of users": "/admin/auth/user/",
    }
    result["pages"] = {}
    for name, url in pages.items():
        result["pages"][name] = page(client, url, args.reps)
        say(f"  {name}: {result['pages'][name]['median_ms']} ms")
    result["cleanup"] = cleanup(["--tasks", str(args.tasks)], args.load_rate, baseline_s=10)
    say(f"  cleanup {result['cleanup']}")
    # The churn's cost: the triggers, claims and cleanup above left dead rows;
    # what they occupy before a vacuum, what VACUUM takes, what it gives back.
    result["sizes_churned"] = sizes()
    result["vacuum_seconds"] = vacuum()
    result["sizes_vacuumed"] = sizes()
    say(f"  vacuum {result['vacuum_seconds']}")
    emit_result(result)
    if not args.keep:
        connection.close()
        import psycopg

        with psycopg.connect(db_url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    main()
