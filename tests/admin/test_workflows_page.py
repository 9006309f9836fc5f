"""The workflows page and its state diagram (workflows_page.py, diagram.py)."""

from __future__ import annotations

import re

import pytest

from tests.factories import make_task, transition_kwargs
from workflows.admin.pictures.diagram import POSITIONS, state_edges
from workflows.engine.store import store
from workflows.models import Task
from workflows.rules.states import TaskState as S

pytestmark = pytest.mark.django_db

URL = "/admin/workflows/task/workflows/"


def test_every_workflow_is_listed_with_steps_and_policies(operator_client):
    html = operator_client.get(URL).content.decode()
    for name in ("demo.echo", "demo.sync_orders", "demo.flaky", "demo.slow", "demo.saga"):
        assert f'data-workflow="{name}"' in html
    saga = html.split('data-workflow="demo.saga"')[1].split('data-workflow=')[0]
    assert "at most 3 attempt(s); backoff 100 ms × 2.0" in saga
    assert "24 h after the task finishes" in saga  # the TTL as a duration
    assert re.search(r"reserve</td>\s*<td>yes — exactly once</td>\s*<td>release", saga)
    sync = html.split('data-workflow="demo.sync_orders"')[1].split('data-workflow=')[0]
    assert re.search(r"write</td>\s*<td>yes — exactly once", sync)
    assert "<code>count</code> (integer)" in sync and "step_seconds</code> (number, optional)" \
        in sync


def test_the_diagram_draws_exactly_the_models_transitions(operator_client):
    html = operator_client.get(URL).content.decode()
    drawn = set(re.findall(r'data-edge="(\w+)-(\w+)"', html))
    expected = {
        (S.PENDING, S.RUNNING), (S.RETRYING, S.RUNNING), (S.RUNNING, S.SUCCEEDED),
        (S.RUNNING, S.RETRYING), (S.RUNNING, S.FAILED), (S.PENDING, S.CANCELLING),
        (S.RETRYING, S.CANCELLING), (S.RUNNING, S.CANCELLING), (S.PENDING, S.CANCELLED),
        (S.RETRYING, S.CANCELLED), (S.CANCELLING, S.CANCELLED), (S.FAILED, S.PENDING),
        (S.CANCELLED, S.PENDING), (S.RUNNING, S.COMPENSATING), (S.COMPENSATING, S.FAILED),
        # a wait step parks; a signal or a due timer wakes; a waiting task is cancellable
        (S.RUNNING, S.WAITING), (S.WAITING, S.PENDING), (S.WAITING, S.CANCELLED),
        (S.WAITING, S.CANCELLING),
        # the workers are stopping: a finished step's task is released
        (S.RUNNING, S.PENDING),
        # resume and defer keep the state (the token moves on): drawn as loops
        (S.COMPENSATING, S.COMPENSATING), (S.CANCELLING, S.CANCELLING),
    }
    assert drawn == {(str(a), str(b)) for a, b in expected}
    assert set(re.findall(r'data-node="(\w+)"', html)) == set(S.values) == set(POSITIONS)
    edges = state_edges()
    assert edges[(S.RUNNING, S.RETRYING)]["names"] == ["recover", "schedule_retry"]
    assert edges[(S.FAILED, S.PENDING)]["permission"] == "workflows.retry_task"
    assert edges[(S.PENDING, S.RUNNING)]["permission"] is None


def test_the_diagram_has_exactly_the_edges_the_model_declares(owner):
    """A running task is only ever cancelled through `cancelling`: the model
    declares no running -> cancelled edge, so the diagram draws none."""
    assert (S.RUNNING, S.CANCELLED) not in state_edges()
    assert state_edges()[(S.RUNNING, S.CANCELLING)]["names"] == ["cancel"]
    for needs_compensation in (False, True):
        task = make_task(owner, state=S.RUNNING)
        store().transition(task, "cancel", at=task.updated_at, actor="test", **{
            **transition_kwargs("cancel"), "needs_compensation": needs_compensation})
        assert Task.objects.get(pk=task.pk).state == S.CANCELLING
