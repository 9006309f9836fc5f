"""Child tasks (docs/writing-workflows.md, "Children"): a step starts children
through the idempotent trigger, a children wait parks the parent until they
have all ended, their results come back in order, a failed child fails the
wait, a cancel reaches the children — through the real worker entry point and
dispatcher."""

import uuid

import pytest

from tests.support.helpers import audit, pop_queued
from workflows.engine import task_cancel
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.registry import registry
from workflows.rules.states import Source
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


def trigger(owner, workflow, payload, key=None):
    return task_trigger(owner=owner, key=key or uuid.uuid4().hex, workflow=workflow,
                        payload=payload).task


def run_queued(rounds=10):
    """Run every queued message, and what those runs queue, until none is left."""
    ran = 0
    for _ in range(rounds):
        messages = pop_queued()
        if not messages:
            return ran
        for message in messages:
            run_task(message)
            ran += 1
    return ran


def children_of(task):
    return list(Task.objects.filter(parent=task).order_by("parent_index"))


def test_a_fanout_parks_its_parent_until_every_child_ended_and_gathers_their_results_in_order(
        owner):
    parent = trigger(owner, "demo.fanout", {"children": 3})
    run_task(pop_queued()[0])  # the parent alone: spawn, then the wait parks it
    parent.refresh_from_db()
    assert parent.state == S.WAITING and parent.waits_for["kind"] == "children"
    assert parent.lease_owner == "" and parent.lease_expires_at is None
    assert parent.children_count == 3
    kids = children_of(parent)
    assert [k.parent_index for k in kids] == [0, 1, 2]
    assert {(k.workflow, k.source, k.owner_id, k.parent_step) for k in kids} == {
        ("demo.slow", Source.CHILD, owner.pk, "spawn")}
    assert [k.idempotency_key for k in kids] == [f"child:{parent.pk}:spawn:{i}" for i in range(3)]
    run_queued()
    parent.refresh_from_db()
    assert parent.state == S.SUCCEEDED
    assert parent.result == {"children": 3, "results": [{"completed_steps": 1}] * 3}
    # Woken once, by the last child's ending.
    assert [t for t, _, _ in audit(parent.pk)] == ["claim", "park", "wake", "claim", "succeed"]


def test_a_failed_child_fails_the_wait_with_child_failed(owner):
    parent = trigger(owner, "demo.fanout", {"children": 2, "fail_child": 1})
    run_queued()
    parent.refresh_from_db()
    kids = children_of(parent)
    assert [k.workflow for k in kids] == ["demo.slow", "demo.saga"]
    assert kids[1].state == S.FAILED and kids[0].state == S.SUCCEEDED
    assert parent.state == S.FAILED and parent.error_type == "ChildFailed"
    assert str(kids[1].pk) in parent.error
    # Not retried (a wait is no attempt, so one of the budget was spent): the
    # children stay as they ended.
    assert parent.max_attempts - parent.attempts == registry.get("demo.fanout").max_attempts - 1
    assert [t for t, _, _ in audit(parent.pk)][-1] == "fail"


def test_a_child_wait_that_finds_every_child_ended_goes_on_without_parking(owner):
    parent = trigger(owner, "demo.fanout", {"children": 2})
    [message] = pop_queued()
    registry_wait = registry.get("demo.fanout")
    assert registry_wait.steps[1].wait.kind == "children"
    # Let the children run first: run the parent up to its park, then the kids.
    run_task(message)
    run_queued()
    parent.refresh_from_db()
    assert parent.state == S.SUCCEEDED


def test_cancelling_a_parent_cancels_its_children_that_have_not_ended(owner):
    parent = trigger(owner, "demo.fanout", {"children": 3, "child_seconds": 5})
    run_task(pop_queued()[0])
    kids = children_of(parent)
    task_cancel(task_id=parent.pk, user=owner, reason="stop it")
    parent.refresh_from_db()
    assert parent.state == S.CANCELLED
    assert {Task.objects.get(pk=k.pk).state for k in kids} == {S.CANCELLED}
    run_queued()  # the children's messages find them cancelled
    assert dispatch_once().woken == 0
    parent.refresh_from_db()
    assert parent.state == S.CANCELLED


def test_a_parents_settle_that_was_lost_is_done_by_the_dispatcher(owner, monkeypatch):
    from workflows.engine import announce

    parent = trigger(owner, "demo.fanout", {"children": 2})
    run_task(pop_queued()[0])
    lost = []
    monkeypatch.setattr(announce, "parent_settle", lambda parent_id, actor, step=None: lost.append(
        parent_id))
    run_queued()
    assert len(lost) == 2  # both endings' settles were lost
    parent.refresh_from_db()
    assert parent.state == S.WAITING
    assert dispatch_once().woken == 1
    run_queued()
    parent.refresh_from_db()
    assert parent.state == S.SUCCEEDED


def test_a_child_ending_while_others_are_open_leaves_its_parent_parked(owner):
    """Woken only by the last ending: an early wake would cost the parent a
    claim, a look and a park again for every child but the last."""
    parent = trigger(owner, "demo.fanout", {"children": 3})
    assert str(parent.pk) in pop_queued()
    run_task(str(parent.pk))
    first, second, third = children_of(parent)
    run_task(str(first.pk))
    run_task(str(second.pk))
    parent.refresh_from_db()
    assert parent.state == S.WAITING
    assert [t for t, _, _ in audit(parent.pk)] == ["claim", "park"]
    run_task(str(third.pk))
    parent.refresh_from_db()
    assert parent.state == S.PENDING
    assert [t for t, _, _ in audit(parent.pk)] == ["claim", "park", "wake"]


def test_a_childs_key_is_derived_from_parent_step_and_suffix_and_a_bad_suffix_is_refused():
    from workflows.engine.children import child_key
    from workflows.rules.errors import ValidationFailed

    assert child_key("p-1", "spawn", "7") == "child:p-1:spawn:7"
    for bad in ("", "has space", "é", "x" * 300):
        with pytest.raises(ValidationFailed, match="A child's suffix"):
            child_key("p-1", "spawn", bad)


def test_a_step_asking_for_two_children_with_one_suffix_starts_none(owner, temp_workflow):
    wf = temp_workflow("t.same_suffix", max_attempts=1)

    @wf.step
    def spawn(ctx):
        return ctx.start_children("demo.echo", [{}, {}], suffixes=["a", "a"])

    parent = trigger(owner, "t.same_suffix", {})
    run_queued()
    parent.refresh_from_db()
    assert (parent.state, parent.error_type) == (S.FAILED, "ValueError")
    assert "one distinct suffix per payload" in parent.error
    assert children_of(parent) == []
