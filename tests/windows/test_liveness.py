"""Nothing stuck, nothing starved (docs/guarantees.md, "Liveness"): work that
can run is run, whatever else the fleet is doing.

- a task whose message was lost is claimed within PILOT_REENQUEUE_SECONDS and
  a dispatcher pass while the workers are kept busy with other tasks' runs, each
  longer than their drain window (review turn 3, F1 — it waited for the whole
  fleet's first idle moment, which never came);
- clients at their cap never keep another client's owed task from its free
  slot, however many of them there are (review turn 3, F7 — the owed scan took
  the same first `batch` clients every pass).

Scaled down (drain 0.2 s, runs 0.3 s, re-send after 1 s) and driven in process:
the worker is `task_run` on the messages the broker holds, the dispatcher
`dispatch_once`. SQLite and PostgreSQL."""

import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db.models.functions import Now

from tests.support.helpers import pop_queued, queued_task_ids, task_claim
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.run import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lost_message_is_claimed_within_a_period_while_long_runs_keep_coming(
        owner, temp_workflow, settings):
    settings.PILOT_REENQUEUE_SECONDS = 1.0
    wf = temp_workflow("t.long_runs", max_attempts=1)

    @wf.step
    def work(ctx):
        time.sleep(0.3)  # longer than the drain window below
        return 1

    lost = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="t.long_runs",
                        payload={"lost": True}).task
    assert pop_queued() == [str(lost.pk)]  # its push failed after the commit
    others = 0
    deadline = time.monotonic() + 20
    while Task.objects.get(pk=lost.pk).state == S.PENDING:
        assert time.monotonic() < deadline, "the lost task was never claimed"
        task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="t.long_runs", payload={})
        others += 1
        for message in pop_queued():  # the other task's message, or the re-sent one
            task_run(task_id=message, worker="w", drain_seconds=0.2)
        dispatch_once()
    lost.refresh_from_db()
    assert (lost.state, lost.attempts) == (S.SUCCEEDED, 1)
    # Claimed in the first period after its message went stale: it was re-sent when
    # its message was a period old, and its claim came with the next runs.
    claimed_at = TaskTransition.objects.get(task_id=lost.pk, transition="claim").at
    waited = (claimed_at - lost.created_at).total_seconds()
    assert waited < 3 * settings.PILOT_REENQUEUE_SECONDS, waited
    assert others >= 2  # the fleet was busy with other work meanwhile


def test_a_client_with_a_free_slot_is_served_whatever_the_clients_at_their_cap(
        temp_workflow, settings):
    """More clients at their cap with owed tasks than the scan's batch; one more
    client has a free slot and one owed task. It gets its message at the first
    pass (the scan chooses among clients with a free slot, oldest owed first)."""
    settings.PILOT_MAX_RUNNING_PER_CLIENT = 1
    users = get_user_model().objects
    patient = users.create_user("patient", password="pw-patient-123")
    mine = task_trigger(owner=patient, key="mine", workflow="demo.echo", payload={}).task
    saturated = [users.create_user(f"busy-{i}", password="pw-busy-123") for i in range(5)]
    for client in saturated:
        running = task_trigger(owner=client, key="running", workflow="demo.echo",
                               payload={}).task
        assert task_claim(task_id=running.pk, worker=f"w-{client.username}") is not None
        for n in range(2):  # owed: their claims were refused at the cap
            task_trigger(owner=client, key=f"owed-{n}", workflow="demo.echo", payload={})
    pop_queued()
    # Every pending task is owed a message (as a refused claim leaves it), and the
    # saturated clients' are the oldest.
    Task.objects.filter(state=S.PENDING).update(enqueued_at=None)
    Task.objects.filter(state=S.PENDING).exclude(pk=mine.pk).update(
        next_attempt_at=Now() - timedelta(seconds=30))
    report = dispatch_once(batch=2)
    assert report.owed_enqueued == 1
    assert queued_task_ids() == [str(mine.pk)]


def test_one_clients_pile_of_lost_messages_does_not_keep_anothers_waiting(owner,
                                                                         other_owner):
    """Client A lost the messages of six tasks, client B of one, newer than all
    of A's. The re-sends of one pass are shared out by client first, the
    client whose task waited longest first: B's goes out in the first pass, not
    after A's pile."""
    from workflows.engine.dispatcher import RESENDS_PER_PASS

    mine = [task_trigger(owner=owner, key=f"a-{i}", workflow="demo.echo", payload={}).task
            for i in range(6)]
    theirs = task_trigger(owner=other_owner, key="b", workflow="demo.echo", payload={}).task
    pop_queued()  # all lost
    for age, task in enumerate(reversed(mine)):
        Task.objects.filter(pk=task.pk).update(
            enqueued_at=Now() - timedelta(seconds=60 + age),
            next_attempt_at=Now() - timedelta(seconds=60 + age))
    Task.objects.filter(pk=theirs.pk).update(enqueued_at=Now() - timedelta(seconds=30),
                                             next_attempt_at=Now() - timedelta(seconds=30))
    assert dispatch_once().reenqueued == RESENDS_PER_PASS
    sent = pop_queued()
    assert str(theirs.pk) in sent
    assert sent[0] == str(mine[0].pk)  # A's oldest first: it waited longest
