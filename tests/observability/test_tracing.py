"""Trace context end to end (docs/tracing.md): a trigger's traceparent is
stored with its task and continued in the worker's log lines, in real
OpenTelemetry spans (trigger, claim, each step, each compensation, each
webhook attempt — recorded here with the SDK's in-memory exporter) and in the
`traceparent` header of its webhooks; without OpenTelemetry, or without a
configured SDK, nothing is recorded and nothing breaks."""

import io
import json
import logging
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.support.helpers import drain
from tests.support.procs import ROOT
from tests.webhooks.receiver import Receiver
from workflows.accounts import client_webhook_ensure
from workflows.engine.run import task_run
from workflows.engine.triggers import task_trigger
from workflows.models import Task, WebhookDelivery
from workflows.observability import tracing
from workflows.observability.logging import JsonFormatter

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
INCOMING = f"00-{TRACE}-{PARENT}-01"


# --- the header ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, parsed", [
    (INCOMING, (TRACE, PARENT, "01")),
    (INCOMING.upper(), (TRACE, PARENT, "01")),
    (f" {INCOMING} ", (TRACE, PARENT, "01")),
    (f"01-{TRACE}-{PARENT}-00-future-part", (TRACE, PARENT, "00")),
    (f"00-{TRACE}-{PARENT}-01-extra", None),  # version 00 has exactly four parts
    (f"ff-{TRACE}-{PARENT}-01", None),
    (f"00-{'0' * 32}-{PARENT}-01", None),
    (f"00-{TRACE}-{'0' * 16}-01", None),
    ("00-abc-def-01", None), ("", None), (None, None), (42, None),
])
def test_a_traceparent_is_parsed_the_w3c_way(value, parsed):
    assert tracing.traceparent_parse(value) == parsed


def test_a_task_without_an_incoming_traceparent_continues_the_requests_trace():
    assert tracing.traceparent_for(INCOMING.upper(), "ignored") == INCOMING
    ours = tracing.traceparent_for("", TRACE)
    assert tracing.traceparent_parse(ours)[0] == TRACE and ours.endswith("-00")
    assert tracing.traceparent_for("", "req-42") == ""  # an X-Request-ID is no trace id


# --- without OpenTelemetry ----------------------------------------------------------------

def test_without_a_configured_sdk_nothing_is_recorded_and_it_costs_a_shared_no_op(
        monkeypatch):
    monkeypatch.setattr(tracing, "_checked", False)
    monkeypatch.setattr(tracing, "_tracer", None)
    assert tracing.tracer() is None  # the API is installed, its provider is the default
    assert tracing.span("pilot.step", parent=INCOMING) is tracing.span("pilot.claim")
    assert tracing.now_ns() == 0
    with tracing.span("pilot.step") as span:
        assert span is None
    tracing.span_failed(None, ValueError("x"))  # harmless


@pytest.mark.django_db(transaction=True)
def test_pilot_runs_when_opentelemetry_is_not_installed(owner, monkeypatch):
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails
    monkeypatch.setattr(tracing, "_checked", False)
    monkeypatch.setattr(tracing, "_tracer", None)
    task = task_trigger(owner=owner, key="no-otel", workflow="demo.echo", payload={},
                        traceparent=INCOMING, trace_id=TRACE).task
    assert task_run(task_id=task.pk).outcome == "succeeded"
    assert tracing.tracer() is None
    assert Task.objects.get(pk=task.pk).traceparent == INCOMING


def test_a_configured_sdk_is_found_in_a_fresh_process():
    """The detection itself, with the global provider (which one process can set
    only once), in a process of its own."""
    code = ("from opentelemetry import trace\n"
            "from workflows.observability import tracing\n"
            "assert tracing.tracer() is None\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "trace.set_tracer_provider(TracerProvider())\n"
            "tracing.tracing_refresh()\n"
            "assert tracing.tracer() is not None\n"
            "print('found')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "found\n"


# --- with OpenTelemetry -------------------------------------------------------------------

@pytest.fixture
def spans(monkeypatch):
    """An SDK tracer recording into memory, as PILOT's tracer for this test (the
    global provider can be set only once per process; the detection of a
    configured one is tested above in a process of its own)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_checked", True)
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("pilot"))
    yield exporter
    provider.shutdown()


def _hex(span_id: int) -> str:
    return f"{span_id:016x}"


@pytest.mark.django_db(transaction=True)
def test_trigger_claim_steps_and_webhook_are_spans_of_the_incoming_trace(owner, spans,
                                                                         settings):
    settings.PILOT_WEBHOOK_ALLOW_PRIVATE = True
    client_webhook_ensure(owner)
    with Receiver() as receiver:
        task = task_trigger(owner=owner, key="traced", workflow="demo.sync_orders",
                            payload={"batch": "t", "count": 1}, traceparent=INCOMING,
                            trace_id=TRACE, callback_url=receiver.url).task
        drain(lambda: WebhookDelivery.objects.filter(task_id=task.pk,
                                                     state="delivered").exists())
    finished = {s.name: [] for s in spans.get_finished_spans()}
    for s in spans.get_finished_spans():
        finished[s.name].append(s)
    [trigger] = finished["pilot.trigger"]
    assert f"{trigger.context.trace_id:032x}" == TRACE
    assert _hex(trigger.parent.span_id) == PARENT and trigger.parent.is_remote
    stored = Task.objects.get(pk=task.pk)
    assert stored.traceparent == f"00-{TRACE}-{_hex(trigger.context.span_id)}-01"
    assert stored.trace_id == TRACE
    below = [*finished["pilot.claim"], *finished["pilot.step"], *finished["pilot.webhook"]]
    assert {s.parent.span_id for s in below} == {trigger.context.span_id}
    assert {s.context.trace_id for s in below} == {trigger.context.trace_id}
    assert [s.attributes["pilot.step"] for s in finished["pilot.step"]] == [
        "fetch", "transform", "write"]
    [claim] = finished["pilot.claim"]
    assert claim.attributes["pilot.task_id"] == str(task.pk)
    assert claim.attributes["pilot.attempt"] == 1 and claim.start_time <= claim.end_time
    [webhook] = finished["pilot.webhook"]
    assert webhook.attributes["pilot.status"] == 204
    [got] = receiver.received
    assert got.headers["traceparent"] == f"00-{TRACE}-{_hex(webhook.context.span_id)}-01"


@pytest.mark.django_db(transaction=True)
def test_a_trigger_inside_a_request_span_of_the_deployment_is_its_child(owner, spans):
    """With the deployment's own instrumentation (a server span per request,
    already a child of the incoming traceparent), the trigger span nests in it."""
    request_tracer = tracing.tracer()
    parent_context = tracing._parent_context(INCOMING)
    with request_tracer.start_as_current_span("GET /api/v1/tasks", context=parent_context) \
            as request_span:
        task_trigger(owner=owner, key="nested", workflow="demo.echo", payload={},
                     traceparent=INCOMING, trace_id=TRACE)
    trigger = next(s for s in spans.get_finished_spans() if s.name == "pilot.trigger")
    assert trigger.parent.span_id == request_span.get_span_context().span_id
    assert f"{trigger.context.trace_id:032x}" == TRACE


@pytest.mark.django_db(transaction=True)
def test_a_failed_step_and_each_compensation_are_spans_too(owner, spans):
    task = task_trigger(owner=owner, key="saga", workflow="demo.saga", payload={"fail": True},
                        traceparent=INCOMING, trace_id=TRACE).task
    assert task_run(task_id=task.pk).outcome == "failed"
    by_name: dict = {}
    for s in spans.get_finished_spans():
        by_name.setdefault(s.name, []).append(s)
    steps = {s.attributes["pilot.step"]: s for s in by_name["pilot.step"]}
    assert set(steps) == {"reserve", "charge", "confirm"}
    assert steps["confirm"].status.status_code == StatusCode.ERROR
    assert steps["reserve"].status.status_code != StatusCode.ERROR
    assert [s.attributes["pilot.step"] for s in by_name["pilot.compensate"]] == [
        "charge", "reserve"]
    [trigger] = by_name["pilot.trigger"]
    assert {s.parent.span_id for s in by_name["pilot.compensate"]} == {
        trigger.context.span_id}


# --- the worker's logs ------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_every_log_line_of_a_run_carries_the_tasks_trace_id(owner, temp_workflow):
    flow = temp_workflow("test.logs")

    @flow.step
    def talk(ctx):
        logging.getLogger("someone.elses.library").warning("inside the step")
        return 1

    task = task_trigger(owner=owner, key="logs", workflow="test.logs", payload={},
                        traceparent=INCOMING, trace_id=TRACE).task
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        assert task_run(task_id=task.pk).outcome == "succeeded"
    finally:
        root.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    [step_line] = [line for line in lines if line.get("message") == "inside the step"]
    assert (step_line["trace_id"], step_line["task_id"]) == (TRACE, str(task.pk))
    assert lines and all(line.get("trace_id") == TRACE for line in lines
                         if line.get("task_id") == str(task.pk))
