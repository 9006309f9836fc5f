"""The ORM broker's pusher outlives a database outage without django-q2's 10-second
sleep (workflows/broker.py): django-q2's own pusher, with PILOT's broker, against
PostgreSQL. The outage is what a failover looks like to a client: the server ends
the pusher's session (pg_terminate_backend) and refuses new ones for a while
(ALLOW_CONNECTIONS false on the test database), then takes them again. A mere
terminated session is not enough: django-q2 closes old connections before each
query and Django's health check reconnects silently. The fault is proven to have
hit the pusher; the next message is delivered well within the 10 s."""

import logging
import queue
import threading
import time

import psycopg
import pytest
from django.db import connection, connections
from django_q.brokers import get_broker
from django_q.pusher import pusher
from django_q.signing import SignedPackage

from workflows.broker import OrmBroker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _message(name: str) -> str:
    return SignedPackage.dumps({"id": name, "name": name, "func": "math.floor", "args": (1,),
                                "kwargs": {}})


def _allow_connections(allow: bool) -> None:
    """From the server's maintenance database: a database cannot refuse its own."""
    params = {**connection.get_connection_params(), "dbname": "postgres", "autocommit": True}
    params.pop("cursor_factory", None)
    params.pop("context", None)
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with psycopg.connect(**params) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {str(allow).lower()}")


def _terminate_other_sessions() -> int:
    """End every other session on the test database (the pusher's); how many."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                       "FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def _wait_for_session(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)
    raise AssertionError("the pusher never connected")


def test_the_standalone_project_selects_pilots_orm_broker_without_redis(settings):
    if settings.REDIS_URL:
        assert not isinstance(get_broker(), OrmBroker)
    else:
        assert isinstance(get_broker(), OrmBroker)


@pytest.fixture
def running_pusher():
    # PILOT's broker whatever REDIS_URL says: the queue table is there either way.
    broker = OrmBroker(list_key="pilot-broker-outage-test")
    broker.purge_queue()
    delivered: queue.Queue = queue.Queue()
    stop = threading.Event()

    def run():
        try:
            pusher(delivered, stop, broker)
        finally:
            connections.close_all()  # this thread's: the test database is dropped after

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield broker, delivered, thread
    stop.set()
    thread.join(timeout=5)
    broker.purge_queue()


def test_the_next_message_arrives_within_a_second_of_a_killed_connection(running_pusher,
                                                                        caplog):
    broker, delivered, thread = running_pusher
    broker.enqueue(_message("before"))
    assert delivered.get(timeout=5)["id"] == "before"
    _wait_for_session()

    try:
        with caplog.at_level(logging.WARNING, logger="pilot.events"):
            _allow_connections(False)
            assert _terminate_other_sessions() >= 1
            deadline = time.monotonic() + 5
            while not broker.outages and time.monotonic() < deadline:
                time.sleep(0.01)
            assert broker.outages == 1, "the pusher never met the outage"
            time.sleep(2)  # the outage lasts: the retries back off to their cap
            assert broker.failures >= 5
    finally:
        _allow_connections(True)
    assert any(r.getMessage() == "broker_unreachable" for r in caplog.records)

    back = time.monotonic()
    broker.enqueue(_message("after"))
    message = delivered.get(timeout=15)
    elapsed = time.monotonic() - back
    assert message["id"] == "after"
    assert elapsed < 2.0, f"the next message took {elapsed:.2f} s (django-q2 alone: 10 s)"
    assert thread.is_alive(), "the pusher must stay in its loop, not exit for the sentinel"
    assert broker.failures == 0  # it reconnected
