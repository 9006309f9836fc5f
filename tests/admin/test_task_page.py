"""The task page (workflows/admin/task_page.py, task_live.html): the order an
operator reads it in, long values kept inside their boxes, what a running
task is doing now, planned steps, honest step states, replays.

Running tasks are real: the engine's `task_run` runs a test workflow whose
step renders the page from inside its own body, while it really holds the
task (the worker entry point `run_task` would also reset connections, which a
test transaction cannot allow)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.conf import settings

from tests.admin.conftest import task_url
from tests.factories import make_task
from workflows.admin.text import timestamp
from workflows.engine.operations import task_cancel
from workflows.engine.replays import replays_fold
from workflows.engine.run import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskReplay
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db


def section_order(html: str, *markers: str) -> list[int]:
    return [html.index(m) for m in markers]


def step_rows(html: str) -> list[tuple[str, str]]:
    """(name, shown state) of each row of the steps table."""
    table = html.split('id="pilot-steps"')[1].split("</table>", maxsplit=1)[0]
    return re.findall(r'data-step="(\w+)" data-step-state="(\w+)"', table)


def test_the_page_reads_timeline_steps_error_history_first_and_folds_details(
        operator_client, owner):
    task = make_task(owner, state=S.FAILED)
    html = operator_client.get(task_url(task)).content.decode()
    positions = section_order(html, "<h2>Timeline</h2>", 'id="steps-group"', 'id="pilot-error"',
                              'id="transitions-group"', ">Payload<", ">Result<",
                              ">Run details<", ">Times (UTC)<")
    assert positions == sorted(positions)
    # Details are folded (<details>), and a finished task has no lease to show.
    details = html[html.index(">Run details<") - 200:]
    assert "<details>" in details and "field-lease_owner" not in html
    assert "field-lease_owner" in operator_client.get(
        task_url(make_task(owner, state=S.RUNNING))).content.decode()


def test_long_values_stay_inside_their_boxes(operator_client, owner, temp_workflow):
    """The page's markup for the browser test's width check: long output and
    error text sit in wrapping boxes (see test_browser for the measured width)."""
    wf = temp_workflow("t.long_output")
    wf.step(lambda ctx: {"text": "x" * 300}, name="long")
    task = task_trigger(owner=owner, key="long", workflow="t.long_output", payload={}).task
    task_run(task_id=str(task.pk))
    html = operator_client.get(task_url(task)).content.decode()
    cell = re.search(r'<td class="pilot-cell-json"><pre class="pilot-json">(.*?)</pre>', html,
                     re.S).group(1)
    assert "x" * 300 in cell


def test_a_running_step_shows_elapsed_heartbeat_progress_and_step_k_of_n(
        operator_client, owner, temp_workflow):
    pages = []
    wf = temp_workflow("t.watch_me", plan=lambda w, payload: w.steps[:payload["n"]])

    def first(ctx):
        return {"done": 1}

    def second(ctx):
        ctx.save_progress({"cursor": 1234})
        pages.append(operator_client.get(task_url(Task.objects.get(pk=ctx.task_id))))
        return {"done": 2}

    for name, body in (("load", first), ("walk", second), ("sum", first), ("send", first),
                       ("never", first)):
        wf.step(body, name=name)
    task = task_trigger(owner=owner, key="watch", workflow="t.watch_me", payload={"n": 4}).task
    task_run(task_id=str(task.pk))
    html = pages[0].content.decode()
    now_panel = html.split('id="pilot-now"')[1].split('id="steps-group"')[0]
    assert "Step 2 of 4: walk" in now_panel
    assert re.search(r'running for <span class="pilot-elapsed" id="pilot-elapsed" '
                     r'data-since="[^"]+">\d+ ms</span>', now_panel)
    assert "still to run: sum, send" in now_panel and "never" not in now_panel
    assert "saved progress: <code class=\"pilot-wrap\">{&quot;cursor&quot;: 1234}" in now_panel
    # Last heartbeat = lease expiry - PILOT_LEASE_SECONDS (each heartbeat renews the lease).
    running = pages[0].context["task"]
    heartbeat = running.lease_expires_at - timedelta(seconds=settings.PILOT_LEASE_SECONDS)
    assert "last heartbeat" in now_panel and timestamp(heartbeat) in now_panel
    # The steps table lists the planned steps not started yet.
    assert step_rows(html) == [("load", "succeeded"), ("walk", "running"), ("sum", "planned"),
                    ("send", "planned")]
    assert Task.objects.get(pk=task.pk).state == S.SUCCEEDED


def test_a_step_stopped_by_a_cancel_is_shown_cancelled_not_failed(
        operator_client, operator, owner, temp_workflow):
    wf = temp_workflow("t.stopped")

    def interrupted(ctx):
        task_cancel(task_id=ctx.task_id, user=operator, reason="stop it", owner_may=False)
        ctx.heartbeat(force=True)  # notices the cancel, as a long step would

    wf.step(interrupted, name="long_work")
    task = task_trigger(owner=owner, key="stop", workflow="t.stopped", payload={}).task
    task_run(task_id=str(task.pk))
    assert Task.objects.get(pk=task.pk).state == S.CANCELLED
    assert StepCheckpoint.objects.get(task_id=task.pk).state == "failed"  # as stored
    html = operator_client.get(task_url(task)).content.decode()
    assert step_rows(html) == [("long_work", "cancelled")]
    assert "pilot-state-failed" not in html.split('id="steps-group"')[1].split("</table>")[0]
    # The timeline draws it in the cancelled colour too.
    timeline = html.split('class="pilot-svg"')[1].split("</svg>")[0]
    assert 'data-step="long_work" data-step-state="cancelled"' in timeline


def test_steps_of_a_task_that_has_not_started_are_listed_as_planned(operator_client, owner):
    task = task_trigger(owner=owner, key="slow-plan", workflow="demo.slow",
                        payload={"steps": 3, "seconds": 0}).task
    html = operator_client.get(task_url(task)).content.decode()
    assert step_rows(html) == [
        ("s0", "planned"), ("s1", "planned"), ("s2", "planned")]
    assert "Waiting for a worker" in html and "To run: s0, s1, s2" in html


def test_a_plan_that_raises_or_an_unknown_workflow_is_said_not_a_500(operator_client, owner):
    broken = make_task(owner, workflow="demo.slow", payload={"no_steps": True})
    html = operator_client.get(task_url(broken)).content.decode()
    assert "The planned steps are unknown: its plan raised KeyError" in html
    assert "No step has run yet." in html
    gone = make_task(owner, workflow="retired.workflow")
    html = operator_client.get(task_url(gone)).content.decode()
    assert "workflow retired.workflow is not registered" in html
    assert "retired.workflow <span class=\"pilot-muted\">(not registered)</span>" in html


def test_replays_are_listed_with_when_and_who(operator_client, owner):
    task = task_trigger(owner=owner, key="twice", workflow="demo.echo", payload={"a": 1}).task
    for _ in range(2):
        task_trigger(owner=owner, key="twice", workflow="demo.echo", payload={"a": 1})
    html = operator_client.get(task_url(task)).content.decode()
    replays = html.split('id="pilot-replays"')[1].split("</table>")[0]
    assert "2 duplicate trigger(s)" in replays and "<strong>client-a</strong>" in replays
    assert replays.count("<td>1</td>") == 2
    TaskReplay.objects.filter(task=task).update(at=task.created_at - timedelta(hours=2))
    replays_fold()  # one hour's calls become one row: its last, and how many
    html = operator_client.get(task_url(task)).content.decode()
    replays = html.split('id="pilot-replays"')[1].split("</table>")[0]
    assert "2 duplicate trigger(s)" in replays and replays.count("<td>2</td>") == 1


def test_the_workflow_links_to_its_page_and_its_other_tasks(operator_client, owner):
    task = make_task(owner, workflow="demo.saga", payload={"fail": False})
    html = operator_client.get(task_url(task)).content.decode()
    assert 'href="/admin/workflows/task/workflows/#workflow-demosaga"' in html
    assert 'href="/admin/workflows/task/?workflow=demo.saga">its tasks</a>' in html


def test_each_failed_attempt_shows_its_exception_and_traceback(operator_client, owner,
                                                               temp_workflow):
    """A flaky step that fails twice then for good: three attempts, each with
    its type, message and traceback, newest first and credentials masked."""
    from workflows.rules.errors import NonRetryableError, RetryableError

    wf = temp_workflow("t.flaky_charge", max_attempts=3)

    def charge(ctx):
        if ctx.attempt < 3:
            raise RetryableError(f"gateway timeout on attempt {ctx.attempt}")
        raise NonRetryableError("card declined at https://pay:s3cret@gw.example/charge")

    wf.step(charge, name="charge")
    task = task_trigger(owner=owner, key="flaky", workflow="t.flaky_charge", payload={}).task
    for _ in range(3):
        Task.objects.filter(pk=task.pk).update(next_attempt_at=None)  # the backoff, skipped
        task_run(task_id=str(task.pk))
    assert Task.objects.get(pk=task.pk).state == S.FAILED
    html = operator_client.get(task_url(task)).content.decode()
    section = html.split('id="pilot-failures"')[1].split("</table>")[0]
    assert re.findall(r'data-failure-attempt="(\d+)" data-failure-step="(\w+)"', section) == [
        ("3", "charge"), ("2", "charge"), ("1", "charge")]
    assert "<code>NonRetryableError</code>: card declined" in section
    assert "gateway timeout on attempt 1" in section
    assert section.count("Traceback (most recent call last)") == 3
    assert "in charge" in section  # the step's own frame
    assert "s3cret" not in html and "pay:********@gw.example" in section
    # The steps table still reads as before; the failures sit before the error box.
    assert section_order(html, 'id="steps-group"', 'id="pilot-failures"',
                         'id="pilot-error"') == sorted(section_order(
                             html, 'id="steps-group"', 'id="pilot-failures"', 'id="pilot-error"'))


def test_a_malformed_failure_entry_reads_as_empty_not_a_500(operator_client, owner):
    task = make_task(owner, state=S.FAILED)
    StepCheckpoint.objects.create(task=task, index=0, name="echo", state="failed",
                                  failures=[{"attempt": "x"}, {"at": "not a time"}])
    r = operator_client.get(task_url(task))
    assert r.status_code == 200
    assert r.content.decode().count("data-failure-attempt=") == 2
