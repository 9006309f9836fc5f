"""The run timeline (workflows/admin/timeline.py), from a real retried run."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from tests.helpers import drain
from workflows.admin.timeline import task_timeline
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task, TaskTransition

# transaction=True: with the Redis broker an enqueue happens on commit.
pytestmark = pytest.mark.django_db(transaction=True)


def draw(task):
    transitions = list(TaskTransition.objects.filter(task_id=task.pk).order_by("at", "id"))
    steps = list(StepCheckpoint.objects.filter(task_id=task.pk).order_by("index"))
    return str(task_timeline(task, transitions, steps, now=timezone.now()))


def test_a_retried_run_shows_each_attempt_each_wait_and_each_step(owner):
    task = task_trigger(owner=owner, key="f", workflow="demo.flaky",
                        payload={"fail_times": 2}).task
    drain(lambda: Task.objects.get(pk=task.pk).is_finished)
    task.refresh_from_db()
    svg = draw(task)
    lanes = re.findall(r'data-state="(\w+)"', svg)
    assert lanes == ["pending", "running", "retrying", "running", "retrying", "running",
                     "succeeded"]
    assert svg.count("<title>running (claim by worker:") == 3
    assert re.findall(r'data-step="(\w+)"', svg) == ["attempt"]
    assert "attempt: succeeded, 3 attempt(s)" in svg


def test_an_unstarted_task_draws_up_to_now_and_escapes_names(owner, temp_workflow):
    wf = temp_workflow("t.timeline_escape")
    wf.step(lambda ctx: None, name="a-b_c")
    task = task_trigger(owner=owner, key="<b>key</b>", workflow="t.timeline_escape",
                        payload={}).task
    StepCheckpoint.objects.create(task=task, index=0, name="a-b_c")
    svg = draw(task)
    assert re.findall(r'data-state="(\w+)"', svg) == ["pending"]
    assert "(now)" in svg and "pending, not started" in svg
    assert "<b>" not in svg
