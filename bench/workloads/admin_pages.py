"""The operator console's pages on 100 000 tasks: server-side render time.

    python -m bench.workloads.admin_pages [--tasks 100000] [--reps 15]

Seeds its own database (pilot_bench_admin; bench.run's other workloads never
see it) in bulk, with SQL: `--tasks` tasks over 20 clients, five workflows
and the last 7 days, in the proportions of a busy installation (mostly
succeeded; some failed, cancelled, pending, retrying, running — a few past
their lease), each with 3 step checkpoints and 2 transitions, plus replays;
and one long run (50 steps, 150 transitions, 40 replays) for the worst task
page.

Then renders each page in this process through Django's test client — the
whole request (middleware, session, permissions, queries, templates), no
network — `--reps` times after 3 warm-ups, as a signed-in operator who sees
every task. Reports the median, min and max in ms and the queries per
request. The baseline, measured in the same run: Django's own admin list of
users, the cost of an admin page with none of PILOT's work in it.

Budgets (issue 12): task list, task page and dashboard each <= 300 ms.
The ORM broker and the database cache (the embedded default) are used, so
the Workers & queue reads (django-q2's cluster status, the queue's depth)
are database queries too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from urllib.parse import quote

from bench.common import OUT, db_url, emit_result
from bench.common import log as say

DB_NAME = "pilot_bench_admin"
BUDGET_MS = 300
STATES = [  # (state, share of the tasks in per mille)
    ("succeeded", 800), ("failed", 50), ("cancelled", 40), ("pending", 50),
    ("retrying", 30), ("running", 20), ("cancelling", 10)]
WORKFLOWS = ["demo.echo", "demo.sync_orders", "demo.flaky", "demo.slow", "demo.saga"]


def seed(n: int, owners: list[int]) -> None:
    """n tasks with 3 checkpoints, 2 transitions and (one in ten) a replay each,
    in three INSERT … SELECT statements."""
    from django.db import connection

    states = "ARRAY[" + ",".join(
        f"'{s}'" for s, share in STATES for _ in range(share // 10)) + "]"
    workflows = "ARRAY[" + ",".join(f"'{w}'" for w in WORKFLOWS) + "]"
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO workflows_task (id, owner_id, idempotency_key, workflow, payload,
                fingerprint, state, error, error_type, attempts, max_attempts, lease_token,
                lease_owner, lease_expires_at, next_attempt_at, source, trace_id,
                created_at, updated_at, started_at, finished_at, expires_at)
            SELECT gen_random_uuid(), o, 'bench-' || i, w, jsonb_build_object('i', i, 'note',
                   repeat('n', 200)), md5(i::text), s,
                   CASE WHEN s IN ('failed', 'retrying')
                        THEN 'RetryableError: upstream said no to batch ' || i ELSE '' END,
                   CASE WHEN s IN ('failed', 'retrying') THEN 'RetryableError' ELSE '' END,
                   1, 3, 2,
                   CASE WHEN s IN ('running', 'cancelling') THEN 'bench-host:' || (i %% 8)
                        ELSE '' END,
                   CASE WHEN s IN ('running', 'cancelling')
                        THEN now() + (CASE WHEN i %% 50 = 0 THEN -30 ELSE 60 END) * interval '1 s'
                        END,
                   CASE WHEN s = 'retrying' THEN now() + interval '5 s' END,
                   'api', '',
                   t, t, t + interval '1 s',
                   CASE WHEN s IN ('succeeded', 'failed', 'cancelled')
                        THEN t + interval '3 s' END,
                   CASE WHEN s IN ('succeeded', 'failed', 'cancelled')
                        THEN t + interval '1 day' END
            FROM (SELECT i, (%s::bigint[])[1 + i %% %s] AS o,
                         ({workflows})[1 + i %% 5] AS w,
                         ({states})[1 + (i * 7919) %% 100] AS s,
                         now() - (i * 604800.0 / %s) * interval '1 s' AS t
                  FROM generate_series(1, %s) AS i) AS seeded""",
                       [owners, len(owners), n, n])
        cursor.execute("""
            INSERT INTO workflows_stepcheckpoint (task_id, index, name, state, output, progress,
                attempts, compensable, compensation_attempts, error, started_at, finished_at)
            SELECT t.id, k, 'step' || k,
                   CASE WHEN t.state = 'succeeded' OR k < 1 THEN 'succeeded'
                        WHEN t.state IN ('running', 'cancelling') AND k = 1 THEN 'running'
                        ELSE 'pending' END,
                   CASE WHEN t.state = 'succeeded' OR k < 1
                        THEN jsonb_build_object('rows', k * 10) END,
                   NULL, 1, false, 0, '', t.started_at + k * interval '1 s',
                   CASE WHEN t.state = 'succeeded' OR k < 1
                        THEN t.started_at + (k + 1) * interval '1 s' END
            FROM workflows_task t, generate_series(0, 2) AS k""")
        cursor.execute("""
            INSERT INTO workflows_tasktransition (task_id, transition, from_state, to_state,
                actor, reason, at)
            SELECT id, 'claim', 'pending', 'running', 'worker:bench-host:1', 'attempt 1 of 3',
                   started_at FROM workflows_task
            UNION ALL
            SELECT id, CASE state WHEN 'succeeded' THEN 'succeed' WHEN 'failed' THEN 'fail'
                                  WHEN 'retrying' THEN 'schedule_retry' ELSE 'cancel' END,
                   'running', state, 'worker:bench-host:1',
                   CASE WHEN state = 'retrying' THEN 'RetryableError; retry in 0.4s' ELSE '' END,
                   started_at + interval '3 s'
            FROM workflows_task WHERE state NOT IN ('pending', 'running')""")
        cursor.execute("""
            INSERT INTO workflows_taskreplay (task_id, workflow, count, at)
            SELECT id, workflow, 1, created_at + interval '2 s' FROM workflows_task
            WHERE right(idempotency_key, 1) = '0'  -- one in ten
            """)
        for table in ("workflows_task", "workflows_stepcheckpoint", "workflows_tasktransition",
                      "workflows_taskreplay"):
            # What autovacuum does to a table this size within a minute: statistics
            # and a current visibility map (index-only scans).
            cursor.execute(f"VACUUM ANALYZE {table}")


def long_run(owner):
    """One demo.slow run of 50 steps that was retried many times: 150
    transitions, 50 checkpoints, 40 replays. Returns its id."""
    from datetime import timedelta

    from django.utils import timezone

    from workflows.models import StepCheckpoint, Task, TaskReplay, TaskTransition
    from workflows.rules.fingerprint import fingerprint

    start = timezone.now() - timedelta(hours=1)
    payload = {"steps": 50, "seconds": 1}
    task = Task.objects.create(
        owner=owner, idempotency_key="bench-long-run", workflow="demo.slow", payload=payload,
        fingerprint=fingerprint("demo.slow", payload), state="running", attempts=50,
        max_attempts=60, lease_token=150, lease_owner="bench-host:9",
        lease_expires_at=timezone.now() + timedelta(seconds=60), created_at=start,
        updated_at=start, started_at=start)
    StepCheckpoint.objects.bulk_create([
        StepCheckpoint(task=task, index=k, name=f"s{k}",
                       state="succeeded" if k < 49 else "running",
                       output={"completed_steps": k + 1} if k < 49 else None, attempts=2,
                       started_at=start + timedelta(seconds=60 * k),
                       finished_at=start + timedelta(seconds=60 * k + 50) if k < 49 else None)
        for k in range(50)])
    moves = []
    for k in range(50):
        at = start + timedelta(seconds=60 * k)
        moves += [("claim", "pending" if k == 0 else "retrying", "running", at),
                  ("schedule_retry", "running", "retrying", at + timedelta(seconds=20)),
                  ("claim", "retrying", "running", at + timedelta(seconds=25))]
    TaskTransition.objects.bulk_create([
        TaskTransition(task=task, transition=name, from_state=a, to_state=b,
                       actor="worker:bench-host:9", at=at,
                       reason="RetryableError; retry in 0.4s" if name == "schedule_retry"
                       else "")
        for name, a, b, at in moves])
    TaskReplay.objects.bulk_create([TaskReplay(task=task, workflow="demo.slow",
                                               at=start + timedelta(seconds=30 * i))
                                    for i in range(40)])
    return task.pk


def measure(client, url: str, reps: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):
        assert client.get(url).status_code == 200, url
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    return {"url": url, "median_ms": round(statistics.median(times), 1),
            "min_ms": round(min(times), 1), "max_ms": round(max(times), 1),
            "queries": len(queries), "bytes": len(response.content)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()

    from bench.workloads.prepare import recreate_database

    recreate_database(DB_NAME)
    os.environ["DATABASE_URL"] = db_url(DB_NAME)
    os.environ.pop("REDIS_URL", None)  # the embedded default: ORM broker, database cache
    os.environ.setdefault("PILOT_DEMO_WORKFLOWS", "true")
    hosts = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1")
    os.environ["DJANGO_ALLOWED_HOSTS"] = f"{hosts},testserver"
    # Production static files: hashed names from collectstatic's manifest.
    os.environ["DJANGO_STATIC_ROOT"] = str(OUT / "static-admin-pages")
    from bench.workloads import pilotdb

    pilotdb.setup()
    import logging

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.utils import timezone

    logging.getLogger("pilot.events").setLevel(logging.WARNING)
    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    users = get_user_model().objects.bulk_create(
        [get_user_model()(username=f"bench-client-{i}") for i in range(20)])
    started = time.monotonic()
    seed(args.tasks, [u.pk for u in users])
    long_id = long_run(users[0])
    seeded = time.monotonic() - started
    say(f"  seeded {args.tasks} tasks (+ steps, transitions, replays) in {seeded:.1f}s")

    from workflows.models import Task

    operator = get_user_model().objects.create_superuser("bench-operator", password="x" * 12)
    client = Client()
    client.force_login(operator)
    typical = Task.objects.filter(state="failed").order_by("-created_at").values_list(
        "pk", flat=True).first()
    base = "/admin/workflows/task/"
    hour_ago = quote((timezone.now() - timedelta(hours=1)).isoformat())
    pages = {
        "task list (newest first)": base,
        "task list, running": f"{base}?state__exact=running",
        "task list, failed demo.saga": f"{base}?state__exact=failed&workflow=demo.saga",
        "task list, key search": f"{base}?q=bench-4242",
        "task list, payload search": f"{base}?q=payload.i%3D4242",
        "task list, error search": f"{base}?q=error%3Abatch+4242",
        "task list, finished in the last hour": f"{base}?finished_at__gte={hour_ago}",
        "task page (3 steps)": f"{base}{typical}/change/",
        "task page (50 steps, 150 transitions)": f"{base}{long_id}/change/",
        "dashboard": f"{base}dashboard/",
        "workers & queue": f"{base}workers/",
        "live update of a task page": f"{base}live/?view=task&id={long_id}",
        "live update of the dashboard": f"{base}live/?view=dashboard",
        "workflows page": f"{base}workflows/",
        "webhook deliveries, failing": "/admin/workflows/webhookdelivery/?health=failing",
        "schedules": "/admin/workflows/pilotschedule/",
        "baseline: Django's admin list of users": "/admin/auth/user/",
    }
    results = {}
    for name, url in pages.items():
        results[name] = measure(client, url, args.reps)
        say(f"  {name}: {results[name]['median_ms']} ms, {results[name]['queries']} queries")
    emit_result({"tasks": args.tasks, "reps": args.reps, "seed_seconds": round(seeded, 1),
                 "budget_ms": BUDGET_MS, "pages": results,
                 "total_tasks": Task.objects.count()})


if __name__ == "__main__":
    main()
