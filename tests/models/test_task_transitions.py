"""The task state machine (docs/design.md): every edge, every refusal, the audit
row, the token every transition moves on, and compare-and-set saves."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition, TransitionNotAllowed, has_transition_perm

from tests.factories import make_task, transition_kwargs
from workflows.engine.store import store
from workflows.models import Task, TaskTransition
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

LEGAL = {
    "claim": {S.PENDING: S.RUNNING, S.RETRYING: S.RUNNING},
    "succeed": {S.RUNNING: S.SUCCEEDED},
    "schedule_retry": {S.RUNNING: S.RETRYING},
    "recover": {S.RUNNING: S.RETRYING},
    "compensate": {S.RUNNING: S.COMPENSATING},
    "fail": {S.RUNNING: S.FAILED, S.COMPENSATING: S.FAILED},
    "cancel": {S.PENDING: S.CANCELLED, S.RETRYING: S.CANCELLED, S.WAITING: S.CANCELLED,
               S.RUNNING: S.CANCELLING},
    "park": {S.RUNNING: S.WAITING},
    "wake": {S.WAITING: S.PENDING},
    "release": {S.RUNNING: S.PENDING},
    "finish_cancel": {S.CANCELLING: S.CANCELLED},
    "retry": {S.FAILED: S.PENDING, S.CANCELLED: S.PENDING},
    "resume": {S.COMPENSATING: S.COMPENSATING, S.CANCELLING: S.CANCELLING},
    "defer": {S.COMPENSATING: S.COMPENSATING, S.CANCELLING: S.CANCELLING},
}


def transition_apply(task, name, *, actor, reason="", **kwargs):
    store().transition(task, name, at=timezone.now(), actor=actor, reason=reason, **kwargs)


def test_the_machine_has_nine_states():
    assert set(S.values) == {"pending", "running", "retrying", "waiting", "cancelling",
                             "compensating", "succeeded", "failed", "cancelled"}


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
    token = locked.lease_token
    task.refresh_from_db()
    assert task.state == target
    # Every transition is a new version: the token moves on, in memory and stored.
    assert task.lease_token == token == make_task_token(source) + 1
    audit = TaskTransition.objects.filter(task=task).order_by("-id").first()
    assert TaskTransition.objects.filter(task=task).count() == before + 1
    assert (audit.transition, audit.from_state, audit.to_state, audit.actor, audit.reason) == (
        name, source, target, "user:op", "because")


def make_task_token(state) -> int:
    from tests.factories import PATHS

    return len(PATHS[state])


@pytest.mark.parametrize("name, source", [
    (name, source) for name, edges in LEGAL.items() for source in S.values if source not in edges
])
def test_every_illegal_transition_is_refused_and_changes_nothing(owner, name, source):
    task = make_task(owner, state=source)
    before = TaskTransition.objects.filter(task=task).count()
    with pytest.raises(TransitionNotAllowed), transaction.atomic():
        transition_apply(task, name, actor="user:op", **transition_kwargs(name))
    assert task.lease_token == make_task_token(source)  # a refused edge is no new version
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
        transition_apply(task, "retry", actor="user:op", **transition_kwargs("retry"))
    task.refresh_from_db()
    assert (task.state, task.attempts, task.max_attempts) == (S.PENDING, 1, 4)
    assert task.error == "" and task.finished_at is None and task.expires_at is None


def test_finishing_sets_expiry_from_the_tasks_own_ttl(owner):
    task = make_task(owner, state=S.SUCCEEDED, ttl=timedelta(minutes=7))
    assert task.expires_at - task.finished_at == timedelta(minutes=7)
    task.refresh_from_db()
    assert (task.idempotency_ttl, task.expires_at - task.finished_at) == (
        timedelta(minutes=7), timedelta(minutes=7))


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
    # The refused copy is left as it was read: it claims no state the database lacks.
    assert (stale.state, stale.lease_token, stale.attempts) == (S.PENDING, 0, 0)
    task.refresh_from_db()
    assert task.state == S.CANCELLED
    assert list(TaskTransition.objects.filter(task=task).values_list("transition", flat=True)) \
        == ["cancel"]


def test_cancel_and_retry_make_a_new_version_so_the_same_state_never_recurs(owner):
    """pending(0) → cancelled(1) → pending(2): a claim that read pending at 0
    cannot match pending at 2 (no ABA)."""
    task = make_task(owner)
    stale = Task.objects.get(pk=task.pk)
    transition_apply(task, "cancel", actor="user:op", **transition_kwargs("cancel"))
    transition_apply(task, "retry", actor="user:op", **transition_kwargs("retry"))
    assert (task.state, task.lease_token) == (S.PENDING, 2)
    with pytest.raises(ConcurrentTransition):
        transition_apply(stale, "claim", actor="worker", **transition_kwargs("claim"))


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
