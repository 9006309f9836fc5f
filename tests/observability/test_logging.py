"""Structured logs: every engine event as one JSON line with the fields an
operator filters on, a text form for people, and no keys or payloads at INFO."""

import io
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from tests.factories import make_finished_tasks
from tests.support.helpers import drain, expire_lease, pop_queued
from tests.support.procs import ROOT
from workflows.engine.cleanup import tasks_cleanup
from workflows.engine.dispatcher import dispatch_once
from workflows.engine.operations import task_cancel
from workflows.engine.triggers import task_trigger
from workflows.models import Task
from workflows.observability.events import emit, log_context
from workflows.observability.logging import JsonFormatter, TextFormatter
from workflows.rules.errors import PilotError
from workflows.worker import run_task

SECRET_KEY_VALUE = "key-do-not-log-7f3a"
SECRET_PAYLOAD_VALUE = "payload-do-not-log-91c2"


@pytest.fixture
def log_lines():
    """Every line the JSON formatter writes for the pilot.events logger."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("pilot.events")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lambda: stream.getvalue().splitlines()
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def parsed(lines) -> list[dict]:
    return [json.loads(line) for line in lines]


@pytest.mark.django_db(transaction=True)
def test_a_task_life_is_logged_as_json_lines_with_the_expected_fields(owner, temp_workflow,
                                                                      log_lines):
    wf = temp_workflow("test.logged", max_attempts=3, backoff_initial=0.01, backoff_max=0.01)

    @wf.step
    def first(ctx):
        if ctx.attempt == 1:
            from workflows.rules.errors import RetryableError
            raise RetryableError("once")
        return 1

    outcome = task_trigger(owner=owner, key=SECRET_KEY_VALUE, workflow="test.logged",
                           payload={"secret": SECRET_PAYLOAD_VALUE}, trace_id="trace-abc")
    task_trigger(owner=owner, key=SECRET_KEY_VALUE, workflow="test.logged",
                 payload={"secret": SECRET_PAYLOAD_VALUE})
    with pytest.raises(PilotError):
        task_trigger(owner=owner, key=SECRET_KEY_VALUE, workflow="test.logged",
                     payload={"other": SECRET_PAYLOAD_VALUE})
    drain(lambda: Task.objects.get(pk=outcome.task.pk).is_finished)

    lines = log_lines()
    assert SECRET_KEY_VALUE not in "\n".join(lines)
    assert SECRET_PAYLOAD_VALUE not in "\n".join(lines)
    records = parsed(lines)
    for record in records:
        assert record["level"] == "info" and record["logger"] == "pilot.events"
        stamp = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
        assert abs(stamp - timezone.now()) < timedelta(minutes=1)
        assert record["timestamp"].endswith("Z")
    events = [r["event"] for r in records]
    for name in ("task_triggered", "task_replayed", "trigger_refused", "retry_scheduled",
                 "task_transitioned"):
        assert name in events, (name, events)
    # DEBUG, not INFO: per-step and per-claim lines are volume (the transitions say it).
    for name in ("step_started", "step_finished", "task_claimed"):
        assert name not in events
    task_id = str(outcome.task.pk)
    mine = [r for r in records if r.get("task_id") == task_id]
    # Everything about the task carries its trace id and workflow.
    assert {(r["trace_id"], r["workflow"]) for r in mine} == {("trace-abc", "test.logged")}
    claims = [r for r in mine if r["event"] == "task_transitioned" and
              r["transition"] == "claim"]
    assert [r["attempt"] for r in claims] == [1, 2]
    refused = next(r for r in records if r["event"] == "trigger_refused")
    assert refused["code"] == "idempotency_key_reused"
    retry = next(r for r in mine if r["event"] == "retry_scheduled")
    assert (retry["attempt"], retry["error_type"]) == (1, "RetryableError")


@pytest.mark.django_db(transaction=True)
def test_lease_loss_recovery_cancel_compensation_and_cleanup_have_events(owner, temp_workflow,
                                                                         log_lines):
    wf = temp_workflow("test.taken_over", max_attempts=3, backoff_initial=0.01,
                       backoff_max=0.01)

    @wf.step
    def stalls(ctx):
        if ctx.attempt == 1:  # this worker "stalls": its lease runs out, the task moves on
            expire_lease(ctx.step_key.split(":")[0])
            dispatch_once()
            ctx.heartbeat()  # raises LeaseLost
        return "ok"

    taken = task_trigger(owner=owner, key="t", workflow="test.taken_over", payload={}).task
    run_task(pop_queued()[0])
    saga = task_trigger(owner=owner, key="s", workflow="demo.saga", payload={"fail": True}).task
    pending = task_trigger(owner=owner, key="c", workflow="demo.echo", payload={}).task
    task_cancel(task_id=pending.pk, user=owner)
    drain(lambda: Task.objects.get(pk=saga.pk).is_finished)
    make_finished_tasks(owner, 3)
    tasks_cleanup(batch_size=2)

    by_event: dict[str, list] = {}
    for record in parsed(log_lines()):
        by_event.setdefault(record["event"], []).append(record)
    lost = by_event["lease_lost"][0]
    assert (lost["task_id"], lost["attempt"]) == (str(taken.pk), 1)
    recovered = by_event["task_recovered"][0]
    assert (recovered["task_id"], recovered["to_state"]) == (str(taken.pk), "retrying")
    cancel = by_event["task_cancel_requested"][0]
    assert (cancel["task_id"], cancel["to_state"], cancel["actor"]) == \
        (str(pending.pk), "cancelled", "user:client-a")
    assert [r["step"] for r in by_event["step_compensated"]] == ["charge", "reserve"]
    assert [r["deleted"] for r in by_event["cleanup_batch"]] == [2, 1]
    assert all("duration_ms" in r for r in by_event["cleanup_batch"])
    assert by_event["cleanup_finished"][0]["deleted"] == 3
    assert {r["action"] for r in by_event["dispatcher_action"]} >= {"recovered"}


def test_bound_context_reaches_every_event_and_explicit_fields_win(log_lines):
    with log_context(trace_id="req-1", workflow="from-context"):
        emit("thing_happened", workflow="explicit", task_id=None)
        with log_context(task_id="t-1"):
            emit("inner_happened")
    emit("outside")
    first, inner, outside = parsed(log_lines())
    assert (first["trace_id"], first["workflow"], "task_id" in first) == \
        ("req-1", "explicit", False)
    assert (inner["trace_id"], inner["task_id"], inner["workflow"]) == \
        ("req-1", "t-1", "from-context")
    assert "trace_id" not in outside


def test_secrets_are_dropped_at_info_but_not_at_debug():
    def render(level):
        record = logging.LogRecord("pilot.events", level, __file__, 1, "e", None, None)
        record.event = "e"
        record.pilot = {"payload": {"a": 1}, "idempotency_key": "k", "key": "k", "token": "t",
                        "workflow": "w"}
        return json.loads(JsonFormatter().format(record))

    assert set(render(logging.INFO)) == {"timestamp", "level", "event", "workflow", "logger"}
    assert render(logging.DEBUG)["payload"] == {"a": 1}


def test_plain_records_and_exceptions_become_json_too():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("django.request", logging.ERROR, __file__, 1,
                                   "Internal error on %s", ("/x",), sys.exc_info())
    line = json.loads(JsonFormatter().format(record))
    assert (line["event"], line["level"], line["message"], line["logger"]) == \
        ("log", "error", "Internal error on /x", "django.request")
    assert "ValueError: boom" in line["exception"]


def test_the_text_format_is_one_readable_line():
    record = logging.LogRecord("pilot.events", logging.INFO, __file__, 1, "step_finished",
                               None, None)
    record.event = "step_finished"
    record.pilot = {"task_id": "t1", "workflow": "demo.echo", "step": "echo",
                    "duration_ms": 1.5, "note": "two words"}
    line = TextFormatter().format(record)
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", line[:12])
    assert line[13:] == ('INFO    step_finished task_id=t1 workflow=demo.echo duration_ms=1.5 '
                         'step=echo note="two words"')


def _run_django(code: str, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PILOT_LOG")}
    environment.update({"DJANGO_SETTINGS_MODULE": "pilot.settings",
                        "DJANGO_SECRET_KEY": "x" * 50, **env})
    return subprocess.run([sys.executable, "-c", "import django; django.setup(); " + code],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)


def test_the_settings_log_json_to_stdout_by_default_and_text_on_request():
    code = ("from workflows.observability.events import emit; "
            f"emit('hello_logged', task_id='{uuid.uuid4()}', attempt=1)")
    default = _run_django(code)
    assert default.returncode == 0, default.stderr
    line = json.loads(default.stdout.strip())
    assert (line["event"], line["attempt"], line["level"]) == ("hello_logged", 1, "info")
    text = _run_django(code, PILOT_LOG_FORMAT="text", PILOT_LOG_STREAM="stderr")
    assert text.stdout == "" and " INFO    hello_logged task_id=" in text.stderr
    wrong = _run_django(code, PILOT_LOG_FORMAT="yaml")
    assert wrong.returncode != 0 and "PILOT_LOG_FORMAT='yaml' must be one of: json, text" \
        in wrong.stderr
