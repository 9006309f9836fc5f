"""A database switch seen by the dispatcher (DatabaseWatch, docs/design.md,
"Dispatcher"): leases nobody renewed since the switch are recovered at once,
not when they expire; the task then runs to its end once; the old owner's late
write is refused by the fence. On PostgreSQL, with the server's identity read
through a hook the test turns (a real switch is tests/ha's)."""

import uuid
from datetime import timedelta

import pytest

from tests.support.helpers import drain, pop_queued, task_claim
from workflows import database
from workflows.engine.dispatcher import DatabaseWatch, dispatch_once
from workflows.engine.leases import Lease, Refused, lease_length
from workflows.engine.store import store
from workflows.engine.triggers import task_trigger
from workflows.models import DemoOrder, StepCheckpoint, Task, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Server:
    """The identity hook: what `read_identity` answers, turned by the test."""

    def __init__(self):
        self.identity = database.server_identity()  # the real one, to start with

    def __call__(self):
        return self.identity

    def promote(self):
        system_identifier, timeline = self.identity
        self.identity = (system_identifier, timeline + 1)


@pytest.fixture
def claimed(owner):
    """A demo.sync_orders task claimed by a worker that then went silent."""
    task = task_trigger(owner=owner, key=uuid.uuid4().hex, workflow="demo.sync_orders",
                        payload={"count": 3, "batch": f"b-{uuid.uuid4().hex[:8]}"}).task
    pop_queued()
    claim = task_claim(task_id=task.pk, worker="zombie")
    assert claim is not None
    return claim.task


def test_the_real_identity_is_the_servers_and_stable():
    system_identifier, timeline = database.server_identity()
    assert system_identifier.isdigit() and timeline >= 1
    assert database.server_identity() == (system_identifier, timeline)


def test_after_a_switch_an_unrenewed_lease_is_recovered_at_once_and_the_task_runs_once(claimed):
    server = Server()
    watch = DatabaseWatch(grace_seconds=0, read_identity=server)
    assert dispatch_once(watch=watch).recovered == 0  # the old primary: nothing to do
    server.promote()

    report = dispatch_once(watch=watch)
    assert (report.recovered, report.after_switch) == (1, 1)
    task = Task.objects.get(pk=claimed.pk)
    assert (task.state, task.attempts) == (S.RETRYING, 1)
    audit = TaskTransition.objects.filter(task_id=task.pk).latest("id")
    assert audit.transition == "recover" and "not renewed since the database switched" in \
        audit.reason and "zombie" in audit.reason
    # The zombie's late write (a heartbeat, on the new primary) is refused by the fence.
    with pytest.raises(Refused):
        store().renew(Lease(task_id=claimed.pk, token=claimed.lease_token, worker="zombie"),
                      lease_length=lease_length())

    drain(lambda: Task.objects.get(pk=claimed.pk).is_finished)
    task.refresh_from_db()
    assert (task.state, task.attempts) == (S.SUCCEEDED, 2)
    batch = task.payload["batch"]
    assert DemoOrder.objects.filter(batch=batch).count() == 3  # the atomic rows, exactly once
    assert StepCheckpoint.objects.filter(task_id=task.pk, state="succeeded").count() == 3
    assert dispatch_once(watch=watch).after_switch == 0  # the switch is handled once


def test_without_a_switch_a_live_lease_is_left_alone(claimed):
    watch = DatabaseWatch(grace_seconds=0, read_identity=Server())
    for _ in range(3):
        assert dispatch_once(watch=watch).recovered == 0
    assert Task.objects.get(pk=claimed.pk).state == S.RUNNING


def test_a_lease_renewed_after_the_switch_is_left_to_its_live_owner(claimed):
    server = Server()
    watch = DatabaseWatch(grace_seconds=60, read_identity=server)
    dispatch_once(watch=watch)
    server.promote()
    dispatch_once(watch=watch)  # the switch is noticed; the grace runs
    # The owner reaches the new primary and heartbeats within its grace.
    store().renew(Lease(task_id=claimed.pk, token=claimed.lease_token, worker="zombie"),
                  lease_length=lease_length())
    watch.recover_at -= timedelta(seconds=60)  # the grace is over
    assert dispatch_once(watch=watch).recovered == 0
    task = Task.objects.get(pk=claimed.pk)
    assert (task.state, task.lease_token) == (S.RUNNING, claimed.lease_token)


def test_within_the_grace_nothing_is_recovered_yet(claimed):
    server = Server()
    watch = DatabaseWatch(grace_seconds=60, read_identity=server)
    dispatch_once(watch=watch)
    server.promote()
    assert dispatch_once(watch=watch).recovered == 0
    assert dispatch_once(watch=watch).recovered == 0
    assert Task.objects.get(pk=claimed.pk).state == S.RUNNING
    watch.recover_at -= timedelta(seconds=60)
    assert dispatch_once(watch=watch).after_switch == 1


def test_a_renewal_on_the_old_primary_after_the_last_pass_does_not_hide_the_lease(claimed):
    """The heartbeat the old primary took after the dispatcher's last pass there
    reached the new primary too (synchronous replication): it is not a renewal on
    the new primary, and the lease is recovered all the same."""
    server = Server()
    watch = DatabaseWatch(grace_seconds=0, read_identity=server)
    dispatch_once(watch=watch)
    store().renew(Lease(task_id=claimed.pk, token=claimed.lease_token, worker="zombie"),
                  lease_length=lease_length())  # still the old primary, after the pass
    server.promote()
    assert dispatch_once(watch=watch).after_switch == 1


def test_the_first_pass_of_a_dispatcher_sees_no_switch(claimed):
    server = Server()
    server.promote()  # whatever the server is, a new dispatcher knows no other
    assert dispatch_once(watch=DatabaseWatch(grace_seconds=0, read_identity=server)).recovered == 0
