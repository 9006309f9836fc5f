"""workflows/engine/store/postgres.py beyond the contract: its prepared
statements across a reconnect (docs/design.md, "The store")."""

import uuid

import pytest
from django.db import close_old_connections, connection

from tests.support.helpers import in_thread, pop_queued, task_claim
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _terminate(pid: int) -> None:
    """End that server session from another connection, as a PostgreSQL restart
    or a failover does."""
    def kill():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            return cursor.fetchone()[0]

    assert in_thread(kill) is True


def test_the_first_claim_after_the_session_died_prepares_its_statement_again(owner):
    """HA review, 3.4 (issue 26, item 9): the cache of prepared statements was
    read before Django's health check replaced the dead connection, so the first
    claim after every reconnect ran EXECUTE on a session that had never
    prepared it ("prepared statement … does not exist"), once per statement."""
    assert store().name == "postgresql"
    first, second = (task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.echo",
                                  payload={}).task for _ in range(2))
    pop_queued()
    assert task_claim(task_id=first.pk, worker="w") is not None  # prepared on this session
    old = _backend_pid()
    _terminate(old)
    close_old_connections()  # what a worker does before each message (workflows/worker.py)
    claimed = task_claim(task_id=second.pk, worker="w")
    assert claimed is not None and claimed.task.state == S.RUNNING
    assert _backend_pid() != old  # the fault landed: this is a new session
