"""The run timeline (workflows/admin/pictures/timeline.py), from a real retried run."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from tests.support.helpers import drain
from workflows.admin.phases import retry_delay
from workflows.admin.task_page import task_page
from workflows.admin.text import seconds_text
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition

# transaction=True: with the Redis broker an enqueue happens on commit.
pytestmark = pytest.mark.django_db(transaction=True)


def draw(task) -> str:
    return str(task_page(task, now=timezone.now())["timeline_svg"])


def lanes(svg: str) -> list[tuple[str, str]]:
    return re.findall(r'data-state="(\w+)" data-phase="([\w+]+)"', svg)


def test_a_retried_run_shows_each_attempt_each_backoff_and_each_wait(owner):
    task = task_trigger(owner=owner, key="f", workflow="demo.flaky",
                        payload={"fail_times": 2}).task
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    svg = draw(task)
    drawn = lanes(svg)
    states = [s for i, (s, _) in enumerate(drawn) if i == 0 or drawn[i - 1][0] != s]
    assert states == ["pending", "running", "retrying", "running", "retrying", "running",
                      "succeeded"]
    assert drawn[0] == ("pending", "queued")  # created, not yet taken by a worker
    # Each wait after a failure starts with exactly the backoff the runner chose.
    retries = TaskTransition.objects.filter(task_id=task.pk, transition="schedule_retry")
    assert retries.count() == 2
    for retry in retries:
        delay = retry_delay(retry.reason).total_seconds()
        assert f"<title>backoff (schedule_retry by {retry.actor}) {seconds_text(delay)}" in svg
    assert next(p for s, p in drawn if s == "retrying") == "backoff"
    assert svg.count("(claim by worker:") == 3
    assert re.findall(r'data-step="(\w+)"', svg) == ["attempt"]
    assert "attempt: succeeded, 3 attempt(s)" in svg


def test_an_unstarted_task_draws_up_to_now_and_escapes_names(owner, temp_workflow):
    wf = temp_workflow("t.timeline_escape")
    wf.step(lambda ctx: None, name="a-b_c")
    task = task_trigger(owner=owner, key="<b>key</b>", workflow="t.timeline_escape",
                        payload={}).task
    StepCheckpoint.objects.create(task=task, index=0, name="a-b_c")
    svg = draw(task)
    assert lanes(svg) == [("pending", "queued")]
    assert "(now)" in svg and "pending, not started" in svg
    assert "<b>" not in svg
