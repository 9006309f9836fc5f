"""The task state machine of SPEC §5: every edge, every refusal, the audit row,
and compare-and-set saves."""

import pytest
from django.db import transaction
from django_fsm import ConcurrentTransition, TransitionNotAllowed, has_transition_perm

from tests.factories import make_task, transition_kwargs
from workflows.engine.audit import transition_apply
from workflows.models import Task, TaskTransition
from workflows.states import TaskState as S

pytestmark = pytest.mark.django_db

LEGAL = {
    "claim": {S.PENDING: S.RUNNING, S.RETRYING: S.RUNNING},
    "succeed": {S.RUNNING: S.SUCCEEDED},
    "schedule_retry": {S.RUNNING: S.RETRYING},
    "recover": {S.RUNNING: S.RETRYING},
    "fail": {S.RUNNING: S.FAILED},
    "cancel": {S.PENDING: S.CANCELLED, S.RETRYING: S.CANCELLED, S.RUNNING: S.CANCELLING},
    "finish_cancel": {S.CANCELLING: S.CANCELLED},
    "retry": {S.FAILED: S.PENDING, S.CANCELLED: S.PENDING},
}


def test_the_machine_has_seven_states():
    assert set(S.values) == {"pending", "running", "retrying", "cancelling", "succeeded",
                             "failed", "cancelled"}


@pytest.mark.parametrize("name, source, target", [
    (name, source, target) for name, edges in LEGAL.items() for source, target in edges.items()
])
def test_every_legal_transition_moves_and_is_audited(owner, name, source, target):
    task = make_task(owner, state=source)
    before = TaskTransition.objects.filter(task=task).count()
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        transition_apply(locked, name, actor="user:op", reason="because",
                         **transition_kwargs(name))
    task.refresh_from_db()
    assert task.state == target
    audit = TaskTransition.objects.filter(task=task).order_by("-id").first()
    assert TaskTransition.objects.filter(task=task).count() == before + 1
    assert (audit.transition, audit.from_state, audit.to_state, audit.actor, audit.reason) == (
        name, source, target, "user:op", "because")


@pytest.mark.parametrize("name, source", [
    (name, source) for name, edges in LEGAL.items() for source in S.values if source not in edges
])
def test_every_illegal_transition_is_refused_and_changes_nothing(owner, name, source):
    task = make_task(owner, state=source)
    before = TaskTransition.objects.filter(task=task).count()
    with pytest.raises(TransitionNotAllowed), transaction.atomic():
        transition_apply(task, name, actor="user:op", **transition_kwargs(name))
    task.refresh_from_db()
    assert task.state == source
    assert TaskTransition.objects.filter(task=task).count() == before


def test_cancel_goes_through_cancelling_when_steps_need_compensating(owner):
    task = make_task(owner, state=S.RETRYING)
    kwargs = transition_kwargs("cancel") | {"needs_compensation": True}
    with transaction.atomic():
        transition_apply(task, "cancel", actor="user:op", **kwargs)
    assert task.state == S.CANCELLING
    assert task.finished_at is None


def test_claim_counts_the_attempt_and_fences_with_a_new_token(owner):
    task = make_task(owner, state=S.RUNNING)
    assert (task.attempts, task.lease_token, task.lease_owner) == (1, 1, "test-worker")
    assert task.started_at is not None


def test_retry_grants_a_fresh_budget_while_attempts_keep_counting(owner):
    task = make_task(owner, state=S.FAILED, max_attempts=1)
    with transaction.atomic():
        transition_apply(task, "retry", actor="user:op", budget=3)
    task.refresh_from_db()
    assert (task.state, task.attempts, task.max_attempts) == (S.PENDING, 1, 4)
    assert task.error == "" and task.finished_at is None and task.expires_at is None


def test_finishing_sets_expiry_from_the_ttl(owner):
    task = make_task(owner, state=S.SUCCEEDED)
    assert task.expires_at - task.finished_at == transition_kwargs("succeed")["ttl"]


def test_state_cannot_be_assigned(owner):
    task = make_task(owner)
    with pytest.raises(AttributeError):
        task.state = S.SUCCEEDED


def test_audit_row_and_change_roll_back_together(owner):
    task = make_task(owner)
    with pytest.raises(RuntimeError), transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        transition_apply(locked, "claim", actor="worker", **transition_kwargs("claim"))
        raise RuntimeError("crash before commit")
    task.refresh_from_db()
    assert task.state == S.PENDING
    assert not TaskTransition.objects.filter(task=task).exists()


def test_a_stale_copy_cannot_overwrite_a_newer_state(owner):
    task = make_task(owner)
    stale = Task.objects.get(pk=task.pk)
    fresh = Task.objects.get(pk=task.pk)
    with transaction.atomic():
        transition_apply(fresh, "cancel", actor="user:op", **transition_kwargs("cancel"))
    with pytest.raises(ConcurrentTransition), transaction.atomic():
        transition_apply(stale, "claim", actor="worker", **transition_kwargs("claim"))
    task.refresh_from_db()
    assert task.state == S.CANCELLED
    assert list(TaskTransition.objects.filter(task=task).values_list("transition", flat=True)) \
        == ["cancel"]


def test_operator_transitions_carry_permissions(owner, django_user_model):
    from django.contrib.auth.models import Permission

    task = make_task(owner, state=S.FAILED)
    operator = django_user_model.objects.create_user("operator")
    assert not has_transition_perm(task.retry, operator)
    operator.user_permissions.add(Permission.objects.get(codename="retry_task"))
    operator = django_user_model.objects.get(pk=operator.pk)
    assert has_transition_perm(task.retry, operator)
    pending = make_task(owner)
    assert not has_transition_perm(pending.cancel, operator)
    assert Permission.objects.filter(codename="view_all_tasks",
                                     content_type__app_label="workflows").exists()
