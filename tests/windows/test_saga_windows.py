"""The compensation phase at its hard windows (docs/design.md, "Compensation"):
a cancel while a failed saga compensates, a compensation that kills its
worker, a poison task with something to undo, a crash in the middle of the
failure's compensations, and the compensation's own key and progress.

Each window is opened deterministically: a compensation that waits for the
test, a fault point, a hook run at a fault point. Runs on SQLite and
PostgreSQL."""

import threading
import uuid

import pytest
from django.conf import settings

from tests.support.helpers import (
    audit,
    drain,
    expire_lease,
    in_thread,
    ledger,
    pop_queued,
    wait_for,
)
from workflows.engine import faults
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_cancel
from workflows.engine.run import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task
from workflows.rules.errors import InvalidTransition, NonRetryableError, RetryableError
from workflows.rules.states import StepState
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


def steps(task) -> list[tuple[str, str]]:
    return list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index")
                .values_list("name", "state"))


def trigger(owner, workflow, payload=None):
    return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                        payload=payload or {}).task


ON_SQLITE = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"


@pytest.mark.parametrize("atomic", [
    False,
    pytest.param(True, marks=pytest.mark.skipif(
        ON_SQLITE, reason="SQLite has one writer: the cancel waits for the atomic "
                          "compensation's transaction, the window cannot open (the test "
                          "below holds what does happen there)"))], ids=["plain", "atomic"])
def test_a_cancel_while_a_failed_saga_compensates_is_refused_and_nothing_runs_twice(
        owner, temp_workflow, atomic):
    """Item 1 of the review: the owner cancels while the refund of a saga that
    failed for good is in flight. The task is `compensating` — a durable phase
    that a cancel cannot restart — so the cancel is refused and each
    compensation runs exactly once."""
    calls = []
    refund_started, cancel_done = threading.Event(), threading.Event()
    wf = temp_workflow("t.saga_cancel", max_attempts=1)

    def release(ctx):
        calls.append("release")

    def refund(ctx):
        calls.append("refund")
        refund_started.set()
        assert cancel_done.wait(30)

    wf.add_step("reserve", lambda ctx: "r", compensation=release, compensation_atomic=atomic)
    wf.add_step("charge", lambda ctx: "c", compensation=refund, compensation_atomic=atomic)

    @wf.step
    def confirm(ctx):
        raise NonRetryableError("refused")

    task = trigger(owner, "t.saga_cancel")
    [message] = pop_queued()
    worker = threading.Thread(target=lambda: in_thread(lambda: run_task(message)))
    worker.start()
    try:
        assert refund_started.wait(30)
        assert Task.objects.get(pk=task.pk).state == S.COMPENSATING
        with pytest.raises(InvalidTransition, match="already undoing its work"):
            task_cancel(task_id=task.pk, user=owner)
    finally:
        cancel_done.set()
        worker.join(30)
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "NonRetryableError")
    assert calls == ["refund", "release"]
    assert steps(task) == [("reserve", "compensated"), ("charge", "compensated"),
                           ("confirm", "failed")]
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "compensate", "fail"]


@pytest.mark.skipif(not ON_SQLITE, reason="SQLite's single writer")
def test_on_sqlite_a_cancel_waits_for_an_atomic_compensation_and_runs_nothing_twice(
        owner, temp_workflow):
    """On SQLite an atomic compensation holds the only write lock from its BEGIN
    (docs/design.md, "SQLite"): the owner's cancel waits for its COMMIT, then is
    refused (the task is still undoing its work, or has failed by then); each
    compensation ran exactly once."""
    import time

    calls = []
    refund_started = threading.Event()
    wf = temp_workflow("t.saga_cancel_sqlite", max_attempts=1)

    def release(ctx):
        calls.append("release")

    def refund(ctx):
        calls.append("refund")
        refund_started.set()
        time.sleep(0.5)  # inside its transaction: the cancel has to wait for this

    wf.add_step("reserve", lambda ctx: "r", compensation=release, compensation_atomic=True)
    wf.add_step("charge", lambda ctx: "c", compensation=refund, compensation_atomic=True)

    @wf.step
    def confirm(ctx):
        raise NonRetryableError("refused")

    task = trigger(owner, "t.saga_cancel_sqlite")
    [message] = pop_queued()
    worker = threading.Thread(target=lambda: in_thread(lambda: run_task(message)))
    worker.start()
    try:
        assert refund_started.wait(30)
        started = time.monotonic()
        with pytest.raises(InvalidTransition):
            task_cancel(task_id=task.pk, user=owner)
        assert time.monotonic() - started >= 0.3  # it queued behind the compensation
    finally:
        worker.join(30)
    task.refresh_from_db()
    assert (task.state, task.error_type) == (S.FAILED, "NonRetryableError")
    assert calls == ["refund", "release"]
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "compensate", "fail"]


def test_the_demo_saga_ledger_holds_each_effect_once_when_it_fails(owner):
    task = trigger(owner, "demo.saga", {"fail": True})
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert task.state == S.FAILED
    assert ledger(task.pk) == ["reserve", "charge", "refund", "release"]
    assert steps(task) == [("reserve", "compensated"), ("charge", "compensated"),
                           ("confirm", "failed")]


@pytest.mark.parametrize("phase", ["cancel", "failure"])
def test_a_compensation_that_kills_its_worker_is_given_up_after_max_attempts(
        owner, temp_workflow, phase):
    """Item 5: every take-over of the phase counts the compensation's attempt
    before its body runs, so one that kills its worker each time ends
    `compensation_failed` after max_attempts — the task ends, the rest of the
    saga still runs."""
    runs, undone = [], []
    wf = temp_workflow("t.poison_comp", max_attempts=2, backoff_initial=0, backoff_max=0)

    def die(ctx):
        runs.append(ctx.step_key)
        raise faults.SimulatedCrash("the compensation kills its worker")

    wf.add_step("a", lambda ctx: 1, compensation=lambda ctx: undone.append("a"))
    wf.add_step("b", lambda ctx: 2, compensation=die)

    @wf.step
    def c(ctx):
        raise (RetryableError if phase == "cancel" else NonRetryableError)("not now")

    task = trigger(owner, "t.poison_comp")
    [message] = pop_queued()
    if phase == "cancel":
        assert run_task(message) == "retrying"
        assert task_cancel(task_id=task.pk, user=owner).state == S.CANCELLING
        [message] = pop_queued()
    for _ in range(2):  # the first run, then one take-over: both die in `b`'s compensation
        with pytest.raises(faults.SimulatedCrash):
            run_task(message)
        expire_lease(task.pk)
        assert dispatch_once().compensations_enqueued == 1
        [message] = pop_queued()
    assert run_task(message) == ("cancelled" if phase == "cancel" else "failed")
    task.refresh_from_db()
    assert task.error_type == "CompensationFailed"
    assert "steps left uncompensated: b (gave up after 2 attempt(s)" in task.error
    assert len(runs) == 2 and set(runs) == {f"{task.pk}:b:compensate"}
    assert undone == ["a"]  # the remaining compensation still ran, once
    cps = {cp.name: cp for cp in StepCheckpoint.objects.filter(task_id=task.pk)}
    assert (cps["b"].state, cps["b"].compensation_attempts) == (
        StepState.COMPENSATION_FAILED, 2)
    assert cps["a"].state == StepState.COMPENSATED
    assert pop_queued() == [] and dispatch_once().actions == 0


def test_a_poison_task_with_steps_to_undo_is_compensated_then_fails(owner, temp_workflow):
    """Item 6, first half: a task whose worker dies on every attempt ends —
    through the dispatcher's `compensate` — with its succeeded steps undone."""
    undone = []
    wf = temp_workflow("t.poison_saga", max_attempts=2, backoff_initial=0, backoff_max=0)
    wf.add_step("charge", lambda ctx: "charged", compensation=lambda ctx: undone.append(
        ("refund", ctx.output)))

    @wf.step
    def confirm(ctx):
        raise faults.SimulatedCrash("kills the worker")

    task = trigger(owner, "t.poison_saga")
    for _ in range(2):
        messages = pop_queued() or (dispatch_once(), pop_queued())[1]
        with pytest.raises(faults.SimulatedCrash):
            run_task(messages[0])
        expire_lease(task.pk)
    report = dispatch_once()
    assert report.compensations_started == 1
    assert Task.objects.get(pk=task.pk).state == S.COMPENSATING
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert (task.state, task.attempts, task.error_type) == (S.FAILED, 2, "LeaseExpired")
    assert undone == [("refund", "charged")]
    assert steps(task) == [("charge", "compensated"), ("confirm", "failed")]
    assert [t for t, _, _ in audit(task.pk)] == [
        "claim", "recover", "claim", "compensate", "resume", "fail"]


def test_a_crash_while_a_failure_compensates_resumes_the_compensations_not_the_steps(
        owner, temp_workflow):
    """Item 6, second half: the decision "failed for good, compensate" is
    durable (`compensating`), so a crash in the middle hands the phase to
    another worker; nothing runs forward again and nothing is undone twice."""
    log = []
    crash = [True]
    wf = temp_workflow("t.crash_comp", max_attempts=3, backoff_initial=0, backoff_max=0)

    def release(ctx):
        log.append("release")
        if crash[0]:
            crash[0] = False
            raise faults.SimulatedCrash("the worker dies while compensating")

    @wf.step(compensation=release)
    def reserve(ctx):
        log.append("reserve")

    @wf.step(compensation=lambda ctx: log.append("refund"))
    def charge(ctx):
        log.append("charge")

    @wf.step
    def confirm(ctx):
        log.append("confirm")
        raise NonRetryableError("permanently refused")

    task = trigger(owner, "t.crash_comp")
    [message] = pop_queued()
    with pytest.raises(faults.SimulatedCrash):
        run_task(message)
    assert Task.objects.get(pk=task.pk).state == S.COMPENSATING
    expire_lease(task.pk)
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    assert (task.state, task.attempts) == (S.FAILED, 1)
    # release ran twice: its first run died before its record (at least once
    # for a plain compensation, with the same key); refund ran once.
    assert log == ["reserve", "charge", "confirm", "refund", "release", "release"]
    assert StepCheckpoint.objects.get(task_id=task.pk, name="reserve").compensation_attempts \
        == 2


def test_a_compensation_has_its_own_key_and_fenced_progress(owner, temp_workflow):
    """Item 11: a refund never reuses the charge's idempotency key, and
    save_progress works inside a compensation (it is fenced on the token, not
    on the task being `running`)."""
    seen = {}
    wf = temp_workflow("t.comp_ctx", max_attempts=1)

    def refund(ctx):
        seen["refund_key"] = ctx.step_key
        ctx.save_progress({"refunded": "half"})
        seen["progress"] = ctx.progress
        seen["compensating"] = ctx.compensating

    @wf.step(compensation=refund)
    def charge(ctx):
        seen["charge_key"] = ctx.step_key
        return "charged"

    @wf.step
    def confirm(ctx):
        raise NonRetryableError("no")

    task = trigger(owner, "t.comp_ctx")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert seen == {"charge_key": f"{task.pk}:charge",
                    "refund_key": f"{task.pk}:charge:compensate",
                    "progress": {"refunded": "half"}, "compensating": True}
    cp = StepCheckpoint.objects.get(task_id=task.pk, name="charge")
    assert (cp.state, cp.progress) == (StepState.COMPENSATED, {"refunded": "half"})


def test_a_cancel_between_the_claim_and_the_first_step_starts_no_step(owner, temp_workflow):
    """Item 11: the first step does not start when a cancel landed after the
    claim; the run notices at its first (fenced) write and ends the cancel."""
    ran = []
    wf = temp_workflow("t.late_cancel")
    wf.add_step("only", lambda ctx: ran.append("only"))
    task = trigger(owner, "t.late_cancel")
    [message] = pop_queued()
    with faults.on("after_claim", lambda: task_cancel(task_id=task.pk, user=owner)):
        report = task_run(task_id=message, worker="w")
    assert (report.outcome, ran) == ("cancelled", [])
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "cancel", "resume", "finish_cancel"]


def test_a_retry_of_a_compensated_task_runs_the_undone_steps_again(owner, temp_workflow):
    """After a saga was undone, retrying it resumes from its checkpoints: the
    compensated steps run again (their effect was undone), and a new failure
    compensates them again — each compensation once per run."""
    calls = []
    fail = [True]
    wf = temp_workflow("t.redo", max_attempts=1)
    wf.add_step("reserve", lambda ctx: calls.append("reserve"),
                compensation=lambda ctx: calls.append("release"))

    @wf.step
    def confirm(ctx):
        calls.append("confirm")
        if fail[0]:
            raise NonRetryableError("no")

    task = trigger(owner, "t.redo")
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert calls == ["reserve", "confirm", "release"]
    fail[0] = False
    from workflows.engine.operations import task_retry

    task_retry(task_id=task.pk, user=owner)
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED
    assert calls == ["reserve", "confirm", "release", "reserve", "confirm"]
    assert steps(task) == [("reserve", "succeeded"), ("confirm", "succeeded")]


def test_a_retryable_compensation_error_waits_its_backoff_then_any_worker_resumes(
        owner, temp_workflow):
    attempts = []
    wf = temp_workflow("t.comp_retry", max_attempts=3, backoff_initial=0, backoff_max=0)

    def refund(ctx):
        attempts.append(ctx.step_key)
        if len(attempts) == 1:
            raise RetryableError("refund API busy")

    wf.add_step("charge", lambda ctx: 1, compensation=refund)

    @wf.step
    def confirm(ctx):
        raise NonRetryableError("no")

    task = trigger(owner, "t.comp_retry")
    [message] = pop_queued()
    assert run_task(message) == "deferred"
    task.refresh_from_db()
    assert task.state == S.COMPENSATING and task.lease_owner == ""
    wait_for(lambda: dispatch_once().compensations_enqueued == 1)
    [message] = pop_queued()
    assert task_run(task_id=message, worker="another").outcome == "failed"
    assert len(attempts) == 2
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "compensate", "defer", "resume",
                                                 "fail"]


def _saga_that_defers_after_giving_up(temp_workflow, name, *, cancel_by=None):
    """reserve (its release fails retryably once: the phase is deferred), charge
    (its refund never works: given up before the defer), confirm (fails for good,
    or — `cancel_by` — is cancelled by that user while it runs)."""
    calls = []
    wf = temp_workflow(name, max_attempts=3, backoff_initial=0, backoff_max=0)

    def release(ctx):
        calls.append("release")
        if calls.count("release") == 1:
            raise RetryableError("inventory API busy")

    def refund(ctx):
        calls.append("refund")
        raise NonRetryableError("card closed")

    wf.add_step("reserve", lambda ctx: "r", compensation=release)
    wf.add_step("charge", lambda ctx: "c", compensation=refund)

    @wf.step
    def confirm(ctx):
        if cancel_by is not None:
            task_cancel(task_id=ctx.task_id, user=cancel_by)
            ctx.heartbeat(force=True)  # notices the cancel
        raise NonRetryableError("confirmation refused")

    return calls


@pytest.mark.parametrize("phase", ["failure", "cancel"])
def test_a_compensation_given_up_before_a_defer_is_named_in_the_tasks_ending(
        owner, temp_workflow, phase):
    """Review turn 3, F6: the phase spans runs — refund is given up, release is
    deferred, a second worker resumes and compensates release. The ending must
    still say that the charge was never refunded (it is read from the stored
    checkpoints, not from the run that gave it up)."""
    calls = _saga_that_defers_after_giving_up(
        temp_workflow, f"t.comp_report_{phase}", cancel_by=owner if phase == "cancel" else None)
    task = trigger(owner, f"t.comp_report_{phase}")
    [message] = pop_queued()
    assert task_run(task_id=message, worker="w").outcome == "deferred"
    wait_for(lambda: dispatch_once().compensations_enqueued == 1)
    [message] = pop_queued()
    ended = task_run(task_id=message, worker="another").outcome
    assert calls == ["refund", "release", "release"]  # the window: given up, deferred, resumed
    assert [t for t, _, _ in audit(task.pk)][-3:] == ["defer", "resume",
                                                      "fail" if phase == "failure"
                                                      else "finish_cancel"]
    task.refresh_from_db()
    assert steps(task)[:2] == [("reserve", StepState.COMPENSATED),
                               ("charge", StepState.COMPENSATION_FAILED)]
    assert (ended, task.state) == (("failed", S.FAILED) if phase == "failure"
                                   else ("cancelled", S.CANCELLED))
    assert task.error_type == "CompensationFailed"
    assert "steps left uncompensated: charge (NonRetryableError: card closed)" in task.error
    assert "reserve" not in task.error.split("uncompensated:")[1]
    if phase == "failure":
        assert task.error.startswith("NonRetryableError: confirmation refused; then ")


def test_a_cancel_noticed_at_a_plain_steps_record_compensates_that_step(owner, temp_workflow):
    """The take-over after a cancel records the step that was in flight: a plain
    step whose body returned — its effect happened — is recorded succeeded and
    compensated; only a body the cancel interrupted is recorded failed. Review
    turn 3's mutant M5 recorded every in-flight step failed, so a finished
    plain step's effect was never undone (demo.saga's steps are all atomic: they
    roll back instead, and no test of this file reached the branch)."""
    undone = []
    wf = temp_workflow("t.cancel_at_record")

    @wf.step(compensation=lambda ctx: undone.append(ctx.output))
    def reserve(ctx):
        return {"reserved": 1}

    @wf.step(compensation=lambda ctx: undone.append(ctx.output))
    def charge(ctx):
        task_cancel(task_id=ctx.task_id, user=owner)
        return {"charged": 5}  # the effect happened; its record finds the cancel

    @wf.step
    def ship(ctx):
        raise AssertionError("no step starts after a cancel")

    task = trigger(owner, "t.cancel_at_record")
    [message] = pop_queued()
    assert task_run(task_id=message, worker="w").outcome == "cancelled"
    assert undone == [{"charged": 5}, {"reserved": 1}]  # last step first
    assert steps(task) == [("reserve", StepState.COMPENSATED),
                           ("charge", StepState.COMPENSATED)]
    assert [t for t, _, _ in audit(task.pk)] == ["claim", "cancel", "resume", "finish_cancel"]
