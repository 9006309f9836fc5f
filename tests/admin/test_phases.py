"""A task's phases from its audit trail (workflows/admin/phases.py): waiting
for a worker told apart from a backoff. No database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from workflows.admin.phases import (
    BACKOFF,
    PARKED,
    WAIT_OR_BACKOFF,
    WAITING,
    retry_delay,
    task_phases,
    waits_before,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def move(seconds, name, frm, to, reason="", actor="worker:w1"):
    return SimpleNamespace(at=at(seconds), transition=name, from_state=frm, to_state=to,
                           reason=reason, actor=actor)


def task(next_attempt_at=None):
    return SimpleNamespace(created_at=T0, next_attempt_at=next_attempt_at)


def kinds(phases):
    return [(p.state, p.kind, round(p.seconds, 3)) for p in phases]


def test_a_short_backoff_then_two_minutes_waiting_for_a_busy_worker():
    """The issue's case: a 0.089 s backoff, then both workers busy for 2 min.
    Drawn as one "retrying" bar it looked like a 2-minute backoff."""
    history = [move(1, "claim", "pending", "running"),
               move(2, "schedule_retry", "running", "retrying",
                    reason="RetryableError; retry in 0.089s"),
               move(122, "claim", "retrying", "running"),
               move(123, "succeed", "running", "succeeded")]
    phases = task_phases(task(), history, end=at(123))
    assert kinds(phases) == [("pending", WAITING, 1.0), ("running", "running", 1.0),
                             ("retrying", BACKOFF, 0.089), ("retrying", WAITING, 119.911),
                             ("running", "running", 1.0), ("succeeded", "succeeded", 0.0)]
    assert phases[3].label == "waiting for a worker"
    notes = waits_before(phases)
    assert notes[at(1)] == "after 1.0 s waiting for a worker"
    assert notes[at(122)] == "after 89 ms backoff, then 1 min 59 s waiting for a worker"


def test_the_current_wait_uses_the_rows_due_time():
    history = [move(1, "claim", "pending", "running"),
               move(2, "recover", "running", "retrying", actor="dispatcher:d")]
    due_later = task(next_attempt_at=at(10))
    assert kinds(task_phases(due_later, history, end=at(5)))[-1] == ("retrying", BACKOFF, 3.0)
    due_before = task(next_attempt_at=at(4))
    assert kinds(task_phases(due_before, history, end=at(9)))[-2:] == [
        ("retrying", BACKOFF, 2.0), ("retrying", WAITING, 5.0)]


def test_a_past_wait_whose_delay_was_not_recorded_is_not_split_by_a_guess():
    """A `recover` from before it recorded its delay: the wait stays one phase,
    labelled honestly."""
    history = [move(1, "claim", "pending", "running"),
               move(5, "recover", "running", "retrying", actor="dispatcher:d"),
               move(9, "claim", "retrying", "running")]
    phases = task_phases(task(), history, end=at(10))
    assert kinds(phases)[2] == ("retrying", WAIT_OR_BACKOFF, 4.0)
    assert phases[2].label == "retrying (backoff, then waiting for a worker)"
    assert waits_before(phases)[at(9)] == "after 4.0 s backoff and waiting"


def test_a_past_recover_wait_is_split_by_the_delay_it_recorded():
    history = [move(1, "claim", "pending", "running"),
               move(5, "recover", "running", "retrying", actor="dispatcher:d",
                    reason="lease held by w:1 expired at …; retry in 1.500s"),
               move(9, "claim", "retrying", "running")]
    phases = task_phases(task(), history, end=at(10))
    assert kinds(phases)[2:4] == [("retrying", BACKOFF, 1.5), ("retrying", WAITING, 2.5)]


def test_retry_delay_reads_only_what_the_runner_wrote():
    assert retry_delay("RetryableError; retry in 0.089s") == timedelta(seconds=0.089)
    assert retry_delay("retry in 12s") == timedelta(seconds=12)
    assert retry_delay("operator retry") is None and retry_delay("") is None


def test_a_parked_task_is_parked_never_waiting_for_a_worker():
    """state `waiting` is a wait step's park: no worker is held, so neither
    the timeline nor the attempt's note may call it "waiting for a worker"."""
    history = [move(1, "claim", "pending", "running"),
               move(2, "park", "running", "waiting"),
               move(62, "wake", "waiting", "pending", actor="dispatcher:d"),
               move(63, "claim", "pending", "running")]
    phases = task_phases(task(), history, end=at(64))
    assert kinds(phases) == [("pending", WAITING, 1.0), ("running", "running", 1.0),
                             ("waiting", PARKED, 60.0), ("pending", WAITING, 1.0),
                             ("running", "running", 1.0)]
    assert phases[2].label.startswith("parked")
    # The second attempt waited one second for a worker, not a minute.
    assert waits_before(phases)[at(63)] == "after 1.0 s waiting for a worker"
