"""Cleanup under load: delete N expired tasks while new-key triggers run.

    python -m bench.workloads.cleanup --tasks 100000 --seconds 10

Seeds N finished tasks whose key expired a day ago, each with three step
checkpoints and two transitions (SQL, in seconds), then under gunicorn:
1. new-key trigger load alone for `--seconds` (the p99 without cleanup);
2. the cleanup started, and the same load run in 2-second windows until the
   cleanup has finished (the p99 with cleanup, over every window).
The cleanup is `python manage.py cleanup_tasks --batch-size 1000` when the
project has that command, else a clearly marked stand-in
(bench/workloads/cleanup_standin.py) that deletes in 1000-row batches through
`workflows.engine.cleanup.tasks_delete`.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid

from bench.common import PILOT_PY, Proc, emit_result
from bench.common import log as say
from bench.workloads import pilotdb
from bench.workloads.load import Server, merge, wrk

WINDOW_SECONDS = 2
MAX_CLEANUP_SECONDS = 420
SEED_PREFIX = "expired-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    pilotdb.setup()
    from django.core.management import get_commands

    pilotdb.reset()
    token = pilotdb.token()
    started = time.monotonic()
    seed(args.tasks, pilotdb.owner())
    seed_seconds = time.monotonic() - started
    say(f"  seeded {args.tasks} expired tasks in {seed_seconds:.1f}s")
    if "cleanup_tasks" in get_commands():
        command, standin = ["manage.py", "cleanup_tasks", "--batch-size", "1000"], False
    else:
        command, standin = ["-m", "bench.workloads.cleanup_standin"], True
    tag = uuid.uuid4().hex[:6]
    with Server(dict(os.environ), name=f"gunicorn-cleanup-{tag}") as server:
        wrk(server.url, mode="new", token=token, prefix=f"warm-{tag}", seconds=2,
            connections=args.concurrency)
        without = wrk(server.url, mode="new", token=token, prefix=f"alone-{tag}",
                      seconds=args.seconds, connections=args.concurrency)
        cleanup = Proc(f"cleanup-{tag}", [PILOT_PY, *command], dict(os.environ)).start()
        cleanup_started = time.monotonic()
        ended: list[float] = []
        watcher = threading.Thread(target=lambda: (cleanup.popen.wait(),
                                                   ended.append(time.monotonic())), daemon=True)
        watcher.start()
        windows = []
        while not ended and time.monotonic() - cleanup_started < MAX_CLEANUP_SECONDS:
            windows.append(wrk(server.url, mode="new", token=token,
                               prefix=f"during-{tag}-{len(windows)}", seconds=WINDOW_SECONDS,
                               connections=args.concurrency))
        timed_out = not ended
        if timed_out:
            cleanup.stop()
        watcher.join(30)
        cleanup_seconds = ended[0] - cleanup_started
    remaining = _expired_left()
    with_cleanup = merge(windows)
    emit_result({
        "tasks": args.tasks, "command": " ".join(command), "standin": standin,
        "seed_seconds": round(seed_seconds, 1),
        "cleanup_seconds": round(cleanup_seconds, 2), "exit_code": cleanup.popen.returncode,
        "timed_out": timed_out,
        "deleted_per_s": round((args.tasks - remaining) / cleanup_seconds, 1),
        "remaining": remaining, "windows": len(windows),
        # the share of the loaded time during which the cleanup really ran
        "overlap": round(min(1.0, cleanup_seconds / max(with_cleanup.seconds, 1e-9)), 2),
        "without": without.summary(), "with": with_cleanup.summary(),
    })


def _expired_left() -> int:
    from workflows.models import Task

    return Task.objects.filter(idempotency_key__startswith=SEED_PREFIX).count()


def seed(n: int, owner) -> None:
    """N succeeded tasks whose key expired a day ago, 3 steps and 2 transitions each."""
    from django.db import connection, transaction

    from workflows.models import StepCheckpoint, Task, TaskTransition

    with transaction.atomic(), connection.cursor() as cursor:
        _insert_select(cursor, Task, {
            "id": "gen_random_uuid()", "owner_id": "%(owner)s",
            "idempotency_key": f"'{SEED_PREFIX}' || g", "workflow": "'test.noop3'",
            "payload": "jsonb_build_object('n', g)", "fingerprint": "md5(g::text) || md5('x')",
            "state": "'succeeded'", "result": "'3'::jsonb", "attempts": "1",
            "max_attempts": "3", "lease_token": "1", "created_at": "now() - interval '3 days'",
            "updated_at": "now() - interval '2 days'", "started_at": "now() - interval '2 days'",
            "finished_at": "now() - interval '2 days'", "expires_at": "now() - interval '1 day'",
        }, "FROM generate_series(1, %(n)s) g", {"owner": owner.pk, "n": n})
        seeded = f"FROM {Task._meta.db_table} t WHERE t.idempotency_key LIKE '{SEED_PREFIX}%%'"
        _insert_select(cursor, StepCheckpoint, {
            "task_id": "t.id", "index": "i", "name": "(ARRAY['one', 'two', 'three'])[i + 1]",
            "state": "'succeeded'", "output": "to_jsonb(i + 1)", "attempts": "1",
            "started_at": "t.started_at", "finished_at": "t.finished_at",
        }, seeded.replace(" t WHERE", " t CROSS JOIN generate_series(0, 2) i WHERE"), {})
        for transition, source, target in (("claim", "pending", "running"),
                                           ("succeed", "running", "succeeded")):
            _insert_select(cursor, TaskTransition, {
                "task_id": "t.id", "transition": f"'{transition}'", "from_state": f"'{source}'",
                "to_state": f"'{target}'", "actor": "'worker:bench'", "at": "t.finished_at",
            }, seeded, {})
    with connection.cursor() as cursor:
        for model in (Task, StepCheckpoint, TaskTransition):
            cursor.execute(f"ANALYZE {model._meta.db_table}")


def _insert_select(cursor, model, expressions: dict, from_clause: str, params: dict) -> None:
    """INSERT INTO model's table SELECT expressions FROM …; every column not in
    `expressions` (except an auto id) gets its field's default, so a new field
    on the model does not break the seeding."""
    from django.db import connection

    columns, values, params = [], [], dict(params)
    for field in model._meta.concrete_fields:
        if field.column in expressions:
            values.append(expressions[field.column])
        elif field.primary_key and field.get_internal_type() in ("AutoField", "BigAutoField"):
            continue
        else:
            name = f"default_{field.column}"
            params[name] = field.get_db_prep_save(field.get_default(), connection)
            values.append(f"%({name})s")
        columns.append(connection.ops.quote_name(field.column))
    cursor.execute(f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) "
                   f"SELECT {', '.join(values)} {from_clause}", params)


if __name__ == "__main__":
    main()
