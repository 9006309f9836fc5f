"""The task representation (docs/design.md, "The task representation") — the
API's, and the body of a completion webhook — built directly.

`TaskSerializer` documents this shape (the OpenAPI schema is generated from
it) and `tests/api/test_representation.py` holds the two to the same output.
Building the dict by hand instead of running the ModelSerializer per task is
what makes a 1000-item batch answer in milliseconds rather than a second:
DRF rebuilds a ModelSerializer's fields for every instance it is given.
Pure formatting: callers read the rows.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.utils.dateparse import parse_datetime


def _when(value: datetime | None) -> str | None:
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text  # as DRF writes it


def step_data(step, *, failures: bool = True) -> dict:
    """One step; with `failures`, its failed attempts' log (engine/failures.py)
    — the API has it, a webhook body does not (tracebacks would make every
    delivery of a flaky task kilobytes longer)."""
    data = {"index": step.index, "name": step.name, "state": step.state,
            "attempts": step.attempts, "output": step.output, "error": step.error,
            "started_at": _when(step.started_at), "finished_at": _when(step.finished_at)}
    if failures:
        data["failures"] = step.failures or []
    return data


def delivery_data(delivery) -> dict:
    """One completion webhook of a task: `id` is its `webhook-id`; `attempt_log`
    its last attempts with a recorded outcome (an attempt counted in `attempts`
    but missing there was lost with its worker)."""
    return {"id": delivery.message_id, "state": delivery.state, "attempts": delivery.attempts,
            "last_status": delivery.last_status, "last_error": delivery.last_error,
            "next_attempt_at": _when(delivery.next_attempt_at)
            if delivery.state == "pending" else None,
            "delivered_at": _when(delivery.delivered_at),
            "created_at": _when(delivery.created_at),
            "attempt_log": [{"attempt": e.get("n"), "at": _when(parse_datetime(e.get("at") or "")),
                             "status": e.get("status"), "error": e.get("error") or "",
                             "duration_ms": e.get("ms")} for e in delivery.attempt_log or []]}


def task_deliveries(task) -> list:
    """Its deliveries, oldest first: none without an endpoint (no query), else
    the prefetched or stored ones."""
    if not task.callback_url:
        return []
    return sorted(task.deliveries.all(), key=lambda d: d.pk)


def signal_data(signal) -> dict:
    """One signal sent to a task (docs/waiting.md)."""
    return {"name": signal.name, "payload": signal.payload,
            "received_at": _when(signal.received_at), "consumed_at": _when(signal.consumed_at)}


def task_data(task, steps=None, deliveries=None, signals=None) -> dict:
    """The representation of `task`; `steps` defaults to its prefetched or
    stored checkpoints in index order, `deliveries` to task_deliveries(task),
    `signals` to its prefetched or stored signals, oldest first."""
    if steps is None:
        steps = sorted(task.steps.all(), key=lambda s: s.index)
    if deliveries is None:
        deliveries = task_deliveries(task)
    if signals is None:
        signals = sorted(task.signals.all(), key=lambda s: s.pk)
    return {
        **_core(task, steps),
        "callback_url": task.callback_url or None,
        "deliveries": [delivery_data(d) for d in deliveries],
        "signals": [signal_data(s) for s in signals],
    }


def _waiting_for(task) -> dict | None:
    """What a waiting task waits for, as the API shows it: its kind, and the
    signal's name and when the wait ends by itself where they apply."""
    shown = task.waits_for
    if shown is None:
        return None
    return {k: shown[k] for k in ("kind", "name", "until") if shown.get(k) is not None}


def _core(task, steps, *, failures: bool = True) -> dict:
    return {
        "id": str(task.pk), "idempotency_key": task.idempotency_key, "workflow": task.workflow,
        "state": task.state, "payload": task.payload, "result": task.result,
        "error": task.error, "error_type": task.error_type, "attempts": task.attempts,
        "max_attempts": task.max_attempts, "replays": task.replays,
        "next_attempt_at": _when(task.next_attempt_at), "waiting_for": _waiting_for(task),
        "run_after": _when(task.run_after), "priority": task.priority,
        "source": task.source, "version": task.version,
        "parent": str(task.parent_id) if task.parent_id else None,
        "children_count": task.children_count,
        "trace_id": task.trace_id, "created_at": _when(task.created_at),
        "started_at": _when(task.started_at), "finished_at": _when(task.finished_at),
        "expires_at": _when(task.expires_at),
        "steps": [step_data(s, failures=failures) for s in steps],
    }


def webhook_body(task, steps) -> bytes:
    """A completion webhook's body: the task representation without
    `deliveries` (which would describe the delivery itself, mid-flight) and
    `signals` (each wait step's output holds the one it consumed) and the
    steps' `failures` (their tracebacks), as compact JSON bytes."""
    data = {**_core(task, steps, failures=False), "callback_url": task.callback_url or None}
    return json.dumps(data, separators=(",", ":")).encode("ascii")
