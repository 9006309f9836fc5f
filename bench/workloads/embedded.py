"""Embedded mode: `make run`'s configuration on SQLite, and the same on PostgreSQL.

    python -m bench.workloads.embedded --seconds 6 --hold 1

The web server as `make run` starts it (deploy/gunicorn.conf.py, 2 processes
of 4 threads), the ORM broker, the trigger throttle in the database cache; the
database is whatever DATABASE_URL names. Two loads of new-key triggers by wrk
(16 connections, `--seconds` each; no workers run during the first):

- `plain`: triggers alone;
- `hold`: triggers while one worker runs `demo.sync_orders` with
  step_seconds=`--hold`, whose atomic `write` step keeps its transaction open
  that long - on SQLite, the database's only write lock, so every trigger that
  arrives meanwhile waits for it (up to the busy timeout, PILOT_SQLITE_TIMEOUT).

The end-to-end rate is bench.workloads.e2e run with the same environment.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from bench.common import PILOT_PY, Proc, emit_result
from bench.common import log as say
from bench.workloads import pilotdb
from bench.workloads.load import Server, wrk

CONNECTIONS = 16
WEB_PROCESSES, WEB_THREADS = 2, 4  # pilot/localrun.py's defaults


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--hold", type=float, default=1.0,
                        help="seconds the atomic step keeps its transaction open")
    args = parser.parse_args()

    pilotdb.setup()
    from django.db import connection

    pilotdb.reset()
    token = pilotdb.token()
    database = connection.vendor
    tag = f"embedded-{database}-{uuid.uuid4().hex[:6]}"
    result: dict = {"database": database, "connections": CONNECTIONS,
                    "web": f"{WEB_PROCESSES}x{WEB_THREADS}", "hold_seconds": args.hold}
    with Server(dict(os.environ), name=f"{tag}-gunicorn", workers=WEB_PROCESSES,
                threads=WEB_THREADS) as server:
        wrk(server.url, mode="new", token=token, prefix=f"{tag}-warm", seconds=2,
            connections=CONNECTIONS)
        load = wrk(server.url, mode="new", token=token, prefix=f"{tag}-plain",
                   seconds=args.seconds, connections=CONNECTIONS)
        result["plain"] = load.summary() | {"max_ms": load.percentile_ms(100)}
        say(f"  {database} triggers: {load.rps:.0f} req/s, p99 {load.percentile_ms(99)} ms")
        result["hold"] = _while_an_atomic_step_runs(server, token, tag, args)
    emit_result(result)


def _while_an_atomic_step_runs(server: Server, token: str, tag: str, args) -> dict:
    """wrk while one worker runs demo.sync_orders back to back, each `write`
    step holding its transaction `args.hold` seconds."""
    from workflows.engine.triggers import TriggerRequest, task_trigger_many
    from workflows.models import StepCheckpoint

    env = dict(os.environ, PILOT_Q_WORKERS="1")
    procs = [Proc(f"{tag}-qcluster", [PILOT_PY, "manage.py", "qcluster"], env),
             Proc(f"{tag}-dispatcher", [PILOT_PY, "manage.py", "run_dispatcher"], env)]
    runs = int(args.seconds / (3 * args.hold)) + 3  # 3 steps of `hold` s: enough for the window
    for proc in procs:
        proc.start()
    try:
        task_trigger_many(owner=pilotdb.owner(), requests=[
            TriggerRequest("demo.sync_orders", {"batch": f"{tag}-{n}", "count": 10,
                                                "step_seconds": args.hold}, f"{tag}-sync-{n}")
            for n in range(runs)])
        deadline = time.monotonic() + 60
        while not StepCheckpoint.objects.filter(task__idempotency_key__startswith=f"{tag}-sync",
                                                name="write").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no write step started in 60 s; see {procs[0].log_path}")
            time.sleep(0.1)
        load = wrk(server.url, mode="new", token=token, prefix=f"{tag}-hold",
                   seconds=args.seconds, connections=CONNECTIONS)
        writes = StepCheckpoint.objects.filter(task__idempotency_key__startswith=f"{tag}-sync",
                                               name="write").count()
    finally:
        for proc in procs:
            proc.stop(timeout=3)  # not the graceful drain of every queued run
    say(f"  triggers while atomic steps hold {args.hold:g} s: {load.rps:.0f} req/s, "
        f"p99 {load.percentile_ms(99)} ms, max {load.percentile_ms(100)} ms")
    return load.summary() | {"max_ms": load.percentile_ms(100), "write_steps": writes}


if __name__ == "__main__":
    main()
