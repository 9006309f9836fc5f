"""A hypothesis state machine drives one task through the real engine
(triggers, worker runs, dying workers, the dispatcher, cancel, retry) in random
orders and checks it against a small model of SPEC §5/§6 after every step,
along with the audit-trail invariants."""

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from hypothesis.strategies import sampled_from

from tests.faults.invariants import violations
from tests.support.helpers import task_claim
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_cancel, task_retry
from workflows.engine.run import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskReplay, TaskTransition
from workflows.registry import registry
from workflows.rules.errors import (
    IdempotencyKeyReused,
    InvalidTransition,
    NonRetryableError,
    RetryableError,
    TaskCancelled,
)
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

BUDGET = 2
MODE = {"step": "ok"}


def _step(ctx):
    if MODE["step"] == "retryable":
        raise RetryableError("transient")
    if MODE["step"] == "fatal":
        raise NonRetryableError("permanent")
    return "done"


if registry.find("test.model") is None:
    registry.define("test.model", max_attempts=BUDGET, backoff_initial=0, backoff_max=0) \
        .add_step("only", _step)


class TaskMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        from django.contrib.auth import get_user_model

        for model in (TaskTransition, StepCheckpoint, TaskReplay, Task):
            model.objects.all().delete()
        self.owner, _ = get_user_model().objects.get_or_create(username="model-owner")
        self.state = None  # no task yet
        self.attempts = 0
        self.max_attempts = BUDGET
        self.replays = 0

    def task(self):
        return Task.objects.get(idempotency_key="k")

    # --- rules ------------------------------------------------------------------------------

    @rule()
    def trigger_same(self):
        try:
            outcome = task_trigger(owner=self.owner, key="k", workflow="test.model",
                                   payload={"p": 1})
        except TaskCancelled:
            assert self.state in (S.CANCELLING, S.CANCELLED)
            return
        if self.state is None:
            assert outcome.outcome == "created"
            self.state = S.PENDING
        elif self.state == S.FAILED:
            assert outcome.outcome == "restarted"
            self.state, self.max_attempts = S.PENDING, self.attempts + BUDGET
        else:
            assert outcome.outcome == "replayed", (self.state, outcome.outcome)
            self.replays += 1

    @rule()
    def trigger_different(self):
        if self.state is None:
            return
        with pytest.raises(IdempotencyKeyReused):
            task_trigger(owner=self.owner, key="k", workflow="test.model", payload={"p": 2})

    @rule(mode=sampled_from(["ok", "retryable", "fatal"]))
    def worker_runs_it(self, mode):
        if self.state is None:
            return
        MODE["step"] = mode
        task = self.task()
        claimable = self.state in (S.PENDING, S.RETRYING)
        orphan_cancel = self.state == S.CANCELLING and (
            task.lease_expires_at is None or task.lease_expires_at < timezone.now())
        outcome = task_run(task_id=task.pk, worker="model-worker").outcome
        if orphan_cancel:
            assert outcome == "cancelled"
            self.state = S.CANCELLED
            return
        if not claimable:
            assert outcome == "skipped", (self.state, outcome)
            return
        self.attempts += 1
        if mode == "ok":
            expected = S.SUCCEEDED
        elif mode == "retryable" and self.attempts < self.max_attempts:
            expected = S.RETRYING
        else:
            expected = S.FAILED
        assert outcome == expected.value, (mode, outcome)
        self.state = expected

    @rule()
    def worker_claims_and_dies(self):
        if self.state not in (S.PENDING, S.RETRYING):
            return
        assert task_claim(task_id=self.task().pk, worker="doomed") is not None
        Task.objects.filter(idempotency_key="k").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))
        self.attempts += 1
        self.state = S.RUNNING

    @rule()
    def dispatcher_pass(self):
        before = self.state
        dispatch_once()
        if before == S.RUNNING:  # only dead workers' tasks are running here
            self.state = S.RETRYING if self.attempts < self.max_attempts else S.FAILED
        elif before == S.CANCELLING:
            self.state = S.CANCELLED  # nothing to compensate: settled by the dispatcher

    @rule()
    def cancel(self):
        if self.state is None:
            return
        if self.state in (S.PENDING, S.RETRYING):
            assert task_cancel(task_id=self.task().pk, user=self.owner).state == S.CANCELLED
            self.state = S.CANCELLED
        elif self.state == S.RUNNING:
            assert task_cancel(task_id=self.task().pk, user=self.owner).state == S.CANCELLING
            self.state = S.CANCELLING
        else:
            with pytest.raises(InvalidTransition):
                task_cancel(task_id=self.task().pk, user=self.owner)

    @rule(from_start=sampled_from([False, True]))
    def retry(self, from_start):
        if self.state is None:
            return
        if self.state in (S.FAILED, S.CANCELLED):
            task = task_retry(task_id=self.task().pk, user=self.owner, from_start=from_start)
            assert task.state == S.PENDING
            self.state, self.max_attempts = S.PENDING, self.attempts + BUDGET
        else:
            with pytest.raises(InvalidTransition):
                task_retry(task_id=self.task().pk, user=self.owner)

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def matches_the_model(self):
        if self.state is None:
            assert not Task.objects.exists()
            return
        task = self.task()
        assert (task.state, task.attempts, task.max_attempts, task.replays) == (
            self.state, self.attempts, self.max_attempts, self.replays)
        assert task.attempts <= task.max_attempts

    @invariant()
    def history_is_legal(self):
        assert violations(require_terminal=False) == []


def test_the_task_state_machine_matches_its_model():
    run_state_machine_as_test(TaskMachine, settings=settings(
        max_examples=60, stateful_step_count=25, deadline=None, derandomize=True,
        # The database makes a step slow; that is not slow data generation. Every
        # other health check stays on.
        suppress_health_check=[HealthCheck.too_slow]))
