"""A key's lifetime is the idempotency TTL its workflow had when the client
triggered (docs/design.md, "Data model"): the task keeps it in its own column,
and every ending computes `expires_at` from it — even when a deploy changed the
workflow's TTL, or removed the workflow, before the task ended.

One test per ending: the worker's success and failure (a step's, and the
workflow gone), a cancel of a waiting task, a cancel of a running one finished
after its compensations, a failure after compensations, and the dispatcher's
two give-ups (an expired lease with no attempts left; a cancel whose worker is
gone). Runs on SQLite and PostgreSQL (both stores' creation paths)."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.support.helpers import drain, expire_lease, pop_queued, task_claim
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_cancel
from workflows.engine.triggers import TriggerRequest, task_trigger, task_trigger_many
from workflows.models import Task
from workflows.registry import DEFAULT_IDEMPOTENCY_TTL, registry
from workflows.rules.errors import NonRetryableError
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db(transaction=True)

PROMISED = timedelta(hours=2)  # the workflow's TTL when the client triggers
DEPLOYED = timedelta(minutes=5)  # its TTL after a deploy, before the task ends


def deploy(name: str, change: str) -> None:
    """A deploy between the trigger and the ending: the workflow's TTL is
    shortened, or the workflow is removed."""
    if change == "removed":
        registry.unregister(name)
    else:
        registry.get(name).idempotency_ttl = DEPLOYED


def trigger(owner, workflow: str) -> Task:
    return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                        payload={}).task


def assert_kept_the_promise(task: Task, state: str) -> None:
    task.refresh_from_db()
    assert task.state == state
    assert task.idempotency_ttl == PROMISED
    assert task.expires_at - task.finished_at == PROMISED


CHANGES = pytest.mark.parametrize("change", ["shortened", "removed"])


# --- at the trigger ------------------------------------------------------------------------

def test_every_trigger_path_stores_the_workflows_ttl_of_that_moment(owner, temp_workflow):
    temp_workflow("t.ttl", idempotency_ttl=PROMISED).add_step("one", lambda ctx: 1)
    single = trigger(owner, "t.ttl")  # PostgreSQL: the store's one-statement insert
    [batched] = task_trigger_many(owner=owner, requests=[
        TriggerRequest(workflow="t.ttl", payload={}, key="batched")])  # the general path
    deploy("t.ttl", "shortened")
    replayed = task_trigger(owner=owner, key="batched", workflow="t.ttl", payload={})
    assert replayed.outcome == "replayed"
    stored = dict(Task.objects.values_list("pk", "idempotency_ttl"))
    assert stored == {single.pk: PROMISED, batched.task.pk: PROMISED}
    assert (single.idempotency_ttl, batched.task.idempotency_ttl) == (PROMISED, PROMISED)


# --- the worker's endings --------------------------------------------------------------------

def test_a_success_keeps_the_ttl_of_its_trigger(owner, temp_workflow):
    temp_workflow("t.ttl", idempotency_ttl=PROMISED).add_step("one", lambda ctx: 1)
    task = trigger(owner, "t.ttl")
    deploy("t.ttl", "shortened")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert_kept_the_promise(task, S.SUCCEEDED)


def test_a_failed_step_keeps_the_ttl_of_its_trigger(owner, temp_workflow):
    wf = temp_workflow("t.ttl", idempotency_ttl=PROMISED, max_attempts=1)

    @wf.step
    def breaks(ctx):
        deploy("t.ttl", "shortened")  # deployed while the step runs
        raise NonRetryableError("no")

    task = trigger(owner, "t.ttl")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert_kept_the_promise(task, S.FAILED)


def test_a_task_whose_workflow_was_removed_fails_with_the_ttl_of_its_trigger(
        owner, temp_workflow):
    temp_workflow("t.ttl", idempotency_ttl=PROMISED).add_step("one", lambda ctx: 1)
    task = trigger(owner, "t.ttl")
    deploy("t.ttl", "removed")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert_kept_the_promise(task, S.FAILED)


def test_a_failure_after_its_compensations_keeps_the_ttl_of_its_trigger(owner, temp_workflow):
    undone = []
    wf = temp_workflow("t.ttl", idempotency_ttl=PROMISED, max_attempts=1)
    wf.add_step("book", lambda ctx: "booked", compensation=lambda ctx: undone.append("book"))

    @wf.step
    def breaks(ctx):
        deploy("t.ttl", "shortened")
        raise NonRetryableError("no")

    task = trigger(owner, "t.ttl")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert undone == ["book"]
    assert_kept_the_promise(task, S.FAILED)


# --- cancels ---------------------------------------------------------------------------------

@CHANGES
def test_a_cancelled_waiting_task_keeps_the_ttl_of_its_trigger(owner, temp_workflow, change):
    temp_workflow("t.ttl", idempotency_ttl=PROMISED).add_step("one", lambda ctx: 1)
    task = trigger(owner, "t.ttl")
    deploy("t.ttl", change)
    task_cancel(task_id=task.pk, user=owner)
    assert_kept_the_promise(task, S.CANCELLED)


@CHANGES
def test_a_running_task_cancelled_after_its_compensations_keeps_the_ttl_of_its_trigger(
        owner, temp_workflow, change):
    wf = temp_workflow("t.ttl", idempotency_ttl=PROMISED)
    wf.add_step("book", lambda ctx: "booked", compensation=lambda ctx: None)

    @wf.step
    def wait(ctx):
        task_cancel(task_id=ctx.task_id, user=owner)
        deploy("t.ttl", change)
        ctx.heartbeat(force=True)  # notices the cancel: compensations, then finish_cancel

    task = trigger(owner, "t.ttl")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert_kept_the_promise(task, S.CANCELLED)


# --- the dispatcher's give-ups ---------------------------------------------------------------

@CHANGES
def test_an_expired_lease_with_no_attempts_left_fails_with_the_ttl_of_its_trigger(
        owner, temp_workflow, change):
    temp_workflow("t.ttl", idempotency_ttl=PROMISED, max_attempts=1).add_step(
        "one", lambda ctx: 1)
    task = trigger(owner, "t.ttl")
    assert task_claim(task_id=pop_queued()[0], worker="dies") is not None
    deploy("t.ttl", change)
    expire_lease(task.pk)
    assert dispatch_once().failed == 1
    assert_kept_the_promise(task, S.FAILED)


@CHANGES
def test_a_cancel_whose_worker_is_gone_finishes_with_the_ttl_of_its_trigger(
        owner, temp_workflow, change):
    temp_workflow("t.ttl", idempotency_ttl=PROMISED).add_step("one", lambda ctx: 1)
    task = trigger(owner, "t.ttl")
    assert task_claim(task_id=pop_queued()[0], worker="dies") is not None
    task_cancel(task_id=task.pk, user=owner)
    deploy("t.ttl", change)
    expire_lease(task.pk)
    assert dispatch_once().cancels_finished == 1
    assert_kept_the_promise(task, S.CANCELLED)


# --- rows from before the column -------------------------------------------------------------

def test_the_migration_gives_existing_tasks_their_workflows_ttl(owner, temp_workflow):
    """Migration 0016: a task of a registered workflow gets its TTL; a task of
    a workflow no longer registered, the default."""
    temp_workflow("t.ttl", idempotency_ttl=PROMISED)
    executor = MigrationExecutor(connection)
    executor.migrate([("workflows", "0015_fair_claims")])
    try:
        old = executor.loader.project_state(("workflows", "0015_fair_claims")).apps
        before = old.get_model("workflows", "Task")
        for key, workflow in (("known", "t.ttl"), ("gone", "t.removed"), ("plain", "demo.echo")):
            before.objects.create(owner_id=owner.pk, idempotency_key=key, workflow=workflow,
                                  payload={}, fingerprint="f", max_attempts=1)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert dict(Task.objects.values_list("idempotency_key", "idempotency_ttl")) == {
        "known": PROMISED, "gone": DEFAULT_IDEMPOTENCY_TTL, "plain": DEFAULT_IDEMPOTENCY_TTL}


@pytest.mark.postgres
def test_a_fast_path_replay_and_cleanups_delete_of_its_task_at_the_expiry_instant(owner):
    """Review turn 3, F8: the PostgreSQL fast path read the task without a lock
    and logged a replay of it; a cleanup that judged the key expired a moment
    later deleted the task under it, and the replay's commit failed its foreign
    key (IntegrityError: a 500). The replay's statement now holds the row FOR
    KEY SHARE until it commits, so cleanup's SKIP LOCKED passes it by. The
    window: the replay's statement has run and not committed (its transaction
    held open here), the key expires by the database's clock, cleanup runs."""
    from django.db import transaction
    from django.db.models.functions import Now

    from tests.support.helpers import in_thread
    from workflows.engine.cleanup import tasks_cleanup
    from workflows.engine.store import store
    from workflows.worker import run_task

    task = trigger(owner, "demo.echo")
    [message] = pop_queued()
    assert run_task(message) == "succeeded"
    Task.objects.filter(pk=task.pk).update(expires_at=Now() + timedelta(milliseconds=300))
    with transaction.atomic():
        replay = task_trigger(owner=owner, key=task.idempotency_key, workflow="demo.echo",
                              payload={})
        assert replay.outcome == "replayed"  # the fast path's statement ran: the key was live
        expires_at = Task.objects.filter(pk=task.pk).values_list("expires_at", flat=True).get()
        while store().db_now() <= expires_at:  # the key expires by the database's clock
            pass
        assert in_thread(lambda: tasks_cleanup().tasks) == 0  # the held row is passed by
    assert Task.objects.get(pk=task.pk).replays == 1  # the replay committed, counted
    assert tasks_cleanup().tasks == 1  # and the expired task goes at the next cleanup
