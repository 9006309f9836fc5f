"""Leases, the fence's signals, the database's clock and a held claim's
patience (engine/leases.py)."""

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, ProgrammingError

from workflows.engine.leases import DbClock, Interrupted, Lease, Refused, classify, patiently
from workflows.rules.errors import CancelRequested, LeaseLost
from workflows.rules.states import TaskState as S

LEASE = Lease(uuid.uuid4(), 7, "w")


def test_a_cancel_of_this_very_run_is_a_cancel_anything_else_a_lost_lease():
    assert isinstance(classify(Refused(LEASE, S.CANCELLING, 8)), CancelRequested)
    for state, token in ((S.CANCELLING, 9), (S.RETRYING, 8), (S.RUNNING, 8), (None, None)):
        assert isinstance(classify(Refused(LEASE, state, token)), LeaseLost), (state, token)
    assert "deleted" in str(Refused(LEASE, None, None))


def test_the_database_clock_runs_on_with_this_process_monotonic_clock():
    anchor = datetime(2026, 1, 1, tzinfo=UTC)
    clock = DbClock(anchor)
    time.sleep(0.05)
    elapsed = clock.now() - anchor
    assert timedelta(seconds=0.04) < elapsed < timedelta(seconds=5)


def test_a_lost_connection_is_retried_until_the_write_lands(db):
    tries = []

    def write():
        tries.append(1)
        if len(tries) < 3:
            raise OperationalError("server closed the connection unexpectedly")
        return "written"

    assert patiently(write, doing="record") == "written"
    assert len(tries) == 3


def test_a_connection_that_stays_lost_interrupts_by_the_deadline(db):
    tries = []

    def write():
        tries.append(1)
        raise OperationalError("connection refused")

    started = time.monotonic()
    with pytest.raises(Interrupted, match="cannot record: OperationalError: connection refused"):
        patiently(write, doing="record", deadline=time.monotonic() + 0.3)
    assert len(tries) >= 1 and time.monotonic() - started < 5


def test_a_refused_statement_is_not_retried(db):
    tries = []

    def write():
        tries.append(1)
        raise ProgrammingError("column does not exist")

    with pytest.raises(ProgrammingError):
        patiently(write, doing="record")
    assert tries == [1]
