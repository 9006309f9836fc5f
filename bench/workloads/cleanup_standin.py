"""STAND-IN for `python manage.py cleanup_tasks`, used by the cleanup workload
only while this checkout has no such command: deletes finished tasks whose key
expired, 1000 at a time, each batch in its own short transaction (rows locked
with SKIP LOCKED, so a trigger racing on one of them is never blocked), through
the engine's `tasks_delete`. Not PILOT's cleanup: its figures say so."""

import time

from bench.workloads import pilotdb

BATCH = 1000


def main() -> None:
    pilotdb.setup()
    from django.db import transaction
    from django.utils import timezone

    from workflows.engine.cleanup import tasks_delete
    from workflows.models import Task

    deleted, batches, started = 0, 0, time.monotonic()
    while True:
        with transaction.atomic():
            ids = list(Task.objects.expired(timezone.now()).select_for_update(skip_locked=True)
                       .order_by().values_list("pk", flat=True)[:BATCH])
            deleted += tasks_delete(ids)
        if not ids:
            break
        batches += 1
    print(f"stand-in cleanup: deleted {deleted} expired task(s) in {batches} batch(es) "
          f"of up to {BATCH}, {time.monotonic() - started:.2f}s", flush=True)


if __name__ == "__main__":
    main()
