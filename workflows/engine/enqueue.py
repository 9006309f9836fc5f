"""The one door to django-q2 (docs/design.md, "The one door to django-q2").

A message carries only a task id (a string) — or, for a completion webhook, a
delivery's `webhook-id` (`<task id>:<state>:<n>`); the worker re-reads
everything from the database and claims under a lock (a delivery: under its
claim token), so a duplicate or stale message is harmless. For tasks the
message is a doorbell, not the queue: the task table is the queue, and a woken
worker goes on claiming due tasks from it in due order (docs/design.md,
"Execution", the queue).

- `enqueue_on_commit(ids)` is the call every engine path makes (triggers,
  operator cancel and retry, the dispatcher, the outbox of webhook deliveries
  via `deliveries_enqueue_on_commit`). With the ORM broker the queue row is
  written inside the caller's transaction (a transactional outbox): a
  rolled-back change enqueues nothing, a committed one cannot lose its message.
  With Redis the push happens after commit; if the process dies in between,
  or Redis is down (`enqueue_failed` is logged, the request still succeeds:
  its change is committed), nothing is lost: a worker draining the table may
  claim the task anyway, and once its message is PILOT_REENQUEUE_SECONDS old the
  dispatcher sends it another, oldest due first (a delivery without a recent
  message: once it is due).
- `enqueue_rollback_unsafe(ids)` pushes at once, whatever the caller's
  transaction then does. Only `enqueue_on_commit` calls it (after the commit,
  or inside the transaction for the ORM broker, where the row then shares the
  transaction's fate); tests use it to put a message on the broker directly.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from workflows.cluster import cluster_name
from workflows.observability.events import Event, emit

# An ORM-broker message is visible to a worker once its `lock` is before the
# worker's own clock (django-q2 dequeues `lock < timezone.now()`). Stamped with
# the sender's clock, a web node a minute ahead hid its messages for a minute
# from correct workers; a fixed time long past makes every message visible at
# once to every worker, whatever the machines' clocks (docs/design.md, "Time").
# The message's send time stays in its package (`started`) and, for the
# engine's decisions, in the task's `enqueued_at` (the database's clock).
VISIBLE_AT_ONCE = datetime(2000, 1, 1, tzinfo=UTC)

RUN_TASK = "workflows.worker.run_task"
DELIVER_WEBHOOK = "workflows.worker.deliver_webhook"

_broker = None


def broker() -> Any:
    """This process's broker (one Redis connection pool, not one per message),
    on PILOT's own queue: PILOT_Q_CLUSTER_NAME (workflows.cluster), whatever
    cluster this process's django-q2 configuration is the default of."""
    global _broker
    if _broker is None:
        _broker = get_broker(list_key=cluster_name())
    return _broker


def uses_orm_broker() -> bool:
    return bool(Conf.ORM)


def _package(arg: str, func: str) -> str:
    kind = "" if func == RUN_TASK else "webhook-"
    return SignedPackage.dumps({
        "id": uuid.uuid4().hex,
        "name": f"pilot-{kind}{arg}",
        "func": func,
        "args": (arg,),
        "kwargs": {},
        "started": timezone.now(),
        "ack_failure": True,
    })


def enqueue_rollback_unsafe(task_ids: Iterable[Any], *, front: bool = False,
                            func: str = RUN_TASK) -> int:
    """Push one message per task now. Returns how many were pushed. `front`
    puts them ahead of the waiting messages where the broker can (Redis):
    for work already under way — due retries, recovered and orphaned tasks —
    which should not wait behind a backlog of new triggers. `func`:
    RUN_TASK (ids are task ids) or DELIVER_WEBHOOK (ids are webhook ids)."""
    packages = [_package(str(task_id), func) for task_id in task_ids]
    if not packages:
        return 0
    b = broker()
    if uses_orm_broker():
        OrmQ.objects.using(Conf.ORM).bulk_create(
            [OrmQ(key=b.list_key, payload=p, lock=VISIBLE_AT_ONCE) for p in packages])
    elif front:
        # django-q2's pusher pops from the left: push the last first, so the
        # first given is the first taken.
        b.connection.lpush(b.list_key, *reversed(packages))
    else:
        b.connection.rpush(b.list_key, *packages)
    return len(packages)


def enqueue_on_commit(task_ids: Iterable[Any], *, front: bool = False,
                      func: str = RUN_TASK) -> None:
    """Enqueue the tasks so that the message exists iff the caller's transaction
    commits (ORM broker) or is pushed right after it commits (Redis); `front`
    and `func` as in enqueue_rollback_unsafe."""
    ids = [str(task_id) for task_id in task_ids]
    if not ids:
        return
    if uses_orm_broker():
        enqueue_rollback_unsafe(ids, func=func)  # same database: part of the caller's transaction
    else:
        transaction.on_commit(lambda: _push_after_commit(ids, front, func))


def deliveries_enqueue_on_commit(message_ids: Iterable[str], *, front: bool = False) -> None:
    """Enqueue webhook deliveries (by `webhook-id`) the same way; a lost
    message is sent again by the dispatcher (deliveries.deliveries_enqueue_due)."""
    enqueue_on_commit(message_ids, front=front, func=DELIVER_WEBHOOK)


def _push_after_commit(ids: list[str], front: bool, func: str) -> None:
    """The committed tasks exist whatever happens here; if the broker is down,
    say so and let the dispatcher enqueue them again after
    PILOT_REENQUEUE_SECONDS instead of failing a request that succeeded."""
    try:
        enqueue_rollback_unsafe(ids, front=front, func=func)
    except Exception as exc:  # noqa: BLE001 - any broker failure; the dispatcher covers it
        emit(Event.ENQUEUE_FAILED, level=logging.WARNING, count=len(ids),
             error=f"{type(exc).__name__}: {exc}"[:300])
