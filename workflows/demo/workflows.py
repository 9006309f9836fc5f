"""The demo workflows — a fixed contract that outside tests rely on
(docs/design.md, "Demo workflows"). Registered only when PILOT_DEMO_WORKFLOWS
is true (`make run` and the tests set it); never in production."""

from __future__ import annotations

import os

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from workflows.models import DemoLedger, DemoOrder
from workflows.sdk import (
    JSONBoolean,
    JSONInteger,
    JSONNumber,
    JSONString,
    NonRetryableError,
    RetryableError,
    define_workflow,
)

# --- demo.echo ------------------------------------------------------------------------

echo = define_workflow("demo.echo", description="Returns its payload.")


@echo.step(name="echo")
def echo_step(ctx):
    return {"echo": ctx.payload}


# --- demo.sync_orders ---------------------------------------------------------------------

class SyncOrdersPayload(serializers.Serializer):
    batch = JSONString(max_length=100)
    count = JSONInteger(min_value=1, max_value=10000)
    step_seconds = JSONNumber(min_value=0, max_value=3600, required=False, default=0)


sync_orders = define_workflow(
    "demo.sync_orders", payload_serializer=SyncOrdersPayload, max_attempts=5,
    backoff_initial=0.2, backoff_factor=2.0, backoff_max=5.0,
    description="Fetches, transforms and writes `count` DemoOrder rows; `write` is atomic, "
                "so the rows are written exactly once.")


@sync_orders.step
def fetch(ctx):
    ctx.sleep(float(ctx.payload.get("step_seconds", 0)))
    return {"fetched": ctx.payload["count"]}


@sync_orders.step
def transform(ctx):
    ctx.sleep(float(ctx.payload.get("step_seconds", 0)))
    return {"transformed": ctx.outputs["fetch"]["fetched"]}


@sync_orders.step(atomic=True)
def write(ctx):
    # Inside the step's transaction: these rows commit together with the
    # checkpoint, or not at all.
    ctx.sleep(float(ctx.payload.get("step_seconds", 0)))
    batch, count = ctx.payload["batch"], ctx.outputs["transform"]["transformed"]
    DemoOrder.objects.bulk_create([DemoOrder(batch=batch, n=n) for n in range(count)],
                                  batch_size=1000)
    return {"written": count}


# --- demo.flaky ----------------------------------------------------------------------------

class FlakyPayload(serializers.Serializer):
    fail_times = JSONInteger(min_value=0, max_value=1000)


flaky = define_workflow(
    "demo.flaky", payload_serializer=FlakyPayload, max_attempts=5,
    backoff_initial=0.1, backoff_factor=2.0, backoff_max=1.0,
    description="Fails (retryably) on its first `fail_times` attempts, then succeeds.")


@flaky.step
def attempt(ctx):
    if ctx.attempt <= ctx.payload["fail_times"]:
        raise RetryableError(f"flaky failure on attempt {ctx.attempt}")
    return {"attempts": ctx.attempt}


# --- demo.slow -----------------------------------------------------------------------------

class SlowPayload(serializers.Serializer):
    steps = JSONInteger(min_value=1, max_value=50)
    seconds = JSONNumber(min_value=0, max_value=3600)


slow = define_workflow(
    "demo.slow", payload_serializer=SlowPayload, max_attempts=5,
    backoff_initial=0.2, backoff_factor=2.0, backoff_max=5.0,
    plan=lambda workflow, payload: workflow.steps[:payload["steps"]],
    description="`steps` steps s0, s1, ... each sleeping `seconds` while heartbeating.")


def _slow_step(number: int):
    def run(ctx):
        ctx.sleep(float(ctx.payload["seconds"]))
        return {"completed_steps": number + 1}

    run.__name__ = f"s{number}"
    return run


for _n in range(50):
    slow.add_step(f"s{_n}", _slow_step(_n))


# --- demo.saga -----------------------------------------------------------------------------

class SagaPayload(serializers.Serializer):
    fail = JSONBoolean()
    step_seconds = JSONNumber(min_value=0, max_value=3600, required=False, default=0)
    compensate_seconds = JSONNumber(min_value=0, max_value=3600, required=False, default=0)


saga = define_workflow(
    "demo.saga", payload_serializer=SagaPayload, max_attempts=3,
    backoff_initial=0.1, backoff_factor=2.0, backoff_max=1.0,
    description="reserve → charge → confirm; on failure (or a cancel) charge is refunded and "
                "the reservation released, in reverse order. Every step and compensation is "
                "atomic and writes one DemoLedger row, so a double effect shows.")


def _ledger(ctx, action: str, seconds_field: str) -> None:
    """Wait (heartbeating), then record the effect — inside the step's transaction."""
    ctx.sleep(float(ctx.payload.get(seconds_field, 0)))
    DemoLedger.objects.create(task=ctx.task_id, action=action)


def release(ctx):
    _ledger(ctx, "release", "compensate_seconds")
    return {"released": ctx.output["reservation"]}


def refund(ctx):
    _ledger(ctx, "refund", "compensate_seconds")
    return {"refunded": ctx.output["charge"]}


@saga.step(atomic=True, compensation=release)
def reserve(ctx):
    _ledger(ctx, "reserve", "step_seconds")
    return {"reservation": f"R-{ctx.step_key}"}


@saga.step(atomic=True, compensation=refund)
def charge(ctx):
    _ledger(ctx, "charge", "step_seconds")
    return {"charge": f"C-{ctx.step_key}"}


@saga.step(atomic=True)
def confirm(ctx):
    ctx.sleep(float(ctx.payload.get("step_seconds", 0)))
    if ctx.payload["fail"]:
        raise NonRetryableError("confirmation refused (payload asked to fail)")
    DemoLedger.objects.create(task=ctx.task_id, action="confirm")
    return {"confirmed": True, "reservation": ctx.outputs["reserve"]["reservation"],
            "charge": ctx.outputs["charge"]["charge"]}


# --- demo.crash ----------------------------------------------------------------------------

class CrashPayload(serializers.Serializer):
    crash_times = JSONInteger(min_value=0, max_value=100)
    compensate = JSONBoolean(required=False, default=False)


def _crash_plan(workflow, payload):
    prepare_step, boom_step = workflow.steps
    if not payload.get("compensate"):
        prepare_step = prepare_step.without_compensation()
    return [prepare_step, boom_step]


crash = define_workflow(
    "demo.crash", payload_serializer=CrashPayload, max_attempts=3,
    backoff_initial=0.1, backoff_factor=2.0, backoff_max=0.5, plan=_crash_plan,
    description="prepare (atomic), then boom, which kills its own worker process on the first "
                "`crash_times` attempts (like an out-of-memory kill). With crash_times >= 3 it "
                "is a poison task: it ends failed after 3 attempts, `unprepare` run once when "
                "`compensate`.")


def unprepare(ctx):
    DemoLedger.objects.create(task=ctx.task_id, action="unprepare")


@crash.step(atomic=True, compensation=unprepare)
def prepare(ctx):
    DemoLedger.objects.create(task=ctx.task_id, action="prepare")
    return {"prepared": True}


@crash.step
def boom(ctx):
    if ctx.attempt <= ctx.payload["crash_times"]:
        os._exit(137)
    return {"survived_attempt": ctx.attempt}


# --- demo.timer -----------------------------------------------------------------------------

@extend_schema_field({"type": "number", "minimum": 0, "exclusiveMinimum": True,
                      "maximum": 3600})
class TimerSeconds(JSONNumber):
    """More than 0, at most 3600 (an hour)."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value <= 0:
            raise serializers.ValidationError("Must be greater than 0.")
        return value


class TimerPayload(serializers.Serializer):
    seconds = TimerSeconds(max_value=3600)


timer = define_workflow(
    "demo.timer", payload_serializer=TimerPayload,
    description="Steps before, wait (a durable timer of `seconds`: the task is `waiting`, "
                "holding no worker), after; result {\"waited\": seconds}.")


@timer.step
def before(ctx):
    return {"started": True}


timer.sleep("wait", seconds=lambda payload: payload["seconds"])


@timer.step
def after(ctx):
    return {"waited": ctx.payload["seconds"]}


# --- demo.approval --------------------------------------------------------------------------

class ApprovalPayload(serializers.Serializer):
    timeout_seconds = JSONNumber(min_value=0, max_value=366 * 24 * 3600, required=False,
                                 default=3600)


approval = define_workflow(
    "demo.approval", payload_serializer=ApprovalPayload,
    description="Steps prepare, decision (waits for signal `decision` up to "
                "`timeout_seconds`: its output is the signal's payload), apply (approved: "
                "one DemoLedger row 'apply'); result = apply's output.")


@approval.step(name="prepare")
def approval_prepare(ctx):
    return {"prepared": True}


approval.wait_for_signal("decision",
                         timeout=lambda payload: payload.get("timeout_seconds", 3600))


@approval.step(atomic=True)
def apply(ctx):
    decision = ctx.outputs["decision"]
    if not isinstance(decision, dict) or decision.get("approved") is not True:
        return {"approved": False}
    DemoLedger.objects.create(task=ctx.task_id, action="apply")
    return {"approved": True, "by": decision.get("by")}


# --- demo.fanout ----------------------------------------------------------------------------

class FanoutPayload(serializers.Serializer):
    children = JSONInteger(min_value=1, max_value=100)
    child_seconds = JSONNumber(min_value=0, max_value=3600, required=False, default=0)
    fail_child = JSONInteger(min_value=0, max_value=99, required=False, allow_null=True,
                             default=None)


fanout = define_workflow(
    "demo.fanout", payload_serializer=FanoutPayload,
    description="Step spawn starts `children` demo.slow tasks ({\"steps\": 1, \"seconds\": "
                "child_seconds}; child `fail_child`, 0-based, a failing demo.saga instead); "
                "step gather waits for them all (the task is `waiting`, holding no worker); "
                "result {\"children\": n, \"results\": [their results in order]}.")


@fanout.step
def spawn(ctx):
    count, failing = ctx.payload["children"], ctx.payload.get("fail_child")
    slow = {"steps": 1, "seconds": float(ctx.payload.get("child_seconds", 0))}
    if failing is None or failing >= count:
        return {"children": ctx.start_children("demo.slow", [slow] * count)}
    # In order: the slow ones before it, the failing saga, the slow ones after.
    ids = ctx.start_children("demo.slow", [slow] * failing)
    ids.append(ctx.start_child("demo.saga", {"fail": True}))
    ids += ctx.start_children("demo.slow", [slow] * (count - failing - 1))
    return {"children": ids}


fanout.wait_for_children("gather", of_step="spawn",
                         output=lambda results: {"children": len(results), "results": results})


# --- demo.versioned -------------------------------------------------------------------------

def _versions() -> list[int]:
    from django.core.exceptions import ImproperlyConfigured

    from workflows.conf import pilot_settings

    raw = pilot_settings.PILOT_DEMO_VERSIONS or "1"
    try:
        versions = sorted({int(v) for v in raw.split(",") if v.strip()})
    except ValueError:
        versions = []
    if not versions or not set(versions) <= {1, 2}:
        raise ImproperlyConfigured(f"PILOT_DEMO_VERSIONS must list demo.versioned's versions "
                                   f"(1, 2 or 1,2), not {raw!r}")
    return versions


def _ran(name: str, version: int | None = None):
    """A step that says which steps ran before it (ctx.outputs is in step
    order), and — the last — its version."""

    def run(ctx):
        ran = [*ctx.outputs, name]
        return {"ran": ran} if version is None else {"version": version, "ran": ran}

    run.__name__ = name
    return run


for _version in _versions():
    _wf = define_workflow(
        "demo.versioned", version=_version,
        description=f"Version {_version}: steps a, gate (waits for signal go), "
                    f"{'b' if _version == 1 else 'c, b'}; result {{\"version\": v, \"ran\": "
                    "[steps in the order they ran]}.")
    _wf.add_step("a", _ran("a"))
    _wf.wait_for_signal("gate", signal="go")
    if _version == 2:
        _wf.add_step("c", _ran("c"))
    _wf.add_step("b", _ran("b", _version))
