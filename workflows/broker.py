"""PILOT's ORM broker: django-q2's, without its 10-second hole after a database error.

django-q2's pusher (django_q/pusher.py) pulls messages with `broker.dequeue()`;
on any exception it logs, sleeps 10 s and exits, and the sentinel starts another
pusher. A restarted or failed-over database therefore left an ORM-broker cluster
idle for 10 s after the database was back — triggers were answered, nothing ran
(docs/operations.md, "High availability").

`OrmBroker.dequeue` treats a DatabaseError as "nothing yet": it closes the
broken connection (the next query opens a fresh one, through the multi-host
URL to the new primary), waits a short, growing pause — PILOT_Q_POLL_SECONDS
at first, doubling, at most RETRY_CAP_SECONDS — and returns no message. The
pusher stays in its loop, so work resumes within about a second of the database
answering again. Other exceptions reach the pusher as before.

Q_CLUSTER sets it with `"broker_class": "workflows.broker.OrmBroker"` next to
`"orm"`: django-q2 uses `broker_class` for the pusher, and PILOT's own writes
to the queue table keep using `Conf.ORM` (workflows/engine/enqueue.py).
"""

from __future__ import annotations

import logging
import time

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django_q.brokers.orm import ORM
from django_q.conf import Conf

from workflows.observability.events import Event, emit

RETRY_CAP_SECONDS = 1.0


class OrmBroker(ORM):
    """django-q2's ORM broker whose `dequeue` outlives the database's outages."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        self.failures = 0  # consecutive failed dequeues; 0 while the database answers
        self.outages = 0  # how many times the database went away, for tests and logs

    def dequeue(self):
        try:
            messages = super().dequeue()
        except DatabaseError as exc:
            self._failed(exc)
            return None
        if self.failures:
            emit(Event.BROKER_RECONNECTED, failures=self.failures)
            self.failures = 0
        return messages

    def _failed(self, exc: DatabaseError) -> None:
        if self.failures == 0:
            self.outages += 1
            emit(Event.BROKER_UNREACHABLE, level=logging.WARNING,
                 error=f"{type(exc).__name__}: {str(exc).strip()}"[:300])
        self.failures += 1
        # The connection may be half-dead (a terminated backend, a demoted
        # primary): drop it so the next query reconnects.
        try:
            connections[Conf.ORM or DEFAULT_DB_ALIAS].close()
        except DatabaseError:
            pass
        time.sleep(min(float(Conf.POLL) * 2 ** (self.failures - 1), RETRY_CAP_SECONDS))
