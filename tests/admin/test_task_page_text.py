"""The task page says what is true (review 3, ux.md C6): a cancel that is
compensating says so and which step; a cancel with nothing to run says that;
a cancel's reason names the compensations that ran, or none; after a retry the
attempts and "took" are the current run's; no Python None; one time format
in the lease-expiry reasons."""

from __future__ import annotations

import re

import pytest

from tests.admin.conftest import task_url
from tests.factories import make_task
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_cancel, task_expire_lease, task_retry
from workflows.engine.run import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import Task, TaskTransition
from workflows.rules.errors import NonRetryableError
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

ISO_Z = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def now_panel(html: str) -> str:
    return html.split('id="pilot-now"')[1].split('id="steps-group"', maxsplit=1)[0]


def last_reason(task) -> str:
    return TaskTransition.objects.filter(task_id=task.pk).order_by("-id").first().reason


def test_a_cancelled_saga_running_its_compensations_says_which_step_it_undoes(
        operator_client, operator, owner, temp_workflow):
    pages = []
    wf = temp_workflow("t.undo_me")

    def undo(ctx):
        pages.append(operator_client.get(task_url(Task.objects.get(pk=ctx.task_id))))

    def cancel_me(ctx):
        task_cancel(task_id=ctx.task_id, user=operator, reason="stop", owner_may=False)
        ctx.heartbeat(force=True)  # notices the cancel

    wf.step(lambda ctx: 1, name="reserve", compensation=undo)
    wf.step(lambda ctx: 2, name="charge", compensation=undo)
    wf.step(cancel_me, name="confirm")
    task = task_trigger(owner=owner, key="undo", workflow="t.undo_me", payload={}).task
    task_run(task_id=str(task.pk))
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED
    first, second = (now_panel(p.content.decode()) for p in pages)
    assert "Compensating step 2 of 3: charge</strong> (undo: <code>undo</code>)" in first
    assert "still to undo: reserve" in first
    assert "Compensating step 1 of 3: reserve" in second and "still to undo" not in second
    for panel in (first, second):
        assert "between steps" not in panel and "the last planned step" not in panel
    assert last_reason(task) == ("cancel finished: step confirm ended in flight; "
                                 "compensated charge, reserve")


def test_a_cancel_without_compensations_says_there_was_nothing_to_compensate(
        operator, owner, temp_workflow):
    wf = temp_workflow("t.plain_cancel")

    def cancel_me(ctx):
        task_cancel(task_id=ctx.task_id, user=operator, reason="stop", owner_may=False)
        ctx.heartbeat(force=True)

    wf.step(cancel_me, name="long_work")
    task = task_trigger(owner=owner, key="plain", workflow="t.plain_cancel", payload={}).task
    task_run(task_id=str(task.pk))
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED
    assert last_reason(task) == ("cancel finished: step long_work ended in flight; "
                                 "nothing to compensate")


def test_a_cancel_whose_worker_is_gone_says_nothing_runs_not_between_steps(
        operator_client, owner):
    task = make_task(owner, state=S.CANCELLING)  # claimed, cancelled; its worker never wrote
    panel = now_panel(operator_client.get(task_url(task)).content.decode())
    assert "No step is running and nothing needs compensating" in panel
    assert "once its lease expires" in panel
    assert "between steps" not in panel and "the last planned step" not in panel


def test_after_a_retry_from_start_attempts_and_took_are_the_runs_own(
        operator_client, operator, owner, temp_workflow):
    failing = {"yes": True}
    wf = temp_workflow("t.retried", max_attempts=3)

    def once(ctx):
        if failing["yes"]:
            raise NonRetryableError("down")
        return {"ok": True}

    wf.step(once, name="only")
    task = task_trigger(owner=owner, key="retried", workflow="t.retried", payload={}).task
    task_run(task_id=str(task.pk))
    assert Task.objects.get(pk=task.pk).state == S.FAILED
    failing["yes"] = False
    task_retry(task_id=task.pk, user=operator, from_start=True)
    task_run(task_id=str(task.pk))
    task.refresh_from_db()
    assert (task.state, task.attempts, task.max_attempts) == (S.SUCCEEDED, 2, 4)
    html = operator_client.get(task_url(task)).content.decode()
    attempts = html.split('class="field-attempts"')[1].split("</dd>")[0]
    assert "1 of 3 in this run, since its retry" in attempts and "(2 over its life)" in attempts
    finished = html.split('class="field-finished"')[1].split("</dd>")[0]
    assert "(this run, from its first claim after the retry)" in finished


def test_a_task_never_replayed_says_never_not_none(operator_client, owner):
    html = operator_client.get(task_url(make_task(owner, state=S.SUCCEEDED))).content.decode()
    field = html.split("field-last_replayed")[1].split('class="form-row')[0]
    assert "Last replayed at:" in field and '<div class="readonly">never</div>' in field
    assert not re.search(r">\s*None\s*<", html)


def test_a_lease_expiry_reason_uses_the_pages_time_format(operator_client, owner):
    task = make_task(owner, state=S.RUNNING)
    task_expire_lease(task_id=task.pk)
    dispatch_once()
    reason = last_reason(task)
    assert re.fullmatch(rf"lease held by test-worker expired at {ISO_Z}; retry in [\d.]+s",
                        reason), reason
    assert reason in operator_client.get(task_url(task)).content.decode()
