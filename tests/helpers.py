"""Test helpers that read the real broker and database (no mocks)."""

from __future__ import annotations

from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from workflows.engine.enqueue import broker, uses_orm_broker


def _raw_packages() -> list:
    if uses_orm_broker():
        return list(OrmQ.objects.using(Conf.ORM).filter(key=broker().list_key)
                    .order_by("id").values_list("payload", flat=True))
    return broker().connection.lrange(broker().list_key, 0, -1)


def queued_task_ids() -> list[str]:
    """The PILOT task id of every message waiting in the broker, in queue order."""
    return [SignedPackage.loads(p)["args"][0] for p in _raw_packages()]


def purge_queue() -> None:
    if uses_orm_broker():
        OrmQ.objects.using(Conf.ORM).filter(key=broker().list_key).delete()
    else:
        broker().connection.delete(broker().list_key)


def run_at_once(n: int, fn, *, timeout: float = 120.0) -> list:
    """Run `fn(i)` in `n` threads released together by a barrier, each on its own
    database connection. Returns, per thread, its return value or the exception
    it raised."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(n)
    results: list = [None] * n

    def body(i):
        try:
            # Connect before the barrier so the race is between statements, not
            # between connection handshakes.
            connections["default"].ensure_connection()
            barrier.wait(timeout=timeout)
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return results
