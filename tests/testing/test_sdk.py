"""workflows.sdk (issue 13 item 6): an author's workflow module needs nothing
from PILOT but `workflows.sdk`, and what the SDK hands out are the engine's own
objects, not copies that could drift."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import textwrap

import pytest

from workflows import sdk
from workflows.registry import registry
from workflows.rules.errors import ValidationFailed
from workflows.rules.states import TaskState as S
from workflows.testing import run_workflow

# An author's pilot_workflows.py: a payload serializer of JSON fields, a plain
# step that retries once, an atomic step, a compensation, and a step that fails
# for good when asked to, so the compensation runs.
AUTHOR_MODULE = textwrap.dedent('''
    from rest_framework import serializers

    from workflows.sdk import (
        JSONBoolean,
        JSONInteger,
        JSONString,
        NonRetryableError,
        RetryableError,
        StepContext,
        define_workflow,
    )

    calls: list[str] = []


    class ShipPayload(serializers.Serializer):
        order = JSONString(max_length=20)
        quantity = JSONInteger(min_value=1)
        refuse = JSONBoolean(required=False, default=False)


    ship = define_workflow("sdk_author.ship", max_attempts=3, backoff_initial=0.01,
                           key_fields=("order",), payload_serializer=ShipPayload)


    def release(ctx: StepContext) -> None:
        calls.append(f"release {ctx.output['reserved']} for {ctx.step_key}")


    @ship.step(compensation=release)
    def reserve(ctx: StepContext) -> dict:
        calls.append(f"reserve attempt {ctx.attempt}")
        if ctx.attempt == 1:
            raise RetryableError("the warehouse timed out")
        return {"reserved": ctx.payload["quantity"]}


    @ship.step(atomic=True)
    def label(ctx: StepContext) -> str:
        return f"{ctx.payload['order']}x{ctx.outputs['reserve']['reserved']}"


    @ship.step
    def hand_over(ctx: StepContext) -> str:
        if ctx.payload.get("refuse"):
            raise NonRetryableError("the carrier refused the parcel")
        return ctx.outputs["label"]
''')


@pytest.fixture
def author_module(tmp_path, monkeypatch):
    """The module above, imported as an app's module would be; its workflow is
    unregistered afterwards."""
    (tmp_path / "sdk_author_workflows.py").write_text(AUTHOR_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("sdk_author_workflows")
    yield module
    registry.unregister("sdk_author.ship")
    sys.modules.pop("sdk_author_workflows", None)


def test_the_author_module_imports_nothing_of_pilot_but_the_sdk():
    imported = set()
    for node in ast.walk(ast.parse(AUTHOR_MODULE)):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert {m for m in imported if m.split(".")[0] == "workflows"} == {"workflows.sdk"}


@pytest.mark.django_db
def test_a_workflow_written_against_the_sdk_retries_checkpoints_and_succeeds(author_module):
    task = run_workflow("sdk_author.ship", {"order": "o-7", "quantity": 2})
    assert (task.state, task.result, task.attempts) == (S.SUCCEEDED, "o-7x2", 2)
    assert [(s.name, s.state) for s in task.steps.all()] == [
        ("reserve", "succeeded"), ("label", "succeeded"), ("hand_over", "succeeded")]
    assert author_module.calls == ["reserve attempt 1", "reserve attempt 2"]


@pytest.mark.django_db
def test_its_non_retryable_error_fails_the_task_and_runs_its_compensation(author_module):
    task = run_workflow("sdk_author.ship", {"order": "o-8", "quantity": 3, "refuse": True})
    assert (task.state, task.error_type) == (S.FAILED, "NonRetryableError")
    released = f"release 3 for {task.pk}:reserve:compensate"
    assert author_module.calls == ["reserve attempt 1", "reserve attempt 2", released]


@pytest.mark.django_db
def test_its_json_fields_refuse_a_string_where_the_payload_needs_a_number(author_module):
    with pytest.raises(ValidationFailed):
        run_workflow("sdk_author.ship", {"order": "o-9", "quantity": "2"})


def test_every_sdk_name_is_the_object_of_the_module_that_defines_it():
    homes = ("workflows.registry", "workflows.rules.errors", "workflows.rules.fields",
             "workflows.engine.context", "workflows.engine.triggers")
    for name in sdk.__all__:
        value = getattr(sdk, name)
        found = [home for home in homes if getattr(importlib.import_module(home), name, None)
                 is value]
        assert found, f"workflows.sdk.{name} is not the object its home module defines"
    assert sdk.define_workflow == registry.define
