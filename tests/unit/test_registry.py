from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from workflows.registry import Registry, Workflow, registry
from workflows.rules.errors import NonRetryableError, RetryableError, UnknownWorkflow


def noop(ctx):
    return None


def test_demo_workflows_are_registered_with_the_contract_names():
    assert {"demo.echo", "demo.sync_orders", "demo.flaky", "demo.slow", "demo.saga"} <= set(
        registry.names())
    assert [s.name for s in registry.get("demo.sync_orders").steps] == [
        "fetch", "transform", "write"]
    assert [s.atomic for s in registry.get("demo.sync_orders").steps] == [False, False, True]
    saga = registry.get("demo.saga")
    assert [(s.name, s.compensation.__name__ if s.compensation else None)
            for s in saga.steps] == [("reserve", "release"), ("charge", "refund"),
                                     ("confirm", None)]
    flaky = registry.get("demo.flaky")
    assert flaky.max_attempts == 5 and flaky.policy.initial <= 0.2
    assert [s.name for s in registry.get("demo.echo").steps] == ["echo"]


def test_demo_slow_runs_as_many_steps_as_asked():
    slow = registry.get("demo.slow")
    assert [s.name for s in slow.steps_for({"steps": 3, "seconds": 0})] == ["s0", "s1", "s2"]
    assert len(slow.steps_for({"steps": 50, "seconds": 0})) == 50


def test_duplicate_workflow_names_are_refused():
    reg = Registry()
    reg.define("acme.sync")
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        reg.define("acme.sync")


def test_unknown_workflow_is_a_domain_error():
    with pytest.raises(UnknownWorkflow):
        Registry().get("nope.nothing")
    with pytest.raises(UnknownWorkflow):
        Registry().get(["not", "a", "name"])


@pytest.mark.parametrize("options, problem", [
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"backoff_initial": -1}, "backoff_initial"),
    ({"backoff_factor": 0.5}, "backoff_factor"),
    ({"backoff_initial": 5, "backoff_max": 1}, "backoff_max"),
    ({"backoff_max": float("inf")}, "backoff_max"),
    ({"idempotency_ttl": -5}, "idempotency_ttl"),
    ({"key_fields": ("a", "a")}, "duplicate"),
    ({"key_fields": "batch"}, "key_fields"),
    ({"payload_serializer": dict}, "payload_serializer"),
    ({"retry_on": (ValueError, "x")}, "retry_on"),
])
def test_bad_options_are_refused_naming_the_problem(options, problem):
    with pytest.raises(ImproperlyConfigured, match=problem):
        Workflow("acme.sync", **options)


@pytest.mark.parametrize("name", ["", "Acme.Sync", "acme..sync", "acme sync", "1acme", "a" * 101])
def test_bad_workflow_names_are_refused(name):
    with pytest.raises(ImproperlyConfigured):
        Workflow(name)


def test_bad_steps_are_refused():
    wf = Workflow("acme.sync")
    wf.add_step("one", noop)
    with pytest.raises(ImproperlyConfigured, match="used twice"):
        wf.add_step("one", noop)
    with pytest.raises(ImproperlyConfigured, match="not callable"):
        wf.add_step("two", "noop")
    with pytest.raises(ImproperlyConfigured, match="compensation"):
        wf.add_step("three", noop, compensation=42)
    with pytest.raises(ImproperlyConfigured, match="step name"):
        wf.add_step("bad name", noop)


def test_a_workflow_without_steps_fails_validation():
    reg = Registry()
    reg.define("acme.empty")
    with pytest.raises(ImproperlyConfigured, match="no steps"):
        reg.validate_all()


def test_decorator_keeps_declaration_order_and_options():
    wf = Workflow("acme.sync", idempotency_ttl=60, key_fields=["batch"])

    @wf.step
    def first(ctx):
        return 1

    @wf.step(atomic=True, compensation=noop, name="second-step")
    def second(ctx):
        return 2

    assert [(s.name, s.atomic, s.compensation) for s in wf.steps] == [
        ("first", False, None), ("second-step", True, noop)]
    assert wf.idempotency_ttl == timedelta(seconds=60)
    assert wf.key_fields == ("batch",)
    assert wf.describe()["steps"][1] == {"index": 1, "name": "second-step", "atomic": True,
                                         "compensation": "noop", "compensation_atomic": True,
                                         "waits_for": None}


def test_retryable_classification():
    wf = Workflow("acme.sync")
    assert wf.is_retryable(RetryableError("x"))
    assert wf.is_retryable(ConnectionError("x"))
    assert wf.is_retryable(TimeoutError("x"))
    assert not wf.is_retryable(NonRetryableError("x"))
    assert not wf.is_retryable(KeyError("bug"))
    assert not wf.is_retryable(ValueError("bug"))
    only_value = Workflow("acme.other", retry_on=(ValueError,))
    assert only_value.is_retryable(ValueError("x"))
    assert not only_value.is_retryable(ConnectionError("x"))


def test_payload_serializer_must_be_a_drf_serializer():
    class Payload(serializers.Serializer):
        n = serializers.IntegerField()

    assert Workflow("acme.sync", payload_serializer=Payload).payload_serializer is Payload


# --- schedules declared in code ------------------------------------------------------------

def test_a_cron_string_declares_one_schedule_named_after_the_workflow():
    from workflows.registry import Schedule

    workflow = Workflow("acme.report", schedule=" 0 3  * * * ")
    assert workflow.schedules == (Schedule("0 3 * * *", payload={}, missed="skip",
                                           name="acme.report"),)
    assert Workflow("acme.quiet").schedules == ()


def test_several_schedules_each_need_their_own_name():
    from workflows.registry import Schedule

    workflow = Workflow("acme.sync", schedule=[
        Schedule("*/15 * * * *", payload={"scope": "delta"}, name="acme.sync-delta"),
        Schedule("0 2 * * *", payload={"scope": "full"}, name="acme.sync-full",
                 missed="run_once", owner="acme")])
    assert [(s.name, s.missed, s.owner) for s in workflow.schedules] == [
        ("acme.sync-delta", "skip", None), ("acme.sync-full", "run_once", "acme")]
    with pytest.raises(ImproperlyConfigured, match="same name"):
        Workflow("acme.sync", schedule=["0 1 * * *", "0 2 * * *"])


@pytest.mark.parametrize(("schedule", "problem"), [
    ("61 * * * *", "not a valid cron expression"),
    ("R * * * *", "random field"),
    (42, "must be a cron string"),
])
def test_a_bad_schedule_is_refused_naming_the_workflow(schedule, problem):
    with pytest.raises(ImproperlyConfigured, match=f"workflow 'acme.bad'.*{problem}"):
        Workflow("acme.bad", schedule=schedule)


def test_bad_schedule_options_are_refused():
    from workflows.registry import Schedule

    for spec, problem in [
        (Schedule("0 3 * * *", missed="sometimes"), "missed must be one of"),
        (Schedule("0 3 * * *", payload=[1]), "payload must be a dict"),
        (Schedule("0 3 * * *", payload={"x": float("nan")}), "plain JSON"),
        (Schedule("0 3 * * *", name="has:colon"), "schedule name"),
        (Schedule("0 3 * * *", owner=""), "owner must be a username"),
    ]:
        with pytest.raises(ImproperlyConfigured, match=problem):
            Workflow("acme.bad", schedule=spec)


def test_one_schedule_name_in_two_workflows_is_refused():
    from workflows.registry import Schedule

    reg = Registry()
    reg.define("acme.one", schedule=Schedule("0 3 * * *", name="nightly")).add_step("s", noop)
    reg.define("acme.two", schedule=Schedule("0 4 * * *", name="nightly")).add_step("s", noop)
    with pytest.raises(ImproperlyConfigured, match="'nightly' is declared by both"):
        reg.validate_all()


def test_the_missed_policies_are_the_models():
    from workflows.models import MissedPolicy
    from workflows.registry import SCHEDULE_MISSED_POLICIES

    assert tuple(MissedPolicy.values) == SCHEDULE_MISSED_POLICIES
