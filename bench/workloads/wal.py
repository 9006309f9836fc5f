"""WAL per run by record kind, this database's records only (pg_walinspect).

    python -m bench.workloads.wal [--runs 1000]      (PILOT's virtualenv, bench env)

Triggers N runs of test.noop3 in one batch, then runs them in this process
through the worker's entry point (`run_task` on each: today's engine drains
the backlog from the first call, the baseline's runs one per call), and reads
the WAL records written in between with pg_walinspect, keeping those whose
block belongs to this database: per run, by resource manager, record type and
relation, with the full-page images apart. Commit records name no relation,
so they are left out (about 30-50 bytes per transaction). Runs in both trees
(bench/baseline.py), so the same code measures before and after.
"""

from __future__ import annotations

import argparse
import re
import uuid
from collections import Counter

from bench.common import emit_result
from bench.workloads import pilotdb

BLOCK = re.compile(r"rel \d+/(\d+)/(\d+)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    pilotdb.setup()
    import logging

    from django.db import connection

    from workflows.engine.triggers import TriggerRequest, task_trigger_many
    from workflows.models import Task
    from workflows.worker import run_task

    logging.getLogger("pilot.events").setLevel(logging.WARNING)
    pilotdb.reset()
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cursor.execute("CHECKPOINT")  # full-page images start from the same place on both sides
    owner = pilotdb.owner()
    prefix = f"wal-{uuid.uuid4().hex[:8]}-"
    # A temporary physical replication slot, held by a connection of its own for
    # the whole measurement, keeps the server from recycling the WAL segments
    # before they are read (other databases' traffic — a CI run beside the
    # bench — can fill and recycle segments within a minute). It goes away with
    # that connection, also if this process dies.
    holder = _hold_wal(f"pilot_bench_wal_{uuid.uuid4().hex[:12]}")
    start = _lsn()
    outcomes = []
    for first in range(0, args.runs, 1000):  # a batch holds at most 1 000 tasks
        outcomes += task_trigger_many(owner=owner, requests=[
            TriggerRequest("test.noop3", {"run": i}, f"{prefix}{i}")
            for i in range(first, min(first + 1000, args.runs))])
    triggered = _lsn()
    for outcome in outcomes:
        run_task(str(outcome.task.pk))
    ran = _lsn()
    done = Task.objects.filter(idempotency_key__startswith=prefix, state="succeeded").count()
    if done != args.runs:
        raise RuntimeError(f"{done}/{args.runs} runs succeeded")
    emit_result({"runs": args.runs, "trigger": _breakdown(start, triggered, args.runs),
                 "run": _breakdown(triggered, ran, args.runs)})
    holder.close()
    pilotdb.reset()


def _hold_wal(slot: str):
    import psycopg
    from django.db import connection

    settings = connection.settings_dict
    holder = psycopg.connect(dbname=settings["NAME"], user=settings["USER"] or None,
                             password=settings["PASSWORD"] or None,
                             host=settings["HOST"] or None, port=settings["PORT"] or None,
                             autocommit=True)
    holder.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", [slot])
    return holder


def _lsn() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()")
        return cursor.fetchone()[0]


def _breakdown(start: str, end: str, runs: int) -> dict:
    """Bytes per run of this database's WAL records between two positions."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        [database] = cursor.fetchone()
        cursor.execute("SELECT relfilenode, relname FROM pg_class WHERE relfilenode <> 0")
        relations = dict(cursor.fetchall())
        cursor.execute("SELECT resource_manager, record_type, record_length, fpi_length, "
                       "block_ref FROM pg_get_wal_records_info(%s, %s)", [start, end])
        records = cursor.fetchall()
    sizes, images = Counter(), Counter()
    for manager, kind, length, image, block in records:
        match = BLOCK.search(block or "")
        if match is None or int(match.group(1)) != database:
            continue
        key = f"{manager} {kind} {relations.get(int(match.group(2)), match.group(2))}"
        sizes[key] += length
        images[key] += image
    return {"bytes_per_run": round(sum(sizes.values()) / runs),
            "fpi_per_run": round(sum(images.values()) / runs),
            "kinds": {k: [round(v / runs), round(images[k] / runs)]
                      for k, v in sizes.most_common()}}


if __name__ == "__main__":
    main()
