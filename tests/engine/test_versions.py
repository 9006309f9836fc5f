"""Versions (docs/writing-workflows.md, "Versions"): several versions of one
workflow registered at once; a trigger runs the newest; a task runs every
later attempt, wait and compensation on the version it was triggered on; a
version removed under a task fails it with WorkflowVersionMissing before any
step of another version runs. A deployment is a registry change between two
of the task's claims — here, in the test's process, exactly at that window."""

import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.support.helpers import audit, pop_queued, versioned_v2
from workflows.demo import workflows as demo
from workflows.engine import task_retry
from workflows.engine.signals import task_signal
from workflows.engine.triggers import task_trigger
from workflows.models import StepCheckpoint, Task
from workflows.registry import Workflow, registry
from workflows.rules.states import TaskState as S
from workflows.worker import run_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def deploy():
    """`deploy.add(2)` registers demo.versioned version 2 (a, gate, c, b) as a
    deployment would; `deploy.remove(1)` takes version 1 away. Put back after."""
    before = {w.version: w for w in registry.versions("demo.versioned")}

    class Deploy:
        @staticmethod
        def add(version):
            assert version == 2, "the demo's contract has versions 1 and 2"
            return registry.register(versioned_v2())

        @staticmethod
        def remove(version):
            registry.unregister("demo.versioned", version)

    yield Deploy
    registry.unregister("demo.versioned")
    for wf in before.values():
        registry.register(wf)


def trigger(owner, workflow="demo.versioned", payload=None):
    return task_trigger(owner=owner, key=uuid.uuid4().hex, workflow=workflow,
                        payload=payload or {}).task


def go(task):
    task_signal(task_id=task.pk, name="go", key=uuid.uuid4().hex, user=None, actor="test")


def run_queued():
    for _ in range(5):
        messages = pop_queued()
        for message in messages:
            run_task(message)
        if not messages:
            return


def test_a_trigger_runs_the_newest_version_and_each_task_keeps_its_own(owner, deploy):
    old = trigger(owner)
    run_queued()
    old.refresh_from_db()
    assert old.version == 1 and old.state == S.WAITING
    deploy.add(2)  # a deployment while a version-1 task waits
    new = trigger(owner)
    assert new.version == 2
    go(old)
    go(new)
    run_queued()
    old.refresh_from_db()
    new.refresh_from_db()
    assert old.result == {"version": 1, "ran": ["a", "gate", "b"]}
    assert new.result == {"version": 2, "ran": ["a", "gate", "c", "b"]}
    assert not StepCheckpoint.objects.filter(task=old, name="c").exists()


def test_a_retry_after_a_deployment_runs_the_version_the_task_was_triggered_on(
        owner, deploy, temp_workflow):
    from workflows.rules.errors import NonRetryableError

    calls = []
    v1 = temp_workflow("t.deployed", max_attempts=1)

    @v1.step
    def first(ctx):
        calls.append(("v1", "first"))
        if not ctx.payload.get("fixed"):
            raise NonRetryableError("broken in v1")
        return 1

    task = trigger(owner, "t.deployed", {})
    run_queued()
    task.refresh_from_db()
    assert task.state == S.FAILED
    v2 = Workflow("t.deployed", version=2)
    v2.add_step("other", lambda ctx: calls.append(("v2", "other")))
    registry.register(v2)
    Task.objects.filter(pk=task.pk).update(payload={"fixed": True})
    task_retry(task_id=task.pk, user=owner)
    run_queued()
    task.refresh_from_db()
    assert task.state == S.SUCCEEDED and task.version == 1
    assert calls == [("v1", "first"), ("v1", "first")]


def test_a_removed_version_fails_its_waiting_task_with_workflow_version_missing(
        owner, deploy):
    task = trigger(owner)
    run_queued()
    deploy.add(2)
    deploy.remove(1)  # a deployment that drops version 1 while its task waits
    go(task)
    run_queued()
    task.refresh_from_db()
    assert task.state == S.FAILED and task.error_type == "WorkflowVersionMissing"
    assert "version 1 of demo.versioned" in task.error
    # No step of version 2 ran for it: its checkpoints are version 1's a and gate.
    assert sorted(StepCheckpoint.objects.filter(task=task).values_list("name", flat=True)) == [
        "a", "gate"]
    assert [t for t, _, _ in audit(task.pk)][-2:] == ["claim", "fail"]
    # And a retry is refused with the reason, not run on another version.
    from workflows.rules.errors import InvalidTransition

    with pytest.raises(InvalidTransition, match=r"Version 1 of workflow 'demo\.versioned' is "
                                                r"no longer registered"):
        task_retry(task_id=task.pk, user=owner)


def test_the_registry_holds_several_versions_and_refuses_a_version_twice(deploy):
    deploy.add(2)
    assert [w.version for w in registry.versions("demo.versioned")] == [1, 2]
    assert registry.get("demo.versioned").version == 2
    assert registry.find("demo.versioned", version=1).version == 1
    assert registry.find("demo.versioned", version=3) is None
    with pytest.raises(ImproperlyConfigured, match=r"version 2 of workflow 'demo\.versioned' "
                                                   r"is registered twice"):
        deploy.add(2)
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ImproperlyConfigured, match="version must be an integer"):
            Workflow("t.bad", version=bad)


@pytest.mark.parametrize("raw, versions", [("1", [1]), ("2", [2]), ("1,2", [1, 2]),
                                           (" 2 , 1 ", [1, 2])])
def test_pilot_demo_versions_chooses_the_registered_versions(settings, raw, versions):
    settings.PILOT_DEMO_VERSIONS = raw
    assert demo._versions() == versions


@pytest.mark.parametrize("raw", ["3", "one", ",", "1,3"])
def test_a_bad_pilot_demo_versions_names_the_setting(settings, raw):
    settings.PILOT_DEMO_VERSIONS = raw
    with pytest.raises(ImproperlyConfigured, match="PILOT_DEMO_VERSIONS"):
        demo._versions()


def test_the_workflows_api_lists_every_version(owner, deploy):
    from tests.api.conftest import client_for

    deploy.add(2)
    api = client_for("client-v")
    [shown] = [w for w in api.get("/api/v1/workflows").json() if w["name"] == "demo.versioned"]
    assert shown["version"] == 2 and shown["versions"] == [1, 2]
    assert [s["name"] for s in shown["steps"]] == ["a", "gate", "c", "b"]
