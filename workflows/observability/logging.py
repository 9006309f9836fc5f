"""Log formatters: JSON lines for machines (the default), text for people.

Both render the `pilot` fields that `events.emit` attaches to a record, plus the
fields bound by `events.log_context`. Settings pick one with PILOT_LOG_FORMAT
(`json` | `text`); `make run` uses text.

JSON line, one per record:

    {"timestamp": "2026-11-29T18:09:36.123Z", "level": "info", "event": "step_finished",
     "trace_id": "…", "task_id": "…", "workflow": "demo.echo", "attempt": 1,
     "duration_ms": 2.1, "step": "echo", "logger": "pilot.events"}

`timestamp`, `level`, `event` and `logger` are always there; the others when
the event has them. A record that is not an event (Django, django-q2, a
warning) gets `event: "log"` and its text in `message`.

Secrets stay out: idempotency keys, payloads, results, tokens and passwords are
never rendered at INFO or above, whoever puts them into a record.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from workflows.observability.events import current_context

# Rendered first, in this order, when present.
LEADING = ("timestamp", "level", "event", "trace_id", "task_id", "workflow", "attempt",
           "duration_ms")
# Never rendered at INFO and above: they carry customer data or credentials.
SENSITIVE = frozenset({"key", "idempotency_key", "payload", "result", "output", "token",
                       "password", "authorization"})


def record_fields(record: logging.LogRecord) -> dict:
    """The ordered fields of one record, secrets removed, empty values dropped."""
    event = getattr(record, "event", None)
    fields = {
        "timestamp": datetime.fromtimestamp(record.created, UTC)
        .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "event": event or "log",
    }
    extra = {**current_context(), **(getattr(record, "pilot", None) or {})}
    if event is None:
        extra["message"] = record.getMessage()
    if record.levelno >= logging.INFO:
        extra = {k: v for k, v in extra.items() if k.lower() not in SENSITIVE}
    for name in LEADING[3:]:
        if extra.get(name) not in (None, ""):
            fields[name] = extra.pop(name)
    fields |= {k: v for k, v in extra.items() if v is not None}
    fields["logger"] = record.name
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line (UTF-8, no newlines inside)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json.dumps(fields, default=str, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`18:09:36.123 INFO  step_finished task_id=… workflow=demo.echo step=echo …`"""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        stamp = fields.pop("timestamp")[11:23]
        level = fields.pop("level").upper()
        event = fields.pop("event")
        logger = fields.pop("logger")
        message = fields.pop("message", None)
        head = f"{stamp} {level:<7} {event}" if message is None else \
            f"{stamp} {level:<7} {logger}: {message}"
        line = " ".join([head, *(f"{k}={_text(v)}" for k, v in fields.items())])
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text(value) -> str:
    if isinstance(value, str):
        return value if value and " " not in value and "=" not in value else json.dumps(value)
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)
